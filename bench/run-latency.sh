#!/usr/bin/env bash
# Measure how long `subagents run` takes to return.
#   - `run -- true`: returns once the detached runner confirmed it is running.
#   - `run --wait -- true`: returns once the run is over and its proof written.
# Each measured launch starts from an idle root (--prepare waits until the
# previous run's active-index marker is released); a second `run -- true`
# series without that wait shows launches back to back.
# Env: SUBAGENTS_BIN (default target/release/subagents), RUNS (default 200),
#      WARMUP (default 10), RESULTS_DIR (default bench/results).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
RUNS="${RUNS:-200}"
WARMUP="${WARMUP:-10}"
R="$BENCH_ROOT"
machine_note | tee "$RESULTS_DIR/run-latency.txt"

wait_quiet "$RESULTS_DIR/run-latency.txt"
hyperfine -N --runs "$RUNS" --warmup "$WARMUP" \
    --prepare "$BENCH_DIR/wait-idle.sh $R" \
    --export-json "$RESULTS_DIR/run-true.json" \
    "$SUBAGENTS_BIN --root $R run -- true"
"$BENCH_DIR/wait-idle.sh" "$R"

wait_quiet "$RESULTS_DIR/run-latency.txt"
hyperfine -N --runs "$RUNS" --warmup "$WARMUP" \
    --prepare "$BENCH_DIR/wait-idle.sh $R" \
    --export-json "$RESULTS_DIR/run-wait-true.json" \
    "$SUBAGENTS_BIN --root $R run --wait -- true"
"$BENCH_DIR/wait-idle.sh" "$R"

wait_quiet "$RESULTS_DIR/run-latency.txt"
hyperfine -N --runs "$RUNS" --warmup "$WARMUP" \
    --export-json "$RESULTS_DIR/run-true-back-to-back.json" \
    "$SUBAGENTS_BIN --root $R run -- true"
"$BENCH_DIR/wait-idle.sh" "$R"

echo "# runs in root: $(ls "$R/async-subagent-runs" | wc -l); not complete: $(grep -L '"state": "complete"' "$R"/async-subagent-runs/*/status.json | wc -l)" | tee -a "$RESULTS_DIR/run-latency.txt"
echo "# loadavg after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$RESULTS_DIR/run-latency.txt"
summarize "$RESULTS_DIR/run-true.json" "$RESULTS_DIR/run-wait-true.json" "$RESULTS_DIR/run-true-back-to-back.json" | tee -a "$RESULTS_DIR/run-latency.txt"
