//! `events.jsonl`: one snapshot per event kind.
//!
//! The runner's and monitor's events are appended through
//! `status::events::append` with the fields `crates/supervisor/src/runner.rs`
//! and `monitor.rs` pass (to be replaced by the runner's own output once the
//! launcher has an injectable clock); `process_terminal` and `repaired_stale`
//! come from the status crate's own writers (`proof::finalize`,
//! `reconcile::reconcile_run`).

use serde_json::{Value, json};
use status::layout::files;
use status::model::{RunState, RunStatus, Step, write_status};
use status::proof::{self, ProofState, RunnerClose};
use status::{LIFECYCLE_ARTIFACT_VERSION, PROMPT_REDACTED, events, reconcile};

use super::{Artifact, Kind, PID, Scratch, T0};

const FAMILY: &str = "events";
const RUN: &str = "run-7f3a";
const RUNNER: &str = "00000000-0000-4000-8000-00000000a001";

/// One artifact per event kind.
pub(super) fn artifacts() -> anyhow::Result<Vec<Artifact>> {
    let scratch = Scratch::new()?;
    let appended: [(&str, &str, Value); 14] = [
        (
            "run-started",
            "subagent.run.started",
            json!({"lifecycleArtifactVersion": LIFECYCLE_ARTIFACT_VERSION, "mode": "chain",
                "cwd": "/work/project", "pid": PID, "task": PROMPT_REDACTED, "goal": PROMPT_REDACTED}),
        ),
        (
            "run-started-session-root",
            "subagent.run.started",
            json!({"lifecycleArtifactVersion": LIFECYCLE_ARTIFACT_VERSION, "mode": "single",
                "cwd": "/work/project", "pid": PID, "sessionRoot": "/home/alice/.pi/agent/sessions/proj",
                "task": PROMPT_REDACTED, "goal": PROMPT_REDACTED}),
        ),
        (
            "run-started-blank-task",
            "subagent.run.started",
            json!({"lifecycleArtifactVersion": LIFECYCLE_ARTIFACT_VERSION, "mode": "single",
                "cwd": "/work/project", "pid": PID}),
        ),
        (
            "parallel-started",
            "subagent.parallel.started",
            json!({"stepIndex": 0, "agents": ["scout", "reviewer"], "count": 2}),
        ),
        (
            "parallel-completed",
            "subagent.parallel.completed",
            json!({"stepIndex": 0, "success": true}),
        ),
        (
            "step-started",
            "subagent.step.started",
            json!({"stepIndex": 1, "agent": "worker"}),
        ),
        (
            "step-started-named-agent",
            "subagent.step.started",
            json!({"stepIndex": 0, "agent": "reviewer", "agentRunner": "claude",
                "agentSessionId": "5a4b7c1e-0000-4000-8000-00000000c001"}),
        ),
        (
            "step-stalled",
            "subagent.step.stalled",
            json!({"stepIndex": 1, "agent": "lint", "idleTimeoutMs": 120_000, "lastOutputAt": T0 + 3_000}),
        ),
        (
            "step-completed",
            "subagent.step.completed",
            json!({"stepIndex": 1, "agent": "worker", "exitCode": 0, "durationMs": 4200, "tokens": null}),
        ),
        (
            "step-failed",
            "subagent.step.failed",
            json!({"stepIndex": 1, "agent": "worker", "exitCode": 3, "durationMs": 4200, "tokens": null}),
        ),
        (
            "step-stopped",
            "subagent.step.stopped",
            json!({"stepIndex": 1, "agent": "worker", "exitCode": null, "durationMs": 900, "tokens": null}),
        ),
        (
            "run-stopped",
            "subagent.run.stopped",
            json!({"message": "Subagent stopped by user."}),
        ),
        (
            "run-timed-out",
            "subagent.run.timed_out",
            json!({"timeoutMs": 60000, "deadlineAt": T0 + 60_000,
                "message": "Subagent timed out after 60000ms."}),
        ),
        (
            "run-completed",
            "subagent.run.completed",
            json!({"lifecycleArtifactVersion": LIFECYCLE_ARTIFACT_VERSION, "status": "complete",
                "durationMs": 61_000}),
        ),
    ];
    let mut out = Vec::new();
    for (case, kind, fields) in appended {
        let dir = run_dir(&scratch, case)?;
        events::append(&dir, kind, RUN, T0 + 1000, fields)?;
        out.push(
            scratch
                .record(FAMILY, case, Kind::Events, &dir.join(files::EVENTS))?
                .note(format!(
                    "`{kind}` with the fields the launcher's runner passes"
                )),
        );
    }
    out.push(process_terminal(&scratch)?);
    out.push(repaired_stale(&scratch)?);
    Ok(out)
}

