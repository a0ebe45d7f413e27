//! The validation, decision and overlay rules of process-terminal proofs
//! (candidate and proof checks, the finalizer's decision table, the step
//! projections), each against the reference's documented behaviour.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use status::model::{RunState, RunStatus, Step, read_status, write_status};
use status::proof::{
    Candidate, Fallback, LeaseState, ProcessTerminal, ProcessTree, ProofState, RunnerClose,
    WriterRecord, complete_persisted, decide, finalize, finalize_with, no_leases, overlay,
    parse_candidate, persistence_unfinished, read_proof, resume_disposition, sanitize,
    valid_instance, validate_candidate, validate_proof, write_candidate,
};
use status::{events, index};

fn runner_record() -> Value {
    json!({"kind": "runner", "processInstanceId": "r", "closeObservedAt": 1,
           "exitCode": 0, "signal": null})
}

fn writer_record() -> Value {
    json!({"kind": "pi-writer", "processInstanceId": "w", "attempt": 0,
           "closeObservedAt": 1, "exitCode": null, "signal": "SIGTERM",
           "processTree": {"state": "observed", "mechanism": "posix-process-group",
                           "processGroupId": 77, "verifiedAt": 2}})
}

/// `base` with `key` set to `value` (or removed when `value` is `None`).
fn with(base: &Value, key: &str, value: Option<Value>) -> Value {
    let mut out = base.clone();
    let obj = out.as_object_mut().unwrap();
    match value {
        Some(v) => obj.insert(key.into(), v),
        None => obj.remove(key),
    };
    out
}

#[test]
fn a_runner_record_needs_every_field_and_no_attempt() {
    let runner = runner_record();
    assert!(valid_instance(&runner, None));
    assert!(valid_instance(&runner, Some("runner")));
    assert!(!valid_instance(&runner, Some("pi-writer")), "wrong kind");
    let signalled = with(
        &with(&runner, "exitCode", Some(Value::Null)),
        "signal",
        Some(json!("SIGKILL")),
    );
    assert!(valid_instance(&signalled, None), "null exit, named signal");
    assert!(!valid_instance(&json!("runner"), None), "not an object");
    let bad = [
        ("processInstanceId", Some(json!(""))),
        ("processInstanceId", None),
        ("kind", Some(json!("monitor"))),
        ("kind", None),
        ("closeObservedAt", None),
        ("closeObservedAt", Some(json!("1"))),
        ("exitCode", None),
        ("exitCode", Some(json!("0"))),
        ("signal", None),
        ("signal", Some(json!(9))),
        ("attempt", Some(json!(0))),
    ];
    for (key, value) in bad {
        let record = with(&runner, key, value.clone());
        assert!(!valid_instance(&record, None), "{key}: {value:?}");
    }
}

#[test]
fn a_writer_record_needs_an_attempt_and_a_verified_or_explained_tree() {
    let writer = writer_record();
    assert!(valid_instance(&writer, None));
    assert!(valid_instance(&writer, Some("pi-writer")));
    assert!(!valid_instance(&writer, Some("runner")));
    let exited = with(&writer, "exitCode", Some(json!(0)));
    assert!(valid_instance(&exited, None), "exit code, null signal");
    let tree = |t: Value| with(&writer, "processTree", Some(t));
    let unknown = json!({"state": "unknown", "reason": "signal-failed", "diagnostic": "EPERM"});
    assert!(valid_instance(&tree(unknown.clone()), None));
    assert!(valid_instance(
        &tree(json!({"state": "unknown", "reason": "unsupported-platform"})),
        None
    ));
    let observed = writer["processTree"].clone();
    let bad = [
        ("attempt", None),
        ("attempt", Some(json!(-1))),
        ("processTree", None),
        ("processTree", Some(json!("observed"))),
    ];
    for (key, value) in bad {
        assert!(
            !valid_instance(&with(&writer, key, value.clone()), None),
            "{key}: {value:?}"
        );
    }
    let bad_trees = [
        with(&observed, "mechanism", Some(json!("cgroup"))),
        with(&observed, "processGroupId", Some(json!(0))),
        with(&observed, "verifiedAt", None),
        with(&observed, "state", Some(json!("gone"))),
        with(&unknown, "reason", Some(json!("timeout"))),
        with(&unknown, "diagnostic", Some(json!(5))),
    ];
    for t in bad_trees {
        assert!(!valid_instance(&tree(t.clone()), None), "{t}");
    }
}

