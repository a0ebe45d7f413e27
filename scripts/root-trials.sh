#!/usr/bin/env bash
# Repeats the full and read-only root faults of docs/reliability.md ("Full
# and read-only roots") on a built binary, each trial on a fresh tmpfs as
# the state root, and prints per fault the trials and how many ended clean.
# Needs root (it mounts).
#
#   scripts/root-trials.sh [TRIALS] [FAULT...]
#
# TRIALS defaults to 20. FAULTs (default: all):
#   full     the COMMAND (`echo first-line; read from a fifo; head -c 4M
#            /dev/zero; exit 0`), once its start is recorded and the fifo
#            written, fills a 2 MiB root; retry budget 300 ms; once runner and
#            monitor are gone the tmpfs grows to 8 MiB and `status` is run
#            once. Clean: `complete`.
#   ro       the root turns read-only while the COMMAND (`echo before; read
#            from a fifo; echo after; exit 0`) runs; the fifo is written;
#            once the runner logs that it retries the root is writable
#            again. Clean: `complete`, without any command.
#   ro-late  the same with a retry budget of 2 s: the root is writable again
#            only after the runner gave up, while its monitor retries.
#            Clean: `complete` (the runner handed its outcome to its
#            monitor), without any command.
#   ro-late-chain     ro-late for a chain: step 1 `echo before`, step 2
#            `read from the fifo; echo after; exit 0`. Clean: `complete`,
#            both steps `complete` with exit code 0.
#   ro-late-parallel  ro-late for two parallel tasks: `echo before; read
#            from a fifo; exit 0` and `read from a second fifo; echo after;
#            exit 3`. Clean: `failed`, the tasks `complete` (exit code 0)
#            and `failed` (exit code 3).
# Every clean trial also has: proof `observed`, no active-run marker, no
# process carrying SUBAGENTS_RUN_ID=<run> alive, and `logs` printing the
# COMMAND's output. "Read-only" is a bind mount of the root over itself,
# remounted `ro,bind` (a plain `remount,ro` of the tmpfs is refused while
# the run holds its logs open for writing). The binary is $SUBAGENTS_BIN,
# else target/release/subagents. Failed trials print why.
# Exit status: 0 when every trial was clean, 1 otherwise.
set -uo pipefail

