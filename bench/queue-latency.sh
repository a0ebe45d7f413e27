#!/usr/bin/env bash
# How long after a capacity slot frees the next queued run starts.
# One gate run holds the only slot of a session (--max-active 1) while
# RUNS runs of `true` join the queue with --queue; then the gate ends and
# the line drains one run at a time. For each run, the latency is from the
# previous run's process-terminal.json mtime (its proof; the finalizer then
# overlays it on status.json and frees the slot), and from that status.json
# mtime, to this run's `startedAt` (the runner's first write). Prints the
# median, p90, min and max in ms of both.
# Env: SUBAGENTS_BIN (default target/release/subagents), RUNS (default 25),
#      RESULTS_DIR (default bench/results).
set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "$BENCH_DIR/.." && pwd)"
BIN="$(realpath -m "${SUBAGENTS_BIN:-$REPO_DIR/target/release/subagents}")"
RUNS="${RUNS:-25}"
RESULTS_DIR="${RESULTS_DIR:-$BENCH_DIR/results}"
[ -x "$BIN" ] || { echo "no executable at SUBAGENTS_BIN=$BIN (cargo build --release -p subagents)" >&2; exit 1; }
unset SUBAGENTS_SESSION_ID SUBAGENTS_ROOT SUBAGENTS_QUEUE
mkdir -p "$RESULTS_DIR"
R="$(mktemp -d "${TMPDIR:-/tmp}/subagents-queue-bench.XXXXXX")"
cleanup() {
    local rc=$? id
    set +e
    for id in $(ls -A "$R/async-subagent-runs/.active-runs" 2>/dev/null); do
        "$BIN" --root "$R" stop "$id" >/dev/null 2>&1
    done
    rm -rf "$R"
    exit "$rc"
}
trap cleanup EXIT
run() { "$BIN" --root "$R" run --session bench --max-active 1 "$@"; }

# The gate waits for a file, so every measured run is queued behind it.
gate="$(run -- sh -c "while [ ! -e '$R/go' ]; do sleep 0.01; done")"
ids=("$gate")
for _ in $(seq "$RUNS"); do
    ids+=("$(run --queue -- true)")
done
touch "$R/go"
"$BIN" --root "$R" wait "${ids[@]}" >/dev/null
{
    echo "queue-latency: $RUNS queued runs behind --max-active 1, $(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg), binary $BIN"
    python3 - "$R/async-subagent-runs" "${ids[@]}" <<'PY'
import json, os, statistics, sys
runs, ids = sys.argv[1], sys.argv[2:]
def mtime(run, name):
    return os.stat(os.path.join(runs, run, name)).st_mtime_ns / 1e6
def started(run):
    with open(os.path.join(runs, run, "status.json")) as f:
        return json.load(f)["startedAt"]
pairs = list(zip(ids, ids[1:]))
# From the proof (written first), and from the proof's overlay on the
# status, the finalizer's last write before it frees the slot.
for name in ["process-terminal.json", "status.json"]:
    gaps = sorted(started(cur) - mtime(prev, name) for prev, cur in pairs)
    p90 = gaps[min(len(gaps) - 1, int(len(gaps) * 0.9))]
    print(f"{name} mtime -> next runner started, ms: median {statistics.median(gaps):.1f}, "
          f"p90 {p90:.1f}, min {gaps[0]:.1f}, max {gaps[-1]:.1f} (n={len(gaps)})")
PY
} | tee "$RESULTS_DIR/queue-latency.txt"
