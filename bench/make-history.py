#!/usr/bin/env python3
"""make-history.py RUNS_DIR SEED_ID COUNT

Clone the finished run RUNS_DIR/SEED_ID into COUNT-1 more finished runs (so the
directory holds COUNT finished runs). Each clone gets a fresh 10-hex-digit id;
every occurrence of the seed id in its JSON/JSONL files (runId, proof runId,
paths) is rewritten, and startedAt/endedAt/lastUpdate are shifted one second
per clone so `list --all` has a real order to sort. No active-index marker is
created: the clones are finished runs with observed proofs, like the seed.
"""
import os
import re
import secrets
import shutil
import sys

runs_dir, seed, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
src = os.path.join(runs_dir, seed)
files = sorted(os.listdir(src))
texts = {}
for name in files:
    with open(os.path.join(src, name), "rb") as f:
        texts[name] = f.read()
ts_re = re.compile(rb'"(startedAt|endedAt|lastUpdate|lastActivityAt)": (\d+)')
made = set(os.listdir(runs_dir))
for i in range(1, count):
    new = secrets.token_hex(5)
    while new in made:
        new = secrets.token_hex(5)
    made.add(new)
    dst = os.path.join(runs_dir, new)
    os.mkdir(dst, 0o700)
    for name in files:
        data = texts[name]
        if name.endswith((".json", ".jsonl")):
            data = data.replace(seed.encode(), new.encode())
            if name == "status.json":
                data = ts_re.sub(lambda m: b'"%s": %d' % (m.group(1), int(m.group(2)) - 1000 * i), data)
        fd = os.open(os.path.join(dst, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
print(f"{count} finished runs in {runs_dir}")
