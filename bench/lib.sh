# Shared helpers for the bench/*.sh scripts. Source it; do not run it.
# Needs: bash, hyperfine, python3.
set -euo pipefail

BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "$BENCH_DIR/.." && pwd)"
SUBAGENTS_BIN="${SUBAGENTS_BIN:-$REPO_DIR/target/release/subagents}"
SUBAGENTS_BIN="$(realpath -m "$SUBAGENTS_BIN")"
RESULTS_DIR="${RESULTS_DIR:-$BENCH_DIR/results}"
export SUBAGENTS_BIN
# Runs must not inherit an owner session from the caller's environment.
unset SUBAGENTS_SESSION_ID SUBAGENTS_ROOT

[ -x "$SUBAGENTS_BIN" ] || { echo "no executable at SUBAGENTS_BIN=$SUBAGENTS_BIN (cargo build --release -p subagents)" >&2; exit 1; }
command -v hyperfine >/dev/null || { echo "hyperfine not found (apt-get install -y hyperfine)" >&2; exit 1; }
mkdir -p "$RESULTS_DIR"

# Fresh private state root, removed on exit together with every process whose
# environment names it (monitor, runner, and the runs' commands all carry
# SUBAGENTS_ROOT=<root>).
BENCH_ROOT="$(mktemp -d "${TMPDIR:-/tmp}/subagents-bench.XXXXXX")"
export BENCH_ROOT

# PIDs of live processes whose environment contains SUBAGENTS_ROOT=$BENCH_ROOT.
bench_pids() {
    local needle="SUBAGENTS_ROOT=$BENCH_ROOT" env pid
    for env in /proc/[0-9]*/environ; do
        pid="${env#/proc/}"; pid="${pid%/environ}"
        [ "$pid" = "$$" ] && continue
        if { tr '\0' '\n' <"$env"; } 2>/dev/null | grep -qxF "$needle"; then echo "$pid"; fi
    done
}

bench_cleanup() {
    local rc=$? runs id pids
    set +e
    runs="$BENCH_ROOT/async-subagent-runs/.active-runs"
    if [ -d "$runs" ]; then
        for id in $(ls -A "$runs"); do
            "$SUBAGENTS_BIN" --root "$BENCH_ROOT" stop "$id" >/dev/null 2>&1
        done
    fi
    pids="$(bench_pids)"
    if [ -n "$pids" ]; then kill -TERM $pids 2>/dev/null; sleep 0.5; fi
    pids="$(bench_pids)"
    if [ -n "$pids" ]; then echo "killing leftover pids: $pids" >&2; kill -KILL $pids 2>/dev/null; fi
    rm -rf "$BENCH_ROOT"
    exit "$rc"
}
trap bench_cleanup EXIT
trap 'exit 130' INT TERM

# Block until no run under the root is active (index empty), at most 30 s.
wait_idle() {
    local idx="$BENCH_ROOT/async-subagent-runs/.active-runs" i
    for i in $(seq 3000); do
        if [ ! -d "$idx" ] || [ -z "$(ls -A "$idx")" ]; then return 0; fi
        sleep 0.01
    done
    echo "runs still active after 30s" >&2; return 1
}

machine_note() {
    echo "# $(date -u +%FT%TZ) nproc=$(nproc) loadavg=$(cut -d' ' -f1-3 /proc/loadavg) bin=$SUBAGENTS_BIN root=$BENCH_ROOT fs=$(df -T "$BENCH_ROOT" | awk 'NR==2{print $2}')"
}

# summarize FILE.json...: median/mean/min/max/p95 table (milliseconds).
summarize() { python3 "$BENCH_DIR/stats.py" "$@"; }

# Other work on a shared machine skews timings. Before each hyperfine block,
# wait (at most QUIET_MAX_WAIT s, default 180) until the 1-minute load average
# is below QUIET_LOAD (default 1.5), then log the load average to $1.
wait_quiet() {
    local log="$1" limit="${QUIET_LOAD:-1.5}" i
    for i in $(seq "${QUIET_MAX_WAIT:-180}"); do
        python3 -c "import sys;sys.exit(0 if float(open('/proc/loadavg').read().split()[0]) < float(sys.argv[1]) else 1)" "$limit" && break
        sleep 1
    done
    echo "# $(date -u +%T) loadavg before block: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$log"
}