fn observed_proof() -> Value {
    json!({"version": 1, "state": "observed", "runId": "run", "runnerProcessInstanceId": "r",
           "observedAt": 5, "instances": [runner_record(), writer_record()],
           "resumeDisposition": "resumable"})
}

fn refusal(proof: &Value, fallback: &Fallback) -> String {
    validate_proof(proof, "L", fallback).unwrap_err()
}

#[test]
fn proof_checks_run_in_the_reference_order_with_its_messages() {
    let none = Fallback::default();
    let good = observed_proof();
    let proof = validate_proof(&good, "L", &none).unwrap();
    assert_eq!(proof.state, ProofState::Observed);
    assert_eq!(proof.to_value(), good, "a valid proof reads back unchanged");
    let prefix = "Invalid process-terminal proof in 'L'.";
    for (key, value, field) in [
        ("version", Some(json!(2)), "version must be 1."),
        (
            "state",
            Some(json!("bogus")),
            "state must be pending, observed, unknown or not-started.",
        ),
        (
            "runId",
            Some(json!("")),
            "runId must be a non-empty string.",
        ),
        (
            "runnerProcessInstanceId",
            None,
            "runnerProcessInstanceId must be a non-empty string.",
        ),
    ] {
        assert_eq!(
            refusal(&with(&good, key, value), &none),
            format!("{prefix} {field}")
        );
    }
    assert!(refusal(&json!([1]), &none).starts_with(prefix));
    let runs = Fallback {
        run_id: Some("other".into()),
        runner_process_instance_id: None,
    };
    assert_eq!(
        refusal(&good, &runs),
        "Process-terminal proof in 'L' belongs to run 'run', expected 'other'."
    );
    let empty_run = Fallback {
        run_id: Some(String::new()),
        runner_process_instance_id: Some("r".into()),
    };
    assert!(
        validate_proof(&good, "L", &empty_run).is_ok(),
        "an empty expected run id is no expectation"
    );
    let runners = Fallback {
        run_id: Some("run".into()),
        runner_process_instance_id: Some("r2".into()),
    };
    assert_eq!(
        refusal(&good, &runners),
        "Process-terminal proof in 'L' belongs to runner 'r', expected 'r2'."
    );
    let instances = "Invalid process-terminal instances in 'L'.";
    for list in [json!({}), json!([runner_record(), {"kind": "pi-writer"}])] {
        let pending = with(
            &with(&good, "state", Some(json!("pending"))),
            "instances",
            Some(list),
        );
        assert_eq!(refusal(&pending, &none), instances);
    }
    let disposition = with(&good, "resumeDisposition", Some(json!("maybe")));
    assert_eq!(
        refusal(&disposition, &none),
        "Invalid process-terminal resume disposition in 'L'."
    );
}

#[test]
fn an_observed_proof_needs_its_time_and_its_runner() {
    let none = Fallback::default();
    let good = observed_proof();
    let observed = "Observed process-terminal proof in 'L'";
    assert_eq!(
        refusal(&with(&good, "observedAt", None), &none),
        format!("{observed} is missing observedAt.")
    );
    assert_eq!(
        refusal(&with(&good, "observedAt", Some(json!("5"))), &none),
        format!("{observed} is missing observedAt.")
    );
    assert_eq!(
        refusal(&with(&good, "instances", None), &none),
        format!("{observed} is missing instances.")
    );
    let no_runner = "has no matching runner instance.";
    let other_runner = with(&runner_record(), "processInstanceId", Some(json!("r9")));
    for list in [
        json!([writer_record()]),
        json!([]),
        json!([writer_record(), other_runner]),
    ] {
        let proof = with(&good, "instances", Some(list));
        assert_eq!(refusal(&proof, &none), format!("{observed} {no_runner}"));
    }
    // Only the first runner record counts, wherever it stands.
    let late_runner = with(
        &good,
        "instances",
        Some(json!([writer_record(), runner_record()])),
    );
    assert!(validate_proof(&late_runner, "L", &none).is_ok());
    // A pending proof needs neither.
    let pending = json!({"version": 1, "state": "pending", "runId": "run",
                         "runnerProcessInstanceId": "r"});
    assert!(validate_proof(&pending, "L", &none).is_ok());
}

