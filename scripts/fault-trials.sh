#!/usr/bin/env bash
# Repeats the process faults of docs/reliability.md ("The fault table") on a
# built binary, each trial in a fresh state root, and prints per fault the
# trials and how many ended clean.
#
#   scripts/fault-trials.sh [TRIALS] [FAULT...]
#
# TRIALS defaults to 20. FAULTs: monitor-early monitor-mid both-early
# both-mid launcher runner command launcher-kill-during-creation
# damaged-status damaged-killed damaged-owner (default: all). The binary is
# $SUBAGENTS_BIN, else target/release/subagents. `launcher` needs strace,
# `launcher-kill-during-creation` perl.
#
# launcher-kill-during-creation SIGKILLs the launcher 0-8 ms after its run
# directory appears (trial i of N waits (i-1)*8/(N-1) ms). Clean means, on
# top of the above once the run settled: no `*.tmp` file in any run
# directory, every budget directory's rootRunId names a run with a status,
# every `not-started` run has its process-terminal.json (after `reconcile`,
# repeated as above: a directory without status is finished once it is
# 10 s old), and after `prune --older-than 0s` nothing of the run is left
# (no run directory, no budget naming it).
#
# The damaged-* faults damage a file of a running run instead of killing a
# process, taking the damage kinds in turn, one per trial:
#   damaged-status  status.json replaced (wrong types, truncated, a
#                   directory, a FIFO, a symlink), then `subagents stop`,
#                   which must exit 0;
#   damaged-killed  the same damage, then SIGKILL monitor and runner and
#                   `reconcile`: the status stays unreadable, so the run
#                   counts as settled by its process-terminal.json alone;
#   damaged-owner   the slot's owner.json replaced (a FIFO, a directory,
#                   20 MB, bad UTF-8, wrong types); a `reconcile` while the
#                   run still runs must keep the slot, and the run then
#                   ends by itself.
#
# A trial is clean when, after `subagents reconcile` (repeated every 100 ms,
# at most 60 s), the run is neither queued nor running, its process-terminal
# proof is `observed` or `not-started`, its active-run marker is gone, the
# session's capacity pool holds no slot, no process carrying
# SUBAGENTS_RUN_ID=<run> is alive (5 s grace for the SIGKILL that follows a
# SIGTERM), and a new `run --max-active 1` in that session is admitted.
# Failed trials leave their root behind and print why.
# Exit status: 0 when every trial was clean, 1 otherwise.
set -uo pipefail

trials="${1:-20}"
case "$trials" in
'' | *[!0-9]*) echo "usage: $0 [TRIALS] [FAULT...]" >&2; exit 2 ;;
esac
shift $(($# > 0 ? 1 : 0))
faults="${*:-monitor-early monitor-mid both-early both-mid launcher runner command launcher-kill-during-creation damaged-status damaged-killed damaged-owner}"
repo="$(cd "$(dirname "$0")/.." && pwd)"
bin="${SUBAGENTS_BIN:-$repo/target/release/subagents}"
[ -x "$bin" ] || { echo "no binary at $bin (cargo build --release -p subagents)" >&2; exit 2; }

# The COMMAND leaves two grandchildren behind in its group, as the issue's
# trials did, so a fault that skips the group's clean-up shows as an orphan.
command=(sh -c 'sleep 30 & sleep 30 & sleep 3; echo done')

field() { "$bin" status "$1" --json 2>/dev/null | jq -r "$2" 2>/dev/null; }

wait_for() { # seconds, condition...
    local until=$((SECONDS + $1)); shift
    until "$@"; do
        [ "$SECONDS" -lt "$until" ] || return 1
        sleep 0.05
    done
}

step_running() { [ "$(field "$1" '.steps[0].status')" = running ]; }

settled() {
    "$bin" reconcile >/dev/null 2>&1
    local state proof
    state="$(field "$1" .state)"
    proof="$(field "$1" .processTerminal.state)"
    if [ "${damaged_status:-}" = 1 ] && ! "$bin" status "$1" >/dev/null 2>&1; then
        # Unreadable by design: the proof file alone says it is over.
        state=unreadable
        proof="$(jq -r .state "$SUBAGENTS_ROOT/async-subagent-runs/$1/process-terminal.json" 2>/dev/null)"
    fi
    case "$state" in queued | running | '') return 1 ;; esac
    case "$proof" in observed | not-started) return 0 ;; *) return 1 ;; esac
}

