//! Release verdicts through reconcile and inspect, on real run directories.

use std::collections::HashSet;
use std::fs;

use serde_json::json;

use super::support::*;
use crate::runfiles::fixtures::write_proof;
use crate::{InspectQuery, Inspection, Kind, Relation, ReleaseState};

fn inspect(fx: &Fixture, run_id: &str, live: &HashSet<String>) -> Inspection {
    let query = InspectQuery {
        run_id,
        session_id: None,
        async_dir: None,
    };
    fx.cap.inspect(&query, live).unwrap()
}

fn verdict(fx: &Fixture, run_id: &str) -> (ReleaseState, String) {
    let seen = inspect(fx, run_id, &fx.none_live);
    (seen.release.state, seen.release.reason)
}

fn retained(reason: &str) -> (ReleaseState, String) {
    (ReleaseState::Retained, reason.to_owned())
}

#[test]
fn an_observed_proof_releases_and_nothing_less_does() {
    let fx = Fixture::new();
    let mut handle = fx.acquire("run-a", 2);
    assert_eq!(
        verdict(&fx, "run-a"),
        retained("status file is missing or unreadable")
    );
    handle.mark_started("rid-a").unwrap();
    let dir = fx.write_status("run-a", "running", "rid-a");
    assert_eq!(verdict(&fx, "run-a"), retained("run is still running"));

    fx.write_status("run-a", "complete", "rid-a");
    assert_eq!(
        verdict(&fx, "run-a"),
        retained("process-terminal proof is missing")
    );
    write_proof(&dir, "pending", "run-a", "rid-a");
    assert_eq!(fx.reconcile(2).used, 1, "a pending proof keeps the slot");
    write_proof(&dir, "observed", "run-a", "other-runner");
    assert_eq!(
        verdict(&fx, "run-a"),
        retained("process-terminal proof is unknown")
    );
    assert_eq!(fx.reconcile(2).used, 1);

    write_proof(&dir, "observed", "run-a", "rid-a");
    let seen = inspect(&fx, "run-a", &fx.none_live);
    assert_eq!(seen.relation, Relation::Current);
    assert_eq!(seen.release.state, ReleaseState::Releasable);
    assert_eq!(
        seen.release.reason,
        "matching observed process-terminal proof is present"
    );
    assert!(handle.slot_dir().exists(), "inspect never removes");
    assert_eq!(fx.reconcile(2).used, 0);
    assert!(!handle.slot_dir().exists());
    let none = inspect(&fx, "run-a", &fx.none_live);
    assert_eq!(none.relation, Relation::None);
    assert_eq!(
        none.release.reason,
        "no active-capacity slot records this run"
    );
}

#[test]
fn an_unbound_runner_of_a_live_reserver_is_retained() {
    let fx = Fixture::new();
    let _handle = fx.acquire("run-a", 1);
    fx.write_status("run-a", "complete", "rid-a");
    assert_eq!(
        verdict(&fx, "run-a"),
        retained("runner process identity has not been recorded")
    );
}

#[test]
fn identity_mismatches_are_retained() {
    let fx = Fixture::new();
    let mut handle = fx.acquire("run-a", 1);
    handle.mark_started("rid-a").unwrap();
    let dir = fx.write_status("run-a", "complete", "rid-a");
    let mut status = read_json(&dir.join("status.json"));
    status["runId"] = json!("run-z");
    write_json(&dir.join("status.json"), &status);
    assert_eq!(
        verdict(&fx, "run-a"),
        retained("status run run-z does not match owner run run-a")
    );
    status.as_object_mut().unwrap().remove("sessionId");
    write_json(&dir.join("status.json"), &status);
    assert_eq!(
        verdict(&fx, "run-a"),
        retained(&format!(
            "status session unknown does not match owner session {SESSION}"
        ))
    );
    fs::write(dir.join("status.json"), "{broken").unwrap();
    let (state, reason) = verdict(&fx, "run-a");
    assert_eq!(state, ReleaseState::Retained);
    assert!(
        reason.starts_with("status file is missing or unreadable: failed to parse"),
        "{reason}"
    );
}

fn write_not_started(fx: &Fixture, run_id: &str, runner: &str, error: Option<&str>) {
    let dir = fx.run_dir(run_id);
    let mut status = json!({
        "runId": run_id,
        "sessionId": SESSION,
        "state": "failed",
        "processTerminal": {"version": 1, "state": "not-started", "runId": run_id, "runnerProcessInstanceId": runner},
    });
    if let Some(error) = error {
        status["error"] = json!(error);
    }
    write_json(&dir.join("status.json"), &status);
}

