#!/usr/bin/env bash
# bench/all.sh: every row of docs/benchmarks.md in one command.
#
#   cargo build --release -p subagents
#   PI_SUBAGENTS_DIR=/tmp/pi-ref/node_modules/pi-subagents bench/all.sh
#
# Sections (results in $RESULTS_DIR/all/, summary in $RESULTS_DIR/all/summary.txt):
#   floors    setsid /bin/true, subagents --version
#   launch    run -- true, run --wait -- true (idle root before each)
#   memory    RSS and PSS of a run's monitor + runner while its COMMAND sleeps
#             (bench/memory.sh BIN [N]: the same for one build, N times)
#   history   list, list --all, status, run -- true at HISTORIES finished runs
#             (+1 active); peak RSS of list --all; the reference's
#             listAsyncRuns+formatAsyncRunList on the same root, interleaved;
#             at MANY_ACTIVE_AT (10000) finished runs, `list` again with
#             MANY_ACTIVE (50) runs active, interleaved with the reference
#             and the baseline
#   active    run --max-active, list, status with ACTIVES runs active in one
#             session; CAPACITY_SLOTS slots held (cloned slot records)
#   handshake ready -> proceed, both sides in one process (divan)
#   race      128 processes claiming one fan-out slot each from a budget of
#             64 (ours: `budget claim`; the reference: claimRunFanoutBatch)
# Knobs: RUNS (hyperfine runs, 30), WARMUP (3), ROUNDS (interleaved rounds of
# the reference rows, 5), HISTORIES ("1000 10000"; add 100000 for the big
# row), ACTIVES ("10 100"), CAPACITY_SLOTS (1000), RACES (3), REF_RACES (1),
# RACE_LOAD_SECONDS (60: the reference's claimants load their modules before
# the start signal), PI_SUBAGENTS_DIR (reference rows only when set),
# BIG_RUNS (3: timed runs of `list --all` at 100,000 runs), BIG_ROOT (a state
# root already holding 100,000 finished runs, made by make-history.py, used
# instead of cloning one; the reference rows are skipped at that size),
# BASELINE_BIN (another build of subagents: `run --wait` and `list --all`
# interleaved with it), BASELINE_ROUNDS (10).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
RUNS="${RUNS:-30}"
WARMUP="${WARMUP:-3}"
ROUNDS="${ROUNDS:-5}"
HISTORIES="${HISTORIES:-1000 10000}"
ACTIVES="${ACTIVES:-10 100}"
MANY_ACTIVE="${MANY_ACTIVE:-50}"
MANY_ACTIVE_AT="${MANY_ACTIVE_AT:-10000}"
CAPACITY_SLOTS="${CAPACITY_SLOTS:-1000}"
RACES="${RACES:-3}"
REF_RACES="${REF_RACES:-1}"
BIG_RUNS="${BIG_RUNS:-3}"
BIG_ROOT="${BIG_ROOT:-}"
BASELINE_BIN="${BASELINE_BIN:-}"
BASELINE_ROUNDS="${BASELINE_ROUNDS:-10}"
S="$SUBAGENTS_BIN"
OUTDIR="$RESULTS_DIR/all"
mkdir -p "$OUTDIR"
OUT="$OUTDIR/summary.txt"
: >"$OUT"
note() { echo "$*" | tee -a "$OUT"; }
hf() { hyperfine -N --style basic --runs "${HF_RUNS:-$RUNS}" --warmup "${HF_WARMUP:-$WARMUP}" "$@" >/dev/null; }
REF=""
if [ -n "${PI_SUBAGENTS_DIR:-}" ]; then REF="node $BENCH_DIR/reference"; fi

# A state root of its own per section, removed with the others on exit.
new_root() { local r; r="$(mktemp -d "$BENCH_ROOT/root.XXXXXX")"; chmod 700 "$r"; echo "$r"; }
stop_all() {
    local r="$1" id
    for id in $(ls -A "$r/async-subagent-runs/.active-runs" 2>/dev/null); do
        "$S" --root "$r" stop "$id" >/dev/null 2>&1 &
    done
    wait
}

# Runs live under per-section roots inside $BENCH_ROOT: stop them all
# before lib.sh's cleanup removes the directory.
all_cleanup() {
    local rc=$? r
    set +e
    for r in "$BENCH_ROOT"/root.*; do [ -d "$r" ] && stop_all "$r"; done
    (exit "$rc")
    bench_cleanup
}
trap all_cleanup EXIT

