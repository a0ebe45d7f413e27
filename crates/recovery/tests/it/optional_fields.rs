//! Every optional field of the recovery descriptor, one by one: absent,
//! `null`, of the wrong JSON type and empty (`""`, `[]` or `{}`, after the
//! field's own type). The table is the reader's contract (the reference's
//! rules): absent is always accepted and written back absent; `null` and a
//! wrong type are refused naming the field, but for
//! `launchResolvedExtensions`, which the reference does not validate; an
//! empty value is kept where the rule allows it. Each case starts from a
//! descriptor with all 41 fields, so no other field's absence can hide it.

extern crate subagents_recovery as recovery;
use recovery::{validate_descriptor_file, write_descriptor};
use serde_json::{Value, json};

/// The descriptor of `descriptor.rs`'s `maximal()`, as text.
const MAXIMAL: &str = r#"{
        "version": 1,
        "launchContractDigest": "abababababababababababababababababababababababababababababababab",
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
        "absoluteDeadlineAt": 1764460800000,
        "initialTurnBudget": {"maxTurns": 8, "graceTurns": 2},
        "initialToolBudget": {"hard": 12, "soft": 8, "block": ["read"]},
        "maxSubagentDepth": 2,
        "maxOutput": {"bytes": 4096, "lines": 100},
        "share": false,
        "sessionDir": "/tmp/sessions/async-1a2b3c4d",
        "artifactsDir": "/tmp/artifacts",
        "artifactConfig": {"enabled": true, "includeInput": true, "includeOutput": true, "includeJsonl": false, "includeMetadata": true, "includeTranscript": false, "cleanupDays": 7, "dir": "/tmp/artifacts"},
        "capabilityCeiling": {"version": 1, "allowedTools": ["bash", "read"], "denyExtensions": true, "sources": ["config"]}
    }"#;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Verdict {
    /// Refused, the error naming the field and the file.
    Refused,
    /// Read and written back as given.
    Kept,
    /// Read as not set: written back absent.
    Unset,
    /// The field's type has no empty value (a boolean, a number).
    NotApplicable,
}
use Verdict::*;

/// (field, null, wrong type, empty).
const TABLE: &[(&str, Verdict, Verdict, Verdict)] = &[
    ("launchContractDigest", Refused, Refused, Refused),
    ("agentContract", Refused, Refused, Refused),
    ("launchResolvedExtensions", Unset, Kept, Kept),
    ("sessionFile", Refused, Refused, Refused),
    ("model", Refused, Refused, Refused),
    ("fallbackModels", Refused, Refused, Kept),
    ("thinking", Refused, Refused, Refused),
    ("tools", Refused, Refused, Kept),
    ("extensions", Refused, Refused, Kept),
    ("subagentOnlyExtensions", Refused, Refused, Kept),
    ("mcpDirectTools", Refused, Refused, Kept),
    ("systemPrompt", Refused, Refused, Kept),
    ("skills", Refused, Refused, Kept),
    ("skillPath", Refused, Refused, Kept),
    ("agentFilePath", Refused, Refused, Refused),
    ("completionGuard", Refused, Refused, NotApplicable),
    ("memory", Refused, Refused, Refused),
    ("outputPath", Refused, Refused, Refused),
    ("structuredOutputSchema", Refused, Refused, Kept),
    ("acceptance", Refused, Refused, Kept),
    ("controlConfig", Refused, Refused, Refused),
    ("intercomBridge", Refused, Refused, Kept),
    ("absoluteDeadlineAt", Refused, Refused, NotApplicable),
    ("initialTurnBudget", Refused, Refused, Refused),
    ("initialToolBudget", Refused, Refused, Refused),
    ("maxOutput", Refused, Refused, Kept),
    ("sessionDir", Refused, Refused, Refused),
    ("artifactsDir", Refused, Refused, Refused),
    ("artifactConfig", Refused, Refused, Refused),
    ("capabilityCeiling", Refused, Refused, Refused),
];

