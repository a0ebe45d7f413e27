//! `subagents __runner`: runs COMMAND for one run and owns its status.
//!
//! The runner blocks its signals and waits on a signalfd, so one `poll`
//! covers child exit, stop requests and the run's deadline. It is a child
//! subreaper, so orphans of COMMAND come back to it and are terminated with
//! the run; at the end it writes the process-terminal candidate and exits,
//! and its parent (the monitor) turns that into the proof.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::FromRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use process_identity::ProcessIdentity;
use serde_json::json;
use status::model::{ExternalProcess, update_status};
use status::proof::{
    Candidate, ProcessTerminal, ProcessTree, ProofState, WriterRecord, write_candidate,
};
use status::{
    LIFECYCLE_ARTIFACT_VERSION, PROMPT_REDACTED, RunState, RunStatus, events, index, now_ms,
};

use crate::config::{LaunchConfig, READY_FD_ENV};
use crate::launch::Launched;
use crate::procs::{Ended, Signals, Wake, empty_group, reap_all, signal_group};

/// How long COMMAND's group gets between SIGTERM and SIGKILL.
pub const KILL_GRACE: Duration = Duration::from_secs(2);

/// Why the run ended early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Interruption {
    Stopped,
    TimedOut,
}

/// The runner's entry point; returns the process exit code.
pub fn main() -> i32 {
    let config: LaunchConfig = match serde_json::from_reader(std::io::stdin()) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("subagents: failed to read runner config from stdin: {e}");
            return 1;
        }
    };
    match run(&config) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("subagents: runner of '{}' failed: {e:#}", config.run_id);
            1
        }
    }
}

fn run(config: &LaunchConfig) -> anyhow::Result<()> {
    let mut signals = Signals::block()?;
    become_subreaper();
    let started_at = now_ms();
    let identity = ProcessIdentity::current()?;
    write_running(config, &identity, started_at)?;
    send_ready(config, identity.pid);
    let outcome = execute(config, &mut signals, started_at);
    finish(config, outcome, started_at)
}

/// Orphaned descendants of COMMAND are reparented to us instead of init.
pub fn become_subreaper() {
    // SAFETY: prctl with integer arguments has no memory effects.
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    }
}

fn write_running(
    config: &LaunchConfig,
    identity: &ProcessIdentity,
    now: u64,
) -> anyhow::Result<()> {
    let dir = &config.run_dir;
    index::create_marker(dir)?;
    update_status(dir, |current| {
        let mut s = current.unwrap_or_else(|| RunStatus::new(&config.run_id, RunState::Running));
        s.lifecycle_artifact_version = Some(LIFECYCLE_ARTIFACT_VERSION);
        s.state = RunState::Running;
        s.mode = Some("single".into());
        s.pid = Some(identity.pid);
        s.runner_identity = Some(identity.clone());
        s.runner_process_instance_id = Some(config.runner_process_instance_id.clone());
        s.monitor_identity = ProcessIdentity::of(std::os::unix::process::parent_id()).ok();
        s.started_at = Some(now);
        s.last_update = Some(now);
        s.last_activity_at = Some(now);
        s.current_step = Some(0);
        s.chain_step_count = Some(1);
        s.deadline_at = config.timeout_ms.map(|t| now + t);
        s.output_file = Some(output_path(config).display().to_string());
        let pending = ProcessTerminal::new(
            ProofState::Pending,
            &config.run_id,
            &config.runner_process_instance_id,
        );
        s.process_terminal = Some(pending.to_value());
        Some(s)
    })?;
    let mut fields = json!({
        "lifecycleArtifactVersion": LIFECYCLE_ARTIFACT_VERSION,
        "mode": "single",
        "cwd": config.cwd,
        "pid": identity.pid,
        "agent": config.agent,
    });
    if config.task_file.is_some() {
        fields["task"] = json!(PROMPT_REDACTED);
        fields["goal"] = json!(PROMPT_REDACTED);
    }
    let _ = events::append(dir, "subagent.run.started", &config.run_id, now, fields);
    Ok(())
}

