//! `subagents __monitor`: the runner's parent, and the process that proves
//! the run is over.
//!
//! The reference finalizes a run's proof in whichever process spawned the
//! runner, so a launcher that exits early leaves the proof `pending` forever.
//! Here the launcher spawns this small monitor in a new session; the monitor
//! spawns the runner, waits on it with `waitpid` (a true answer, zombies
//! included), terminates whatever the runner left behind (it is a child
//! subreaper, so orphans come back to it), repairs the status if the runner
//! died before its final write, and then finalizes `process-terminal.json`.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::Pid;
use serde_json::json;
use status::model::update_status;
use status::proof::{
    self, Candidate, ProcessTerminal, ProcessTree, ProofState, RunnerClose, WriterRecord,
};
use status::{RunStatus, events, now_ms, reconcile};

use crate::config::LaunchConfig;
use crate::procs::{Ended, Signals, empty_group};

/// The monitor's entry point; returns the process exit code.
pub fn main() -> i32 {
    let config: LaunchConfig = match serde_json::from_reader(std::io::stdin()) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("subagents: failed to read monitor config from stdin: {e}");
            return 1;
        }
    };
    let Ok(mut signals) = Signals::block() else {
        eprintln!(
            "subagents: failed to block signals in the monitor of '{}'",
            config.run_id
        );
        return 1;
    };
    crate::runner::become_subreaper();
    let runner = match spawn_runner(&config) {
        Ok(pid) => pid,
        Err(e) => {
            record_spawn_failure(&config, &e.to_string());
            return 1;
        }
    };
    let (ended, mut reaped) = wait_for(runner);
    let closed_at = now_ms();
    let (_, more) = empty_group(
        &mut signals,
        None,
        Duration::from_secs(2),
        Duration::from_secs(1),
    );
    reaped.extend(more);
    if config.revival.is_some() {
        await_launcher_verdict(&config, &mut signals);
    }
    repair_if_unfinished(&config, ended, &mut signals, &reaped);
    let close = RunnerClose {
        process_instance_id: config.runner_process_instance_id.clone(),
        close_observed_at: closed_at,
        exit_code: ended.code(),
        signal: ended.signal(),
    };
    let leases = |file: &str| lease_state(&config, file);
    let facts = listing_facts(&config);
    let freeze = |s: &mut RunStatus| {
        if let (Some((snapshot, facts)), false) = (&facts, s.state.is_active()) {
            if let Some(snapshot) = snapshot {
                s.run_fanout_budget = Some(snapshot.clone());
            }
            s.extra
                .insert(status::list::LISTING_FACTS.into(), facts.clone());
        }
    };
    let (dir, id) = (&config.run_dir, &config.run_id);
    proof::finalize_with(dir, id, &close, &leases, now_ms(), &freeze);
    0
}

/// The run's listing facts, frozen into its status with the observed proof
/// in the same write: the fan-out counts as of now, so listings take them
/// and the proof from the status as they are instead of validating the
/// proof sidecar and counting claims for every finished run
/// (`status::list::LISTING_FACTS`). `None` when the budget cannot be read:
/// listings then say live why it is unavailable.
fn listing_facts(config: &LaunchConfig) -> Option<(Option<serde_json::Value>, serde_json::Value)> {
    let budgets = status::Layout::new(&config.root).fanout_budgets_dir();
    let (snapshot, claims) = match fanout_budget::read_persisted(&config.run_dir, &budgets) {
        Ok(Some(budget)) => (
            serde_json::to_value(budget.snapshot().ok()?).ok(),
            Some(budget.descriptor().directory.join("claims")),
        ),
        Ok(None) => (None, None),
        Err(_) => return None,
    };
    let mut facts = json!({"frozenAt": now_ms()});
    if let Some(claims) = claims {
        facts["fanoutClaimsDir"] = json!(claims);
    }
    Some((snapshot, facts))
}