#[test]
fn an_invalid_projection_is_sanitised_to_an_unknown_proof() {
    let fallback = Fallback {
        run_id: Some("run".into()),
        runner_process_instance_id: Some("r".into()),
    };
    assert_eq!(sanitize(None, &fallback, "status"), None);
    let good = observed_proof();
    assert_eq!(
        sanitize(Some(&good), &fallback, "status")
            .unwrap()
            .to_value(),
        good
    );
    let bogus = with(&good, "state", Some(json!("bogus")));
    let proof = sanitize(Some(&bogus), &Fallback::default(), "s.json").unwrap();
    assert_eq!(proof.state, ProofState::Unknown);
    assert_eq!(proof.reason.as_deref(), Some("proof-write-failed"));
    assert_eq!(proof.run_id, "s.json", "the label stands in for the run id");
    assert_eq!(proof.runner_process_instance_id, "unknown");
}

fn candidate_value() -> Value {
    json!({"version": 1, "runId": "run", "runnerProcessInstanceId": "r",
           "writers": {"0": [writer_record()]}, "expectedWriters": {"0": 1},
           "sessionFile": "/s", "revivalLeaseToken": "t",
           "revivalLeaseReleaseAcknowledged": true})
}

#[test]
fn candidate_checks_name_the_field_at_fault() {
    let good = candidate_value();
    assert_eq!(validate_candidate(&good, "top"), Ok(()));
    for (key, value, message) in [
        ("runId", Some(json!(1)), "top runId must be a string."),
        (
            "runnerProcessInstanceId",
            None,
            "top runnerProcessInstanceId must be a string.",
        ),
        ("writers", Some(json!([])), "top writers must be an object."),
        (
            "writers",
            Some(json!({"3": {}})),
            "Invalid writer process records for child '3'.",
        ),
        (
            "expectedWriters",
            Some(json!([1])),
            "Invalid expected writer process records.",
        ),
        (
            "expectedWriters",
            Some(json!({"0": 1, "1": 1.5})),
            "Invalid expected writer count for child '1'.",
        ),
        (
            "sessionFile",
            Some(json!(5)),
            "Invalid process-terminal candidate sessionFile.",
        ),
        (
            "revivalLeaseToken",
            Some(json!(null)),
            "Invalid process-terminal candidate lease token.",
        ),
        (
            "revivalLeaseReleaseAcknowledged",
            Some(json!("yes")),
            "Invalid process-terminal lease release acknowledgement.",
        ),
    ] {
        assert_eq!(
            validate_candidate(&with(&good, key, value.clone()), "top"),
            Err(message.to_owned()),
            "{key}: {value:?}"
        );
    }
    assert_eq!(validate_candidate(&json!(1), "top"), Err("top".to_owned()));
}

#[test]
fn empty_session_file_and_lease_token_are_dropped() {
    let good = candidate_value();
    let kept = parse_candidate(&good.to_string(), "bad").unwrap();
    assert_eq!(kept.session_file.as_deref(), Some("/s"));
    assert_eq!(kept.revival_lease_token.as_deref(), Some("t"));
    let empty = with(
        &with(&good, "sessionFile", Some(json!(""))),
        "revivalLeaseToken",
        Some(json!("")),
    );
    let dropped = parse_candidate(&empty.to_string(), "bad").unwrap();
    assert_eq!(dropped.session_file, None);
    assert_eq!(dropped.revival_lease_token, None);
}

// The finalizer's decision table (docs/protocol/status.md §5.4).

fn writer(tree_observed: bool, pgid: u32) -> WriterRecord {
    WriterRecord {
        process_instance_id: format!("w{pgid}"),
        kind: "pi-writer".into(),
        attempt: 0,
        close_observed_at: 10,
        exit_code: Some(0),
        signal: None,
        process_tree: if tree_observed {
            ProcessTree::Observed {
                mechanism: "posix-process-group".into(),
                process_group_id: pgid,
                verified_at: 11,
            }
        } else {
            ProcessTree::Unknown {
                reason: "verification-failed".into(),
                diagnostic: None,
            }
        },
    }
}

