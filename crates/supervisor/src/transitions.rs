//! Every change the launcher's processes make to `status.json`, as pure
//! functions of the current status and injected facts (time, identities).
//!
//! The runner, the launcher and `cargo xtask snapshots` call the same
//! functions, so a snapshot records exactly what a real run writes.

use process_identity::ProcessIdentity;
use serde_json::{Value, json};
use status::model::ExternalProcess;
use status::proof::{ProcessTerminal, ProofState};
use status::{LIFECYCLE_ARTIFACT_VERSION, PROMPT_REDACTED, RunState, RunStatus, Step};

use crate::config::LaunchConfig;

/// `output-<i>.log` of a run.
pub fn output_path(config: &LaunchConfig, step: usize) -> std::path::PathBuf {
    config.run_dir.join(format!("output-{step}.log"))
}

/// `external-<i>.<stream>.log` of a run.
pub fn log_path(config: &LaunchConfig, step: usize, stream: &str) -> std::path::PathBuf {
    config.run_dir.join(format!("external-{step}.{stream}.log"))
}

/// The record the launcher writes before any process exists.
pub fn queued(
    config: &LaunchConfig,
    fanout: Option<Value>,
    launcher: Option<ProcessIdentity>,
    now: u64,
) -> RunStatus {
    let mut queued = RunStatus::new(&config.run_id, RunState::Queued);
    queued.session_id = config.session_id.clone();
    queued.mode = Some(config.mode.clone());
    queued.last_update = Some(now);
    queued.cwd = config.steps.first().map(|s| s.cwd.display().to_string());
    queued.timeout_ms = config.timeout_ms;
    queued.chain_step_count = Some(config.chain_step_count());
    queued.launcher_identity = launcher;
    queued.runner_process_instance_id = Some(config.runner_process_instance_id.clone());
    queued.run_fanout_budget = fanout;
    if let Some(revival) = &config.revival {
        queued
            .extra
            .insert("resumedFrom".into(), json!(revival.source_run_id));
    }
    if let Some(root) = &config.session_root {
        queued.extra.insert("sessionRoot".into(), json!(root));
    }
    let steps = config.steps.iter().map(|s| Step {
        agent: s.agent.clone(),
        status: "pending".into(),
        description: s.task_file.as_ref().map(|_| PROMPT_REDACTED.to_owned()),
        ..Step::default()
    });
    queued.steps = Some(steps.collect());
    queued
}

/// The runner's first write.
pub fn running(
    current: Option<RunStatus>,
    config: &LaunchConfig,
    runner: &ProcessIdentity,
    monitor: Option<ProcessIdentity>,
    now: u64,
) -> RunStatus {
    let mut s = current.unwrap_or_else(|| RunStatus::new(&config.run_id, RunState::Running));
    s.lifecycle_artifact_version = Some(LIFECYCLE_ARTIFACT_VERSION);
    s.state = RunState::Running;
    s.mode = Some(config.mode.clone());
    s.pid = Some(runner.pid);
    s.runner_identity = Some(runner.clone());
    s.runner_process_instance_id = Some(config.runner_process_instance_id.clone());
    // The monitor registers itself before spawning us; our parent is only a
    // fallback (it may already be a reaper, not the monitor).
    s.monitor_identity = s.monitor_identity.take().or(monitor);
    s.started_at = Some(now);
    s.last_update = Some(now);
    s.last_activity_at = Some(now);
    s.current_step = Some(0);
    s.chain_step_count = Some(config.chain_step_count());
    s.deadline_at = config.timeout_ms.map(|t| now + t);
    s.output_file = Some(output_path(config, 0).display().to_string());
    s.extra
        .insert("parallelGroups".into(), json!(parallel_groups(config)));
    let pending = ProcessTerminal::new(
        ProofState::Pending,
        &config.run_id,
        &config.runner_process_instance_id,
    );
    s.process_terminal = Some(pending.to_value());
    s
}