#[test]
fn a_not_started_failure_releases_only_with_an_error() {
    let fx = Fixture::new();
    let mut handle = fx.acquire("run-a", 1);
    handle.mark_started("rid-a").unwrap();
    write_not_started(&fx, "run-a", "rid-a", None);
    assert_eq!(fx.reconcile(1).used, 1, "no error: kept");
    assert_eq!(
        verdict(&fx, "run-a"),
        retained("process-terminal proof is missing")
    );
    write_not_started(&fx, "run-a", "another-runner", Some("Timed out"));
    assert_eq!(fx.reconcile(1).used, 1, "other runner: kept");
    write_not_started(&fx, "run-a", "rid-a", Some("Timed out"));
    assert_eq!(
        verdict(&fx, "run-a"),
        (
            ReleaseState::Releasable,
            "run failed before child startup completed".to_owned()
        )
    );
    assert_eq!(fx.reconcile(1).used, 0);
}

#[test]
fn a_transferred_revival_that_failed_before_startup_is_released() {
    let fx = Fixture::new();
    let mut source = fx.acquire("run-a", 1);
    source.mark_started("rid-a").unwrap();
    let source_dir = fx.write_status("run-a", "complete", "rid-a");
    write_proof(&source_dir, "observed", "run-a", "rid-a");
    let mut revival = fx.transfer("run-a", "run-b", Some(1)).unwrap().unwrap();
    revival.mark_started("rid-b").unwrap();
    assert_eq!(
        fx.reconcile(1).used,
        1,
        "the source's old proof does not free the revival"
    );
    write_not_started(&fx, "run-b", "rid-b", Some("runner wrote an error"));
    assert_eq!(fx.reconcile(1).used, 0);
}

#[test]
fn an_abandoned_reservation_is_released_once_its_reserver_is_dead() {
    let fx = Fixture::new();
    let handle = fx.acquire("run-a", 1);
    let owner_path = handle.slot_dir().join("owner.json");
    let mut owner = read_json(&owner_path);
    owner["reservedByProcess"] = json!(dead_identity());
    write_json(&owner_path, &owner);
    // A runner trace means a runner may exist: keep the slot.
    let dir = fx.run_dir("run-a");
    fs::write(dir.join("runner-startup.json"), "{}").unwrap();
    assert_eq!(fx.reconcile(1).used, 1);
    fs::remove_file(dir.join("runner-startup.json")).unwrap();
    let (state, reason) = verdict(&fx, "run-a");
    assert_eq!(state, ReleaseState::Releasable);
    assert!(
        reason.contains("died before a runner was bound"),
        "{reason}"
    );
    assert_eq!(fx.reconcile(1).used, 0);
}

#[test]
fn a_dead_reserver_whose_runner_finished_is_released_by_the_runners_proof() {
    let fx = Fixture::new();
    let handle = fx.acquire("run-a", 1);
    let owner_path = handle.slot_dir().join("owner.json");
    let mut owner = read_json(&owner_path);
    owner["reservedByProcess"] = json!(dead_identity());
    write_json(&owner_path, &owner);
    let dir = fx.write_status("run-a", "complete", "rid-a");
    assert_eq!(
        verdict(&fx, "run-a"),
        retained("process-terminal proof is missing")
    );
    write_proof(&dir, "observed", "run-a", "rid-a");
    assert_eq!(fx.reconcile(1).used, 0);
}

fn write_workflow(fx: &Fixture, run_id: &str, state: &str, steps: serde_json::Value) {
    let dir = fx.run_dir(run_id);
    let status = json!({"runId": run_id, "sessionId": SESSION, "mode": "workflow", "state": state, "steps": steps});
    write_json(&dir.join("status.json"), &status);
}