/// Tells the launcher we are running, then closes the pipe.
fn send_ready(config: &LaunchConfig, pid: u32) {
    let Some(fd) = std::env::var(READY_FD_ENV)
        .ok()
        .and_then(|v| v.parse::<i32>().ok())
    else {
        return;
    };
    // SAFETY: the monitor handed us this descriptor for exactly this use; we own it from here.
    let mut pipe = unsafe { File::from_raw_fd(fd) };
    let launched = Launched {
        run_id: config.run_id.clone(),
        async_dir: config.run_dir.clone(),
        pid,
        runner_process_instance_id: config.runner_process_instance_id.clone(),
    };
    let _ = writeln!(
        pipe,
        "ready {}",
        serde_json::to_string(&launched).unwrap_or_default()
    );
}

fn output_path(config: &LaunchConfig) -> PathBuf {
    config.run_dir.join("output-0.log")
}

/// What happened to COMMAND.
struct Outcome {
    spawn_error: Option<String>,
    pid: Option<u32>,
    child_started_at: u64,
    ended: Option<Ended>,
    interruption: Option<Interruption>,
    tree: Option<ProcessTree>,
    closed_at: u64,
}

fn execute(config: &LaunchConfig, signals: &mut Signals, started_at: u64) -> Outcome {
    let child_started_at = now_ms();
    let mut outcome = Outcome {
        spawn_error: None,
        pid: None,
        child_started_at,
        ended: None,
        interruption: None,
        tree: None,
        closed_at: child_started_at,
    };
    let pid = match spawn_command(config) {
        Ok(pid) => pid,
        Err(e) => {
            outcome.spawn_error = Some(format!(
                "failed to start command '{}': {e}",
                config.command[0]
            ));
            return outcome;
        }
    };
    outcome.pid = Some(pid);
    mark_step_started(config, pid, child_started_at);
    let deadline = config.timeout_ms.map(|t| {
        let elapsed = now_ms().saturating_sub(started_at);
        Instant::now() + Duration::from_millis(t.saturating_sub(elapsed))
    });
    let (ended, interruption) = wait_for_child(signals, pid, deadline);
    outcome.ended = Some(ended);
    outcome.interruption = interruption;
    outcome.closed_at = now_ms();
    outcome.tree = Some(verify_group_gone(signals, pid));
    outcome
}

fn spawn_command(config: &LaunchConfig) -> std::io::Result<u32> {
    let task = config
        .task_file
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let args: Vec<String> = config.command[1..]
        .iter()
        .map(|a| a.replace("{task_file}", &task))
        .collect();
    let log = |name: &str| {
        OpenOptions::new()
            .append(true)
            .create(true)
            .mode(atomic_file::FILE_MODE)
            .open(config.run_dir.join(name))
    };
    let stdin = match &config.task_file {
        Some(path) => Stdio::from(File::open(path)?),
        None => Stdio::null(),
    };
    let mut command = Command::new(&config.command[0]);
    command
        .args(args)
        .current_dir(&config.cwd)
        .stdin(stdin)
        .stdout(log("external-0.stdout.log")?)
        .stderr(log("external-0.stderr.log")?)
        .env_remove(READY_FD_ENV)
        .env("SUBAGENTS_RUN_ID", &config.run_id)
        .env("SUBAGENTS_ROOT", &config.root)
        .env("SUBAGENTS_RUN_DIR", &config.run_dir)
        .env("SUBAGENTS_OUTPUT_FILE", output_path(config))
        .envs(&config.env)
        .process_group(0);
    if config.task_file.is_some() {
        command.env("SUBAGENTS_TASK_FILE", &task);
    }
    // SAFETY: only resets the signal mask (async-signal-safe) between fork and exec.
    unsafe {
        command.pre_exec(crate::procs::unblock_all_in_child);
    }
    Ok(command.spawn()?.id())
}

fn mark_step_started(config: &LaunchConfig, pid: u32, now: u64) {
    let dir = &config.run_dir;
    let _ = update_status(dir, |s| {
        let mut s = s?;
        s.last_update = Some(now);
        if let Some(step) = s.steps.get_or_insert_with(Vec::new).first_mut() {
            step.status = "running".into();
            step.started_at = Some(now);
            step.external_process = Some(ExternalProcess {
                pid: Some(pid),
                started_at: now,
                stdout_path: dir.join("external-0.stdout.log").display().to_string(),
                stderr_path: dir.join("external-0.stderr.log").display().to_string(),
                ..ExternalProcess::default()
            });
        }
        Some(s)
    });
    let _ = events::append(
        dir,
        "subagent.step.started",
        &config.run_id,
        now,
        json!({"stepIndex": 0, "agent": config.agent}),
    );
}

