#!/usr/bin/env bash
# Runs every cargo-fuzz target of fuzz/ (or only the TARGETs named) for
# SECONDS each (default 600) and prints, per target, the executions and the
# crashes found in this run.
#
#   scripts/fuzz-all.sh [SECONDS] [TARGET...]
#
# Needs `cargo install cargo-fuzz`. On a stable toolchain RUSTC_BOOTSTRAP=1
# lets cargo-fuzz pass its nightly-only flags (-Zsanitizer=address). Each
# target's corpus (fuzz/corpus/<target>, not committed) is seeded from the
# golden snapshots in xtask/snapshots the first time. Crash inputs land in
# fuzz/artifacts/<target>/; reproduce one with
#   RUSTC_BOOTSTRAP=1 cargo fuzz run <target> fuzz/artifacts/<target>/<file>
# Exit status: 0 when no target crashed, 1 otherwise.
set -euo pipefail

seconds="${1:-600}"
case "$seconds" in
'' | *[!0-9]*) echo "usage: $0 [SECONDS] [TARGET...]" >&2; exit 2 ;;
esac
shift $(($# > 0 ? 1 : 0))
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo/fuzz"
export RUSTC_BOOTSTRAP=1

# target -> snapshot name patterns used as seeds
seeds() {
    case "$1" in
    status_json) echo "runs__single-* runs__chain-* runs__parallel-* proof__status-after-finalize handshake__pre-proceed-failure-status" ;;
    events_line) echo "events__*" ;;
    proof) echo "proof__observed* proof__pending proof__not-started proof__unknown-*" ;;
    candidate) echo "proof__candidate-* handshake__pre-proceed-failure-candidate" ;;
    recovery_descriptor) echo "runs__recovery-descriptor" ;;
    launch_contract) echo "runs__launch-contract" ;;
    fanout_manifest) echo "fanout__manifest" ;;
    fanout_descriptor) echo "fanout__descriptor fanout__persisted-descriptor" ;;
    fanout_env) echo "fanout__env-encoding" ;;
    handshake_record) echo "handshake__startup-* handshake__ack handshake__proceed" ;;
    capacity_owner) echo "capacity__*" ;;
    lease_owner) echo "runs__lease-owner" ;;
    run_processes) echo "runs__run-processes" ;;
    esac
}

seed_corpus() {
    local target="$1" dir="corpus/$1" pattern file
    if [ -d "$dir" ]; then
        return
    fi
    mkdir -p "$dir"
    for pattern in $(seeds "$target"); do
        for file in "$repo"/xtask/snapshots/$pattern.snap; do
            [ -f "$file" ] || continue
            # The artifact is everything after the second `---` line.
            awk 'n >= 2 { print } /^---$/ { n++ }' "$file" >"$dir/$(basename "$file" .snap)"
        done
    done
    case "$target" in
    proc_stat) printf '%s' '4242 (sh (x) y) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 123456 1000000 200 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0' >"$dir/stat" ;;
    spec) printf '%s' '{"mode":"chain","tasks":[{"agent":"a","command":["sh","-c","true"],"task":"x"},{"parallel":[{"agent":"b","command":["true"]}]}]}' >"$dir/chain" ;;
    recovery_seal) printf '%s' '{"version":1,"algorithm":"hmac-sha256","keyId":"0123456789abcdef","mac":"00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"}' >"$dir/seal" ;;
    esac
}

count_crashes() {
    # slow-unit-* files only note a slow input; they are not failures.
    if [ -d "artifacts/$1" ]; then
        find "artifacts/$1" -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'oom-*' -o -name 'timeout-*' \) | wc -l
    else
        echo 0
    fi
}

nice -n 10 cargo fuzz build >/dev/null
mkdir -p logs
failed=0
printf '%-22s %12s %8s\n' target runs crashes
targets="${*:-$(cargo fuzz list)}"
for target in $targets; do
    seed_corpus "$target"
    before="$(count_crashes "$target")"
    log="logs/$target.log"
    status=0
    nice -n 10 cargo fuzz run "$target" "corpus/$target" -- \
        -max_total_time="$seconds" -print_final_stats=1 >"$log" 2>&1 || status=$?
    runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
    [ -n "$runs" ] || runs="$(sed -n 's/^Done \([0-9]*\) runs.*/\1/p' "$log" | tail -1)"
    crashes=$(($(count_crashes "$target") - before))
    if [ "$status" -ne 0 ] || [ "$crashes" -gt 0 ]; then
        failed=1
        [ "$crashes" -gt 0 ] || crashes="exit $status"
    fi
    printf '%-22s %12s %8s\n' "$target" "${runs:-?}" "$crashes"
done
exit "$failed"
