//! The recovery descriptor reader and writer against real files.

extern crate subagents_recovery as recovery;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use recovery::{
    ALLOWED_FIELDS, DescriptorError, RecoveryDescriptor, RunFanoutBudget, ToolBlock,
    check_fanout_budget, read_descriptor, validate_descriptor_file, write_descriptor,
};
use serde_json::{Value, json};

/// A descriptor using every one of the 41 fields.
fn maximal() -> Value {
    json!({
        "version": 1,
        "launchContractDigest": "ab".repeat(32),
        "runFanoutBudget": {"version": 1, "rootRunId": "1a2b3c4d", "directory": "/tmp/budgets/1a2b3c4d", "limit": 64, "parentPath": "chain[0]"},
        "sourceRunId": "1a2b3c4d",
        "agentContract": {"version": 1},
        "agent": "worker",
        "launchResolvedExtensions": {"version": 1, "source": "launch-resolved", "disableAmbientExtensions": false, "runtime": [], "configured": [], "effective": [], "omitted": {"runtime": 0, "configured": 0, "effective": 0}},
        "sessionFile": "/tmp/s/session.jsonl",
        "cwd": "/work",
        "model": "anthropic/claude-sonnet-4:high",
        "fallbackModels": ["openai/gpt-5"],
        "thinking": "high",
        "tools": ["read", "bash"],
        "extensions": ["ext-a"],
        "subagentOnlyExtensions": [],
        "mcpDirectTools": ["mcp_x"],
        "systemPrompt": "",
        "systemPromptMode": "replace",
        "inheritProjectContext": true,
        "inheritSkills": false,
        "skills": ["review"],
        "skillPath": ["/skills"],
        "agentFilePath": "/work/.pi/agents/worker.md",
        "completionGuard": true,
        "memory": {"scope": "project", "path": "/work/.pi/memory", "note": "kept"},
        "outputPath": "/tmp/out.md",
        "outputMode": "file-only",
        "structuredOutputSchema": {"type": "object"},
        "acceptance": {"level": "checked", "evidence": ["commands-run"], "review": false, "stopRules": []},
        "controlConfig": {"enabled": true, "needsAttentionAfterMs": 60000, "activeNoticeAfterMs": 30000, "failedToolAttemptsBeforeAttention": 3, "activeNoticeAfterTurns": 5, "activeNoticeAfterTokens": 1000, "notifyOn": ["needs_attention", "active_long_running"], "notifyChannels": ["event", "async", "intercom"]},
        "intercomBridge": {"mode": "fork-only", "instructionFile": "", "resultDelivery": true},
        "absoluteDeadlineAt": 1_764_460_800_000_u64,
        "initialTurnBudget": {"maxTurns": 8, "graceTurns": 2},
        "initialToolBudget": {"hard": 12, "soft": 8, "block": ["read"]},
        "maxSubagentDepth": 2,
        "maxOutput": {"bytes": 4096, "lines": 100},
        "share": false,
        "sessionDir": "/tmp/sessions/async-1a2b3c4d",
        "artifactsDir": "/tmp/artifacts",
        "artifactConfig": {"enabled": true, "includeInput": true, "includeOutput": true, "includeJsonl": false, "includeMetadata": true, "includeTranscript": false, "cleanupDays": 7, "dir": "/tmp/artifacts"},
        "capabilityCeiling": {"version": 1, "allowedTools": ["bash", "read"], "denyExtensions": true, "sources": ["config"]}
    })
}

fn minimal() -> Value {
    json!({
        "version": 1,
        "runFanoutBudget": {"version": 1, "rootRunId": "r1", "directory": "/b/r1", "limit": 64},
        "sourceRunId": "r1",
        "agent": "worker",
        "cwd": "/work",
        "systemPromptMode": "append",
        "inheritProjectContext": true,
        "inheritSkills": true,
        "outputMode": "inline",
        "maxSubagentDepth": 2,
        "share": false
    })
}

fn store(dir: &Path, value: &Value) -> std::path::PathBuf {
    let path = dir.join("recovery-descriptor.json");
    fs::write(&path, serde_json::to_vec_pretty(value).unwrap()).unwrap();
    path
}

fn with(mut base: Value, key: &str, value: Value) -> Value {
    base.as_object_mut().unwrap().insert(key.into(), value);
    base
}

