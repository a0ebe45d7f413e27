#!/usr/bin/env bash
# Installs the MCP clients the MCP tests drive, outside the source tree:
#   target/mcp-sdk      the official MCP TypeScript SDK and ajv, from this
#                       directory's package.json and lockfile (`npm ci`),
#                       and check.mjs beside them (its imports resolve there)
#   target/mcp-clients  the Claude Code CLI (for `claude mcp list`), with
#                       --clients
# Prints the SDK directory. Does nothing that is already installed.
# Usage: crates/subagents/tests/mcp-sdk/install.sh [--clients]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../../../.." && pwd)"
sdk="$repo/target/mcp-sdk"
mkdir -p "$sdk"
if ! cmp -s "$here/package-lock.json" "$sdk/package-lock.json" || [ ! -d "$sdk/node_modules/@modelcontextprotocol/sdk" ]; then
    cp "$here/package.json" "$here/package-lock.json" "$sdk/"
    (cd "$sdk" && npm ci --no-audit --no-fund >/dev/null)
fi
cp "$here/check.mjs" "$sdk/check.mjs"
if [ "${1:-}" = "--clients" ]; then
    clients="$repo/target/mcp-clients"
    mkdir -p "$clients"
    if [ ! -x "$clients/node_modules/.bin/claude" ]; then
        (cd "$clients" && { [ -f package.json ] || npm init -y >/dev/null; } \
            && npm install --no-audit --no-fund @anthropic-ai/claude-code@2.1.197 >/dev/null)
    fi
fi
echo "$sdk"
