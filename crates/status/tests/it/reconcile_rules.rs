//! Stale-run reconciliation of our own records (they carry a process
//! identity): who may declare a run stale, after how long, what the repair
//! writes, and the runner's stderr tail in its message.

use process_identity::ProcessIdentity;
use serde_json::json;
use status::model::{RunState, RunStatus, Step, write_status};
use status::proof::{ProcessTerminal, ProofState};
use status::reconcile::{Options, Outcome, reconcile_run, repair, stale_message};

const DAY: u64 = 24 * 60 * 60 * 1000;

fn dead_identity() -> ProcessIdentity {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let identity = ProcessIdentity::of(child.id()).unwrap();
    child.wait().unwrap();
    identity
}

fn me() -> ProcessIdentity {
    ProcessIdentity::current().unwrap()
}

fn status(state: RunState) -> RunStatus {
    let mut status = RunStatus::new("r1", state);
    // Distinct from the last update: an age counted from the start fails.
    status.started_at = Some(400);
    status.last_update = Some(1_000);
    status
}

fn stale_at(status: &RunStatus, now: u64) -> Option<String> {
    stale_message(status, Options::at(now))
}

#[test]
fn a_finished_or_dismissed_run_is_never_stale() {
    for state in [RunState::Complete, RunState::Failed, RunState::Stopped] {
        let mut s = status(state);
        s.runner_identity = Some(dead_identity());
        assert_eq!(stale_at(&s, 10 * DAY), None, "{state}");
    }
    let mut dismissed = status(RunState::Running);
    dismissed.runner_identity = Some(dead_identity());
    dismissed.display_dismissed_at = Some(2_000);
    assert_eq!(stale_at(&dismissed, 10 * DAY), None);
}

#[test]
fn a_live_monitor_repairs_the_run_itself() {
    let mut s = status(RunState::Running);
    s.runner_identity = Some(dead_identity());
    s.monitor_identity = Some(me());
    assert_eq!(stale_at(&s, 2_000), None, "the monitor is alive");
    s.monitor_identity = Some(dead_identity());
    let message = stale_at(&s, 2_000).unwrap();
    assert!(message.contains("exited or disappeared"), "{message}");
}

#[test]
fn a_pid_without_a_runner_identity_is_trusted_for_a_day() {
    // Our record (a launcher identity) whose runner left only its pid.
    let mut s = status(RunState::Running);
    s.launcher_identity = Some(me());
    s.pid = Some(dead_identity().pid);
    let pid = s.pid.unwrap();
    assert_eq!(
        stale_at(&s, 1_001).unwrap(),
        format!(
            "Async runner process {pid} exited or disappeared before writing a result. Marked run failed by stale-run reconciliation."
        )
    );
    s.pid = Some(std::process::id());
    assert_eq!(stale_at(&s, 2_000), None);
    assert_eq!(stale_at(&s, 1_000 + DAY), None, "exactly a day");
    let message = stale_at(&s, 1_001 + DAY).unwrap();
    assert!(
        message.contains(&format!("has not updated for {}ms", DAY + 1)),
        "{message}"
    );
    // Without a last update the age counts from the start.
    s.last_update = None;
    assert_eq!(stale_at(&s, 400 + DAY), None, "a day after the start");
    assert!(stale_at(&s, 401 + DAY).is_some());
}

#[test]
fn only_a_queued_record_is_judged_by_its_launcher() {
    let mut queued = status(RunState::Queued);
    queued.launcher_identity = Some(me());
    assert_eq!(stale_at(&queued, 10 * DAY), None, "its launcher is alive");
    queued.launcher_identity = Some(dead_identity());
    assert_eq!(stale_at(&queued, 31_000), None, "exactly the grace");
    assert!(stale_at(&queued, 31_001).is_some());
    let mut running = status(RunState::Running);
    running.launcher_identity = Some(dead_identity());
    assert_eq!(
        stale_at(&running, 10 * DAY),
        None,
        "a running record without runner or pid is not the launcher's to judge"
    );
}

