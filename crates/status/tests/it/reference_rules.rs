//! The rules applied to runs written by pi-subagents 0.49 (records without
//! any of our identities), each on its own: which records they are, where
//! their result file lives, when they are stale, what a result file
//! repairs, the activity time a listing shows, and the failed result file.

use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use serde_json::{Value, json};
use status::model::{RunState, RunStatus, Step};
use status::reconcile::Options;
use status::reference::{
    failed_result, is_reference_record, listed_last_activity, repair_from_result, result_path,
    stale_message,
};

fn identity() -> process_identity::ProcessIdentity {
    process_identity::ProcessIdentity {
        pid: 5,
        start_time: 7,
        boot_id: None,
        machine_id: None,
        host: None,
    }
}

fn dead_pid() -> u32 {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    pid
}

fn step(agent: &str, status: &str) -> Step {
    Step {
        agent: agent.into(),
        status: status.into(),
        started_at: Some(1_000),
        ..Default::default()
    }
}

#[test]
fn any_one_of_our_identities_makes_a_record_ours() {
    let reference = RunStatus::new("r", RunState::Running);
    assert!(is_reference_record(&reference));
    for which in 0..3 {
        let mut ours = reference.clone();
        match which {
            0 => ours.runner_identity = Some(identity()),
            1 => ours.monitor_identity = Some(identity()),
            _ => ours.launcher_identity = Some(identity()),
        }
        assert!(!is_reference_record(&ours), "identity {which}");
    }
}

#[test]
fn a_result_file_lives_beside_the_runs_directory_only() {
    assert_eq!(
        result_path(Path::new("/x/async-subagent-runs/d"), "id"),
        Some(PathBuf::from("/x/async-subagent-results/id.json"))
    );
    assert_eq!(result_path(Path::new("/x/elsewhere/d"), "id"), None);
}

#[test]
fn a_dismissed_or_finished_run_is_never_stale() {
    let mut status = RunStatus::new("r", RunState::Running);
    status.pid = Some(dead_pid());
    let options = Options::at(5_000);
    let message = stale_message(&status, options).unwrap();
    assert!(message.contains("exited or disappeared"), "{message}");
    let mut dismissed = status.clone();
    dismissed.display_dismissed_at = Some(1);
    assert_eq!(stale_message(&dismissed, options), None);
    for state in [RunState::Queued, RunState::Complete, RunState::Failed] {
        let mut other = status.clone();
        other.state = state;
        assert_eq!(stale_message(&other, options), None, "{state}");
    }
    // A live pid, updated recently: not stale.
    let mut live = status.clone();
    live.pid = Some(std::process::id());
    live.last_update = Some(4_000);
    assert_eq!(stale_message(&live, options), None);
}

fn running(steps: Vec<Step>) -> RunStatus {
    let mut status = RunStatus::new("r", RunState::Running);
    status.lifecycle_artifact_version = Some(3);
    status.steps = Some(steps);
    status
}

fn repaired(status: &RunStatus, result: Value) -> RunStatus {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("r.json");
    std::fs::write(&path, result.to_string()).unwrap();
    repair_from_result(status, &path, 9_000).unwrap().unwrap()
}

#[test]
fn truthy_success_values_complete_the_run_as_in_javascript() {
    let status = running(vec![step("a", "running")]);
    for (success, state) in [
        (json!(1), RunState::Complete),
        (json!(0), RunState::Failed),
        (json!(0.5), RunState::Complete),
        (json!("yes"), RunState::Complete),
        (json!(""), RunState::Failed),
        (json!([]), RunState::Complete),
        (json!(null), RunState::Failed),
    ] {
        let out = repaired(&status, json!({"success": success}));
        assert_eq!(out.state, state, "success {success}");
    }
}

#[test]
fn a_childs_own_success_decides_its_step() {
    let status = running(vec![step("a", "running"), step("b", "running")]);
    let children =
        json!([{"success": false, "error": "a broke"}, {"success": true, "error": "noise"}]);
    let ok = repaired(&status, json!({"success": true, "results": children}));
    assert_eq!(ok.state, RunState::Complete);
    assert_eq!(ok.stopped, None);
    let (a, b) = (&ok.steps()[0], &ok.steps()[1]);
    assert_eq!((a.status.as_str(), a.exit_code), ("failed", Some(1)));
    assert_eq!(a.error.as_deref(), Some("a broke"));
    assert_eq!((b.status.as_str(), b.exit_code), ("complete", Some(0)));
    assert_eq!(b.error, None, "a complete step takes no error");
    assert_eq!((a.stopped, b.stopped), (None, None));
    let failed = repaired(&status, json!({"success": false, "results": children}));
    assert_eq!(failed.state, RunState::Failed);
    assert_eq!(failed.steps()[1].status, "complete");
    assert_eq!(failed.steps()[0].status, "failed");
}