/// Waits until COMMAND (pid = pgid) exits; a stop request or the deadline
/// terminates its group, SIGKILL following after [`KILL_GRACE`].
fn wait_for_child(
    signals: &mut Signals,
    pid: u32,
    deadline: Option<Instant>,
) -> (Ended, Option<Interruption>) {
    let mut interruption = None;
    let mut kill_at: Option<Instant> = None;
    loop {
        if let Some(ended) = reap_all().get(&pid) {
            return (*ended, interruption);
        }
        let next = match (kill_at, interruption) {
            (Some(k), _) => Some(k),
            (None, None) => deadline,
            (None, Some(_)) => None,
        };
        let wake = signals.wait(next).unwrap_or(Wake::Child);
        let cause = match wake {
            Wake::Child => continue,
            Wake::Stop => Interruption::Stopped,
            Wake::Deadline if kill_at.is_some() => {
                signal_group(pid, nix::sys::signal::Signal::SIGKILL);
                kill_at = None;
                continue;
            }
            Wake::Deadline => Interruption::TimedOut,
        };
        if interruption.is_none() {
            interruption = Some(cause);
            signal_group(pid, nix::sys::signal::Signal::SIGTERM);
            kill_at = Some(Instant::now() + KILL_GRACE);
        }
    }
}

/// Proves COMMAND's process group (and any orphan of it) is gone.
fn verify_group_gone(signals: &mut Signals, pgid: u32) -> ProcessTree {
    let (alive, _) = empty_group(
        signals,
        Some(pgid),
        Duration::from_secs(3),
        Duration::from_secs(1),
    );
    if alive.is_empty() {
        ProcessTree::Observed {
            mechanism: "posix-process-group".into(),
            process_group_id: pgid,
            verified_at: now_ms(),
        }
    } else {
        ProcessTree::Unknown {
            reason: "verification-failed".into(),
            diagnostic: Some(format!("processes still alive after SIGKILL: {alive:?}")),
        }
    }
}

fn finish(config: &LaunchConfig, outcome: Outcome, started_at: u64) -> anyhow::Result<()> {
    let now = now_ms();
    fill_output(config);
    let stop_reason = status::model::read_status(&config.run_dir)?.and_then(|s| s.stop_reason);
    let (state, error, step_error) = verdict(config, &outcome, stop_reason);
    let step_status = match state {
        RunState::Complete => "complete",
        RunState::Stopped => "stopped",
        _ => "failed",
    };
    update_status(&config.run_dir, |s| {
        let mut s = s?;
        s.state = state;
        s.error = error.clone();
        s.ended_at = Some(now);
        s.last_update = Some(now);
        s.timed_out = (outcome.interruption == Some(Interruption::TimedOut)).then_some(true);
        s.stopped = (state == RunState::Stopped).then_some(true);
        if let Some(step) = s.steps.get_or_insert_with(Vec::new).first_mut() {
            finish_step(step, &outcome, step_status, step_error.clone(), now);
        }
        Some(s)
    })?;
    append_end_events(
        config,
        &outcome,
        state,
        step_status,
        error.as_deref(),
        started_at,
        now,
    );
    write_candidate(&config.run_dir, &candidate(config, &outcome))?;
    Ok(())
}

fn verdict(
    config: &LaunchConfig,
    outcome: &Outcome,
    stop_reason: Option<String>,
) -> (RunState, Option<String>, Option<String>) {
    if let Some(error) = &outcome.spawn_error {
        return (RunState::Failed, Some(error.clone()), Some(error.clone()));
    }
    let ended = outcome.ended.map(Ended::describe).unwrap_or_default();
    match (outcome.interruption, outcome.ended) {
        (Some(Interruption::Stopped), _) => {
            let reason = stop_reason.unwrap_or_else(|| "Subagent stopped by user.".into());
            (RunState::Stopped, Some(reason.clone()), Some(reason))
        }
        (Some(Interruption::TimedOut), _) => {
            let message = format!(
                "Subagent timed out after {}ms.",
                config.timeout_ms.unwrap_or(0)
            );
            (RunState::Failed, Some(message.clone()), Some(message))
        }
        (None, Some(Ended::Exited(0))) => (RunState::Complete, None, None),
        _ => (
            RunState::Failed,
            Some(format!("Step failed: {}", config.agent)),
            Some(format!("command ended with {ended}")),
        ),
    }
}