/// Reads `value` from a real file and returns the error's field and message.
fn refusal(value: &Value) -> (String, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = store(dir.path(), value);
    let err = validate_descriptor_file(&path).unwrap_err();
    let field = err.field().expect("an Invalid error").to_owned();
    let message = err.to_string();
    assert!(message.contains(&path.display().to_string()), "{message}");
    (field, message)
}

fn detail(value: &Value) -> (String, String) {
    let (field, message) = refusal(value);
    let (_, detail) = message.split_once("': ").expect("common prefix");
    (field, detail.to_owned())
}

#[test]
fn maximal_descriptor_is_accepted_and_round_trips_byte_for_byte() {
    assert_eq!(maximal().as_object().unwrap().len(), ALLOWED_FIELDS.len());
    let dir = tempfile::tempdir().unwrap();
    let path = store(dir.path(), &maximal());
    let read = validate_descriptor_file(&path).unwrap();
    assert_eq!(read.agent, "worker");
    assert_eq!(read.initial_turn_budget.unwrap().grace_turns, 2);

    let out = tempfile::tempdir().unwrap();
    let written = write_descriptor(out.path(), &read).unwrap();
    let bytes = fs::read(&written).unwrap();
    assert_eq!(
        serde_json::from_slice::<Value>(&bytes).unwrap(),
        maximal(),
        "written JSON must equal the maximal input"
    );
    assert!(!bytes.ends_with(b"\n"));
    assert!(String::from_utf8_lossy(&bytes).starts_with("{\n  \"version\": 1,\n"));
    assert_eq!(validate_descriptor_file(&written).unwrap(), read);
    assert_eq!(
        fs::metadata(&written).unwrap().permissions().mode() & 0o777,
        0o600
    );
}

#[test]
fn minimal_descriptor_reads_and_missing_file_is_none() {
    let dir = tempfile::tempdir().unwrap();
    assert!(read_descriptor(dir.path()).unwrap().is_none());
    store(
        dir.path(),
        &with(minimal(), "launchContractDigest", json!("d")),
    );
    let read = read_descriptor(dir.path()).unwrap().unwrap();
    assert_eq!(read.launch_contract_digest.as_deref(), Some("d"));
}

#[test]
fn unknown_field_is_refused_by_name() {
    let (field, detail) = detail(&with(minimal(), "token", json!("x")));
    assert_eq!(
        (field.as_str(), detail.as_str()),
        ("token", "unknown field 'token'.")
    );
}

#[test]
fn wrong_types_are_refused_naming_the_field() {
    let cases = [
        (
            "launchContractDigest",
            json!({}),
            "launchContractDigest must be a non-empty string.",
        ),
        ("agent", json!("  "), "agent must be a non-empty string."),
        ("version", json!("1"), "version must be 1."),
        ("share", json!("false"), "share must be a boolean."),
        (
            "maxSubagentDepth",
            json!(1.5),
            "maxSubagentDepth must be a non-negative integer.",
        ),
        (
            "tools",
            json!(["read", ""]),
            "tools must contain non-empty strings.",
        ),
        (
            "systemPrompt",
            json!(null),
            "systemPrompt must be a string.",
        ),
        (
            "absoluteDeadlineAt",
            json!("2026"),
            "absoluteDeadlineAt must be a positive timestamp.",
        ),
        (
            "structuredOutputSchema",
            json!([]),
            "structuredOutputSchema must be an object.",
        ),
        (
            "completionGuard",
            json!(1),
            "completionGuard must be a boolean.",
        ),
    ];
    for (key, value, expected) in cases {
        let (field, got) = detail(&with(minimal(), key, value));
        assert_eq!((field.as_str(), got.as_str()), (key, expected));
    }
}

#[test]
fn bad_enums_are_refused() {
    let cases = [
        (
            "systemPromptMode",
            json!("prepend"),
            "systemPromptMode is invalid.",
        ),
        ("outputMode", json!("stream"), "outputMode is invalid."),
        (
            "intercomBridge",
            json!({"mode": "sometimes"}),
            "intercomBridge.mode is invalid.",
        ),
        (
            "memory",
            json!({"scope": "global", "path": "/m"}),
            "memory is invalid.",
        ),
        (
            "controlConfig",
            json!({"enabled": true, "needsAttentionAfterMs": 1, "activeNoticeAfterMs": 1, "failedToolAttemptsBeforeAttention": 1, "notifyOn": ["always"], "notifyChannels": []}),
            "controlConfig.notifyOn is invalid.",
        ),
    ];
    for (key, value, expected) in cases {
        let (field, got) = detail(&with(minimal(), key, value));
        assert_eq!((field.as_str(), got.as_str()), (key, expected));
    }
}

