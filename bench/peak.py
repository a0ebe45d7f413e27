#!/usr/bin/env python3
"""peak.py COMMAND... : run COMMAND (output discarded), print its peak RSS.

Prints {"seconds", "peak_rss_mib", "exit"} as one JSON line; the peak is the
kernel's ru_maxrss of the child (its largest resident set).
"""
import json
import resource
import subprocess
import sys
import time

t0 = time.perf_counter()
code = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
seconds = time.perf_counter() - t0
peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(json.dumps({"seconds": round(seconds, 3), "peak_rss_mib": round(peak_kib / 1024, 1), "exit": code}))
