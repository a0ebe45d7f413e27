#!/usr/bin/env python3
"""fsync-segments.py ROUNDS ROOT NAME=BIN... : wall time of the durable-write
segments of one `BIN --root ROOT run --wait -- true`, under
`strace -f -ttt -T`, rounds interleaved (a busy moment hits every build
alike); prints the medians in ms.

* launcher: from creating the temp file of `run-fanout-budget.json` to the
  end of the directory fsync after the queued `status.json`'s rename: the
  five run files written, fsynced and renamed, and the run directory synced.
* runner: from opening the status lock for the final `status.json` (or
  creating the candidate's temp file, when that comes first) to the end of
  the directory fsync after `process-terminal-candidate.json`'s rename.

strace slows every system call, so the figures are larger than untraced
ones; compare rows, not absolute values. ROOT should already hold a
`.recovery-key` (run one `run -- true` in it first).
"""
import os
import re
import statistics
import subprocess
import sys

rounds = int(sys.argv[1])
root = sys.argv[2]
rows = [a.split("=", 1) for a in sys.argv[3:]]
times = {name: {"launcher": [], "runner": []} for name, _ in rows}
log = f"/tmp/fsync-segments-{os.getpid()}.log"
line = re.compile(r"^(\d+)\s+(\d+\.\d+) (.*?)(?: <(\d+\.\d+)>)?$")


def parse(path):
    calls = []
    with open(path) as f:
        for text in f:
            m = line.match(text.rstrip("\n"))
            if m:
                calls.append((m[1], float(m[2]), m[3], float(m[4] or 0)))
    return calls


def renamed_onto(call, name):
    return call[2].startswith("rename(") and call[2].split('"')[-2].endswith("/" + name)


def ends_at_next_fsync(calls, i):
    end = next(c for c in calls[i:] if c[2].startswith("fsync("))
    return end[1] + end[3]


def launcher_segment(calls):
    mine = [c for c in calls if c[0] == calls[0][0]]
    start = next(c[1] for c in mine if "openat(" in c[2] and "/.run-fanout-budget.json." in c[2])
    i = next(i for i, c in enumerate(mine) if renamed_onto(c, "status.json"))
    return (ends_at_next_fsync(mine, i) - start) * 1000


def runner_segment(calls):
    pid = next(c[0] for c in calls if "execve(" in c[2] and '"__runner"' in c[2])
    mine = [c for c in calls if c[0] == pid]
    j = next(i for i, c in enumerate(mine) if renamed_onto(c, "process-terminal-candidate.json"))
    created = [(i, c) for i, c in enumerate(mine[:j]) if "openat(" in c[2] and "O_EXCL" in c[2]]
    status = max(i for i, c in created if "/.status.json." in c[2])
    # The final status's read-modify-write starts with taking its lock.
    locked = max(i for i, c in enumerate(mine[:status]) if "openat(" in c[2] and "/.status.lock" in c[2])
    candidate = [i for i, c in created if "/.process-terminal-candidate.json." in c[2]]
    start = mine[min([locked] + candidate)][1]
    return (ends_at_next_fsync(mine, j) - start) * 1000


for r in range(rounds + 1):
    for name, binary in rows:
        subprocess.run(
            ["strace", "-f", "-qq", "-ttt", "-T", "-e",
             "trace=fsync,sync_file_range,rename,openat,execve", "-o", log,
             binary, "--root", root, "run", "--wait", "--", "true"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        calls = parse(log)
        if r:
            times[name]["launcher"].append(launcher_segment(calls))
            times[name]["runner"].append(runner_segment(calls))
os.remove(log)
for name, _ in rows:
    t = times[name]
    print(f"{name}: launcher run files {statistics.median(t['launcher']):.2f} ms, "
          f"runner final writes {statistics.median(t['runner']):.2f} ms (medians of {rounds})")