#[test]
fn a_workflow_is_released_when_its_controller_is_gone_and_children_are_proven() {
    let fx = Fixture::new();
    let mut handle = fx.acquire_kind("wf", 1, Kind::Workflow).unwrap().unwrap();
    handle.mark_workflow_started().unwrap();
    let child_step = json!([
        {"agent": "scout", "status": "failed", "async": false},
        {"agent": "worker", "workflowKey": "build", "status": "complete", "async": true, "runId": "child-1"},
    ]);
    write_workflow(&fx, "wf", "running", child_step.clone());
    assert_eq!(verdict(&fx, "wf"), retained("workflow is still running"));
    write_workflow(&fx, "wf", "complete", child_step);
    let live: HashSet<String> = ["wf".to_owned()].into();
    let seen = inspect(&fx, "wf", &live);
    assert_eq!(seen.release.reason, "workflow controller is still live");

    assert_eq!(
        verdict(&fx, "wf"),
        retained("async workflow child build directory is missing")
    );
    let child_dir = fx.run_dir("child-1");
    assert_eq!(
        verdict(&fx, "wf"),
        retained("async workflow child build status is missing or unreadable")
    );
    write_not_started(&fx, "child-1", "rid-c", Some("failed before proceed"));
    assert_eq!(
        verdict(&fx, "wf"),
        retained("async workflow child build process-terminal proof is missing")
    );
    write_proof(&child_dir, "unknown", "child-1", "rid-c");
    assert_eq!(fx.reconcile(1).used, 1);
    write_proof(&child_dir, "observed", "child-1", "rid-c");
    assert_eq!(
        verdict(&fx, "wf").0,
        ReleaseState::Releasable,
        "all children proven"
    );
    assert_eq!(fx.cap.reconcile(SESSION, Some(1), &live).unwrap().used, 1);
    assert_eq!(fx.reconcile(1).used, 0);
}

#[test]
fn workflow_steps_block_release_in_order() {
    let fx = Fixture::new();
    let _handle = fx.acquire_kind("wf", 1, Kind::Workflow).unwrap().unwrap();
    let cases = [
        (
            json!([{"agent": "a", "status": "running", "async": true}]),
            "workflow child a is still running",
        ),
        (
            json!([{"agent": "a", "status": "complete"}]),
            "workflow child a is missing async classification",
        ),
        (
            json!([{"agent": "a", "status": "complete", "async": true}]),
            "async workflow child a is missing run id",
        ),
        (
            json!([{"agent": "a", "status": "complete", "async": true, "runId": "nope"}]),
            "async workflow child a directory is missing",
        ),
    ];
    for (steps, reason) in cases {
        write_workflow(&fx, "wf", "failed", steps);
        assert_eq!(verdict(&fx, "wf"), retained(reason));
    }
    write_workflow(
        &fx,
        "wf",
        "failed",
        json!([{"agent": "a", "status": "failed", "async": false}]),
    );
    assert_eq!(verdict(&fx, "wf").0, ReleaseState::Releasable);
    let dir = fx.run_dir("wf");
    let mut status = read_json(&dir.join("status.json"));
    status["mode"] = json!("chain");
    write_json(&dir.join("status.json"), &status);
    assert_eq!(
        verdict(&fx, "wf"),
        retained("status mode is chain, not workflow")
    );
}

#[test]
fn a_failed_run_whose_reserver_died_before_any_runner_is_released() {
    let fx = Fixture::new();
    let handle = fx.acquire("run-a", 1);
    let owner_path = handle.slot_dir().join("owner.json");
    let dir = fx.run_dir("run-a");
    // What stale repair leaves of a queued run: failed, no proof, no runner.
    let status =
        json!({"runId": "run-a", "sessionId": SESSION, "mode": "single", "state": "failed"});
    write_json(&dir.join("status.json"), &status);
    assert_eq!(
        verdict(&fx, "run-a"),
        retained("runner process identity has not been recorded"),
        "the reserver is alive (this process)"
    );
    let mut owner = read_json(&owner_path);
    owner["reservedByProcess"] = json!(dead_identity());
    write_json(&owner_path, &owner);
    let (state, reason) = verdict(&fx, "run-a");
    assert_eq!(state, ReleaseState::Releasable, "{reason}");
    assert!(reason.contains("run is failed without one"), "{reason}");
    // A runner pid in the status means a runner existed: its proof decides.
    let mut with_runner = status.clone();
    with_runner["pid"] = json!(1);
    write_json(&dir.join("status.json"), &with_runner);
    assert_eq!(
        verdict(&fx, "run-a"),
        retained("runner process identity has not been recorded")
    );
    // Still queued: a monitor may be starting it.
    let mut queued = status.clone();
    queued["state"] = json!("queued");
    write_json(&dir.join("status.json"), &queued);
    assert_eq!(fx.reconcile(1).used, 1);
    write_json(&dir.join("status.json"), &status);
    assert_eq!(fx.reconcile(1).used, 0);
}