# Damages status.json of run $1 in the $2-th way of five.
damage_status() {
    local file="$SUBAGENTS_ROOT/async-subagent-runs/$1/status.json" tmp
    tmp="$file.trial-tmp"
    case $(($2 % 5)) in
    0) printf '{"state": 5}' >"$tmp" ;;
    1) printf '{"runId": "x", "sta' >"$tmp" ;;
    2) rm -f "$file" && mkdir "$file" && : >"$file/inside" && return ;;
    3) mkfifo "$tmp" ;;
    4) ln -s /etc/hostname "$tmp" ;;
    esac
    mv -T "$tmp" "$file"
}

# Damages the owner.json of session s's only slot in the $1-th way of five.
damage_owner() {
    local slot owner
    slot="$(ls -d "$SUBAGENTS_ROOT"/session-active-async-capacity/*/slot-* 2>/dev/null | head -1)"
    [ -n "$slot" ] || return 1
    owner="$slot/owner.json"
    rm -f "$owner"
    case $(($1 % 5)) in
    0) mkfifo "$owner" ;;
    1) mkdir "$owner" && : >"$owner/inside" ;;
    2) truncate -s 20000000 "$owner" ;;
    3) printf '{"version": 1, "runId": "\377\376"}' >"$owner" ;;
    4) printf '{"version": "1", "runId": 7}' >"$owner" ;;
    esac
}

alive() { # processes carrying the run id in their environment
    grep -lsz "^SUBAGENTS_RUN_ID=$1\$" /proc/[0-9]*/environ 2>/dev/null | grep -q .
}
none_alive() { ! alive "$1"; }

launch() {
    "$bin" run --session s --max-active 1 -- "${command[@]}" 2>/dev/null
}

runs_dir() { echo "$SUBAGENTS_ROOT/async-subagent-runs"; }

# Starts `run` and SIGKILLs it $1 microseconds after its run directory
# appears; prints "killed" when the kill landed on the live launcher.
kill_during_creation() {
    perl -MTime::HiRes=usleep,time -e '
        my ($delay, $runs, @cmd) = @ARGV;
        my $pid = fork() // die "fork: $!";
        if ($pid == 0) {
            open STDOUT, ">", "/dev/null"; open STDERR, ">", "/dev/null";
            exec @cmd or exit 127;
        }
        my $until = time + 20;
        POLL: while (time < $until) {
            if (opendir(my $d, $runs)) {
                for (readdir $d) { last POLL unless /^\./ }
            }
        }
        usleep($delay) if $delay > 0;
        kill "KILL", $pid;
        waitpid($pid, 0);
        print(($? & 127) == 9 ? "killed\n" : "exited\n");
    ' "$1" "$(runs_dir)" "$bin" run --session s --max-active 1 -- "${command[@]}"
}

# Nothing a launcher killed during creation left is unfinished.
creation_finished() {
    "$bin" reconcile >/dev/null 2>&1
    local runs dir budget root state
    runs="$(runs_dir)"
    for dir in "$runs"/*/; do
        [ -d "$dir" ] || continue
        ls -A "$dir" | grep -q '\.tmp$' && return 1
        [ -e "$dir/status.json" ] || return 1
        state="$(jq -r '.processTerminal.state // empty' "$dir/status.json" 2>/dev/null)"
        case "$state" in not-started) [ -e "$dir/process-terminal.json" ] || return 1 ;; esac
    done
    for budget in "$SUBAGENTS_ROOT"/run-fanout-budgets/*/; do
        [ -d "$budget" ] || continue
        root="$(jq -r .rootRunId "$budget/manifest.json" 2>/dev/null)"
        [ -e "$runs/$root/status.json" ] || return 1
    done
    return 0
}