fn candidate(writers: &[(&str, Vec<WriterRecord>)], expected: Option<&[(&str, u64)]>) -> Candidate {
    Candidate {
        version: 1,
        run_id: "run-1".into(),
        runner_process_instance_id: "runner-1".into(),
        writers: writers
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect(),
        expected_writers: expected.map(|e| e.iter().map(|(k, n)| ((*k).to_owned(), *n)).collect()),
        session_file: None,
        revival_lease_token: None,
        revival_lease_release_acknowledged: None,
    }
}

fn close() -> RunnerClose {
    RunnerClose {
        process_instance_id: "runner-1".into(),
        close_observed_at: 20,
        exit_code: Some(0),
        signal: None,
        observer: None,
    }
}

/// `<tmp>/runs/run-1` with a status of `state` and `steps` step states, and a marker.
fn run_dir(tmp: &Path, state: RunState, steps: &[&str]) -> PathBuf {
    let dir = tmp.join("runs").join("run-1");
    std::fs::create_dir_all(&dir).unwrap();
    let mut status = RunStatus::new("run-1", state);
    status.steps = Some(
        steps
            .iter()
            .map(|s| Step {
                agent: "a".into(),
                status: (*s).into(),
                ..Step::default()
            })
            .collect(),
    );
    write_status(&dir, &status).unwrap();
    index::create_marker(&dir).unwrap();
    dir
}

fn decided(dir: &Path, c: &Candidate) -> ProcessTerminal {
    write_candidate(dir, c).unwrap();
    decide(dir, "run-1", &close(), &no_leases)
}

fn reason(proof: &ProcessTerminal) -> Option<&str> {
    proof.reason.as_deref()
}

#[test]
fn a_candidate_of_another_run_is_a_mismatch() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(tmp.path(), RunState::Complete, &["complete"]);
    let mut c = candidate(&[("0", vec![writer(true, 7)])], None);
    c.run_id = "run-2".into();
    assert_eq!(reason(&decided(&dir, &c)), Some("runner-instance-mismatch"));
}

#[test]
fn writer_evidence_must_match_the_expected_counts() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(tmp.path(), RunState::Complete, &["complete", "complete"]);
    let w = || vec![writer(true, 7)];
    // Without `expectedWriters`, the records themselves are the expectation.
    let derived = decided(&dir, &candidate(&[("0", w())], None));
    assert_eq!(derived.state, ProofState::Observed);
    // A child that started no writer needs no entry.
    let idle = decided(&dir, &candidate(&[("0", w())], Some(&[("0", 1), ("1", 0)])));
    assert_eq!(idle.state, ProofState::Observed);
    // A child that started one needs its record.
    let missing = decided(&dir, &candidate(&[("0", w())], Some(&[("0", 1), ("1", 1)])));
    assert_eq!(reason(&missing), Some("writer-close-unverified"));
    // A record nobody expected.
    let extra = decided(
        &dir,
        &candidate(&[("0", w()), ("1", w())], Some(&[("0", 1)])),
    );
    assert_eq!(reason(&extra), Some("writer-close-unverified"));
}

#[test]
fn an_observed_proof_lists_the_runner_then_writers_in_child_order() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(tmp.path(), RunState::Complete, &["complete"]);
    let c = candidate(
        &[("10", vec![writer(true, 10)]), ("2", vec![writer(true, 2)])],
        None,
    );
    let proof = decided(&dir, &c);
    let ids: Vec<&str> = proof
        .instances
        .iter()
        .flatten()
        .map(|i| i["processInstanceId"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["runner-1", "w2", "w10"], "numeric, not string order");
    assert_eq!(proof.observed_at, Some(20), "the runner's close time");
    assert_eq!(
        proof.instances.as_ref().unwrap()[0],
        json!({"kind": "runner", "processInstanceId": "runner-1", "closeObservedAt": 20,
               "exitCode": 0, "signal": null})
    );
    // No session file in candidate or status: nothing to resume.
    assert_eq!(proof.resume_disposition.as_deref(), Some("unavailable"));
    assert_eq!(proof.canonical_session, None);
}

