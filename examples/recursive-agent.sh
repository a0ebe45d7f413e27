#!/bin/sh
# An "agent" that delegates to two copies of itself, forever.
#
#   SUBAGENTS_BIN=$PWD/target/release/subagents \
#     subagents run --agent recursive -- examples/recursive-agent.sh
#
# Every copy is a background run started from inside another run, so it
# claims from the root run's fan-out budget (inherited through
# $SUBAGENTS_RUN_FANOUT_BUDGET). The budget (64 by default) ends the
# recursion: the launch that would be the 65th run of the tree is refused
# with exit code 3 and starts nothing.
#
# A shell alias is not seen inside a run: the binary comes from
# $SUBAGENTS_BIN, else from PATH; without either the script says so on
# stderr (see `subagents logs <id>`) and exits 127.
subagents=${SUBAGENTS_BIN:-$(command -v subagents)}
if [ -z "$subagents" ]; then
    echo "recursive-agent: subagents is not on PATH; set SUBAGENTS_BIN=/path/to/subagents" >&2
    exit 127
fi
for copy in 1 2; do
    # Only the run id is hidden; a refusal (exit 3 once the budget is spent)
    # or any other error stays visible in this run's stderr.
    "$subagents" run --agent recursive -- "$0" >/dev/null || echo "recursive-agent: copy $copy not started (exit $?)" >&2
done
exit 0
