#!/usr/bin/env bash
# Listing and status latency on a root with 1 active run and HISTORY finished
# runs (default 2000).
#   - `list` (active listing) reads only the .active-runs index;
#   - `list --all` reads every run directory;
#   - `status <id>` for a finished run, the active run, and a unique prefix.
# The history is one real finished run (`run --wait -- true`) cloned by
# make-history.py; the active run is `run --timeout 2h -- sleep 3600`, stopped
# on exit.
# With PI_SUBAGENTS_DIR set (see bench/reference/README.md), the reference
# pi-subagents@0.49.0 listing is timed on the same root with node.
# Env: SUBAGENTS_BIN, HISTORY (2000), RUNS (200), WARMUP (10),
#      REF_RUNS (default RUNS), REF_REPEAT (in-process repeats, default 50),
#      RESULTS_DIR (bench/results), PI_SUBAGENTS_DIR (optional).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
HISTORY="${HISTORY:-2000}"
RUNS="${RUNS:-200}"
WARMUP="${WARMUP:-10}"
REF_RUNS="${REF_RUNS:-$RUNS}"
REF_REPEAT="${REF_REPEAT:-50}"
R="$BENCH_ROOT"
D="$R/async-subagent-runs"
OUT="$RESULTS_DIR/listing.txt"
S="$SUBAGENTS_BIN"

seed="$("$S" --root "$R" run --wait -- true)"
python3 "$BENCH_DIR/make-history.py" "$D" "$seed" "$HISTORY"
active="$("$S" --root "$R" run --timeout 2h -- sleep 3600)"
finished="$(ls "$D" | grep -vx "$active" | grep -vx "$seed" | sed -n 1p)"
prefix="${finished:0:6}"
[ "$(ls "$D" | cut -c1-6 | grep -cx "$prefix")" = 1 ] || prefix="$finished"

{
    machine_note
    echo "# runs: $(ls "$D" | wc -l) dirs, active markers: $(ls -A "$D/.active-runs" | wc -l) ($active)"
    echo "# finished id: $finished  prefix: $prefix"
    echo "# \`list\` first line: $("$S" --root "$R" list | sed -n 1p)"
    echo "# \`list --all\` first line: $("$S" --root "$R" list --all | sed -n 1p)"
} | tee "$OUT"

touch "$R/.before-bench"
STATE=("$D"); [ -d "$R/run-fanout-budgets" ] && STATE+=("$R/run-fanout-budgets")
wait_quiet "$OUT"
hyperfine -N --runs "$RUNS" --warmup "$WARMUP" \
    --export-json "$RESULTS_DIR/list.json" \
    "$S --root $R list" \
    "$S --root $R list --all"
wait_quiet "$OUT"
hyperfine -N --runs "$RUNS" --warmup "$WARMUP" \
    --export-json "$RESULTS_DIR/status.json" \
    "$S --root $R status $finished" \
    "$S --root $R status $active" \
    "$S --root $R status $prefix"
echo "# files modified under the root by list/status: $(find "${STATE[@]}" -type f -newer "$R/.before-bench" | wc -l) ($(find "${STATE[@]}" -type f -newer "$R/.before-bench" | sed "s|$R/||" | sed -n 1,5p | tr '\n' ' '))" | tee -a "$OUT"
files=("$RESULTS_DIR/list.json" "$RESULTS_DIR/status.json")

if [ -n "${PI_SUBAGENTS_DIR:-}" ]; then
    N="node $BENCH_DIR/reference/list.mjs"
    # The reference only accepts run fan-out budget directories under its own
    # temp root, $TMPDIR/pi-subagents-uid-<uid>/run-fanout-budgets; subagents
    # keeps them in <root>/run-fanout-budgets. Point the reference's temp root
    # at this root's budgets (its nested-events dir there stays empty).
    mkdir -p "$R/ref-tmp/pi-subagents-uid-$(id -u)"
    ln -s "$R/run-fanout-budgets" "$R/ref-tmp/pi-subagents-uid-$(id -u)/run-fanout-budgets"
    export TMPDIR="$R/ref-tmp"
    {
        echo "# node $(node --version); reference: $(python3 -c 'import json,sys;p=json.load(open(sys.argv[1]));print(p["name"]+"@"+p["version"])' "$PI_SUBAGENTS_DIR/package.json")"
        echo "# reference active listing first line: $($N "$D" active | sed -n 1p)"
        echo "# reference full listing first line: $($N "$D" all | sed -n 1p)"
    } | tee -a "$OUT"
    # Same process-level measurement as ours: node start + module load (jiti,
    # cache warm after --warmup) + listing + formatting.
    wait_quiet "$OUT"
    hyperfine -N --runs "$REF_RUNS" --warmup "$WARMUP" \
        --export-json "$RESULTS_DIR/reference-list.json" \
        "$N $D active" \
        "$N $D all" \
        "node -e 0"
    files+=("$RESULTS_DIR/reference-list.json")
    # In-process: the listing call alone, REF_REPEAT times after one warm call.
    for mode in active all; do
        wait_quiet "$OUT"
        $N "$D" "$mode" --repeat "$REF_REPEAT" 2>"$RESULTS_DIR/reference-inprocess-$mode.json" >/dev/null
        python3 - "$RESULTS_DIR/reference-inprocess-$mode.json" <<'PY' | tee -a "$OUT"
import json, math, statistics, sys
d = json.load(open(sys.argv[1])); t = sorted(d["times"])
p95 = t[max(0, math.ceil(0.95 * len(t)) - 1)]
print(f"# reference in-process listAsyncRuns+formatAsyncRunList ({d['mode']}, {len(t)} calls, ms): "
      f"median {statistics.median(t):.2f} mean {statistics.mean(t):.2f} min {t[0]:.2f} max {t[-1]:.2f} p95 {p95:.2f}")
PY
    done
    echo "# files modified under the root after the reference ran: $(find "${STATE[@]}" -type f -newer "$R/.before-bench" | wc -l)" | tee -a "$OUT"
fi

echo "# loadavg after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT"
summarize "${files[@]}" | tee -a "$OUT"