#[test]
fn null_child_fields_are_absent_ones() {
    let mut s = step("a", "running");
    s.extra.insert("model".into(), json!("p/m"));
    s.extra.insert("thinking".into(), json!("low"));
    let status = running(vec![s]);
    // (A null model or thinking level is refused as not a string.)
    let child = json!({"sessionFile": null, "attemptedModels": null});
    let out = repaired(&status, json!({"success": true, "results": [child]}));
    let extra = &out.steps()[0].extra;
    assert_eq!(extra.get("model"), Some(&json!("p/m")));
    assert_eq!(extra.get("thinking"), Some(&json!("low")));
    assert!(!extra.contains_key("sessionFile"), "{extra:?}");
    assert!(!extra.contains_key("attemptedModels"), "{extra:?}");
}

#[test]
fn an_empty_model_has_no_thinking_level() {
    let status = running(vec![step("a", "running")]);
    let child = json!({"model": "", "thinking": "high"});
    let out = repaired(&status, json!({"success": true, "results": [child]}));
    let extra = &out.steps()[0].extra;
    assert_eq!(extra.get("model"), Some(&json!("")));
    assert!(!extra.contains_key("thinking"), "{extra:?}");
}

#[test]
fn only_a_pending_or_missing_proof_of_a_version_3_record_is_replaced() {
    let observed = json!({"state": "observed", "runId": "r"});
    let mut with_proof = running(vec![step("a", "running")]);
    with_proof.process_terminal = Some(observed.clone());
    let out = repaired(&with_proof, json!({"success": true}));
    assert_eq!(out.process_terminal, Some(observed));
    with_proof.process_terminal = Some(json!({"state": "pending"}));
    let out = repaired(&with_proof, json!({"success": true}));
    assert_eq!(out.process_terminal.unwrap()["state"], "unknown");
    let mut older = running(vec![step("a", "running")]);
    older.lifecycle_artifact_version = None;
    let out = repaired(&older, json!({"success": true}));
    assert_eq!(out.process_terminal, None);
}

#[test]
fn an_unreadable_result_file_is_an_error_not_absent() {
    let tmp = tempfile::tempdir().unwrap();
    let status = running(vec![step("a", "running")]);
    let path = tmp.path().join("r.json");
    assert!(repair_from_result(&status, &path, 1).unwrap().is_none());
    std::fs::create_dir(&path).unwrap();
    let err = repair_from_result(&status, &path, 1).unwrap_err();
    assert!(err.to_string().contains("r.json"), "{err}");
}

#[test]
fn the_listed_activity_of_a_running_run_falls_back_in_order() {
    let tmp = tempfile::tempdir().unwrap();
    let mut status = running(vec![step("a", "complete"), step("b", "running")]);
    status.started_at = Some(3);
    // Each step starts at its own time: the current step's is the one read.
    status.steps.as_mut().unwrap()[0].started_at = Some(900);
    // Recorded activity wins.
    status.last_activity_at = Some(7);
    assert_eq!(listed_last_activity(tmp.path(), &status), Some(7));
    status.last_activity_at = None;
    // Then the run's start (the current step has none).
    assert_eq!(listed_last_activity(tmp.path(), &status), Some(3));
    // Then the current step's start.
    status.current_step = Some(1);
    assert_eq!(listed_last_activity(tmp.path(), &status), Some(1_000));
    // Then its activity.
    let steps = status.steps.as_mut().unwrap();
    steps[1].extra.insert("lastActivityAt".into(), json!(2_000));
    assert_eq!(listed_last_activity(tmp.path(), &status), Some(2_000));
    // Then the output file's modification time.
    let out = tmp.path().join("out.log");
    let file = std::fs::File::create(&out).unwrap();
    file.set_modified(UNIX_EPOCH + Duration::from_millis(1_234_567))
        .unwrap();
    status.output_file = Some("out.log".into());
    assert_eq!(listed_last_activity(tmp.path(), &status), Some(1_234_567));
    // A workflow takes no start as activity.
    let mut workflow = running(vec![step("a", "running")]);
    workflow.mode = Some("workflow".into());
    workflow.started_at = Some(3);
    workflow.current_step = Some(0);
    assert_eq!(listed_last_activity(tmp.path(), &workflow), None);
    // A run that is not running shows what it recorded.
    let mut done = running(vec![step("a", "running")]);
    done.state = RunState::Complete;
    done.started_at = Some(3);
    assert_eq!(listed_last_activity(tmp.path(), &done), None);
}

