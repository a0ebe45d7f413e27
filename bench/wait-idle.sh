#!/usr/bin/env bash
# wait-idle.sh ROOT [KEEP]: block until ROOT/async-subagent-runs/.active-runs
# holds at most KEEP markers (default 0: every run's process-terminal proof
# is written), at most 30 s.
# Used as hyperfine --prepare so one measured launch does not overlap the
# previous run's runner/monitor; KEEP leaves deliberately long runs alone.
idx="$1/async-subagent-runs/.active-runs"
keep="${2:-0}"
for _ in $(seq 3000); do
    if [ ! -d "$idx" ] || [ "$(ls -A "$idx" | wc -l)" -le "$keep" ]; then exit 0; fi
    sleep 0.01
done
echo "runs still active after 30s under $1" >&2
exit 1