#[test]
fn the_observed_resume_disposition_follows_the_run_state_and_session() {
    let tmp = tempfile::tempdir().unwrap();
    let session = tmp.path().join("session.jsonl");
    std::fs::write(&session, "").unwrap();
    let dir = run_dir(tmp.path(), RunState::Failed, &["failed"]);
    let mut c = candidate(&[("0", vec![writer(true, 7)])], None);
    c.session_file = Some(session.display().to_string());
    write_candidate(&dir, &c).unwrap();
    let free = |_: &str| Ok(LeaseState::Free("abc".into()));
    let proof = decide(&dir, "run-1", &close(), &free);
    assert_eq!(proof.resume_disposition.as_deref(), Some("resumable"));
    let stopped = run_dir(tmp.path(), RunState::Stopped, &["stopped"]);
    write_candidate(&stopped, &c).unwrap();
    let proof = decide(&stopped, "run-1", &close(), &free);
    assert_eq!(proof.resume_disposition.as_deref(), Some("non-resumable"));
}

#[test]
fn a_leased_session_decides_the_proof_and_its_canonical_session() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(tmp.path(), RunState::Complete, &["complete"]);
    let mut c = candidate(&[("0", vec![writer(true, 7)])], None);
    c.session_file = Some("/no/such/session.jsonl".into());
    write_candidate(&dir, &c).unwrap();
    let owned = |_: &str| Ok(LeaseState::Owned);
    let unreadable = |_: &str| Ok(LeaseState::Unreadable);
    let failing = |_: &str| Err("lease dir unreadable".to_owned());
    let free = |_: &str| Ok(LeaseState::Free("abc".into()));
    assert_eq!(
        reason(&decide(&dir, "run-1", &close(), &owned)),
        Some("canonical-session-lease-active")
    );
    assert_eq!(
        reason(&decide(&dir, "run-1", &close(), &unreadable)),
        Some("canonical-session-unavailable")
    );
    let failed = decide(&dir, "run-1", &close(), &failing);
    assert_eq!(reason(&failed), Some("proof-write-failed"));
    assert_eq!(failed.diagnostic.as_deref(), Some("lease dir unreadable"));
    let proof = decide(&dir, "run-1", &close(), &free);
    assert_eq!(
        proof.canonical_session,
        Some(
            json!({"canonicalSessionId": "abc", "leaseDisposition": "not-held",
                    "freeAtObservation": true})
        )
    );
    assert_eq!(
        proof.resume_disposition.as_deref(),
        Some("unavailable"),
        "the session file does not exist"
    );
    c.revival_lease_token = Some("t".into());
    c.revival_lease_release_acknowledged = Some(true);
    write_candidate(&dir, &c).unwrap();
    let proof = decide(&dir, "run-1", &close(), &free);
    assert_eq!(proof.state, ProofState::Observed);
    assert_eq!(
        proof.canonical_session,
        Some(
            json!({"canonicalSessionId": "abc", "leaseDisposition": "released",
                    "freeAtObservation": true, "canonicalSessionLeaseReleased": true})
        )
    );
}

#[test]
fn an_unreadable_candidate_is_a_failed_proof_not_a_missing_one() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(tmp.path(), RunState::Complete, &["complete"]);
    std::fs::create_dir(dir.join("process-terminal-candidate.json")).unwrap();
    let proof = decide(&dir, "run-1", &close(), &no_leases);
    assert_eq!(reason(&proof), Some("proof-write-failed"));
    assert!(proof.diagnostic.is_some());
}

#[test]
fn an_unreadable_proof_file_is_an_unknown_proof_not_an_absent_one() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(tmp.path(), RunState::Complete, &["complete"]);
    assert_eq!(read_proof(&dir, &Fallback::default()), None);
    std::fs::create_dir(dir.join("process-terminal.json")).unwrap();
    let proof = read_proof(&dir, &Fallback::default()).unwrap();
    assert_eq!(reason(&proof), Some("proof-write-failed"));
    assert_eq!(proof.run_id, "run-1", "the directory names the run");
}