note "$(machine_note)"
note "# $(uname -srm); $(hyperfine --version); node $(node --version 2>/dev/null || echo none)"
note "# knobs: RUNS=$RUNS WARMUP=$WARMUP ROUNDS=$ROUNDS HISTORIES='$HISTORIES' ACTIVES='$ACTIVES' CAPACITY_SLOTS=$CAPACITY_SLOTS RACES=$RACES REF_RACES=$REF_RACES BIG_RUNS=$BIG_RUNS BIG_ROOT=$BIG_ROOT BASELINE_BIN=$BASELINE_BIN"

# --- floors and launch -------------------------------------------------------
R="$(new_root)"
wait_quiet "$OUT"
hf --export-json "$OUTDIR/floors.json" "setsid /bin/true" "$S --version"
wait_quiet "$OUT"
hf --prepare "$BENCH_DIR/wait-idle.sh $R" --export-json "$OUTDIR/launch.json" \
    "$S --root $R run -- true" "$S --root $R run --wait -- true"
"$BENCH_DIR/wait-idle.sh" "$R"
note "## floors and launch"
summarize "$OUTDIR/floors.json" "$OUTDIR/launch.json" | tee -a "$OUT"
# Floor of any durable write here: a new file's write + fsync + rename +
# directory fsync, as atomic-file does it (50 in a row, one python process).
note "floor, one durable file write (write, fsync, rename, directory fsync): $(python3 - "$R" <<'PY'
import os, statistics, sys, time
d = sys.argv[1]; ts = []
for i in range(50):
    t0 = time.perf_counter()
    tmp, dst = os.path.join(d, f".f{i}.tmp"), os.path.join(d, f"f{i}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, b"x" * 1024); os.fsync(fd); os.close(fd)
    os.rename(tmp, dst)
    dfd = os.open(d, os.O_RDONLY); os.fsync(dfd); os.close(dfd)
    ts.append((time.perf_counter() - t0) * 1000)
    os.unlink(dst)
print(f"median {statistics.median(ts):.2f} ms (min {min(ts):.2f}, max {max(ts):.2f})")
PY
)"
# Before/after: this binary against BASELINE_BIN (e.g. an older build),
# interleaved, in the same root.
if [ -n "$BASELINE_BIN" ]; then
    wait_quiet "$OUT"
    note "interleaved with the baseline $BASELINE_BIN ($BASELINE_ROUNDS rounds; whole processes):"
    python3 "$BENCH_DIR/interleave.py" "$BASELINE_ROUNDS" \
        "ours run --wait=$S --root $R run --wait -- true" \
        "baseline run --wait=$BASELINE_BIN --root $R run --wait -- true" | tee -a "$OUT"
fi
# A revival: launch plus the file handshake (ready -> ack -> acknowledged ->
# proceed) with the new runner.
src="$("$S" --root "$R" run --wait -- true)"
wait_quiet "$OUT"
if hf --prepare "$BENCH_DIR/wait-idle.sh $R" --export-json "$OUTDIR/resume.json" \
    "$S --root $R resume $src --task again"; then
    summarize "$OUTDIR/resume.json" | tee -a "$OUT"
else
    note "resume row failed"
fi
"$BENCH_DIR/wait-idle.sh" "$R"

# --- memory of one run's processes -------------------------------------------
note "## memory of monitor + runner (MiB): RSS, and PSS (shared pages of the one binary split between them)"
"$BENCH_DIR/memory.sh" "$S" 3 | tee -a "$OUT"

