//! `status.json` reading and writing: every known key lands in its own
//! field (not among the unknown keys kept verbatim), the errors name the
//! file and the field, and the two update paths write what they return.

use std::path::Path;

use serde_json::{Value, json};
use status::model::{
    RunState, RunStatus, parse_status, read_status, update_status_unsynced_dir, write_status,
};

fn parse(value: &Value) -> status::Result<RunStatus> {
    parse_status(Path::new("/r/status.json"), &value.to_string())
}

fn identity(pid: u32) -> Value {
    json!({"pid": pid, "startTime": 7, "bootId": "b"})
}

#[test]
fn every_known_key_is_read_into_its_own_field() {
    let step = json!({
        "agent": "a", "status": "failed", "description": "[prompt redacted]",
        "startedAt": 1, "endedAt": 2, "durationMs": 1, "exitCode": 3, "error": "e",
        "timedOut": true, "stopped": false,
        "externalProcess": {"pid": 9, "startedAt": 1, "stdoutPath": "o", "stderrPath": "e"},
        "processTerminal": {"state": "pending"}
    });
    let text = json!({
        "lifecycleArtifactVersion": 3, "runId": "r", "sessionId": "s", "mode": "chain",
        "state": "failed", "displayDismissedAt": 4, "error": "boom", "lastActivityAt": 5,
        "startedAt": 6, "endedAt": 7, "lastUpdate": 8, "timeoutMs": 9, "deadlineAt": 10,
        "timedOut": true, "stopped": true, "pid": 11, "cwd": "/w", "currentStep": 0,
        "chainStepCount": 1, "processTerminal": {"state": "pending"},
        "runFanoutBudget": {"used": 1, "limit": 2, "remaining": 1}, "steps": [step],
        "outputFile": "out.log", "sessionFile": "/s.jsonl",
        "runnerIdentity": identity(12), "monitorIdentity": identity(13),
        "launcherIdentity": identity(14), "runnerProcessInstanceId": "rid",
        "stopReason": "user"
    });
    let status = parse(&text).unwrap();
    assert!(status.extra.is_empty(), "{:?}", status.extra.keys());
    let s = &status.steps()[0];
    assert!(s.extra.is_empty(), "{:?}", s.extra.keys());
    assert_eq!(
        (
            s.agent.as_str(),
            s.status.as_str(),
            s.description.as_deref()
        ),
        ("a", "failed", Some("[prompt redacted]"))
    );
    assert_eq!(
        (s.started_at, s.ended_at, s.duration_ms),
        (Some(1), Some(2), Some(1))
    );
    assert_eq!((s.exit_code, s.error.as_deref()), (Some(3), Some("e")));
    assert_eq!((s.timed_out, s.stopped), (Some(true), Some(false)));
    assert_eq!(s.external_process.as_ref().unwrap().pid, Some(9));
    assert_eq!(s.process_terminal, Some(json!({"state": "pending"})));

    assert_eq!(status.lifecycle_artifact_version, Some(3));
    assert_eq!(status.run_id, "r");
    assert_eq!(status.session_id.as_deref(), Some("s"));
    assert_eq!(status.mode.as_deref(), Some("chain"));
    assert_eq!(status.state, RunState::Failed);
    assert_eq!(status.display_dismissed_at, Some(4));
    assert_eq!(status.error.as_deref(), Some("boom"));
    assert_eq!(status.last_activity_at, Some(5));
    assert_eq!((status.started_at, status.ended_at), (Some(6), Some(7)));
    assert_eq!(status.last_update, Some(8));
    assert_eq!((status.timeout_ms, status.deadline_at), (Some(9), Some(10)));
    assert_eq!((status.timed_out, status.stopped), (Some(true), Some(true)));
    assert_eq!(status.pid, Some(11));
    assert_eq!(status.cwd.as_deref(), Some("/w"));
    assert_eq!(
        (status.current_step, status.chain_step_count),
        (Some(0), Some(1))
    );
    assert_eq!(status.process_terminal, Some(json!({"state": "pending"})));
    assert_eq!(status.run_fanout_budget.as_ref().unwrap()["limit"], 2);
    assert_eq!(status.output_file.as_deref(), Some("out.log"));
    assert_eq!(status.session_file.as_deref(), Some("/s.jsonl"));
    assert_eq!(status.runner_identity.as_ref().unwrap().pid, 12);
    assert_eq!(status.monitor_identity.as_ref().unwrap().pid, 13);
    assert_eq!(status.launcher_identity.as_ref().unwrap().pid, 14);
    assert_eq!(status.runner_process_instance_id.as_deref(), Some("rid"));
    assert_eq!(status.stop_reason.as_deref(), Some("user"));
    // And back: the same document.
    assert_eq!(serde_json::to_value(&status).unwrap(), text);
}