fn run_dir(scratch: &Scratch, case: &str) -> anyhow::Result<std::path::PathBuf> {
    let dir = scratch.path().join(case).join(RUN);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// `subagent.run.process_terminal`, appended by `proof::finalize` for a run
/// whose runner left no candidate.
fn process_terminal(scratch: &Scratch) -> anyhow::Result<Artifact> {
    let dir = run_dir(scratch, "run-process-terminal")?;
    write_status(&dir, &RunStatus::new(RUN, RunState::Complete))?;
    let close = RunnerClose {
        process_instance_id: RUNNER.into(),
        close_observed_at: T0 + 5000,
        exit_code: Some(0),
        signal: None,
        observer: None,
    };
    let decided = proof::finalize(&dir, RUN, &close, &proof::no_leases, T0 + 6000);
    anyhow::ensure!(decided.state == ProofState::Unknown, "unexpected proof");
    Ok(scratch
        .record(
            FAMILY,
            "run-process-terminal",
            Kind::Events,
            &dir.join(files::EVENTS),
        )?
        .note("`subagent.run.process_terminal` appended by `status::proof::finalize`"))
}

/// `subagent.run.repaired_stale`, appended by `reconcile::reconcile_run` for
/// a running status whose runner identity names a process that cannot exist.
fn repaired_stale(scratch: &Scratch) -> anyhow::Result<Artifact> {
    let dir = run_dir(scratch, "run-repaired-stale")?;
    let mut status = RunStatus::new(RUN, RunState::Running);
    status.lifecycle_artifact_version = Some(LIFECYCLE_ARTIFACT_VERSION);
    status.pid = Some(dead_pid());
    status.runner_identity = Some(dead_identity());
    status.started_at = Some(T0);
    status.steps = Some(vec![Step {
        agent: "worker".into(),
        status: "running".into(),
        started_at: Some(T0),
        ..Step::default()
    }]);
    write_status(&dir, &status)?;
    let outcome = reconcile::reconcile_run(&dir, reconcile::Options::at(T0 + 9000))?;
    anyhow::ensure!(
        matches!(outcome, reconcile::Outcome::Repaired { .. }),
        "the stale run was not repaired"
    );
    Ok(scratch
        .record(
            FAMILY,
            "run-repaired-stale",
            Kind::Events,
            &dir.join(files::EVENTS),
        )?
        .note("`subagent.run.repaired_stale` appended by `status::reconcile::reconcile_run`"))
}

/// A pid above Linux's `pid_max` ceiling (2^22), so no process can hold it.
pub(super) fn dead_pid() -> u32 {
    99_999_999
}

/// An identity from another boot, which every reader judges dead.
pub(super) fn dead_identity() -> process_identity::ProcessIdentity {
    process_identity::ProcessIdentity {
        pid: dead_pid(),
        start_time: 1,
        boot_id: Some("00000000-0000-0000-0000-00000000b007".into()),
        // A record of a past boot with no machine id (as written before
        // identities named the machine): dead on its boot id alone.
        machine_id: None,
        host: None,
    }
}