# --- history growth ------------------------------------------------------------
for H in $HISTORIES; do
    HF_RUNS="$RUNS"; HF_WARMUP="$WARMUP"
    if [ "$H" -ge 100000 ] && [ -n "$BIG_ROOT" ]; then
        # A history made earlier by make-history.py (1.3 million files take
        # minutes to clone); runs added here stay in it.
        R="$BIG_ROOT"; own_root=0; seed=""
    else
        R="$(new_root)"; own_root=1
        seed="$("$S" --root "$R" run --wait -- true)"
    fi
    D="$R/async-subagent-runs"
    if [ "$own_root" = 1 ]; then
        python3 "$BENCH_DIR/make-history.py" "$D" "$seed" "$H" >/dev/null
    fi
    active="$("$S" --root "$R" run --timeout 2h -- sleep 3600)"
    finished="$(ls "$D" | grep -vx "$active" | grep -vx "$seed" | sed -n 1p)"
    note "## history $H finished + 1 active"
    wait_quiet "$OUT"
    # At 100,000 runs `list --all` takes seconds: timed BIG_RUNS times by
    # peak.py below (with its peak RSS), not by hyperfine.
    all_rows=("$S --root $R list --all")
    if [ "$H" -ge 100000 ]; then all_rows=(); fi
    hf --export-json "$OUTDIR/history-$H.json" \
        "$S --root $R list" "${all_rows[@]}" \
        "$S --root $R status $finished" "$S --root $R status $active"
    wait_quiet "$OUT"
    hf --prepare "$BENCH_DIR/wait-idle.sh $R 1" --export-json "$OUTDIR/history-$H-run.json" \
        "$S --root $R run -- true"
    "$BENCH_DIR/wait-idle.sh" "$R" 1
    summarize "$OUTDIR/history-$H.json" "$OUTDIR/history-$H-run.json" | tee -a "$OUT"
    for _ in $(seq "$([ "$H" -ge 100000 ] && echo "$BIG_RUNS" || echo 1)"); do
        note "peak of list --all: $(python3 "$BENCH_DIR/peak.py" "$S" --root "$R" list --all)"
    done
    # Floor of any listing that reads one file per run: open and read every
    # status.json, nothing else (one python process).
    note "floor, read every status.json: $(python3 - "$D" <<'PY'
import os, sys, time
t0 = time.perf_counter(); n = 0
for e in os.scandir(sys.argv[1]):
    try:
        with open(os.path.join(e.path, "status.json"), "rb") as f:
            f.read(); n += 1
    except OSError:
        pass
print(f"{n} files in {(time.perf_counter() - t0) * 1000:.0f} ms")
PY
)"
    if [ -n "$REF" ] && [ "$H" -lt 100000 ]; then
        # The reference finds budgets only under its own temp root.
        mkdir -p "$R/ref-tmp/pi-subagents-uid-$(id -u)"
        ln -sfn "$R/run-fanout-budgets" "$R/ref-tmp/pi-subagents-uid-$(id -u)/run-fanout-budgets"
        wait_quiet "$OUT"
        note "interleaved with the reference ($ROUNDS rounds; whole processes):"
        TMPDIR="$R/ref-tmp" python3 "$BENCH_DIR/interleave.py" "$ROUNDS" \
            "ours list=$S --root $R list" \
            "reference list=$REF/list.mjs $D active" \
            "ours list --all=$S --root $R list --all" \
            "ours list --all, no index=rm -f $R/listing-index/finished-runs-v2 && $S --root $R list --all" \
            "reference list --all=$REF/list.mjs $D all" \
            "node floor=node -e 0" \
            ${BASELINE_BIN:+"baseline list --all=$BASELINE_BIN --root $R list --all"} | tee -a "$OUT"
    fi
    if [ "$H" = "$MANY_ACTIVE_AT" ] && [ "$MANY_ACTIVE" -gt 1 ]; then
        # The issue's row: this history with MANY_ACTIVE runs active.
        for _ in $(seq $((MANY_ACTIVE - 1))); do
            "$S" --root "$R" run --timeout 2h -- sleep 3600 >/dev/null
        done
        note "## history $H finished + $MANY_ACTIVE active"
        wait_quiet "$OUT"
        hf --export-json "$OUTDIR/history-$H-active-$MANY_ACTIVE.json" "$S --root $R list"
        summarize "$OUTDIR/history-$H-active-$MANY_ACTIVE.json" | tee -a "$OUT"
        if [ -n "$REF" ] || [ -n "$BASELINE_BIN" ]; then
            wait_quiet "$OUT"
            note "interleaved ($ROUNDS rounds; whole processes):"
            TMPDIR="$R/ref-tmp" python3 "$BENCH_DIR/interleave.py" "$ROUNDS" \
                "ours list=$S --root $R list" \
                ${REF:+"reference list=$REF/list.mjs $D active"} \
                ${BASELINE_BIN:+"baseline list=$BASELINE_BIN --root $R list"} | tee -a "$OUT"
        fi
        stop_all "$R"
    fi
    "$S" --root "$R" stop "$active" >/dev/null 2>&1 || true
    if [ "$own_root" = 1 ]; then rm -rf "$R"; fi
    unset HF_RUNS HF_WARMUP
done