fn finish_step(
    step: &mut status::Step,
    outcome: &Outcome,
    state: &str,
    error: Option<String>,
    now: u64,
) {
    step.status = state.into();
    step.ended_at = Some(now);
    step.duration_ms = step.started_at.map(|s| now.saturating_sub(s));
    step.error = error;
    step.exit_code = Some(match (state, outcome.ended) {
        ("complete", _) => 0,
        ("failed", Some(Ended::Exited(code))) if outcome.interruption.is_none() => i64::from(code),
        _ => 1,
    });
    step.timed_out = (outcome.interruption == Some(Interruption::TimedOut)).then_some(true);
    step.stopped = (state == "stopped").then_some(true);
    if let (Some(process), Some(ended)) = (step.external_process.as_mut(), outcome.ended) {
        process.ended_at = Some(outcome.closed_at);
        process.duration_ms = Some(outcome.closed_at.saturating_sub(outcome.child_started_at));
        process.exit_code = ended.code();
        process.process_signal = ended.signal();
    }
}

fn append_end_events(
    config: &LaunchConfig,
    outcome: &Outcome,
    state: RunState,
    step_status: &str,
    error: Option<&str>,
    started_at: u64,
    now: u64,
) {
    let dir = &config.run_dir;
    let id = &config.run_id;
    let exit_code = outcome.ended.and_then(Ended::code);
    let step = json!({"stepIndex": 0, "agent": config.agent, "exitCode": exit_code,
        "durationMs": now.saturating_sub(outcome.child_started_at), "tokens": null});
    let _ = events::append(
        dir,
        &format!("subagent.step.{}", step_event(step_status)),
        id,
        now,
        step,
    );
    match outcome.interruption {
        Some(Interruption::Stopped) => {
            let _ = events::append(
                dir,
                "subagent.run.stopped",
                id,
                now,
                json!({"message": error}),
            );
        }
        Some(Interruption::TimedOut) => {
            let fields = json!({"timeoutMs": config.timeout_ms, "deadlineAt": config.timeout_ms.map(|t| started_at + t), "message": error});
            let _ = events::append(dir, "subagent.run.timed_out", id, now, fields);
        }
        None => {}
    }
    let fields = json!({"lifecycleArtifactVersion": LIFECYCLE_ARTIFACT_VERSION, "status": state.as_str(),
        "durationMs": now.saturating_sub(started_at)});
    let _ = events::append(dir, "subagent.run.completed", id, now, fields);
}

fn step_event(step_status: &str) -> &str {
    match step_status {
        "complete" => "completed",
        other => other,
    }
}

/// The output file is what COMMAND wrote to `$SUBAGENTS_OUTPUT_FILE`, or else its stdout.
fn fill_output(config: &LaunchConfig) {
    let output = output_path(config);
    if !output.exists() {
        let _ = std::fs::copy(config.run_dir.join("external-0.stdout.log"), &output);
    }
}

fn candidate(config: &LaunchConfig, outcome: &Outcome) -> Candidate {
    let records: Vec<WriterRecord> = match (outcome.ended, &outcome.tree) {
        (Some(ended), Some(tree)) => vec![WriterRecord {
            process_instance_id: format!("{}-writer-0", config.runner_process_instance_id),
            kind: "pi-writer".into(),
            attempt: 0,
            close_observed_at: outcome.closed_at,
            exit_code: ended.code(),
            signal: ended.signal(),
            process_tree: tree.clone(),
        }],
        _ => Vec::new(),
    };
    let expected = u64::from(outcome.pid.is_some());
    Candidate {
        version: 1,
        run_id: config.run_id.clone(),
        runner_process_instance_id: config.runner_process_instance_id.clone(),
        writers: if records.is_empty() {
            BTreeMap::new()
        } else {
            BTreeMap::from([("0".to_owned(), records)])
        },
        expected_writers: Some(BTreeMap::from([("0".to_owned(), expected)])),
        session_file: None,
        revival_lease_token: None,
        revival_lease_release_acknowledged: None,
    }
}
