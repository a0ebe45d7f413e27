#!/bin/sh
# Runs the crash matrix N times per cell (default 20) and prints one line
# per cell: "cell trials clean". Exit status 0 only when every trial of
# every cell settled cleanly; the failed trials are listed after the table.
#
#   scripts/crash-matrix.sh            # 20 trials per cell
#   scripts/crash-matrix.sh 5          # 5 trials per cell
#   CRASH_MATRIX_CELL=runner:during-step scripts/crash-matrix.sh 50
set -eu
cd "$(dirname "$0")/.."
trials="${1:-20}"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
status=0
CRASH_MATRIX_REPEAT="$trials" cargo test -q -p subagents --test it crash_matrix:: -- --nocapture \
    >"$log" 2>&1 || status=$?
grep -E '^(cell trials clean|[a-z]+:[a-z-]+ [0-9]+ [0-9]+)$' "$log" | column -t
if [ "$status" -ne 0 ]; then
    echo
    echo "failed trials:"
    grep -E '^[a-z]+:[a-z-]+ \(trial [0-9]+\):' "$log" || tail -n 40 "$log"
fi
exit "$status"
