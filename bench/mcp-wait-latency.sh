#!/usr/bin/env bash
# How long after a run's proof is written the MCP `wait` tool answers.
# Starts one `subagents mcp` server on stdio and, RUNS times: calls `run`
# with a command that waits for a gate file, calls `wait` on it, opens the
# gate, and takes the time the `wait` result's line arrived (clock of this
# machine, read right after the line is read) minus the run's
# process-terminal.json mtime (the proof: the first file the finalizer
# writes). The client speaks newline-delimited JSON-RPC itself, so no SDK
# start-up or validation sits between the server's write and the clock.
# Prints the median, p90, min and max in ms; writes them to
# $RESULTS_DIR/mcp-wait-latency.txt.
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
R="$(mktemp -d "${TMPDIR:-/tmp}/subagents-mcp-bench.XXXXXX")"
trap 'rm -rf "$R"' EXIT
{
    echo "mcp-wait-latency: $RUNS runs, $(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg), binary $BIN"
    python3 - "$BIN" "$R" "$RUNS" <<'PY'
import json, os, statistics, subprocess, sys, time
bin_, root, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
server = subprocess.Popen([bin_, "--root", root, "mcp"], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True, bufsize=1)
next_id = 0
def send(method, params=None, notify=False):
    global next_id
    msg = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        msg["params"] = params
    if not notify:
        next_id += 1
        msg["id"] = next_id
    server.stdin.write(json.dumps(msg) + "\n")
    server.stdin.flush()
    return None if notify else next_id
def answer(want):
    # Skips notifications (progress) until the response to `want`.
    while True:
        line = server.stdout.readline()
        at = time.time_ns() / 1e6
        if not line:
            sys.exit("the server closed its output")
        msg = json.loads(line)
        if msg.get("id") == want:
            if "error" in msg:
                sys.exit(f"error: {msg['error']}")
            return msg["result"], at
def call(tool, args):
    return send("tools/call", {"name": tool, "arguments": args})
answer(send("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                           "clientInfo": {"name": "bench", "version": "0"}}))
send("notifications/initialized", notify=True)
gaps = []
for i in range(runs):
    gate = os.path.join(root, f"go-{i}")
    cmd = ["sh", "-c", f"while [ ! -e '{gate}' ]; do sleep 0.005; done"]
    result, _ = answer(call("run", {"command": cmd}))
    run_id = result["structuredContent"]["runId"]
    waiting = call("wait", {"runs": [run_id]})
    open(gate, "w").close()
    result, at = answer(waiting)
    state = result["structuredContent"]["runs"][0]["state"]
    if state != "complete":
        sys.exit(f"run {run_id} ended {state}")
    proof = os.path.join(root, "async-subagent-runs", run_id, "process-terminal.json")
    gaps.append(at - os.stat(proof).st_mtime_ns / 1e6)
server.stdin.close()
server.wait(timeout=30)
gaps.sort()
p90 = gaps[min(len(gaps) - 1, int(len(gaps) * 0.9))]
print(f"process-terminal.json mtime -> wait result read, ms: median {statistics.median(gaps):.2f}, "
      f"p90 {p90:.2f}, min {gaps[0]:.2f}, max {gaps[-1]:.2f} (n={len(gaps)})")
PY
} | tee "$RESULTS_DIR/mcp-wait-latency.txt"
