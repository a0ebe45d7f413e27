#!/usr/bin/env python3
"""Print a Markdown table (ms) of hyperfine --export-json results.

p95 is the nearest-rank 95th percentile of the individual run times.
"""
import json
import math
import statistics
import sys

print("| command | runs | median | mean | min | max | p95 | stddev |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for path in sys.argv[1:]:
    with open(path) as f:
        data = json.load(f)
    for r in data["results"]:
        t = sorted(x * 1000 for x in r["times"])
        p95 = t[max(0, math.ceil(0.95 * len(t)) - 1)]
        sd = statistics.stdev(t) if len(t) > 1 else 0.0
        cmd = r["command"].replace("|", "\\|")
        print(f"| `{cmd}` | {len(t)} | {statistics.median(t):.2f} | {statistics.mean(t):.2f} "
              f"| {t[0]:.2f} | {t[-1]:.2f} | {p95:.2f} | {sd:.2f} |")
