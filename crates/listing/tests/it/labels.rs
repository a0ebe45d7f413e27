//! The short texts every view builds a run's lines from, each at its
//! edges: the executor line of a dispatched run, the queue labels, step
//! numbers, which steps never ran, the command label's cut, and the step
//! states a listing's JSON carries.

use std::path::Path;

use listing::format::{
    command_label, dispatch_line, never_ran, queue_label, state_with_queue, step_number,
};
use listing::list::RunSummary;
use serde_json::{Value, json};
use status::RunState;
use status::model::{RunStatus, parse_status};

fn status(value: Value) -> RunStatus {
    parse_status(Path::new("status.json"), &value.to_string()).unwrap()
}

fn dispatched(view: Value) -> Option<String> {
    dispatch_line(&status(
        json!({"runId": "r", "state": "running", "dispatch": view}),
    ))
}

#[test]
fn a_dispatched_run_names_its_job_cluster_node_and_slurm_state() {
    assert_eq!(
        dispatched(
            json!({"executor": "slurm", "jobId": "12", "cluster": "c1", "node": "n1",
            "slurmState": "PENDING", "slurmReason": "Resources"})
        ),
        Some("slurm job 12 of c1 on n1 (PENDING: Resources)".to_owned())
    );
    assert_eq!(
        dispatched(json!({"executor": "slurm", "jobId": "13", "slurmState": "RUNNING"})),
        Some("slurm job 13 (RUNNING)".to_owned())
    );
    // A reason without a state says nothing on its own.
    assert_eq!(
        dispatched(json!({"executor": "slurm", "jobId": "14", "slurmReason": "Priority"})),
        Some("slurm job 14".to_owned())
    );
}

#[test]
fn a_run_without_a_whole_dispatch_view_has_no_executor_line() {
    assert_eq!(
        dispatch_line(&status(json!({"runId": "r", "state": "running"}))),
        None
    );
    assert_eq!(dispatched(json!({"executor": "slurm"})), None);
    assert_eq!(dispatched(json!({"jobId": "12"})), None);
    assert_eq!(dispatched(json!({"executor": "slurm", "jobId": 12})), None);
}

#[test]
fn a_queued_run_shows_its_place_in_line_or_that_it_waits() {
    let queued =
        |wait: Value| status(json!({"runId": "r", "state": "queued", "queuedForSlot": wait}));
    let placed = queued(json!({"since": 5, "position": 2}));
    assert_eq!(queue_label(&placed), Some("queue position 2".to_owned()));
    assert_eq!(state_with_queue(&placed), "queued #2");
    let unplaced = queued(json!({"since": 5}));
    assert_eq!(
        queue_label(&unplaced),
        Some("waiting for a capacity slot".to_owned())
    );
    assert_eq!(state_with_queue(&unplaced), "queued");
}

#[test]
fn a_run_not_waiting_for_a_slot_has_no_queue_label() {
    let plain = status(json!({"runId": "r", "state": "queued"}));
    assert_eq!(queue_label(&plain), None);
    assert_eq!(state_with_queue(&plain), "queued");
    // A running run's leftover wait record is no place in line.
    let running = status(json!({"runId": "r", "state": "running",
        "queuedForSlot": {"since": 5, "position": 1}}));
    assert_eq!(queue_label(&running), None);
    assert_eq!(state_with_queue(&running), "running");
}

#[test]
fn step_numbers_count_from_one_and_never_out_of_zero() {
    assert_eq!(step_number(0, 3), "1/3");
    assert_eq!(step_number(2, 3), "3/3");
    assert_eq!(step_number(0, 0), "1/1");
}

#[test]
fn only_a_step_of_a_finished_run_that_never_started_never_ran() {
    let step = |value: Value| {
        status(json!({"runId": "r", "state": "failed", "steps": [value]})).steps()[0].clone()
    };
    let pending = step(json!({"agent": "a", "status": "pending"}));
    assert!(never_ran(&pending, RunState::Failed));
    assert!(never_ran(&pending, RunState::Complete));
    // A paused run's pending step may still run; an active run's will.
    assert!(!never_ran(&pending, RunState::Paused));
    assert!(!never_ran(&pending, RunState::Running));
    for started in [
        json!({"agent": "a", "status": "failed", "startedAt": 3}),
        json!({"agent": "a", "status": "failed", "durationMs": 4}),
        json!({"agent": "a", "status": "complete"}),
        json!({"agent": "a", "status": "running"}),
    ] {
        assert!(
            !never_ran(&step(started.clone()), RunState::Failed),
            "{started}"
        );
    }
}

#[test]
fn a_command_label_cuts_only_an_argument_longer_than_24_characters() {
    let argv = |arg: &str| vec!["echo".to_owned(), arg.to_owned()];
    let exact = "a".repeat(24);
    assert_eq!(command_label(&argv(&exact)), format!("echo {exact}"));
    let longer = "b".repeat(25);
    assert_eq!(
        command_label(&argv(&longer)),
        format!("echo {}…", "b".repeat(24))
    );
}

#[test]
fn a_listing_shows_a_step_that_never_ran_as_skipped_and_keeps_the_others() {
    let summary = |value: Value| RunSummary {
        id: "r".into(),
        async_dir: "/runs/r".into(),
        status: status(value),
    };
    let states = |run: &RunSummary| -> Vec<Value> {
        let json = serde_json::to_value(run).unwrap();
        json["steps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["status"].clone())
            .collect()
    };
    let failed = summary(json!({"runId": "r", "state": "failed", "steps": [
        {"agent": "a", "status": "failed", "startedAt": 3},
        {"agent": "b", "status": "pending"}]}));
    assert_eq!(states(&failed), [json!("failed"), json!("skipped")]);
    // Every step changed: none keeps its recorded state.
    let stopped = summary(json!({"runId": "r", "state": "stopped", "steps": [
        {"agent": "a", "status": "pending"},
        {"agent": "b", "status": "pending"}]}));
    assert_eq!(states(&stopped), [json!("skipped"), json!("skipped")]);
    let complete = summary(json!({"runId": "r", "state": "complete", "steps": [
        {"agent": "a", "status": "complete", "startedAt": 3},
        {"agent": "b", "status": "complete", "startedAt": 4}]}));
    assert_eq!(states(&complete), [json!("complete"), json!("complete")]);
}