#[test]
fn reconcile_frees_only_slots_recording_this_session() {
    let fx = Fixture::new();
    let mut handle = fx.acquire("run-a", 2);
    handle.mark_started("rid-a").unwrap();
    // The slot's record and the run's status both name another session:
    // releasable for that session, but not a slot this session's reconcile
    // may free, although it sits in this session's pool.
    let owner_path = handle.slot_dir().join("owner.json");
    let mut owner = read_json(&owner_path);
    owner["ownerSessionId"] = json!("/home/u/.pi/sessions/other.jsonl");
    write_json(&owner_path, &owner);
    let dir = fx.write_status("run-a", "complete", "rid-a");
    let mut status = read_json(&dir.join("status.json"));
    status["sessionId"] = json!("/home/u/.pi/sessions/other.jsonl");
    write_json(&dir.join("status.json"), &status);
    write_proof(&dir, "observed", "run-a", "rid-a");
    assert_eq!(verdict(&fx, "run-a").0, ReleaseState::Releasable);
    assert_eq!(fx.reconcile(2).used, 1);
    assert!(handle.slot_dir().exists());
}

#[test]
fn inspecting_all_pools_of_a_missing_or_broken_root() {
    let fx = Fixture::new();
    let seen = inspect(&fx, "run-a", &fx.none_live);
    assert_eq!(seen.relation, Relation::None);
    fs::write(fx.root(), "not a directory").unwrap();
    let query = InspectQuery {
        run_id: "run-a",
        session_id: None,
        async_dir: None,
    };
    let err = fx.cap.inspect(&query, &fx.none_live).unwrap_err();
    assert!(err.to_string().starts_with("failed to list "), "{err}");
}

#[test]
fn a_listing_frees_over_runs_and_passes_over_the_runs_it_listed_active() {
    let fx = Fixture::new();
    let mut a = fx.acquire("run-a", 3);
    a.mark_started("rid-a").unwrap();
    let mut b = fx.acquire("run-b", 3);
    b.mark_started("rid-b").unwrap();
    for (run, runner) in [("run-a", "rid-a"), ("run-b", "rid-b")] {
        let dir = fx.write_status(run, "complete", runner);
        write_proof(&dir, "observed", run, runner);
    }
    // Both are over; the caller read run-b as active a moment before it
    // ended, so its slot waits for the next reconcile.
    let listed: HashSet<String> = ["run-b".to_owned()].into();
    fx.cap.release_over(SESSION, &listed).unwrap();
    assert!(!a.slot_dir().exists(), "the over run's slot is freed");
    assert!(
        b.slot_dir().exists(),
        "the listed run's slot is passed over"
    );
    assert_eq!(fx.used(), 1);
    fx.cap.release_over(SESSION, &HashSet::new()).unwrap();
    assert_eq!(fx.used(), 0);
    // A session without a pool is left without one.
    fx.cap
        .release_over("/home/u/.pi/sessions/none.jsonl", &HashSet::new())
        .unwrap();
    assert_eq!(fs::read_dir(fx.root()).unwrap().count(), 1);
}

#[test]
fn a_finalizer_frees_its_runs_slot_and_no_other() {
    let fx = Fixture::new();
    let mut a = fx.acquire("run-a", 3);
    a.mark_started("rid-a").unwrap();
    let mut b = fx.acquire("run-b", 3);
    b.mark_started("rid-b").unwrap();
    for (run, runner) in [("run-a", "rid-a"), ("run-b", "rid-b")] {
        let dir = fx.write_status(run, "complete", runner);
        write_proof(&dir, "observed", run, runner);
    }
    let slot_b = b.owner().slot;
    // A wrong hint falls back to the run's own slot.
    assert!(fx.cap.release_run(SESSION, "run-a", Some(slot_b)).unwrap());
    assert!(!a.slot_dir().exists());
    assert!(b.slot_dir().exists(), "another run's slot stays");
    assert!(!fx.cap.release_run(SESSION, "run-a", None).unwrap());
    assert!(fx.cap.release_run(SESSION, "run-b", Some(slot_b)).unwrap());
    assert_eq!(fx.used(), 0);
    // A session without a pool is left without one.
    let none = "/home/u/.pi/sessions/none.jsonl";
    assert!(!fx.cap.release_run(none, "run-a", None).unwrap());
    assert_eq!(fs::read_dir(fx.root()).unwrap().count(), 1);
}

