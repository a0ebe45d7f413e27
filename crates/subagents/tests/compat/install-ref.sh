#!/usr/bin/env bash
# Installs pi-subagents 0.49.0 and tsx into a scratch directory for the
# compatibility tests and the fixture generator (on demand; nothing here runs
# in a plain `cargo test` unless the directory exists).
# Usage: crates/subagents/tests/compat/install-ref.sh [DIR]   (default: target/compat-ref)
set -euo pipefail
cd "$(dirname "$0")/../../../.."
dir="${1:-${PI_SUBAGENTS_REF:-target/compat-ref}}"
mkdir -p "$dir"
cd "$dir"
[ -f package.json ] || npm init -y >/dev/null
if [ ! -f node_modules/pi-subagents/package.json ] || [ ! -d node_modules/tsx ]; then
    npm install --no-audit --no-fund pi-subagents@0.49.0 tsx >/dev/null
fi
version=$(node -p 'require("./node_modules/pi-subagents/package.json").version')
[ "$version" = "0.49.0" ] || { echo "expected pi-subagents 0.49.0, found $version" >&2; exit 1; }
echo "$(pwd)"