#[test]
fn the_sort_time_is_the_last_update_else_the_end_else_the_start() {
    let mut status = RunStatus::new("r", RunState::Complete);
    assert_eq!(status.sort_time(), 0);
    status.started_at = Some(3);
    assert_eq!(status.sort_time(), 3);
    status.ended_at = Some(5);
    assert_eq!(status.sort_time(), 5);
    status.last_update = Some(4);
    assert_eq!(status.sort_time(), 4);
}

#[test]
fn a_null_session_id_is_refused_like_any_non_string() {
    let err = parse(&json!({"state": "running", "sessionId": null})).unwrap_err();
    assert!(
        err.to_string().contains("sessionId must be a string"),
        "{err}"
    );
    // A `sessionId` key deeper down is not the run's.
    let status = parse(&json!({"state": "running", "runId": "r", "x": {"sessionId": 1}})).unwrap();
    assert_eq!(status.run_id, "r");
    assert_eq!(status.session_id, None);
    assert_eq!(status.extra["x"], json!({"sessionId": 1}));
}

#[test]
fn a_bad_field_is_named_even_with_a_good_session_id() {
    let err = parse(&json!({"state": "running", "sessionId": "s", "steps": [1]})).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.starts_with("failed to parse async status file '/r/status.json'"),
        "{msg}"
    );
    assert!(msg.contains("steps[0]"), "{msg}");
    assert!(msg.contains("expected struct Step"), "{msg}");
    assert!(!msg.contains("sessionId"), "{msg}");
    let err = parse(&json!([1])).unwrap_err();
    assert!(
        err.to_string().contains("expected struct RunStatus"),
        "{err}"
    );
}

#[test]
fn an_unreadable_status_is_an_error_not_absent() {
    let tmp = tempfile::tempdir().unwrap();
    assert!(read_status(tmp.path()).unwrap().is_none());
    std::fs::create_dir(tmp.path().join("status.json")).unwrap();
    let err = read_status(tmp.path()).unwrap_err();
    assert!(err.to_string().contains("status.json"), "{err}");
}

#[test]
fn the_unsynced_update_writes_what_it_returns() {
    let tmp = tempfile::tempdir().unwrap();
    write_status(tmp.path(), &RunStatus::new("r", RunState::Queued)).unwrap();
    let next = update_status_unsynced_dir(tmp.path(), |s| {
        let mut s = s.unwrap();
        s.state = RunState::Running;
        s.pid = Some(42);
        Some(s)
    })
    .unwrap()
    .unwrap();
    assert_eq!(next.state, RunState::Running);
    assert_eq!(read_status(tmp.path()).unwrap().unwrap(), next);
    let none = update_status_unsynced_dir(tmp.path(), |_| None).unwrap();
    assert!(none.is_none());
    assert_eq!(read_status(tmp.path()).unwrap().unwrap(), next);
}

#[test]
fn paused_is_over_for_listings_but_holds_its_capacity_slot() {
    use RunState::*;
    let all = [Queued, Running, Complete, Failed, Paused, Stopped, Rejected];
    let active: Vec<_> = all.into_iter().filter(|s| s.is_active()).collect();
    let holding: Vec<_> = all.into_iter().filter(|s| s.holds_capacity()).collect();
    assert_eq!(active, [Queued, Running]);
    assert_eq!(holding, [Queued, Running, Paused]);
}

#[test]
fn the_capacity_facts_of_steps_and_of_the_projection() {
    let status = parse(&json!({
        "runId": "r", "state": "complete",
        "processTerminal": {"state": "not-started", "runId": "r-proj", "runnerProcessInstanceId": 7},
        "steps": [
            {"agent": "a", "status": "paused", "workflowKey": "build", "async": true, "runId": "child"},
            {"agent": "b", "status": "pending", "async": "yes", "workflowKey": 3},
            {"agent": "c", "status": "running"},
            {"agent": "d", "status": "complete"},
            {"agent": "e", "status": "failed"},
        ],
    }))
    .unwrap();
    assert_eq!(status.projected_proof_str("state"), Some("not-started"));
    assert_eq!(status.projected_proof_str("runId"), Some("r-proj"));
    assert_eq!(status.projected_proof_str("runnerProcessInstanceId"), None);
    assert_eq!(
        RunStatus::new("r", RunState::Complete).projected_proof_str("state"),
        None
    );
    let steps = status.steps();
    let holding: Vec<bool> = steps.iter().map(|s| s.holds_capacity()).collect();
    assert_eq!(holding, [true, true, true, false, false]);
    assert_eq!(
        (
            steps[0].extra_str("workflowKey"),
            steps[0].extra_str("runId"),
            steps[0].is_async()
        ),
        (Some("build"), Some("child"), Some(true))
    );
    assert_eq!(
        (steps[1].extra_str("workflowKey"), steps[1].is_async()),
        (None, None)
    );
    assert_eq!(
        (steps[2].extra_str("runId"), steps[2].is_async()),
        (None, None)
    );
}