#[test]
fn bad_nested_objects_are_refused() {
    let cases = [
        (
            "agentContract",
            json!({"version": 1, "x": 1}),
            "agentContract must be { version: 1 }.",
        ),
        (
            "intercomBridge",
            json!({"token": "x"}),
            "intercomBridge.token is not supported.",
        ),
        (
            "intercomBridge",
            json!({"resultDelivery": "yes"}),
            "intercomBridge.resultDelivery must be a boolean.",
        ),
        (
            "maxOutput",
            json!({"bytes": 0}),
            "maxOutput.bytes must be a positive integer.",
        ),
        (
            "artifactConfig",
            json!({"enabled": true, "includeInput": true, "includeOutput": true, "includeJsonl": true, "includeMetadata": true, "cleanupDays": -1}),
            "artifactConfig.cleanupDays must be a non-negative integer.",
        ),
        (
            "artifactConfig",
            json!({"enabled": true}),
            "artifactConfig.includeInput must be a boolean.",
        ),
        (
            "controlConfig",
            json!({"enabled": true}),
            "controlConfig.needsAttentionAfterMs must be a positive integer.",
        ),
        (
            "initialTurnBudget",
            json!({"maxTurns": 8, "unrelated": 1}),
            "recoveryDescriptor.initialTurnBudget.unrelated is not supported.",
        ),
        (
            "initialTurnBudget",
            json!({"maxTurns": 0}),
            "recoveryDescriptor.initialTurnBudget.maxTurns must be an integer >= 1.",
        ),
        (
            "initialToolBudget",
            json!(3),
            "recoveryDescriptor.initialToolBudget must be an object with hard and optional soft/block.",
        ),
        (
            "initialToolBudget",
            json!({"hard": 3, "soft": 4}),
            "recoveryDescriptor.initialToolBudget.soft must be <= recoveryDescriptor.initialToolBudget.hard.",
        ),
        (
            "initialToolBudget",
            json!({"hard": 3, "block": []}),
            "recoveryDescriptor.initialToolBudget.block must contain at least one tool name.",
        ),
        (
            "runFanoutBudget",
            json!(null),
            "Run fan-out budget descriptor is missing or invalid.",
        ),
        (
            "runFanoutBudget",
            json!({"version": 1, "rootRunId": "r", "directory": "/d", "limit": 0}),
            "Run fan-out budget descriptor is invalid.",
        ),
    ];
    for (key, value, expected) in cases {
        let (field, got) = detail(&with(minimal(), key, value));
        assert_eq!((field.as_str(), got.as_str()), (key, expected), "{key}");
    }
}

#[test]
fn capability_ceiling_errors_name_the_file() {
    let (field, message) = refusal(&with(
        minimal(),
        "capabilityCeiling",
        json!({"version": 1, "allowedTools": ["read"]}),
    ));
    assert_eq!(field, "capabilityCeiling");
    assert!(
        message.ends_with("capabilityCeiling sources; expected an array of strings."),
        "{message}"
    );
}

#[test]
fn first_failure_follows_the_reference_order() {
    // Both are wrong: the required-string rule (step 3) wins over version (step 4).
    let value = with(with(minimal(), "version", json!(2)), "cwd", json!(""));
    assert_eq!(detail(&value).1, "cwd must be a non-empty string.");
    let (field, message) = refusal(&json!([1]));
    assert_eq!(field, "");
    assert!(message.ends_with("': expected an object."), "{message}");
}