#[test]
fn the_observed_hook_edits_the_status_only_for_an_observed_proof() {
    let tmp = tempfile::tempdir().unwrap();
    let mark = |s: &mut RunStatus| s.stop_reason = Some("frozen".into());
    let dir = run_dir(tmp.path(), RunState::Complete, &["complete"]);
    write_candidate(&dir, &candidate(&[("0", vec![writer(false, 7)])], None)).unwrap();
    let proof = finalize_with(&dir, "run-1", &close(), &no_leases, 30, &mark);
    assert_eq!(reason(&proof), Some("process-tree-unverified"));
    assert_eq!(read_status(&dir).unwrap().unwrap().stop_reason, None);
    std::fs::remove_file(dir.join("process-terminal.json")).unwrap();
    write_candidate(&dir, &candidate(&[("0", vec![writer(true, 7)])], None)).unwrap();
    let proof = finalize_with(&dir, "run-1", &close(), &no_leases, 30, &mark);
    assert_eq!(proof.state, ProofState::Observed);
    assert_eq!(
        read_status(&dir).unwrap().unwrap().stop_reason.as_deref(),
        Some("frozen")
    );
}

#[test]
fn a_proof_whose_finalizer_died_before_the_overlay_is_completed_once() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(tmp.path(), RunState::Complete, &["complete"]);
    write_candidate(&dir, &candidate(&[("0", vec![writer(true, 7)])], None)).unwrap();
    let proof = finalize(&dir, "run-1", &close(), &no_leases, 30);
    assert_eq!(proof.state, ProofState::Observed);
    assert!(!persistence_unfinished(&dir, &proof));
    assert!(!complete_persisted(&dir, "run-1", &proof, 40));
    // The finalizer died after writing the proof: the status still projects
    // the pending proof and the marker is still there.
    let pending = ProcessTerminal::new(ProofState::Pending, "run-1", "runner-1");
    let mut status = read_status(&dir).unwrap().unwrap();
    status.process_terminal = Some(pending.to_value());
    write_status(&dir, &status).unwrap();
    index::create_marker(&dir).unwrap();
    let events_before = events::read_all(&dir).len();
    assert!(persistence_unfinished(&dir, &proof));
    assert!(complete_persisted(&dir, "run-1", &proof, 40));
    assert_eq!(
        read_status(&dir).unwrap().unwrap().process_terminal,
        Some(proof.to_value())
    );
    assert!(!index::has_marker(&dir));
    assert_eq!(events::read_all(&dir).len(), events_before + 1);
    assert!(!complete_persisted(&dir, "run-1", &proof, 50), "done once");
    // Only the marker left behind (overlay done): still unfinished.
    index::create_marker(&dir).unwrap();
    assert!(persistence_unfinished(&dir, &proof));
    // An unknown proof keeps the marker by design: overlaid, it is finished.
    let unknown = ProcessTerminal::unknown("run-1", "runner-1", "process-tree-unverified", None);
    let mut status = read_status(&dir).unwrap().unwrap();
    status.process_terminal = Some(unknown.to_value());
    write_status(&dir, &status).unwrap();
    assert!(!persistence_unfinished(&dir, &unknown));
}

fn step_proofs(status: &RunStatus) -> Vec<Value> {
    status
        .steps()
        .iter()
        .map(|s| s.process_terminal.clone().unwrap())
        .collect()
}