#[test]
fn a_run_over_before_its_launcher_bound_the_slot_is_freed_by_the_launcher() {
    let fx = Fixture::new();
    let mut handle = fx.acquire("run-a", 2);
    let dir = fx.write_status("run-a", "complete", "rid-a");
    assert!(!handle.release_if_over().unwrap(), "no proof yet");
    write_proof(&dir, "observed", "run-a", "rid-a");
    // The finalizer came first: the slot was not bound, its reserver lives.
    assert!(!fx.cap.release_run(SESSION, "run-a", None).unwrap());
    assert_eq!(fx.used(), 1);
    handle.mark_started("rid-a").unwrap();
    assert!(handle.release_if_over().unwrap());
    assert_eq!(fx.used(), 0);
    assert!(!handle.rollback().unwrap(), "nothing left to roll back");
}

#[test]
fn a_status_the_status_reader_refuses_keeps_the_slot_naming_the_file() {
    let fx = Fixture::new();
    let mut handle = fx.acquire("run-a", 1);
    handle.mark_started("rid-a").unwrap();
    let path = fx.run_dir("run-a").join("status.json");
    // Read field by field, each would be a run that failed before its
    // child started, which frees the slot; the status reader refuses them.
    let failed_early = |key: &str, value: serde_json::Value| {
        let mut status = json!({
            "runId": "run-a", "sessionId": SESSION, "mode": "single", "state": "failed",
            "error": "Timed out",
            "processTerminal": {"version": 1, "state": "not-started", "runId": "run-a",
                                "runnerProcessInstanceId": "rid-a"},
        });
        status[key] = value;
        status.to_string().into_bytes()
    };
    let cases: [(&str, Vec<u8>, &str); 5] = [
        ("malformed", b"{\"state\": \"failed\"".to_vec(), "EOF"),
        (
            "wrong-typed state",
            failed_early("state", json!(5)),
            "state:",
        ),
        (
            "not a run state",
            failed_early("state", json!("detached")),
            "state:",
        ),
        (
            "wrong-typed pid",
            failed_early("pid", json!("4242")),
            "pid:",
        ),
        (
            "wrong-typed steps",
            failed_early("steps", json!("none")),
            "steps:",
        ),
    ];
    for (what, bytes, field) in cases {
        atomic_file::write_private(&path, &bytes).unwrap();
        let (state, reason) = verdict(&fx, "run-a");
        assert_eq!(state, ReleaseState::Retained, "{what}: {reason}");
        let prefix = format!(
            "status file is missing or unreadable: failed to parse async status file '{}': ",
            path.display()
        );
        assert!(reason.starts_with(&prefix), "{what}: {reason}");
        assert!(reason[prefix.len()..].contains(field), "{what}: {reason}");
        assert_eq!(fx.reconcile(1).used, 1, "{what}");
    }
    // The same status well typed is read, and frees the slot.
    atomic_file::write_private(&path, &failed_early("pid", json!(4242))).unwrap();
    assert_eq!(
        verdict(&fx, "run-a"),
        (
            ReleaseState::Releasable,
            "run failed before child startup completed".to_owned()
        )
    );
}

#[test]
fn a_paused_run_keeps_its_slot_until_a_resume_takes_it_over() {
    use status::RunState;
    assert!(RunState::Paused.holds_capacity() && !RunState::Paused.is_active());
    let fx = Fixture::new();
    let mut source = fx.acquire("run-a", 1);
    source.mark_started("rid-a").unwrap();
    let dir = fx.write_status("run-a", "paused", "rid-a");
    // Its processes are gone, yet a resume may carry it on.
    write_proof(&dir, "observed", "run-a", "rid-a");
    assert_eq!(verdict(&fx, "run-a"), retained("run is still paused"));
    assert_eq!(fx.reconcile(1).used, 1);
    let revival = fx.transfer("run-a", "run-b", Some(1)).unwrap().unwrap();
    assert!(revival.is_transfer());
    assert_eq!(revival.owner().run_id, "run-b");
    assert_eq!(fx.used(), 1);

    let fx = Fixture::new();
    let _workflow = fx.acquire_kind("wf", 1, Kind::Workflow).unwrap().unwrap();
    let settled = json!([{"agent": "a", "status": "complete", "async": false}]);
    write_workflow(&fx, "wf", "paused", settled.clone());
    assert_eq!(verdict(&fx, "wf"), retained("workflow is still paused"));
    let paused_step =
        json!([{"agent": "a", "workflowKey": "review", "status": "paused", "async": false}]);
    write_workflow(&fx, "wf", "failed", paused_step);
    assert_eq!(
        verdict(&fx, "wf"),
        retained("workflow child review is still paused")
    );
    let child_dir = fx.write_status("child-p", "paused", "rid-p");
    write_proof(&child_dir, "observed", "child-p", "rid-p");
    let async_step =
        json!([{"agent": "a", "status": "complete", "async": true, "runId": "child-p"}]);
    write_workflow(&fx, "wf", "failed", async_step);
    assert_eq!(
        verdict(&fx, "wf"),
        retained("async workflow child a is still paused")
    );
    write_workflow(&fx, "wf", "failed", settled);
    assert_eq!(fx.reconcile(1).used, 0);
}

