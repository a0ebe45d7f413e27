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

new_id() {
    cat /proc/sys/kernel/random/uuid
}