trials="${1:-20}"
case "$trials" in
'' | *[!0-9]*) echo "usage: $0 [TRIALS] [FAULT...]" >&2; exit 2 ;;
esac
shift $(($# > 0 ? 1 : 0))
faults="${*:-full ro ro-late ro-late-chain ro-late-parallel}"
repo="$(cd "$(dirname "$0")/.." && pwd)"
bin="${SUBAGENTS_BIN:-$repo/target/release/subagents}"
[ -x "$bin" ] || { echo "no binary at $bin (cargo build --release -p subagents)" >&2; exit 2; }

wait_for() { # seconds, condition...
    local until=$((SECONDS + $1)); shift
    until "$@"; do
        [ "$SECONDS" -lt "$until" ] || return 1
        sleep 0.05
    done
}

steps() { jq -c '[.steps[] | [.status, .exitCode]]' "$root/async-subagent-runs/$1/status.json" 2>/dev/null; }
json() { jq -r "$2" "$root/async-subagent-runs/$1/status.json" 2>/dev/null; }
dead() { ! kill -0 "$1" 2>/dev/null; }
run_alive() {
    grep -lsz "^SUBAGENTS_RUN_ID=$1\$" /proc/[0-9]*/environ 2>/dev/null | grep -q .
}
retrying() { grep -q "retrying while the root is read-only" "$root/async-subagent-runs/$1/runner.stderr.log"; }
started() { [ "$(json "$1" ".steps[$last].externalProcess.pid")" != null ] && [ -n "$(json "$1" ".steps[$last].externalProcess.pid")" ]; }

# One trial of fault $1 in the mounted tmpfs $2; prints why when unclean.
trial() {
    local fault="$1" mnt="$2" id want want_steps='' logs_want budget gate gates spec
    root="$mnt/state"
    gate="$mnt.gate"
    gates="$gate"
    spec="$mnt.spec.json"
    last=0
    case "$fault" in
    full) budget=300 ;;
    ro) budget=120000 ;;
    ro-late*) budget=2000 ;;
    esac
    export SUBAGENTS_WRITE_RETRY_MS="$budget"
    mkfifo "$gate"
    case "$fault" in
    full)
        id="$("$bin" --root "$root" run -- sh -c "echo first-line; read l < '$gate'; head -c 4M /dev/zero; exit 0")" || { echo "run failed"; return 1; } ;;
    ro-late-chain)
        last=1
        jq -n --arg g "$gate" '{mode: "chain", steps: [{agent: "a", command: ["sh", "-c", "echo before"]},
            {agent: "b", command: ["sh", "-c", "read l < \($g); echo after; exit 0"]}]}' > "$spec"
        id="$("$bin" --root "$root" run --spec "$spec")" || { echo "run failed"; return 1; } ;;
    ro-late-parallel)
        last=1
        gates="$gate $mnt.gate2"
        mkfifo "$mnt.gate2"
        jq -n --arg g "$gate" --arg h "$mnt.gate2" '{mode: "parallel", tasks: [{agent: "a", command: ["sh", "-c", "echo before; read l < \($g); exit 0"]},
            {agent: "b", command: ["sh", "-c", "read l < \($h); echo after; exit 3"]}]}' > "$spec"
        id="$("$bin" --root "$root" run --spec "$spec")" || { echo "run failed"; return 1; } ;;
    *)
        id="$("$bin" --root "$root" run -- sh -c "echo before; read l < '$gate'; echo after; exit 0")" || { echo "run failed"; return 1; } ;;
    esac
    wait_for 20 started "$id" || { echo "$id: COMMAND never started"; for g in $gates; do echo go > "$g"; done; return 1; }
    local runner monitor
    runner="$(json "$id" .runnerIdentity.pid)"
    monitor="$(json "$id" .monitorIdentity.pid)"
    if [ "$fault" = full ]; then
        echo go > "$gate"
        wait_for 60 dead "$runner" && wait_for 60 dead "$monitor" || { echo "$id: runner or monitor still alive"; return 1; }
        mount -o remount,size=8m "$mnt"
        "$bin" --root "$root" status "$id" >/dev/null 2>&1
        want=complete
    else
        mount --bind "$root" "$root" && mount -o remount,ro,bind "$root" || { echo "cannot make the root read-only"; for g in $gates; do echo go > "$g"; done; return 1; }
        for g in $gates; do echo go > "$g"; done
        if [ "$fault" = ro ]; then
            wait_for 60 retrying "$id" || { echo "$id: the runner never retried"; umount "$root"; return 1; }
        else
            wait_for 60 dead "$runner" || { echo "$id: the runner never gave up"; umount "$root"; return 1; }
        fi
        case "$fault" in
        ro-late-chain) want=complete want_steps='[["complete",0],["complete",0]]' ;;
        ro-late-parallel) want=failed want_steps='[["complete",0],["failed",3]]' ;;
        *) want=complete ;;
        esac
        mount -o remount,rw,bind "$root"
        wait_for 60 dead "$monitor" || { echo "$id: the monitor never exited"; umount "$root"; return 1; }
        umount "$root"
    fi
    local state proof
    state="$(json "$id" .state)"
    proof="$(json "$id" .processTerminal.state)"
    [ "$state" = "$want" ] || { echo "$id: state $state, want $want ($(json "$id" .error))"; return 1; }
    [ -z "$want_steps" ] || [ "$(steps "$id")" = "$want_steps" ] || { echo "$id: steps $(steps "$id"), want $want_steps"; return 1; }
    [ "$proof" = observed ] || { echo "$id: proof $proof"; return 1; }
    [ ! -e "$root/async-subagent-runs/.active-runs/$id" ] || { echo "$id: marker left"; return 1; }
    ! run_alive "$id" || { echo "$id: a process of the run is alive"; return 1; }
    if [ "$fault" = full ]; then
        logs_want=first-line
        [ "$("$bin" --root "$root" logs "$id" 2>/dev/null | head -n 1)" = "$logs_want" ] || { echo "$id: logs miss the output"; return 1; }
    elif [ -n "$want_steps" ]; then
        local logs
        logs="$("$bin" --root "$root" logs "$id" 2>/dev/null)"
        grep -qx before <<<"$logs" && grep -qx after <<<"$logs" || { echo "$id: logs miss the output"; return 1; }
    else
        [ "$("$bin" --root "$root" logs "$id" 2>/dev/null)" = "$(printf 'before\nafter')" ] || { echo "$id: logs miss the output"; return 1; }
    fi
}

status=0
for fault in $faults; do
    case "$fault" in full | ro | ro-late | ro-late-chain | ro-late-parallel) ;; *) echo "unknown fault $fault" >&2; exit 2 ;; esac
    clean=0
    for _ in $(seq "$trials"); do
        mnt="$(mktemp -d)"
        mount -t tmpfs -o size=$([ "$fault" = full ] && echo 2m || echo 8m),mode=0700 tmpfs "$mnt" || { echo "cannot mount a tmpfs" >&2; exit 2; }
        if why="$(trial "$fault" "$mnt" 2>&1)"; then
            clean=$((clean + 1))
        else
            echo "  $fault: $why"
            status=1
        fi
        umount -l "$mnt"
        rm -f "$mnt.gate" "$mnt.gate2" "$mnt.spec.json"
        rmdir "$mnt"
    done
    echo "$fault $trials $clean"
done
exit "$status"