#[test]
fn the_overlay_projects_each_step_from_its_own_writers() {
    let observed = ProcessTerminal {
        observed_at: Some(20),
        ..ProcessTerminal::new(ProofState::Observed, "run-1", "runner-1")
    };
    let mut status = RunStatus::new("run-1", RunState::Complete);
    status.steps = Some(
        ["complete", "complete", "stopped"]
            .iter()
            .map(|s| Step {
                agent: "a".into(),
                status: (*s).into(),
                ..Step::default()
            })
            .collect(),
    );
    // Step 0 has its writer, step 1 expected one and has none, step 2 started none.
    let c = candidate(
        &[("0", vec![writer(true, 7)])],
        Some(&[("0", 1), ("1", 1), ("2", 0)]),
    );
    let out = overlay(status.clone(), &observed, Some(&c), 99);
    assert_eq!(out.process_terminal, Some(observed.to_value()));
    let steps = step_proofs(&out);
    assert_eq!(
        steps[0],
        json!({"version": 1, "state": "observed", "runId": "run-1", "childIndex": 0,
               "runnerProcessInstanceId": "runner-1", "observedAt": 20,
               "instances": [serde_json::to_value(writer(true, 7)).unwrap()],
               "resumeDisposition": "unavailable"})
    );
    assert_eq!(
        steps[1],
        json!({"version": 1, "state": "unknown", "runId": "run-1", "childIndex": 1,
               "runnerProcessInstanceId": "runner-1", "reason": "writer-close-unverified",
               "resumeDisposition": "unavailable"})
    );
    assert_eq!(steps[2]["state"], "not-started");
    assert_eq!(steps[2]["resumeDisposition"], "non-resumable");
    // A run proof without its time: the step takes the overlay's.
    let timeless = ProcessTerminal::new(ProofState::Observed, "run-1", "runner-1");
    let out = overlay(status.clone(), &timeless, Some(&c), 99);
    assert_eq!(step_proofs(&out)[0]["observedAt"], 99);
    // An unknown run proof passes its reason on; a pending one stays pending.
    let unknown = ProcessTerminal::unknown("run-1", "runner-1", "runner-instance-mismatch", None);
    let out = overlay(status.clone(), &unknown, Some(&c), 99);
    assert_eq!(step_proofs(&out)[0]["reason"], "runner-instance-mismatch");
    let pending = ProcessTerminal::new(ProofState::Pending, "run-1", "runner-1");
    let out = overlay(status.clone(), &pending, Some(&c), 99);
    let states: Vec<Value> = step_proofs(&out)
        .iter()
        .map(|p| p["state"].clone())
        .collect();
    assert_eq!(states, ["pending", "pending", "not-started"]);
    // Without a candidate every step is `not-started` (the reference's quirk).
    let out = overlay(status, &unknown, None, 99);
    assert!(
        step_proofs(&out)
            .iter()
            .all(|p| p["state"] == "not-started")
    );
}

#[test]
fn a_step_resumes_from_its_own_session_file_else_the_candidates() {
    let tmp = tempfile::tempdir().unwrap();
    let session = tmp.path().join("s.jsonl");
    std::fs::write(&session, "").unwrap();
    let observed = ProcessTerminal::new(ProofState::Observed, "run-1", "runner-1");
    let mut status = RunStatus::new("run-1", RunState::Complete);
    let mut own = Step {
        agent: "a".into(),
        status: "complete".into(),
        ..Step::default()
    };
    own.extra
        .insert("sessionFile".into(), json!(session.display().to_string()));
    let bare = Step {
        agent: "b".into(),
        status: "failed".into(),
        ..Step::default()
    };
    status.steps = Some(vec![own, bare]);
    let c = candidate(&[], Some(&[("0", 0), ("1", 0)]));
    let out = overlay(status.clone(), &observed, Some(&c), 1);
    let dispositions: Vec<Value> = step_proofs(&out)
        .iter()
        .map(|p| p["resumeDisposition"].clone())
        .collect();
    assert_eq!(dispositions, ["resumable", "unavailable"]);
    let mut with_session = c.clone();
    with_session.session_file = Some(session.display().to_string());
    let out = overlay(status, &observed, Some(&with_session), 1);
    assert_eq!(step_proofs(&out)[1]["resumeDisposition"], "resumable");
}

#[test]
fn resume_disposition_needs_a_session_file_that_exists() {
    for state in ["complete", "completed", "failed", "paused"] {
        assert_eq!(resume_disposition(Some(state), Some("/")), "resumable");
        assert_eq!(
            resume_disposition(Some(state), Some("/no/such/file")),
            "unavailable"
        );
        assert_eq!(resume_disposition(Some(state), None), "unavailable");
    }
    assert_eq!(resume_disposition(None, Some("/")), "unavailable");
}