fn spawn_runner(config: &LaunchConfig) -> std::io::Result<u32> {
    let mut command = Command::new(std::env::current_exe()?);
    command
        .arg("__runner")
        .current_dir(&config.run_dir)
        .stdin(Stdio::piped());
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    // SAFETY: only resets the signal mask (async-signal-safe) between fork and exec.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(
            &mut command,
            crate::procs::unblock_all_in_child,
        );
    }
    let mut child = command.spawn()?;
    // The runner inherited the ready pipe; our copy must close so the
    // launcher sees EOF if the runner dies before reporting.
    // SAFETY: descriptor 3 is the ready pipe handed to us and no longer used here.
    unsafe {
        libc::close(3);
    }
    let mut stdin = child
        .stdin
        .take()
        .ok_or_else(|| std::io::Error::other("runner has no stdin"))?;
    stdin.write_all(&serde_json::to_vec(config).map_err(std::io::Error::other)?)?;
    Ok(child.id())
}

/// Blocks until the runner exits, reaping any orphan met on the way.
fn wait_for(runner: u32) -> (Ended, BTreeMap<u32, Ended>) {
    let mut reaped = BTreeMap::new();
    loop {
        match waitpid(Pid::from_raw(-1), None) {
            Ok(WaitStatus::Exited(pid, code)) => {
                let ended = Ended::Exited(code);
                if pid.as_raw() as u32 == runner {
                    return (ended, reaped);
                }
                reaped.insert(pid.as_raw() as u32, ended);
            }
            Ok(WaitStatus::Signaled(pid, sig, _)) => {
                let ended = Ended::Signaled(sig);
                if pid.as_raw() as u32 == runner {
                    return (ended, reaped);
                }
                reaped.insert(pid.as_raw() as u32, ended);
            }
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            // No children at all: the runner is gone without a status we could read.
            Err(_) => return (Ended::Exited(-1), reaped),
        }
    }
}

/// A runner that died before its final write leaves an active status and no
/// candidate; we know better than a later stale check, so say it now.
fn repair_if_unfinished(
    config: &LaunchConfig,
    ended: Ended,
    signals: &mut Signals,
    reaped: &BTreeMap<u32, Ended>,
) {
    let dir = &config.run_dir;
    let Ok(Some(current)) = status::model::read_status(dir) else {
        return;
    };
    if proof::read_candidate(dir).ok().flatten().is_some() {
        return;
    }
    // Every step's COMMAND group must be gone before anything is claimed.
    let mut all = reaped.clone();
    let mut gone = BTreeMap::new();
    for (i, pid) in step_groups(&current) {
        let (alive, more) = empty_group(
            signals,
            Some(pid),
            Duration::from_secs(2),
            Duration::from_secs(1),
        );
        all.extend(more);
        gone.insert(i, alive.is_empty());
    }
    let message = format!(
        "Async runner process exited with {} before writing a final status.",
        ended.describe()
    );
    let message = reconcile::with_stderr_tail(dir, message);
    let now = now_ms();
    let repaired = update_status(dir, |s| {
        let s = s?;
        s.state.is_active().then(|| {
            let mut s = reconcile::fail_active(s, &message, now);
            s.error = Some(message.clone());
            s
        })
    });
    if let Ok(Some(status)) = &repaired {
        let fields = json!({"pid": status.pid, "message": message});
        let _ = events::append(
            dir,
            "subagent.run.repaired_stale",
            &config.run_id,
            now,
            fields,
        );
    }
    let status = repaired.ok().flatten().unwrap_or(current);
    let _ = proof::write_candidate(dir, &witnessed_candidate(config, &status, &all, &gone));
}

/// (step index, COMMAND pid = process group) of every started step.
fn step_groups(status: &RunStatus) -> Vec<(usize, u32)> {
    let steps = status.steps().iter().enumerate();
    steps
        .filter_map(|(i, s)| Some((i, s.external_process.as_ref()?.pid?)))
        .collect()
}

