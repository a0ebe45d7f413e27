#!/usr/bin/env python3
"""fsync-batch.py DIR [ROUNDS]: what the launcher's durable writes would cost
if they were batched, on the filesystem of DIR (use the state root's).

Writes the shape of a launch's durable writes before `run` returns (see
docs/reliability.md, "Durable writes of a launch"): 9 small files (a slot's
owner, a budget manifest, a claim, the five run files, the active marker)
in 6 directories, each file 0600, written to a temp name and renamed. Times,
interleaved round by round, three ways of making them durable:

* inline: what the launch does today: each file fsynced before its rename,
  each directory fsynced after its renames, one after the other (15 fsyncs);
* two-phase batch: every temp file written, writeback of all started
  (sync_file_range), then each fsynced; then every rename; then each
  directory fsynced. The best a batch can do that keeps "no renamed file
  is ever empty after a crash": the data is durable before any name;
* none: the same writes and renames without any fsync (what a crash could
  then lose is unbounded).

The difference inline - batch bounds what batching could take off a launch
on this machine now. Prints the medians in ms.
"""
import ctypes
import os
import shutil
import statistics
import sys
import time

libc = ctypes.CDLL(None, use_errno=True)
SYNC_FILE_RANGE_WRITE = 2
base = os.path.join(sys.argv[1], f"fsync-batch-{os.getpid()}")
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 40
DIRS = ["slot", "budget", "budgets", "claims", "run", "runs"]
FILES = [("slot", "owner.json"), ("budget", "manifest.json"), ("claims", "0001.json")] + [
    ("run", name)
    for name in ["run-fanout-budget.json", "launch-contract.json",
                 "recovery-descriptor.json", "recovery-seal.json", "status.json"]
] + [("runs", "active")]
PAYLOAD = b"{" + b"x" * 400 + b"}\n"


def now_ms():
    return time.perf_counter() * 1000


def fresh(round_no):
    root = os.path.join(base, str(round_no))
    for d in DIRS:
        os.makedirs(os.path.join(root, d), mode=0o700)
    return root


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(fd)
    os.close(fd)


def write_temp(root, d, name):
    tmp = os.path.join(root, d, f".{name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, PAYLOAD)
    return fd, tmp, os.path.join(root, d, name)


def inline(root):
    for d, name in FILES:
        fd, tmp, final = write_temp(root, d, name)
        os.fsync(fd)
        os.close(fd)
        os.rename(tmp, final)
        if d in ("slot", "budget", "claims"):
            fsync_dir(os.path.join(root, d))
    for d in ("budgets", "run", "runs"):
        fsync_dir(os.path.join(root, d))


def batch(root):
    opened = [write_temp(root, d, name) for d, name in FILES]
    for fd, _, _ in opened:
        libc.sync_file_range(fd, ctypes.c_longlong(0), ctypes.c_longlong(0), SYNC_FILE_RANGE_WRITE)
    for fd, _, _ in opened:
        os.fsync(fd)
        os.close(fd)
    for _, tmp, final in opened:
        os.rename(tmp, final)
    for d in DIRS:
        fsync_dir(os.path.join(root, d))


def none(root):
    for d, name in FILES:
        fd, tmp, final = write_temp(root, d, name)
        os.close(fd)
        os.rename(tmp, final)


ways = {"inline": inline, "two-phase batch": batch, "none": none}
times = {name: [] for name in ways}
try:
    n = 0
    for _ in range(rounds):
        for name, way in ways.items():
            root = fresh(n)
            n += 1
            t0 = now_ms()
            way(root)
            times[name].append(now_ms() - t0)
    for name, xs in times.items():
        print(f'{{"name": "{len(FILES)} durable writes, {name}", "runs": {len(xs)}, '
              f'"median_ms": {statistics.median(xs):.2f}, "min_ms": {min(xs):.2f}, "max_ms": {max(xs):.2f}}}')
finally:
    shutil.rmtree(base, ignore_errors=True)
