#!/usr/bin/env python3
"""interleave.py ROUNDS NAME=COMMAND... : time whole commands round-robin.

Each round runs every command once, so a slow moment of a shared machine
hits every row alike and the ratio between rows is measured, not inferred.
The order within a round is shuffled (seeded, so a rerun repeats it): in a
fixed order a row always follows the same one and pays for what that one
leaves behind (a daemon's writes, a monitor still finishing). One warm-up
round is not counted. Commands run through
`sh -c`, stdout/stderr discarded. Prints a JSON object per command:
{"name", "runs", "median_ms", "min_ms", "max_ms", "ratio_to_first"}.
"""
import json
import random
import statistics
import subprocess
import sys
import time

rounds = int(sys.argv[1])
rows = [a.split("=", 1) for a in sys.argv[2:]]
times = {name: [] for name, _ in rows}
order = random.Random(29)
for r in range(rounds + 1):
    for name, cmd in order.sample(rows, len(rows)):
        t0 = time.perf_counter()
        subprocess.run(["sh", "-c", cmd], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if r:
            times[name].append((time.perf_counter() - t0) * 1000)
first = statistics.median(times[rows[0][0]])
for name, _ in rows:
    t = sorted(times[name])
    med = statistics.median(t)
    print(json.dumps({
        "name": name,
        "runs": len(t),
        "median_ms": round(med, 2),
        "min_ms": round(t[0], 2),
        "max_ms": round(t[-1], 2),
        "ratio_to_first": round(med / first, 2) if first else None,
    }))