/// The candidate the runner could not write, from what the monitor itself
/// witnessed: the children it reaped and the groups it verified empty.
fn witnessed_candidate(
    config: &LaunchConfig,
    status: &RunStatus,
    reaped: &BTreeMap<u32, Ended>,
    gone: &BTreeMap<usize, bool>,
) -> Candidate {
    let mut writers = BTreeMap::new();
    let mut expected: BTreeMap<String, u64> = (0..status.steps().len())
        .map(|i| (i.to_string(), 0))
        .collect();
    for (i, pid) in step_groups(status) {
        let ended = reaped.get(&pid).copied();
        let tree = if gone.get(&i).copied().unwrap_or(false) {
            ProcessTree::Observed {
                mechanism: "posix-process-group".into(),
                process_group_id: pid,
                verified_at: now_ms(),
            }
        } else {
            let diagnostic = Some("group not empty after SIGKILL".into());
            ProcessTree::Unknown {
                reason: "verification-failed".into(),
                diagnostic,
            }
        };
        let record = WriterRecord {
            process_instance_id: format!("{}-writer-{i}", config.runner_process_instance_id),
            kind: "pi-writer".into(),
            attempt: 0,
            close_observed_at: status.ended_at.unwrap_or_else(now_ms),
            exit_code: ended.and_then(Ended::code),
            signal: ended.and_then(Ended::signal),
            process_tree: tree,
        };
        writers.insert(i.to_string(), vec![record]);
        expected.insert(i.to_string(), 1);
    }
    Candidate {
        version: 1,
        run_id: config.run_id.clone(),
        runner_process_instance_id: config.runner_process_instance_id.clone(),
        writers,
        expected_writers: Some(expected),
        session_file: None,
        revival_lease_token: None,
        revival_lease_release_acknowledged: None,
    }
}

/// The runner never existed: the run failed, and no process can be left.
fn record_spawn_failure(config: &LaunchConfig, error: &str) {
    let message = format!("failed to spawn runner: {error}");
    eprintln!("subagents: {message}");
    let now = now_ms();
    let _ = update_status(&config.run_dir, |s| {
        let mut s = s?;
        s.state = status::RunState::Failed;
        s.error = Some(message.clone());
        s.last_update = Some(now);
        s.ended_at = Some(now);
        let proof = ProcessTerminal::new(
            ProofState::NotStarted,
            &config.run_id,
            &config.runner_process_instance_id,
        );
        s.process_terminal = Some(proof.to_value());
        Some(s)
    });
}

/// The session lease as the proof finalizer needs it.
fn lease_state(config: &LaunchConfig, file: &str) -> Result<proof::LeaseState, String> {
    let root = recovery::lease::lease_root(&config.root);
    let inspection = recovery::lease::inspect_lease(&root, std::path::Path::new(file))
        .map_err(|e| e.to_string())?;
    Ok(match inspection.state {
        recovery::lease::LeaseState::Free => proof::LeaseState::Free(inspection.session.id),
        recovery::lease::LeaseState::Owned(_) => proof::LeaseState::Owned,
        recovery::lease::LeaseState::Unreadable => proof::LeaseState::Unreadable,
    })
}

/// A revival runner that exits before proceed is the launcher's to record
/// (status failed, proof not-started); give it the handshake's time to do
/// so before judging the run ourselves.
fn await_launcher_verdict(config: &LaunchConfig, signals: &mut Signals) {
    let waits = config.revival.as_ref().map_or(0, |r| r.timeouts_ms.0);
    let deadline = std::time::Instant::now() + Duration::from_millis(waits * 2 + 2_000);
    let queued = || {
        status::model::read_status(&config.run_dir)
            .ok()
            .flatten()
            .is_some_and(|s| s.state == status::RunState::Queued)
    };
    while queued() && std::time::Instant::now() < deadline {
        let tick = std::time::Instant::now() + Duration::from_millis(25);
        if signals.wait(Some(tick.min(deadline))) == Ok(crate::procs::Wake::Stop) {
            signals.defer_stop();
        }
    }
}