#[test]
fn the_failed_result_lists_every_step_and_the_runs_facts() {
    let mut original = running(vec![step("a", "complete"), step("b", "running")]);
    original.mode = Some("chain".into());
    original.session_id = Some("s".into());
    original.session_file = Some("/s.jsonl".into());
    original.current_step = Some(1);
    let mut after = original.clone();
    after.state = RunState::Failed;
    after.steps.as_mut().unwrap()[1].status = "failed".into();
    let result = failed_result(&original, &after, Path::new("/d"), "gone", 9_000);
    assert_eq!(result["agent"], "b");
    assert_eq!(result["mode"], "chain");
    assert_eq!(result["sessionId"], "s");
    assert_eq!(result["sessionFile"], "/s.jsonl");
    assert_eq!(result["durationMs"], Value::Null);
    let a = &result["results"][0];
    assert_eq!(a["output"], "");
    assert_eq!(a["success"], true);
    assert!(a.get("error").is_none(), "{a}");
    let b = &result["results"][1];
    assert_eq!(
        (&b["output"], &b["error"]),
        (&json!("gone"), &json!("gone"))
    );
}

/// A result file's fields past `success` (absent, `null`, of the wrong
/// type, empty): only `state: "stopped"` stops the run and only an
/// `exitCode` equal to 0 (or `state: "paused"`) pauses it; a child's own
/// `success` decides its step only as a boolean (`false` apart from
/// absent: the run's outcome), and its `error` is taken only as text.
#[test]
fn result_file_fields_absent_null_wrong_or_empty() {
    let status = running(vec![step("a", "running")]);
    let state_of = |result: Value| repaired(&status, result).state;
    assert_eq!(state_of(json!({"state": "stopped"})), RunState::Stopped);
    assert_eq!(state_of(json!({"state": "paused"})), RunState::Paused);
    assert_eq!(state_of(json!({"exitCode": 0})), RunState::Paused);
    assert_eq!(state_of(json!({"exitCode": 0.0})), RunState::Paused);
    assert_eq!(state_of(json!({})), RunState::Failed);
    for value in [
        json!(null),
        json!(7),
        json!(""),
        json!("STOPPED"),
        json!(["stopped"]),
    ] {
        assert_eq!(
            state_of(json!({"state": value})),
            RunState::Failed,
            "state {value}"
        );
    }
    for value in [json!(null), json!("0"), json!(""), json!(false), json!(1)] {
        assert_eq!(
            state_of(json!({"exitCode": value})),
            RunState::Failed,
            "exitCode {value}"
        );
    }
    let step_of = |child: Value, success: bool| {
        let out = repaired(&status, json!({"success": success, "results": [child]}));
        let s = &out.steps()[0];
        (s.status.clone(), s.error.clone())
    };
    let failed = |error: Option<&str>| ("failed".to_owned(), error.map(str::to_owned));
    assert_eq!(
        step_of(json!({"success": false, "error": "a broke"}), true),
        failed(Some("a broke"))
    );
    for value in [Value::Null, json!("false"), json!(0), json!({})] {
        let child = json!({"success": value, "error": "a broke"});
        assert_eq!(
            step_of(child.clone(), true),
            ("complete".to_owned(), None),
            "{value}: the run's"
        );
        assert_eq!(
            step_of(child, false),
            failed(Some("a broke")),
            "{value}: the run's"
        );
    }
    let mut absent = json!({"error": "a broke"});
    assert_eq!(
        step_of(absent.clone(), true),
        ("complete".to_owned(), None),
        "absent"
    );
    for error in [Value::Null, json!(7), json!(["a broke"])] {
        absent["error"] = error.clone();
        assert_eq!(
            step_of(absent.clone(), false),
            failed(None),
            "error {error}"
        );
    }
}
