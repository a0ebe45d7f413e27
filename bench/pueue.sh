#!/usr/bin/env bash
# bench/pueue.sh: `subagents run` side by side with pueue's `add`, interleaved.
#
#   cargo build --release -p subagents
#   nice cargo install --locked pueue --root /tmp/pueue   # a few minutes, once
#   PUEUE_ROOT=/tmp/pueue bench/pueue.sh
#
# Starts `pueued` on a private configuration (its own socket, state and
# runtime directories under a fresh `mktemp -d`), then times, round-robin in
# one `bench/interleave.py` run (so a busy moment hits every row alike):
#
#   pueue add -- true                      vs  subagents run -- true
#   pueue add -- true && pueue wait        vs  subagents run --wait -- true
#   setsid /bin/true                       (two process starts: the floor of a detached start)
#   run -- true, run --wait on a tmpfs root (/dev/shm: every fsync free; the
#                                          difference to ext4 is what the durable writes cost)
#   run -- true, run --wait, fsync free    (ext4 root, every fsync a no-op through the
#                                          LD_PRELOAD shim bench/spawn/nofsync.c, built with cc:
#                                          what the launch costs when durable writes cost nothing)
#   BASELINE_BIN run -- true, run --wait   (with BASELINE_BIN=<an older build>)
#
# and then the first `list --all` after LIST_RUNS (1,000) finished runs
# (cloned by make-history.py; no listing index yet), LIST_REPEAT times on
# fresh copies. Every row goes through `sh -c` (interleave.py), the same
# for both tools. Prints JSON lines and the load average; writes them to
# $RESULTS_DIR/pueue-<HHMM>.txt. Knobs: ROUNDS (40), LIST_RUNS, LIST_REPEAT (3).
set -euo pipefail

BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "$BENCH_DIR/.." && pwd)"
BIN="$(realpath -m "${SUBAGENTS_BIN:-$REPO_DIR/target/release/subagents}")"
PUEUE_ROOT="${PUEUE_ROOT:?PUEUE_ROOT=<the --root of cargo install pueue>}"
ROUNDS="${ROUNDS:-40}"
LIST_RUNS="${LIST_RUNS:-1000}"
LIST_REPEAT="${LIST_REPEAT:-3}"
RESULTS_DIR="${RESULTS_DIR:-$BENCH_DIR/results}"
unset SUBAGENTS_SESSION_ID SUBAGENTS_ROOT
[ -x "$BIN" ] || { echo "no executable at $BIN" >&2; exit 1; }
[ -x "$PUEUE_ROOT/bin/pueue" ] || { echo "no pueue in $PUEUE_ROOT/bin" >&2; exit 1; }
mkdir -p "$RESULTS_DIR"

W="$(mktemp -d "${TMPDIR:-/tmp}/pueue-bench.XXXXXX")"
SHM="$(mktemp -d /dev/shm/pueue-bench.XXXXXX)"
PUEUED_PID=
cleanup() {
    set +e
    [ -n "$PUEUED_PID" ] && kill "$PUEUED_PID" 2>/dev/null && wait "$PUEUED_PID" 2>/dev/null
    for root in "$W"/root "$W"/base-root "$W"/free-root "$SHM"/root; do
        idx="$root/async-subagent-runs/.active-runs"
        [ -d "$idx" ] || continue
        for id in $(ls -A "$idx"); do "$BIN" --root "$root" stop "$id" >/dev/null 2>&1; done
    done
    rm -rf "$W" "$SHM"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$W/pueue/data" "$W/pueue/run"
cat >"$W/pueue/pueue.yml" <<EOF
shared:
  pueue_directory: $W/pueue/data
  runtime_directory: $W/pueue/run
  use_unix_socket: true
  unix_socket_path: $W/pueue/pueue.socket
daemon:
  default_parallel_tasks: 1
EOF
"$PUEUE_ROOT/bin/pueued" -c "$W/pueue/pueue.yml" >"$W/pueue/pueued.log" 2>&1 &
PUEUED_PID=$!
for _ in $(seq 500); do [ -S "$W/pueue/pueue.socket" ] && break; sleep 0.01; done
P="$PUEUE_ROOT/bin/pueue -c $W/pueue/pueue.yml"
$P add -- true >/dev/null && $P wait >/dev/null

out="$RESULTS_DIR/pueue-$(date -u +%H%M).txt"
note() { echo "$*" | tee -a "$out"; }
load() { note "# $(date -u +%T) load average: $(cut -d' ' -f1-3 /proc/loadavg)"; }

note "# bin=$BIN pueue=$($P --version 2>/dev/null | head -1) nproc=$(nproc) fs=$(df -T "$W" | awk 'NR==2{print $2}')"
rows=(
    "pueue add=$P add -- true"
    "run=$BIN --root $W/root run -- true"
    "pueue add+wait=$P add -- true && $P wait"
    "run --wait=$BIN --root $W/root run --wait -- true"
    "setsid true=setsid /bin/true"
    "run, tmpfs root=$BIN --root $SHM/root run -- true"
    "run --wait, tmpfs root=$BIN --root $SHM/root run --wait -- true"
)
if cc -O2 -shared -fPIC -o "$W/nofsync.so" "$BENCH_DIR/spawn/nofsync.c" 2>/dev/null; then
    rows+=(
        "run, fsync free=LD_PRELOAD=$W/nofsync.so $BIN --root $W/free-root run -- true"
        "run --wait, fsync free=LD_PRELOAD=$W/nofsync.so $BIN --root $W/free-root run --wait -- true"
    )
fi
if [ -n "${BASELINE_BIN:-}" ]; then
    rows+=(
        "baseline run=$BASELINE_BIN --root $W/base-root run -- true"
        "baseline run --wait=$BASELINE_BIN --root $W/base-root run --wait -- true"
    )
fi
load
python3 "$BENCH_DIR/interleave.py" "$ROUNDS" "${rows[@]}" | tee -a "$out"
load
# What batching the launcher's durable writes could save at best, on the root's filesystem.
python3 "$BENCH_DIR/fsync-batch.py" "$W" "$ROUNDS" | tee -a "$out"

# The first `list --all` after LIST_RUNS finished runs: a root with one
# finished run cloned to LIST_RUNS, no listing index yet; a fresh copy each time.
seed_root="$W/list-seed"
id="$("$BIN" --root "$seed_root" run --wait -- true | head -1)"
python3 "$BENCH_DIR/make-history.py" "$seed_root/async-subagent-runs" "$id" "$LIST_RUNS" >/dev/null
for i in $(seq "$LIST_REPEAT"); do
    rm -rf "$W/list-root" && cp -a "$seed_root" "$W/list-root" && sync -f "$W/list-root"
    t0=$(date +%s%N)
    "$BIN" --root "$W/list-root" list --all >/dev/null
    t1=$(date +%s%N)
    note "{\"name\": \"first list --all, $LIST_RUNS runs\", \"try\": $i, \"ms\": $(( (t1 - t0) / 10000 ))e-2}"
done
load
echo "written: $out"