/// The candidate's optional fields one by one: absent is "not set"; null
/// and a wrong type are refused with the field's own message; an empty
/// session file or lease token reads as not set; an empty expected-writers
/// map is kept; the release acknowledgement keeps `false` apart from absent.
#[test]
fn candidate_optional_fields_absent_null_wrong_type_and_empty() {
    let good = candidate_value();
    let parse = |key: &str, value: Option<Value>| {
        parse_candidate(&with(&good, key, value).to_string(), "top")
    };
    let table = [
        (
            "expectedWriters",
            json!("1"),
            "Invalid expected writer process records.",
        ),
        (
            "sessionFile",
            json!(5),
            "Invalid process-terminal candidate sessionFile.",
        ),
        (
            "revivalLeaseToken",
            json!(5),
            "Invalid process-terminal candidate lease token.",
        ),
        (
            "revivalLeaseReleaseAcknowledged",
            json!("true"),
            "Invalid process-terminal lease release acknowledgement.",
        ),
    ];
    for (key, wrong, message) in table {
        let absent = parse(key, None).unwrap_or_else(|e| panic!("{key} absent: {e}"));
        let back = serde_json::to_value(&absent).unwrap();
        assert_eq!(back.get(key), None, "{key} absent");
        for bad in [Value::Null, wrong] {
            assert_eq!(
                parse(key, Some(bad.clone())).unwrap_err(),
                message,
                "{key} = {bad}"
            );
        }
    }
    let empty = parse("sessionFile", Some(json!(""))).unwrap();
    assert_eq!(empty.session_file, None);
    let empty = parse("revivalLeaseToken", Some(json!(""))).unwrap();
    assert_eq!(empty.revival_lease_token, None);
    let empty = parse("expectedWriters", Some(json!({}))).unwrap();
    assert_eq!(empty.expected_writers, Some(Default::default()));
    let off = parse("revivalLeaseReleaseAcknowledged", Some(json!(false))).unwrap();
    assert_eq!(off.revival_lease_release_acknowledged, Some(false));
    let absent = parse("revivalLeaseReleaseAcknowledged", None).unwrap();
    assert_eq!(absent.revival_lease_release_acknowledged, None);
}

/// The proof's optional fields the validator does not check one by one
/// (`childIndex`, `canonicalSession`, `reason`, `diagnostic`, and
/// `resumeDisposition`, which it does), each absent, `null`, of the wrong
/// type and empty, starting from an observed proof with all of them set:
/// absent and `null` are none (but a `null` disposition, refused as the
/// reference refuses any value outside its three), an empty string is
/// kept, a wrong type is refused naming the field.
#[test]
fn each_optional_proof_field_absent_null_wrong_or_empty() {
    let none = Fallback::default();
    let full = {
        let mut p = observed_proof();
        p["childIndex"] = json!(3);
        p["canonicalSession"] = json!({"path": "/s.jsonl"});
        p["reason"] = json!("runner exited");
        p["diagnostic"] = json!("all groups empty");
        p
    };
    let fields = |p: &ProcessTerminal| {
        [
            ("childIndex", json!(p.child_index)),
            ("canonicalSession", json!(p.canonical_session)),
            ("reason", json!(p.reason)),
            ("diagnostic", json!(p.diagnostic)),
            ("resumeDisposition", json!(p.resume_disposition)),
        ]
    };
    let read = validate_proof(&full, "L", &none).unwrap();
    for (key, value) in fields(&read) {
        assert_eq!(value, full[key], "{key} read into its own field");
    }
    for key in [
        "childIndex",
        "canonicalSession",
        "reason",
        "diagnostic",
        "resumeDisposition",
    ] {
        let text = matches!(key, "reason" | "diagnostic");
        let wrong = if key == "childIndex" || text {
            json!({"x": 1})
        } else {
            json!(7)
        };
        let empty = match key {
            "childIndex" => None,
            "canonicalSession" => Some(json!({})),
            _ => Some(json!("")),
        };
        let mut cases = vec![("absent", None), ("null", Some(Value::Null))];
        if key != "canonicalSession" {
            cases.push(("wrong type", Some(wrong)));
        }
        if let Some(empty) = empty {
            cases.push(("empty", Some(empty)));
        }
        for (case, value) in cases {
            let proof = with(&full, key, value.clone());
            let refused_disposition = key == "resumeDisposition" && value.is_some();
            match validate_proof(&proof, "L", &none) {
                Ok(p) => {
                    assert!(
                        case != "wrong type" && !refused_disposition,
                        "{key} {case} read"
                    );
                    for (other, got) in fields(&p) {
                        let want = if other == key {
                            value.clone().unwrap_or(Value::Null)
                        } else {
                            full[other].clone()
                        };
                        assert_eq!(got, want, "{key} {case}: {other}");
                    }
                }
                Err(e) => {
                    assert!(
                        case == "wrong type" || refused_disposition,
                        "{key} {case}: {e}"
                    );
                    let named = e.contains(key) || e.contains("resume disposition");
                    assert!(named && !e.contains('\n'), "{key} {case}: names it: {e}");
                }
            }
        }
    }
}
