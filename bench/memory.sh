#!/usr/bin/env bash
# bench/memory.sh BIN [N]: RSS and PSS (MiB) of the monitor + runner of
# `BIN run -- sleep 30`, measured N times (default 6) while COMMAND sleeps:
# the memory block of bench/all.sh for one binary, to compare builds side by
# side. CHAIN=1 measures during the second step of a chain instead (the
# first, `sh -c 'echo hi'`, has ended: the runner has been awake since).
set -euo pipefail
S="$1"; N="${2:-6}"
R="$(mktemp -d)"
trap 'rm -rf "$R"' EXIT
spec="$R/chain.json"
echo '{"mode":"chain","steps":[{"agent":"first","command":["sh","-c","echo hi"]},{"agent":"second","command":["sleep","30"]}]}' >"$spec"
for _ in $(seq "$N"); do
    if [ "${CHAIN:-0}" = 1 ]; then
        id="$("$S" --root "$R/root" run --spec "$spec")"
    else
        id="$("$S" --root "$R/root" run -- sleep 30)"
    fi
    python3 - "$S" "$R/root" "$id" <<'PY'
import json, subprocess, sys, time
s, root, run = sys.argv[1:]
def status():
    out = subprocess.run([s, "--root", root, "status", run, "--json"], capture_output=True, check=True)
    return json.loads(out.stdout)
st = status()
deadline = time.monotonic() + 30
# A chain: wait until its second step is the current one.
while st.get("mode") == "chain" and st.get("currentStep") != 1 and time.monotonic() < deadline:
    time.sleep(0.1)
    st = status()
def mem(pid):
    f = {}
    for line in open(f"/proc/{pid}/smaps_rollup"):
        parts = line.split()
        if len(parts) >= 2 and parts[1].isdigit():
            f[parts[0].rstrip(":")] = int(parts[1]) / 1024
    return f["Rss"], f["Pss"]
(mr, mp), (rr, rp) = mem(st["monitorIdentity"]["pid"]), mem(st["runnerIdentity"]["pid"])
print(f"RSS monitor {mr:.2f} + runner {rr:.2f} = {mr + rr:.2f}; PSS {mp:.2f} + {rp:.2f} = {mp + rp:.2f}")
PY
    "$S" --root "$R/root" stop "$id" >/dev/null
    "$S" --root "$R/root" wait "$id" >/dev/null 2>&1 || true
done
