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
#            Clean: `failed` ("before writing a final status"; the outcome
#            died with the runner), without any command.
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
faults="${*:-full ro ro-late}"
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

json() { jq -r "$2" "$root/async-subagent-runs/$1/status.json" 2>/dev/null; }
dead() { ! kill -0 "$1" 2>/dev/null; }
run_alive() {
    grep -lsz "^SUBAGENTS_RUN_ID=$1\$" /proc/[0-9]*/environ 2>/dev/null | grep -q .
}
retrying() { grep -q "retrying while the root is read-only" "$root/async-subagent-runs/$1/runner.stderr.log"; }
started() { [ "$(json "$1" '.steps[0].externalProcess.pid')" != null ] && [ -n "$(json "$1" '.steps[0].externalProcess.pid')" ]; }

# One trial of fault $1 in the mounted tmpfs $2; prints why when unclean.
trial() {
    local fault="$1" mnt="$2" id want logs_want budget gate
    root="$mnt/state"
    gate="$mnt.gate"
    case "$fault" in
    full) budget=300 ;;
    ro) budget=120000 ;;
    ro-late) budget=2000 ;;
    esac
    export SUBAGENTS_WRITE_RETRY_MS="$budget"
    mkfifo "$gate"
    if [ "$fault" = full ]; then
        id="$("$bin" --root "$root" run -- sh -c "echo first-line; read l < '$gate'; head -c 4M /dev/zero; exit 0")" || { echo "run failed"; return 1; }
    else
        id="$("$bin" --root "$root" run -- sh -c "echo before; read l < '$gate'; echo after; exit 0")" || { echo "run failed"; return 1; }
    fi
    wait_for 20 started "$id" || { echo "$id: COMMAND never started"; echo go > "$gate"; return 1; }
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
        mount --bind "$root" "$root" && mount -o remount,ro,bind "$root" || { echo "cannot make the root read-only"; echo go > "$gate"; return 1; }
        echo go > "$gate"
        if [ "$fault" = ro ]; then
            wait_for 60 retrying "$id" || { echo "$id: the runner never retried"; umount "$root"; return 1; }
            want=complete
        else
            wait_for 60 dead "$runner" || { echo "$id: the runner never gave up"; umount "$root"; return 1; }
            want=failed
        fi
        mount -o remount,rw,bind "$root"
        wait_for 60 dead "$monitor" || { echo "$id: the monitor never exited"; umount "$root"; return 1; }
        umount "$root"
    fi
    local state proof
    state="$(json "$id" .state)"
    proof="$(json "$id" .processTerminal.state)"
    [ "$state" = "$want" ] || { echo "$id: state $state, want $want ($(json "$id" .error))"; return 1; }
    [ "$proof" = observed ] || { echo "$id: proof $proof"; return 1; }
    [ ! -e "$root/async-subagent-runs/.active-runs/$id" ] || { echo "$id: marker left"; return 1; }
    ! run_alive "$id" || { echo "$id: a process of the run is alive"; return 1; }
    if [ "$fault" = full ]; then
        logs_want=first-line
        [ "$("$bin" --root "$root" logs "$id" 2>/dev/null | head -n 1)" = "$logs_want" ] || { echo "$id: logs miss the output"; return 1; }
    else
        [ "$("$bin" --root "$root" logs "$id" 2>/dev/null)" = "$(printf 'before\nafter')" ] || { echo "$id: logs miss the output"; return 1; }
    fi
}

status=0
for fault in $faults; do
    case "$fault" in full | ro | ro-late) ;; *) echo "unknown fault $fault" >&2; exit 2 ;; esac
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
        rm -f "$mnt.gate"
        rmdir "$mnt"
    done
    echo "$fault $trials $clean"
done
exit "$status"
