# Shared by the fake agent CLIs: record argv, stdin and environment of each
# call under $FAKE_RECORD_DIR as <name>.<n>.{argv,stdin,env}.
json() {
    local s=$1
    s=${s//\\/\\\\}
    s=${s//\"/\\\"}
    s=${s//$'\n'/\\n}
    s=${s//$'\t'/\\t}
    printf '"%s"' "$s"
}

record() {
    local name=$1
    shift
    local dir=${FAKE_RECORD_DIR:?FAKE_RECORD_DIR is not set}
    local n=0
    while [ -e "$dir/$name.$n.argv" ]; do n=$((n + 1)); done
    base="$dir/$name.$n"
    printf '%s\n' "$@" > "$base.argv"
    cat > "$base.stdin"
    env | grep -E '^(SUBAGENTS_|HOME=|PWD=)' | sort > "$base.env"
    prompt=$(cat "$base.stdin")
    # A definition's `env: {FAKE_FAIL: why}` makes the CLI fail before it
    # starts a session, as a real one does without a login or network.
    if [ -n "${FAKE_FAIL:-}" ]; then
        echo "Error: $FAKE_FAIL" >&2
        exit 1
    fi
}

# A definition's `env: {FAKE_SCENARIO: …}` picks what the CLI prints:
# `error` (the CLI's own failure event), `cut` (killed in the middle of a
# line after an interim message), `long` (a 5,000-line answer), `gate`
# (prints its session and a tool use, then waits for $FAKE_GATE to exist;
# every scenario waits so when $FAKE_GATE is set).
scenario=${FAKE_SCENARIO:-}

# The answer of a `long` run, else $1.
answer_for() {
    if [ "$scenario" = long ]; then
        seq -f "line %g of the long answer" 1 5000
    else
        printf '%s' "$1"
    fi
}

# Waits (in the fake, for its test) until $FAKE_GATE exists.
hold_at_gate() {
    [ -n "${FAKE_GATE:-}" ] || return 0
    while [ ! -e "${FAKE_GATE:?FAKE_GATE is not set}" ]; do sleep 0.05; done
}

# Prints $1 without its newline and dies at once, as a CLI killed mid-write.
cut_here() {
    printf '%s' "$1"
    kill -9 $$
}

new_id() {
    cat /proc/sys/kernel/random/uuid
}