#[test]
fn outcomes_carry_the_status_after_reconciliation() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("r1");
    std::fs::create_dir(&dir).unwrap();
    assert!(
        reconcile_run(&dir, Options::at(1))
            .unwrap()
            .status()
            .is_none()
    );
    let mut s = status(RunState::Running);
    s.runner_identity = Some(me());
    write_status(&dir, &s).unwrap();
    let unchanged = reconcile_run(&dir, Options::at(2_000)).unwrap();
    assert_eq!(unchanged.status(), Some(&s));
    s.runner_identity = Some(dead_identity());
    write_status(&dir, &s).unwrap();
    let repaired = reconcile_run(&dir, Options::at(2_000)).unwrap();
    assert!(matches!(repaired, Outcome::Repaired { .. }));
    assert_eq!(repaired.status().unwrap().state, RunState::Failed);
}

#[test]
fn the_repair_downgrades_only_a_pending_lifecycle_3_proof() {
    let pending = ProcessTerminal::new(ProofState::Pending, "r1", "i1").to_value();
    let observed = json!({"version": 1, "state": "observed", "runId": "r1",
                          "runnerProcessInstanceId": "i1"});
    let mut s = status(RunState::Running);
    s.lifecycle_artifact_version = Some(3);
    s.process_terminal = Some(observed.clone());
    assert_eq!(
        repair(s.clone(), "gone", 5).process_terminal,
        Some(observed),
        "a proof that is not pending stays"
    );
    s.lifecycle_artifact_version = None;
    s.process_terminal = Some(pending.clone());
    assert_eq!(
        repair(s.clone(), "gone", 5).process_terminal,
        Some(pending),
        "not a lifecycle-3 record"
    );
    s.lifecycle_artifact_version = Some(3);
    s.process_terminal = None;
    let proof = repair(s, "gone", 5).process_terminal.unwrap();
    assert_eq!(
        proof,
        json!({"version": 1, "state": "unknown", "runId": "r1",
               "runnerProcessInstanceId": "observer-unavailable", "reason": "stale-repair"})
    );
}

#[test]
fn a_run_without_steps_gets_one_failed_subagent_step() {
    let repaired = repair(status(RunState::Running), "gone", 5);
    assert_eq!(
        repaired.steps(),
        [Step {
            agent: "subagent".into(),
            status: "failed".into(),
            ended_at: Some(5),
            exit_code: Some(1),
            error: Some("gone".into()),
            ..Step::default()
        }]
    );
    assert_eq!(repaired.state, RunState::Failed);
    assert_eq!(
        (repaired.last_update, repaired.ended_at),
        (Some(5), Some(5))
    );
}

/// Repairs a run with a dead runner whose stderr log holds `stderr`; the message.
fn repaired_message(stderr: &str) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut s = status(RunState::Running);
    s.runner_identity = Some(dead_identity());
    write_status(dir, &s).unwrap();
    std::fs::write(dir.join("runner.stderr.log"), stderr).unwrap();
    match reconcile_run(dir, Options::at(2_000)).unwrap() {
        Outcome::Repaired { message, .. } => message,
        other => panic!("not repaired: {other:?}"),
    }
}

fn tail_of(message: &str) -> &str {
    message.split_once("\n\nRunner stderr tail:\n").unwrap().1
}

fn lines(n: usize, width: usize) -> Vec<String> {
    (0..n).map(|i| format!("{i:0width$}")).collect()
}

#[test]
fn the_stderr_tail_is_its_last_30_lines() {
    let all = lines(40, 100);
    let message = repaired_message(&(all.join("\n") + "\n"));
    assert_eq!(tail_of(&message), all[10..].join("\n"));
}

#[test]
fn a_stderr_tail_over_4000_characters_keeps_its_end() {
    // 30 lines of 150 characters: 4529 characters with the newlines.
    let all = lines(30, 150).join("\n");
    let message = repaired_message(&all);
    let kept: String = all.chars().skip(all.chars().count() - 4000).collect();
    assert_eq!(
        tail_of(&message),
        format!("{kept}\n[stderr tail truncated]")
    );
    // Exactly 4000 characters are kept whole.
    let exact = "y".repeat(4000);
    assert_eq!(tail_of(&repaired_message(&exact)), exact);
}