#[test]
fn normalisations_apply_on_read() {
    let value = with(
        with(
            minimal(),
            "initialTurnBudget",
            json!({"maxTurns": 8.0, "graceTurns": 2, "turnCount": 7, "outcome": "x"}),
        ),
        "acceptance",
        json!({"level": "attested", "explicit": true, "inferredReason": ["x"], "criteria": ["c"]}),
    );
    let dir = tempfile::tempdir().unwrap();
    let read = validate_descriptor_file(&store(dir.path(), &value)).unwrap();
    let turn = read.initial_turn_budget.unwrap();
    assert_eq!((turn.max_turns, turn.grace_turns), (8, 2));
    assert_eq!(
        read.acceptance,
        Some(json!({"level": "attested", "criteria": ["c"]}))
    );

    let dropped = with(
        minimal(),
        "acceptance",
        json!({"level": "reviewed", "explicit": false}),
    );
    let read = validate_descriptor_file(&store(dir.path(), &dropped)).unwrap();
    assert_eq!(read.acceptance, None);
    let refused = with(
        minimal(),
        "acceptance",
        json!({"level": "reviewed", "explicit": true}),
    );
    let (field, got) = detail(&refused);
    assert_eq!(field, "acceptance");
    assert!(got.contains("acceptance.review.required"), "{got}");
}

#[test]
fn syntax_errors_use_the_parse_message() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("recovery-descriptor.json");
    fs::write(&path, "{ nope").unwrap();
    let err = validate_descriptor_file(&path).unwrap_err();
    assert!(matches!(err, DescriptorError::Syntax { .. }));
    assert!(err.to_string().starts_with(&format!(
        "Failed to parse async recovery descriptor '{}': ",
        path.display()
    )));
}

#[test]
fn writer_refuses_what_the_reader_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let mut descriptor: RecoveryDescriptor = serde_json::from_value(minimal()).unwrap();
    descriptor.agent = " ".into();
    let err = write_descriptor(dir.path(), &descriptor).unwrap_err();
    assert_eq!(err.field(), Some("agent"));
    assert!(!dir.path().join("recovery-descriptor.json").exists());
}

#[test]
fn live_fanout_check_replaces_or_refuses_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let path = store(dir.path(), &minimal());
    let mut descriptor = validate_descriptor_file(&path).unwrap();
    let real = |b: &RunFanoutBudget| {
        Ok(RunFanoutBudget {
            directory: format!("/real{}", b.directory),
            ..b.clone()
        })
    };
    check_fanout_budget(&mut descriptor, &path, &real).unwrap();
    assert_eq!(descriptor.run_fanout_budget.directory, "/real/b/r1");
    let gone = |_: &RunFanoutBudget| {
        Err("Run fan-out budget descriptor does not match its manifest.".to_owned())
    };
    let err = check_fanout_budget(&mut descriptor, &path, &gone).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "Invalid async recovery descriptor '{}': Run fan-out budget descriptor does not match its manifest.",
            path.display()
        )
    );
}

#[test]
fn null_grace_turns_reads_as_the_default_one() {
    let dir = tempfile::tempdir().unwrap();
    for (grace, expected) in [(json!(null), 1), (json!(3), 3)] {
        let budget = json!({"maxTurns": 4, "graceTurns": grace});
        store(dir.path(), &with(minimal(), "initialTurnBudget", budget));
        let read = read_descriptor(dir.path()).unwrap().unwrap();
        let turns = read.initial_turn_budget.unwrap();
        assert_eq!((turns.max_turns, turns.grace_turns), (4, expected));
    }
    let budget = json!({"maxTurns": 4, "graceTurns": "1"});
    store(dir.path(), &with(minimal(), "initialTurnBudget", budget));
    let err = read_descriptor(dir.path()).unwrap_err();
    assert!(
        err.to_string()
            .contains("graceTurns must be an integer >= 0"),
        "{err}"
    );
}

