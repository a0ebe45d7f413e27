#!/usr/bin/env python3
"""make-history.py RUNS_DIR SEED_ID COUNT

Clone the finished run RUNS_DIR/SEED_ID into COUNT-1 more finished runs (so the
directory holds COUNT finished runs). Each clone gets a fresh 10-hex-digit id;
every occurrence of the seed id in its JSON/JSONL files (runId, proof runId,
paths) is rewritten, and startedAt/endedAt/lastUpdate are shifted one second
per clone so `list --all` has a real order to sort. No active-index marker is
created: the clones are finished runs with observed proofs, like the seed.
Per-run state kept outside the runs directory (any entry named <seed>* in a
sibling directory of RUNS_DIR, e.g. run-fanout-budgets/<id>-<uuid>) is cloned
the same way, so every clone is as complete as the seed.
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
state_root = os.path.dirname(os.path.abspath(runs_dir))
siblings = []  # (directory, entry name) of per-run state outside runs_dir
for d in sorted(os.listdir(state_root)):
    full = os.path.join(state_root, d)
    if full == os.path.abspath(runs_dir) or not os.path.isdir(full):
        continue
    siblings += [(full, e) for e in sorted(os.listdir(full)) if e.startswith(seed)]


def clone_tree(src_path, dst_path, new):
    if os.path.isdir(src_path):
        os.mkdir(dst_path, 0o700)
        for e in sorted(os.listdir(src_path)):
            clone_tree(os.path.join(src_path, e), os.path.join(dst_path, e), new)
        return
    with open(src_path, "rb") as f:
        data = f.read()
    if src_path.endswith((".json", ".jsonl")):
        data = data.replace(seed.encode(), new.encode())
    fd = os.open(dst_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    shutil.copystat(src_path, dst_path)

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
        # Same times as the seed's files: a clone is as old as its seed (a
        # descriptor newer than the run's frozen listing facts reads as replaced).
        shutil.copystat(os.path.join(src, name), os.path.join(dst, name))
    for d, e in siblings:
        clone_tree(os.path.join(d, e), os.path.join(d, e.replace(seed, new, 1)), new)
print(f"{count} finished runs in {runs_dir}")
