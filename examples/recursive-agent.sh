#!/bin/sh
# An "agent" that delegates to two copies of itself, forever.
#
#   subagents run --agent recursive -- examples/recursive-agent.sh
#
# Every copy is a background run started from inside another run, so it
# claims from the root run's fan-out budget (inherited through
# $SUBAGENTS_RUN_FANOUT_BUDGET). The budget (64 by default) ends the
# recursion: the launch that would be the 65th run of the tree is refused
# with exit code 3 and starts nothing.
subagents=${SUBAGENTS_BIN:-subagents}
"$subagents" run --agent recursive -- "$0" >/dev/null 2>&1
"$subagents" run --agent recursive -- "$0" >/dev/null 2>&1
exit 0