/// The descriptor with `key` replaced (`None`: removed), read from a real
/// file; `Ok` holds the document the writer stores for it.
fn read_with(key: &str, value: Option<Value>) -> Result<Value, (Option<String>, String)> {
    let mut doc: Value = serde_json::from_str(MAXIMAL).unwrap();
    let object = doc.as_object_mut().unwrap();
    match value {
        Some(v) => object.insert(key.to_owned(), v),
        None => object.remove(key),
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("recovery-descriptor.json");
    std::fs::write(&path, doc.to_string()).unwrap();
    match validate_descriptor_file(&path) {
        Ok(read) => {
            let out = tempfile::tempdir().unwrap();
            let written = write_descriptor(out.path(), &read).unwrap();
            Ok(serde_json::from_slice(&std::fs::read(written).unwrap()).unwrap())
        }
        Err(e) => {
            let message = e.to_string();
            assert!(message.contains(&path.display().to_string()), "{message}");
            Err((e.field().map(str::to_owned), message))
        }
    }
}

fn wrong_type(original: &Value) -> Value {
    if original.is_string() {
        json!(7)
    } else {
        json!("7")
    }
}

fn empty_of(original: &Value) -> Option<Value> {
    match original {
        Value::String(_) => Some(json!("")),
        Value::Array(_) => Some(json!([])),
        Value::Object(_) => Some(json!({})),
        _ => None,
    }
}

fn check(key: &str, case: &str, value: Value, want: Verdict) {
    let got = read_with(key, Some(value.clone()));
    match want {
        Refused => {
            let (field, message) = got.expect_err(&format!("{key} {case} accepted"));
            assert_eq!(field.as_deref(), Some(key), "{key} {case}: {message}");
        }
        Kept => {
            let back = got.unwrap_or_else(|e| panic!("{key} {case}: {e:?}"));
            assert_eq!(back[key], value, "{key} {case}");
        }
        Unset => {
            let back = got.unwrap_or_else(|e| panic!("{key} {case}: {e:?}"));
            assert_eq!(back.get(key), None, "{key} {case}");
        }
        NotApplicable => panic!("{key} {case}: no such case"),
    }
}

#[test]
fn the_table_lists_every_optional_field() {
    let maximal: Value = serde_json::from_str(MAXIMAL).unwrap();
    assert_eq!(
        maximal.as_object().unwrap().len(),
        recovery::ALLOWED_FIELDS.len()
    );
    let required = [
        "version",
        "runFanoutBudget",
        "sourceRunId",
        "agent",
        "cwd",
        "systemPromptMode",
        "inheritProjectContext",
        "inheritSkills",
        "outputMode",
        "maxSubagentDepth",
        "share",
    ];
    for key in recovery::ALLOWED_FIELDS {
        let listed = TABLE.iter().any(|(k, ..)| *k == key);
        assert_eq!(listed, !required.contains(&key), "{key}");
        // A required field is refused when absent; an optional one is not.
        assert_eq!(read_with(key, None).is_ok(), listed, "{key} absent");
    }
}

#[test]
fn an_absent_optional_field_is_accepted_and_stays_absent() {
    for (key, ..) in TABLE {
        let back = read_with(key, None).unwrap_or_else(|e| panic!("{key}: {e:?}"));
        assert_eq!(back.get(*key), None, "{key}");
    }
}

#[test]
fn null_wrong_types_and_empty_values_per_field() {
    let maximal: Value = serde_json::from_str(MAXIMAL).unwrap();
    for (key, null, wrong, empty) in TABLE {
        let original = &maximal[*key];
        check(key, "null", Value::Null, *null);
        check(key, "of the wrong type", wrong_type(original), *wrong);
        match empty_of(original) {
            Some(value) => check(key, "empty", value, *empty),
            None => assert_eq!(*empty, NotApplicable, "{key}"),
        }
    }
}

#[test]
fn an_optional_boolean_keeps_false_apart_from_absent() {
    // `completionGuard` is the descriptor's one optional boolean.
    let off = read_with("completionGuard", Some(json!(false))).unwrap();
    assert_eq!(off["completionGuard"], json!(false));
    let on = read_with("completionGuard", Some(json!(true))).unwrap();
    assert_eq!(on["completionGuard"], json!(true));
    let absent = read_with("completionGuard", None).unwrap();
    assert_eq!(absent.get("completionGuard"), None);
}
