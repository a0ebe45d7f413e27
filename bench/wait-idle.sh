#!/usr/bin/env bash
# wait-idle.sh ROOT: block until ROOT/async-subagent-runs/.active-runs is empty
# (every run's process-terminal proof is written), at most 30 s.
# Used as hyperfine --prepare so one measured launch does not overlap the
# previous run's runner/monitor.
idx="$1/async-subagent-runs/.active-runs"
for _ in $(seq 3000); do
    if [ ! -d "$idx" ] || [ -z "$(ls -A "$idx")" ]; then exit 0; fi
    sleep 0.01
done
echo "runs still active after 30s under $1" >&2
exit 1