#[test]
fn the_edges_of_each_numeric_and_list_rule() {
    let refused = [
        (
            "maxSubagentDepth",
            json!(-1),
            "maxSubagentDepth must be a non-negative integer.",
        ),
        (
            "absoluteDeadlineAt",
            json!(0),
            "absoluteDeadlineAt must be a positive timestamp.",
        ),
        (
            "absoluteDeadlineAt",
            json!(-1.5),
            "absoluteDeadlineAt must be a positive timestamp.",
        ),
        (
            "runFanoutBudget",
            json!({"version": 2, "rootRunId": "r1", "directory": "/b/r1", "limit": 64}),
            "Run fan-out budget descriptor is invalid.",
        ),
        (
            "runFanoutBudget",
            json!({"version": 1, "rootRunId": "r1", "directory": "/b/r1", "limit": 64, "parentPath": 5}),
            "Run fan-out budget descriptor is invalid.",
        ),
        (
            "initialToolBudget",
            json!({"hard": 3, "block": "read"}),
            "recoveryDescriptor.initialToolBudget.block must be \"*\" or an array of tool names.",
        ),
        (
            "initialToolBudget",
            json!({"hard": 3, "block": ["read", " "]}),
            "recoveryDescriptor.initialToolBudget.block must contain non-empty tool names.",
        ),
        ("maxOutput", json!(3), "maxOutput must be an object."),
    ];
    for (key, value, expected) in refused {
        let (field, got) = detail(&with(minimal(), key, value));
        assert_eq!((field.as_str(), got.as_str()), (key, expected), "{key}");
    }

    let accepted = [
        ("maxSubagentDepth", json!(0)),
        ("absoluteDeadlineAt", json!(0.5)),
        (
            "initialToolBudget",
            json!({"hard": 3, "soft": 3, "block": "*"}),
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (key, value) in accepted {
        let path = store(dir.path(), &with(minimal(), key, value.clone()));
        let read = validate_descriptor_file(&path)
            .unwrap_or_else(|e| panic!("{key} = {value} must be accepted: {e}"));
        let stored = serde_json::to_value(&read).unwrap();
        assert_eq!(stored[key], value, "{key} is kept as read");
    }
}

#[test]
fn an_unreadable_descriptor_is_an_error_not_absent() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("recovery-descriptor.json");
    fs::create_dir(&path).unwrap();
    let err = read_descriptor(dir.path()).unwrap_err();
    assert!(matches!(err, DescriptorError::Read { .. }), "{err}");
    assert!(
        err.to_string().starts_with(&format!(
            "Failed to parse async recovery descriptor '{}': ",
            path.display()
        )),
        "{err}"
    );
}

#[test]
fn integral_floats_are_read_and_stored_as_integers() {
    let value = [
        ("maxSubagentDepth", json!(2.0)),
        ("initialToolBudget", json!({"hard": 3.0, "soft": 2.0})),
        ("maxOutput", json!({"bytes": 10.0, "lines": 5.0})),
        (
            "artifactConfig",
            json!({"enabled": true, "includeInput": true, "includeOutput": true, "includeJsonl": true, "includeMetadata": true, "cleanupDays": 7.0}),
        ),
        (
            "controlConfig",
            json!({"enabled": true, "needsAttentionAfterMs": 1000.0, "activeNoticeAfterMs": 2000.0, "failedToolAttemptsBeforeAttention": 3.0, "activeNoticeAfterTurns": 4.0, "notifyOn": [], "notifyChannels": []}),
        ),
    ]
    .into_iter()
    .fold(minimal(), |base, (key, value)| with(base, key, value));
    let dir = tempfile::tempdir().unwrap();
    let read = validate_descriptor_file(&store(dir.path(), &value)).unwrap();
    let out = tempfile::tempdir().unwrap();
    let written = fs::read(write_descriptor(out.path(), &read).unwrap()).unwrap();
    let stored: Value = serde_json::from_slice(&written).unwrap();
    for (key, inner) in [
        ("maxSubagentDepth", None),
        ("initialToolBudget", Some("hard")),
        ("initialToolBudget", Some("soft")),
        ("maxOutput", Some("bytes")),
        ("maxOutput", Some("lines")),
        ("artifactConfig", Some("cleanupDays")),
        ("controlConfig", Some("needsAttentionAfterMs")),
        ("controlConfig", Some("activeNoticeAfterTurns")),
    ] {
        let number = inner.map_or(&stored[key], |inner| &stored[key][inner]);
        assert!(number.is_u64(), "{key}.{inner:?} = {number}");
    }
}

#[test]
fn only_the_star_string_blocks_every_tool() {
    assert_eq!(
        serde_json::from_value::<ToolBlock>(json!("*")).unwrap(),
        ToolBlock::All
    );
    assert_eq!(
        serde_json::from_value::<ToolBlock>(json!(["read"])).unwrap(),
        ToolBlock::Tools(vec!["read".into()])
    );
    assert!(serde_json::from_value::<ToolBlock>(json!("read")).is_err());
}
