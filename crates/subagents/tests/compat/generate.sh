#!/usr/bin/env bash
# Regenerates crates/subagents/tests/compat/fixtures/ from pi-subagents 0.49.0 itself (on
# demand; the Rust tests only read the committed fixtures).
# Usage: crates/subagents/tests/compat/generate.sh
set -euo pipefail
repo="$(cd "$(dirname "$0")/../../../.." && pwd)"
ref="$("$repo/crates/subagents/tests/compat/install-ref.sh")"
cargo build --quiet --manifest-path "$repo/Cargo.toml" --bin subagents
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
cd "$ref"
TMPDIR="$scratch" PI_SUBAGENTS_PKG="$ref/node_modules/pi-subagents" \
    node --import tsx "$repo/crates/subagents/tests/compat/generate.mts" \
    "$repo/crates/subagents/tests/compat/fixtures" "$repo" "$repo/target/debug/subagents"