/// A `status.json` as the reference's runner writes it: its own keys
/// (camelCase), many this version does not model, steps with theirs.
fn reference_status(
    run_id: &str,
    mode: &str,
    runner: &str,
    steps: serde_json::Value,
) -> serde_json::Value {
    json!({
        "lifecycleArtifactVersion": 3,
        "runId": run_id,
        "toolCallId": "toolu_01RefCall",
        "sessionId": SESSION,
        "mode": mode,
        "context": "fresh",
        "isNested": false,
        "state": "complete",
        "activityState": "idle",
        "lastActivityAt": 1_700_000_000_400u64,
        "turnCount": 4,
        "toolCount": 9,
        "steering": {"pending": 0, "delivered": []},
        "startedAt": 1_700_000_000_000u64,
        "endedAt": 1_700_000_000_500u64,
        "lastUpdate": 1_700_000_000_520u64,
        "turnBudget": {"used": 4, "limit": 40},
        "pid": 31337,
        "cwd": "/home/u/project",
        "currentStep": 0,
        "chainStepCount": 1,
        "checkpoint": null,
        "workflowGraph": {"nodes": [{"id": "n0"}], "edges": []},
        "launchContractDigest": "sha256:0f0f",
        "capabilityAudit": {"granted": ["read"], "denied": []},
        "processTerminal": {"version": 1, "state": "pending", "runId": run_id,
                            "runnerProcessInstanceId": runner},
        "steps": steps,
    })
}

#[test]
fn a_status_the_reference_wrote_is_read() {
    let fx = Fixture::new();
    let mut handle = fx.acquire("run-r", 2);
    handle.mark_started("rid-r").unwrap();
    let dir = fx.run_dir("run-r");
    let step = json!([{
        "agent": "worker", "status": "complete", "context": "fresh",
        "description": "[prompt redacted]", "startedAt": 1_700_000_000_010u64,
        "endedAt": 1_700_000_000_490u64, "durationMs": 480, "exitCode": 0,
        "runner": {"kind": "pi", "model": "m-1"}, "tokens": {"input": 10, "output": 3},
    }]);
    write_json(
        &dir.join("status.json"),
        &reference_status("run-r", "single", "rid-r", step),
    );
    assert_eq!(
        verdict(&fx, "run-r"),
        retained("process-terminal proof is missing")
    );
    write_proof(&dir, "observed", "run-r", "rid-r");
    assert_eq!(
        verdict(&fx, "run-r"),
        (
            ReleaseState::Releasable,
            "matching observed process-terminal proof is present".to_owned()
        )
    );

    // A workflow's steps: its child is named by the step's `workflowKey`
    // and found by its `runId`, keys this version keeps as the reference's.
    let mut workflow = fx.acquire_kind("wf-r", 2, Kind::Workflow).unwrap().unwrap();
    workflow.mark_workflow_started().unwrap();
    let wf_step = json!([{
        "agent": "builder", "workflowKey": "compile", "status": "complete", "async": true,
        "runId": "child-r", "context": "fork", "runner": {"kind": "pi"},
    }]);
    let wf_dir = fx.run_dir("wf-r");
    write_json(
        &wf_dir.join("status.json"),
        &reference_status("wf-r", "workflow", "rid-w", wf_step),
    );
    let child_dir = fx.run_dir("child-r");
    write_json(
        &child_dir.join("status.json"),
        &reference_status("child-r", "single", "rid-c", json!([])),
    );
    assert_eq!(
        verdict(&fx, "wf-r"),
        retained("async workflow child compile process-terminal proof is missing")
    );
    write_proof(&child_dir, "observed", "child-r", "rid-c");
    assert_eq!(
        verdict(&fx, "wf-r"),
        (
            ReleaseState::Releasable,
            "workflow is terminal, controller is gone, and async children have observed proof"
                .to_owned()
        )
    );
    assert_eq!(fx.reconcile(2).used, 0);
}