# Runs one trial of fault $1 in root $SUBAGENTS_ROOT; prints why it is not
# clean, nothing when it is. $2: the trial's number (1-based).
trial() {
    local fault="$1" n="$2" id=""
    case "$fault" in
    launcher-kill-during-creation)
        local delay=$(((${2:-1} - 1) * 8000 / (trials > 1 ? trials - 1 : 1)))
        local landed
        landed="$(kill_during_creation "$delay")"
        [ "$landed" = killed ] || { echo "the kill at ${delay} us did not land: the launcher had $landed"; return; }
        id="$(ls "$(runs_dir)" 2>/dev/null | head -1)"
        [ -n "$id" ] || { echo "no run directory appeared"; return; }
        wait_for 60 creation_finished ||
            { echo "not finished by reconcile: $(cd "$(runs_dir)" && ls -A ./*/ 2>/dev/null | tr '\n' ' ')"; return; }
        ;;
    launcher)
        # SIGKILL at the launcher's first process creation: after it reserved
        # the slot and wrote the queued run, before the monitor exists.
        strace -o /dev/null -f -e inject=clone3,clone,vfork,fork:signal=KILL:when=1 \
            "$bin" run --session s --max-active 1 -- "${command[@]}" >/dev/null 2>&1
        id="$(ls "$SUBAGENTS_ROOT/async-subagent-runs" 2>/dev/null | head -1)"
        [ -n "$id" ] || { echo "killed before the run existed (strace missing?)"; return; }
        ;;
    *)
        id="$(launch)" || { echo "launch failed"; return; }
        local monitor runner
        monitor="$(field "$id" .monitorIdentity.pid)"
        runner="$(field "$id" .runnerIdentity.pid)"
        case "$fault" in
        *-mid | runner | command | damaged-*)
            wait_for 20 step_running "$id" || { echo "step never ran"; return; }
            ;;
        esac
        local victims out
        case "$fault" in
        damaged-status)
            damage_status "$id" "$n"
            out="$("$bin" stop "$id" 2>&1)" || { echo "stop failed: $out"; return; }
            ;;
        damaged-killed)
            damage_status "$id" "$n"
            damaged_status=1
            kill -9 "$monitor" "$runner" 2>/dev/null || { echo "the fault did not land"; return; }
            ;;
        damaged-owner)
            damage_owner "$n" || { echo "no slot to damage"; return; }
            "$bin" reconcile >/dev/null 2>&1
            [ "$("$bin" capacity --session s --json 2>/dev/null | jq -r .used)" = 1 ] ||
                { echo "the slot of a live run was reclaimed"; return; }
            ;;
        esac
        case "$fault" in
        monitor-*) victims="$monitor" ;;
        both-*) victims="$monitor $runner" ;;
        runner) victims="$runner" ;;
        command) victims="$(field "$id" .steps[0].externalProcess.pid)" ;;
        esac
        if [ -n "${victims:-}" ]; then
            # shellcheck disable=SC2086 # one or two pids
            kill -9 $victims 2>/dev/null || { echo "the fault did not land: $victims already gone"; return; }
        fi
        ;;
    esac
    if [ -n "$id" ]; then
        wait_for 60 settled "$id" ||
            { echo "not settled: state $(field "$id" .state), proof $(field "$id" .processTerminal.state)"; return; }
        [ ! -e "$SUBAGENTS_ROOT/async-subagent-runs/.active-runs/$id" ] || { echo "marker kept"; return; }
        wait_for 5 none_alive "$id" || { echo "process of the run alive"; return; }
    fi
    local used
    used="$("$bin" capacity --session s --json 2>/dev/null | jq -r .used)"
    [ "$used" = 0 ] || { echo "capacity used $used"; return; }
    if [ "$fault" = launcher-kill-during-creation ]; then
        "$bin" prune --older-than 0s >/dev/null 2>&1 || { echo "prune failed"; return; }
        [ ! -e "$(runs_dir)/$id" ] || { echo "prune left run $id: $(ls -A "$(runs_dir)/$id" | tr '\n' ' ')"; return; }
        local budget
        for budget in "$SUBAGENTS_ROOT"/run-fanout-budgets/*/; do
            [ -d "$budget" ] || continue
            [ "$(jq -r .rootRunId "$budget/manifest.json" 2>/dev/null)" != "$id" ] ||
                { echo "prune left budget $budget"; return; }
        done
    fi
    local next
    next="$("$bin" run --session s --max-active 1 -- true 2>&1)" || { echo "next run refused: $next"; return; }
}

status=0
printf '%-30s %7s %6s\n' fault trials clean
for fault in $faults; do
    clean=0
    for n in $(seq "$trials"); do
        SUBAGENTS_ROOT="$(mktemp -d /tmp/fault-trial.XXXXXX)"
        export SUBAGENTS_ROOT
        why="$(trial "$fault" "$n")"
        if [ -z "$why" ]; then
            clean=$((clean + 1))
            # Let the admission probe end before removing its root.
            for r in $("$bin" list --json 2>/dev/null | jq -r '.[].id'); do "$bin" wait "$r" >/dev/null 2>&1; done
            rm -rf "$SUBAGENTS_ROOT"
        else
            status=1
            echo "  $fault: $why (root kept: $SUBAGENTS_ROOT)" >&2
        fi
    done
    printf '%-30s %7s %6s\n' "$fault" "$trials" "$clean"
done
exit "$status"
