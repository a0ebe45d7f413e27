//! The pre-proceed failure record (docs/protocol/handshake.md §6.3) written on real files.

extern crate subagents_handshake as handshake;
use std::fs;

use handshake::{Binding, CANDIDATE_FILE, STATUS_FILE, persist_pre_proceed_failure};
use serde_json::{Value, json};

fn binding() -> Binding {
    Binding {
        run_id: "run1".into(),
        runner_process_instance_id: "rid-1".into(),
    }
}

fn read(path: &std::path::Path) -> Value {
    serde_json::from_str(&fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn merges_into_an_existing_status_and_keeps_its_fields() {
    let tmp = tempfile::tempdir().unwrap();
    let status = tmp.path().join(STATUS_FILE);
    fs::write(
        &status,
        r#"{"mode":"single","state":"running","startedAt":5}"#,
    )
    .unwrap();
    persist_pre_proceed_failure(tmp.path(), &binding(), Some("s1"), "lease conflict").unwrap();
    let mut value = read(&status);
    assert!(value["lastUpdate"].as_u64().unwrap() > 0);
    value.as_object_mut().unwrap().shift_remove("lastUpdate");
    assert_eq!(
        value,
        json!({
            "mode": "single",
            "state": "failed",
            "startedAt": 5,
            "runId": "run1",
            "sessionId": "s1",
            "error": "lease conflict",
            "processTerminal": {
                "version": 1,
                "state": "not-started",
                "runId": "run1",
                "runnerProcessInstanceId": "rid-1",
            },
        })
    );
    // Key order of an existing file is kept; new keys follow in the order of docs/protocol/handshake.md §6.3.
    let keys: Vec<_> = value.as_object().unwrap().keys().cloned().collect();
    assert_eq!(
        keys,
        [
            "mode",
            "state",
            "startedAt",
            "runId",
            "sessionId",
            "error",
            "processTerminal"
        ]
    );
}

#[test]
fn an_unreadable_status_is_replaced_and_session_id_is_optional() {
    let tmp = tempfile::tempdir().unwrap();
    let status = tmp.path().join(STATUS_FILE);
    fs::write(&status, "[1, 2").unwrap();
    persist_pre_proceed_failure(tmp.path(), &binding(), None, "boom").unwrap();
    let value = read(&status);
    let keys: Vec<_> = value.as_object().unwrap().keys().cloned().collect();
    assert_eq!(
        keys,
        ["runId", "state", "lastUpdate", "error", "processTerminal"]
    );
    assert!(!fs::read_to_string(&status).unwrap().ends_with('\n'));
}

#[test]
fn the_candidate_is_written_even_when_the_status_cannot_be() {
    let tmp = tempfile::tempdir().unwrap();
    let status = tmp.path().join(STATUS_FILE);
    fs::create_dir(&status).unwrap();
    fs::write(status.join("occupied"), "").unwrap();
    let err = persist_pre_proceed_failure(tmp.path(), &binding(), None, "boom").unwrap_err();
    assert_eq!(err.path, status);
    assert_eq!(
        read(&tmp.path().join(CANDIDATE_FILE)),
        json!({
            "version": 1,
            "runId": "run1",
            "runnerProcessInstanceId": "rid-1",
            "writers": {},
            "expectedWriters": {"0": 0},
        })
    );
}

#[test]
fn the_injected_time_is_the_last_update() {
    let tmp = tempfile::tempdir().unwrap();
    handshake::persist_pre_proceed_failure_at(tmp.path(), &binding(), None, "boom", 1234).unwrap();
    assert_eq!(read(&tmp.path().join(STATUS_FILE))["lastUpdate"], 1234);
}

#[test]
fn the_error_record_carries_the_given_pid() {
    let tmp = tempfile::tempdir().unwrap();
    handshake::report_startup_failure_as(tmp.path(), &binding(), "lease conflict", 4242).unwrap();
    let record = read(&tmp.path().join(handshake::STARTUP_FILE));
    assert_eq!(
        record,
        json!({"state": "error", "pid": 4242, "error": "lease conflict",
            "runId": "run1", "runnerProcessInstanceId": "rid-1"})
    );
}