/// `parallelGroups`: one `{start, count, stepIndex}` per parallel group.
pub fn parallel_groups(config: &LaunchConfig) -> Vec<Value> {
    let groups = config.groups.iter().enumerate().filter(|(_, g)| g.parallel);
    groups
        .map(|(i, g)| json!({"start": g.start, "count": g.count, "stepIndex": i}))
        .collect()
}

/// Step `i`'s COMMAND was spawned as `pid`.
pub fn step_started(
    mut s: RunStatus,
    config: &LaunchConfig,
    i: usize,
    pid: u32,
    identity: Option<ProcessIdentity>,
    now: u64,
) -> RunStatus {
    s.last_update = Some(now);
    s.last_activity_at = Some(now);
    s.current_step = Some(i);
    s.output_file = Some(output_path(config, i).display().to_string());
    if let Some(step) = s.steps.get_or_insert_with(Vec::new).get_mut(i) {
        step.status = "running".into();
        step.started_at = Some(now);
        step.external_process = Some(ExternalProcess {
            pid: Some(pid),
            identity,
            started_at: now,
            stdout_path: log_path(config, i, "stdout").display().to_string(),
            stderr_path: log_path(config, i, "stderr").display().to_string(),
            ..ExternalProcess::default()
        });
    }
    s
}

/// How one step ended.
#[derive(Debug, Clone, PartialEq)]
pub struct StepEnd {
    /// `complete`, `failed`, `stopped` or `pending`.
    pub status: &'static str,
    /// The step error.
    pub error: Option<String>,
    /// The step exit code (0 complete, the child's, else 1).
    pub exit_code: i64,
    /// When it started, if it did.
    pub started_at: Option<u64>,
    /// When its end was observed.
    pub closed_at: u64,
    /// A timeout ended it.
    pub timed_out: bool,
    /// The child's exit code and signal name, if it ran.
    pub process: Option<(Option<i32>, Option<String>)>,
}

/// Step `i` ended.
pub fn step_ended(
    mut s: RunStatus,
    config: &LaunchConfig,
    i: usize,
    end: &StepEnd,
    now: u64,
) -> RunStatus {
    s.last_update = Some(now);
    if end.started_at.is_some() && end.process.is_none() && end.status == "failed" {
        // Its COMMAND could not be started, so `step_started` never ran: the
        // run's current step is still this one, not the one before it.
        s.current_step = Some(i);
    }
    if let Some(step) = s.steps.get_or_insert_with(Vec::new).get_mut(i) {
        step.status = end.status.into();
        step.ended_at = Some(end.closed_at);
        step.duration_ms = end.started_at.map(|t| end.closed_at.saturating_sub(t));
        step.exit_code = Some(end.exit_code);
        step.error = end.error.clone();
        step.timed_out = end.timed_out.then_some(true);
        step.stopped = (end.status == "stopped").then_some(true);
        step.extra
            .insert("outputFile".into(), json!(output_path(config, i)));
        if let (Some(process), Some((code, signal))) =
            (step.external_process.as_mut(), &end.process)
        {
            process.ended_at = Some(end.closed_at);
            process.duration_ms = Some(end.closed_at.saturating_sub(process.started_at));
            process.exit_code = *code;
            process.process_signal = signal.clone();
        }
    }
    s
}

/// The runner's final write. `stopped` means a stop request ended the run:
/// its error is the recorded stop reason.
pub fn finished(
    mut s: RunStatus,
    state: RunState,
    error: Option<String>,
    timed_out: bool,
    stopped: bool,
    now: u64,
) -> RunStatus {
    s.state = state;
    s.error = error;
    s.ended_at = Some(now);
    s.last_update = Some(now);
    s.timed_out = timed_out.then_some(true);
    s.stopped = (state == RunState::Stopped).then_some(true);
    if stopped {
        s.error = Some(
            s.stop_reason
                .clone()
                .unwrap_or_else(|| "Subagent stopped by user.".to_owned()),
        );
    }
    s
}
