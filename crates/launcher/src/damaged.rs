//! Runs whose `status.json` cannot be read (unparsable, wrong types,
//! oversize, a FIFO, directory or symlink in its place): `stop` and
//! `status` work from `run-processes.json` (see `status::processes`), which
//! the monitor writes once and a damaged status cannot take with it.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use process_identity::{Liveness, ProcessIdentity};
use status::Layout;
use status::processes::RunProcesses;
use status::proof::{Fallback, ProofState};
use supervisor::observer;

use crate::admission;
use crate::api::StopOutcome;
use crate::error::{Error, Result};
use crate::runs::{load, observer_options, resolve};
use supervisor::procs::signal_group;

fn alive(identity: &ProcessIdentity) -> bool {
    identity.liveness() == Liveness::Alive
}

/// The record of a run whose status could not be read, if it has one.
fn record_of(layout: &Layout, id: &str) -> Option<(String, RunProcesses)> {
    let id = resolve(layout, id).ok()?;
    let dir = status::layout::exact_run_dir(layout, &id)?;
    let record = status::processes::read(&dir).ok().flatten()?;
    (record.run_id == id).then_some((id, record))
}

/// Waits (polling `/proc`: these processes are not our children) until
/// `identity` is gone or `within` passed; true when it is gone.
fn gone_within(identity: &ProcessIdentity, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while alive(identity) {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    true
}

/// `stop` of a run whose status could not be read (`error`): SIGTERM to
/// the recorded runner, which rewrites its damaged status from its last
/// write and stops as asked (a stop reason cannot be recorded in a damaged
/// status: the runner's default message stands); SIGKILL to its group if it
/// has not ended within its kill grace + 3 s; then the monitor (or, when it
/// is gone, the observer) proves the run over, which releases its marker,
/// and its capacity slot is freed. Ok once the status reads again; when it
/// does not, one line saying what was proven (exit 1). A run without a
/// readable record fails with `error`, as before.
pub fn stop(layout: &Layout, id: &str, reason: &str, error: Error) -> Result<StopOutcome> {
    let Some((id, record)) = record_of(layout, id) else {
        return Err(error);
    };
    let was_over = !alive(&record.runner) && !alive(&record.monitor);
    if alive(&record.runner) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(record.runner.pid as i32),
            Signal::SIGTERM,
        );
    }
    let grace = supervisor::runner::KILL_GRACE + Duration::from_secs(3);
    if !gone_within(&record.runner, grace) && alive(&record.runner) {
        // Its own process group; the monitor then ends what the runner left.
        signal_group(record.runner.pid, Signal::SIGKILL);
    }
    // The monitor ends the runner's leftovers and writes the proof.
    gone_within(&record.monitor, Duration::from_secs(5));
    let options = observer::Options {
        stop_reason: Some(reason.to_owned()),
        ..observer_options(layout)
    };
    if let Some(dir) = status::layout::exact_run_dir(layout, &id) {
        observer::observe(&dir, &options);
    }
    admission::release_finished(layout, record.session_id.as_deref());
    let mut warnings = Vec::new();
    match load(layout, &id, &mut warnings) {
        Ok(run) => Ok(StopOutcome {
            run,
            was_over,
            warnings,
        }),
        Err(e) => Err(unreadable(layout, &id, &e)),
    }
}

/// `status` of a run whose status could not be read: frees its capacity
/// slot when its proof shows it over (the observer already ran), then says
/// it is unreadable, why, and what its proof says.
pub fn status_error(layout: &Layout, id: &str, error: Error) -> Error {
    let Some((id, record)) = record_of(layout, id) else {
        return error;
    };
    admission::release_finished(layout, record.session_id.as_deref());
    unreadable(layout, &id, &error)
}

/// "run 'ID' is unreadable: WHY; PROOF" (exit 1).
fn unreadable(layout: &Layout, id: &str, error: &Error) -> Error {
    let dir = layout.run_dir(id);
    let fallback = Fallback {
        run_id: Some(id.to_owned()),
        runner_process_instance_id: status::processes::read(&dir)
            .ok()
            .flatten()
            .map(|r| r.runner_process_instance_id),
    };
    let proof = match status::proof::read_proof(&dir, &fallback).map(|p| p.state) {
        Some(ProofState::Observed) => {
            "its processes were proven gone (process-terminal proof observed)".to_owned()
        }
        Some(state) => format!("its process-terminal proof is {}", state.as_str()),
        None => "it has no process-terminal proof yet".to_owned(),
    };
    Error::failed(format!(
        "run '{}' is unreadable: {}; {proof}",
        atomic_file::escape(id),
        error.message
    ))
}