# --- active runs in one session ----------------------------------------------------
for A in $ACTIVES; do
    R="$(new_root)"
    cap=(--session bench --max-active 100000)
    for _ in $(seq "$A"); do "$S" --root "$R" run "${cap[@]}" --timeout 2h -- sleep 3600 >/dev/null; done
    one="$(ls "$R/async-subagent-runs/.active-runs" | sed -n 1p)"
    note "## $A runs active in one session"
    wait_quiet "$OUT"
    hf --prepare "$BENCH_DIR/wait-idle.sh $R $A" --export-json "$OUTDIR/active-$A.json" \
        "$S --root $R run ${cap[*]} -- true" "$S --root $R list" "$S --root $R status $one"
    "$BENCH_DIR/wait-idle.sh" "$R" "$A"
    summarize "$OUTDIR/active-$A.json" | tee -a "$OUT"
    if [ "$A" = "$(echo $ACTIVES | awk '{print $1}')" ] && [ "$CAPACITY_SLOTS" -gt "$A" ]; then
        # Many held slots without as many processes: clone a live run's slot
        # record into slots $A..CAPACITY_SLOTS-1 (each names that live run,
        # so every verdict says "retained").
        python3 - "$R/session-active-async-capacity" "$CAPACITY_SLOTS" <<'PY'
import json, os, sys
root, total = sys.argv[1], int(sys.argv[2])
pool = os.path.join(root, os.listdir(root)[0])
slots = sorted(d for d in os.listdir(pool) if d.startswith("slot-"))
owner = json.load(open(os.path.join(pool, slots[0], "owner.json")))
for n in range(len(slots), total):
    d = os.path.join(pool, f"slot-{n}")
    if os.path.exists(d):
        continue
    os.mkdir(d, 0o700)
    owner["slot"] = n
    fd = os.open(os.path.join(d, "owner.json"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(owner, f, indent=2)
PY
        note "## $CAPACITY_SLOTS capacity slots held in one session"
        wait_quiet "$OUT"
        hf --prepare "$BENCH_DIR/wait-idle.sh $R $A" --export-json "$OUTDIR/slots-$CAPACITY_SLOTS.json" \
            "$S --root $R run ${cap[*]} -- true"
        "$BENCH_DIR/wait-idle.sh" "$R" "$A"
        summarize "$OUTDIR/slots-$CAPACITY_SLOTS.json" | tee -a "$OUT"
    fi
    stop_all "$R"
    rm -rf "$R"
done

# --- handshake ready -> proceed (in process, divan) ------------------------------
note "## handshake ready -> proceed (crates/handshake/benches/ready_to_proceed.rs)"
wait_quiet "$OUT"
(cd "$REPO_DIR" && cargo bench -q -p handshake --bench ready_to_proceed 2>/dev/null) \
    | grep -E 'fastest|ready_to_proceed ' | tee -a "$OUT" \
    || note "handshake bench failed"

# --- 128 processes racing for 64 fan-out slots -------------------------------------
note "## 128 processes, one claim each, budget of 64"
R="$(new_root)"
for i in $(seq "$RACES"); do
    "$S" --root "$R" budget create --root-run-id "race$i" --limit 64 >"$R/race$i.json"
    wait_quiet "$OUT"
    note "ours: $(python3 "$BENCH_DIR/race.py" 128 -- "$S" --root "$R" budget claim --descriptor "$R/race$i.json" --path "p{i}")"
done
# The floor: starting the same 128 processes, each doing nothing (no lock, no file).
for i in $(seq "$RACES"); do
    wait_quiet "$OUT"
    note "floor, 128 x subagents --version: $(python3 "$BENCH_DIR/race.py" 128 -- "$S" --version)"
done
if [ -n "$REF" ]; then
    mkdir -p "$R/ref-tmp"
    for i in $(seq "$REF_RACES"); do
        TMPDIR="$R/ref-tmp" $REF/claim.mjs create "refrace$i" 64 >"$R/refrace$i.json"
        wait_quiet "$OUT"
        note "reference: $(TMPDIR="$R/ref-tmp" RACE_LOAD_SECONDS="${RACE_LOAD_SECONDS:-60}" python3 "$BENCH_DIR/race.py" --go "$R/go$i" 128 -- node "$BENCH_DIR/reference/claim.mjs" claim "$R/refrace$i.json" "p{i}" "$R/go$i")"
    done
fi
note "# loadavg after: $(cut -d' ' -f1-3 /proc/loadavg)"
