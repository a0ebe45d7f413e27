//! `subagents run`: create the run, spawn the detached monitor, and return
//! once the runner has said on the ready pipe that it is running.
//!
//! Process tree of one run (the monitor and the runner are forks, not
//! `exec`s, when launched from the command line; see
//! `supervisor::spawn::SpawnMode`):
//!
//! ```text
//! subagents run            (returns; not a parent of anything that outlives it)
//! └─ subagents __monitor   new session, child subreaper; waits on the runner,
//!    │                     writes process-terminal.json, releases the marker
//!    └─ subagents __runner own process group; writes status.json and events
//!       └─ COMMAND         own process group; stdin = task, logs to files
//! ```

use std::path::Path;
use std::time::Duration;

use process_identity::ProcessIdentity;
use status::Layout;
use status::layout::files;

use crate::admission::{self, Spawned};
use crate::api::{Launched, RunRequest, Settings};
use crate::error::{Error, Result};
use crate::prepare::{self, Request};
use supervisor::config::LaunchConfig;

/// Runs `subagents run` (or the MCP `run` tool).
pub fn run(layout: &Layout, run: &RunRequest, settings: &Settings) -> Result<Launched> {
    let session = admission::session_id(settings.session.as_deref());
    // A run started inside a Slurm run is its own job (docs/cluster.md §7).
    if run.executor.is_none() && crate::executor::inside_slurm_run(layout) {
        let run = RunRequest {
            executor: Some(crate::executor::ExecutorKind::Slurm),
            ..run.clone()
        };
        return launch(layout, &Request::from_run(&run, settings, &session)?);
    }
    launch(layout, &Request::from_run(run, settings, &session)?)
}

/// Prepares, spawns and (for a revival) hands over a run; settles its
/// capacity slot from what is proven about the runner.
pub fn launch(layout: &Layout, request: &Request) -> Result<Launched> {
    let mut executor = request.executor.clone();
    executor.admit()?;
    let (config, slot) = prepare::prepare(layout, request)?;
    supervisor::fault::point(supervisor::fault::Point::AfterRunDir);
    if config.revival.is_some() {
        handshake::remove_stale_files(&config.run_dir)?;
    }
    match executor.start(&config) {
        Ok(launched) if config.queue.is_some() => Ok(queued(layout, &config, launched)),
        Ok(launched) if config.revival.is_some() => hand_over(layout, &config, launched, slot),
        Ok(launched) => {
            let spawned = Spawned::started(launched.pid, &launched.runner_process_instance_id);
            admission::settle(slot, &spawned)?;
            Ok(launched)
        }
        Err(e) => {
            if let Some(queue) = &config.queue {
                admission::leave_queue(layout, &queue.session_id, &config.run_id);
            }
            settle_failed_start(&config, slot)?;
            let reason = failure_reason(&config.run_dir, &e);
            Err(Error::failed(format!(
                "failed to start run '{}': {reason}",
                config.run_id
            )))
        }
    }
}

/// A run that waits in its session's queue: its monitor said so on the
/// ready pipe; its place in the line is read back for the caller.
fn queued(layout: &Layout, config: &LaunchConfig, mut launched: Launched) -> Launched {
    let Some(queue) = &config.queue else {
        return launched;
    };
    let positions = admission::pools(layout).queue_positions(&queue.session_id);
    // Not in the line any more: its turn came while we read.
    let position = positions
        .iter()
        .find(|(id, _)| *id == config.run_id)
        .map(|(_, p)| *p);
    launched.queued_for_slot = position.map(|position| crate::api::QueuedForSlot {
        since: queue.since,
        position,
    });
    launched
}

/// The revival startup handshake (docs/protocol/handshake.md §4–6): the runner holds the
/// session lease and waits; we acknowledge and authorise it. On failure the
/// crate has persisted the failure and terminated the runner; we free a
/// lease the dead runner still holds and settle the slot by the table of docs/protocol/handshake.md §8.
fn hand_over(
    layout: &Layout,
    config: &LaunchConfig,
    launched: Launched,
    slot: Option<capacity::SlotHandle>,
) -> Result<Launched> {
    let identity = ProcessIdentity::of(launched.pid).unwrap_or(ProcessIdentity {
        pid: launched.pid,
        start_time: 0,
        boot_id: None,
        machine_id: None,
        host: None,
    });
    let binding = handshake::Binding {
        run_id: config.run_id.clone(),
        runner_process_instance_id: config.runner_process_instance_id.clone(),
    };
    let wait = Duration::from_millis(config.revival.as_ref().map_or(10_000, |r| r.timeouts_ms.0));
    let timeouts = handshake::LauncherTimeouts {
        ready: wait,
        acknowledged: wait,
        ..Default::default()
    };
    let runner = handshake::Runner::Process(identity);
    match handshake::run_launcher_side(
        &config.run_dir,
        &binding,
        config.session_id.as_deref(),
        runner,
        &timeouts,
    ) {
        Ok(_) => {
            let spawned = Spawned::started(launched.pid, &launched.runner_process_instance_id);
            admission::settle(slot, &spawned)?;
            Ok(launched)
        }
        Err(failure) => {
            if failure.termination_observed {
                release_dead_runners_lease(layout, config);
            }
            let spawned = Spawned {
                failed: true,
                pid: Some(failure.pid),
                runner_process_instance_id: Some(&failure.runner_process_instance_id),
                did_not_proceed: failure.startup_did_not_proceed,
                termination_observed: failure.termination_observed,
            };
            admission::settle(slot, &spawned)?;
            Err(Error::failed(format!(
                "failed to start run '{}': {}",
                config.run_id, failure.error
            )))
        }
    }
}

/// A runner killed before proceed cannot release its lease; we can, once its
/// termination is observed and the lease names this run.
fn release_dead_runners_lease(layout: &Layout, config: &LaunchConfig) {
    let Some(revival) = &config.revival else {
        return;
    };
    let root = recovery::lease::lease_root(layout.root());
    let Ok(inspection) = recovery::lease::inspect_lease(&root, &revival.session_file) else {
        return;
    };
    if let recovery::lease::LeaseState::Owned(owner) = inspection.state
        && owner.run_id == config.run_id
    {
        let _ = recovery::lease::release_lease(&root, &revival.session_file, &owner.token);
    }
}

/// A runner that never reported ready did not proceed; its slot comes back
/// only if no runner exists or the recorded one is provably gone.
fn settle_failed_start(config: &LaunchConfig, slot: Option<capacity::SlotHandle>) -> Result {
    let status = status::model::read_status(&config.run_dir).ok().flatten();
    let runner = status.as_ref().and_then(|s| s.runner_identity.clone());
    let gone = runner
        .as_ref()
        .is_none_or(|r| r.liveness() == process_identity::Liveness::Dead);
    let spawned = Spawned {
        failed: true,
        pid: runner.as_ref().map(|r| r.pid),
        runner_process_instance_id: runner
            .as_ref()
            .map(|_| config.runner_process_instance_id.as_str()),
        did_not_proceed: true,
        termination_observed: gone,
    };
    admission::settle(slot, &spawned)
}

/// The best explanation of a failed start: the run's own error if the
/// monitor or runner recorded one, else the launcher's.
fn failure_reason(run_dir: &Path, e: &std::io::Error) -> String {
    let recorded = status::model::read_status(run_dir)
        .ok()
        .flatten()
        .and_then(|s| s.error);
    let stderr =
        atomic_file::read::read_to_string(&run_dir.join(files::RUNNER_STDERR)).unwrap_or_default();
    let last = stderr
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .map(str::to_owned);
    recorded.or(last).unwrap_or_else(|| e.to_string())
}
