#!/usr/bin/env python3
"""race.py N -- COMMAND... : start N copies of COMMAND at once, time the batch.

Every copy gets its index as {i} in its arguments. Prints one JSON line:
{"n", "seconds", "admitted" (exit 0), "refused" (exit 3), "other"}.
With --go FILE the copies are started first and FILE is created once all are
running, so start-up cost (node module loading) is outside the timing; the
clock starts when FILE is created.
"""
import json
import os
import subprocess
import sys
import time

args = sys.argv[1:]
go = None
if args[0] == "--go":
    go, args = args[1], args[2:]
n = int(args[0])
assert args[1] == "--"
command = args[2:]
procs = []
start = time.perf_counter()
for i in range(n):
    argv = [a.replace("{i}", str(i)) for a in command]
    procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
if go:
    # Each claimant polls for FILE after loading its modules.
    time.sleep(float(os.environ.get("RACE_LOAD_SECONDS", "15")))
    start = time.perf_counter()
    open(go, "w").close()
codes = [p.wait() for p in procs]
seconds = time.perf_counter() - start
print(json.dumps({
    "n": n,
    "seconds": round(seconds, 4),
    "admitted": codes.count(0),
    "refused": codes.count(3),
    "other": len([c for c in codes if c not in (0, 3)]),
}))
