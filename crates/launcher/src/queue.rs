//! The launcher's side of the queue for capacity slots (`run --queue`):
//! stopping a run that waits in line, and the positions that `list`,
//! `status` and `top` show. The waiting itself is the run's monitor's
//! (`supervisor::slot_wait`); the line is the capacity crate's.

use std::collections::HashMap;
use std::path::Path;

use listing::list::RunSummary;
use serde_json::json;
use status::model::update_status;
use status::proof::{ProcessTerminal, ProofState};
use status::{Layout, RunState, RunStatus, now_ms, reconcile};

use crate::error::{Error, Result};

/// Stops a run that waits in its session's queue without ever starting it:
/// under the pool lock (so its monitor cannot take its turn meanwhile) the
/// run is recorded `stopped` with a `not-started` proof and leaves the
/// line; its monitor, woken by the change, then exits. `Ok(false)` when the
/// run was not in the line (its turn came): the caller stops it as any run.
pub fn stop_queued(layout: &Layout, run: &RunSummary, reason: &str) -> Result<bool> {
    if status::slot_wait::queued_for_slot(&run.status).is_none() {
        return Ok(false);
    }
    let Some(session) = run.status.session_id.as_deref() else {
        return Ok(false);
    };
    let dir = run.async_dir.as_path();
    let left = pools(layout)
        .leave_queue(session, &run.id, || record_stopped(dir, &run.id, reason))
        .map_err(|e| Error::failed(format!("failed to stop run '{}': {e}", run.id)))?;
    let left = left?;
    if left {
        let _ = status::index::release_marker(dir);
    }
    Ok(left)
}

/// The status of a run stopped in line, its proof and its events.
fn record_stopped(dir: &Path, id: &str, reason: &str) -> Result {
    let now = now_ms();
    let runner = status::model::read_status(dir)?
        .and_then(|s| s.runner_process_instance_id)
        .unwrap_or_else(|| "unknown".into());
    let proof = ProcessTerminal::new(ProofState::NotStarted, id, &runner);
    update_status(dir, |s| {
        let s = s?;
        status::slot_wait::queued_for_slot(&s)?;
        let mut s = reconcile::fail_active(s, reason, now);
        s.state = RunState::Stopped;
        s.stopped = Some(true);
        s.stop_reason = Some(reason.to_owned());
        s.error = Some(format!(
            "{reason} (stopped while waiting for a capacity slot)"
        ));
        s.process_terminal = Some(proof.to_value());
        Some(s)
    })?;
    let _ = supervisor::observer::write_not_started(dir, &proof);
    let fields = json!({"reason": reason, "pid": std::process::id(), "queued": true});
    let _ = status::events::append(dir, "subagent.run.stop_requested", id, now, fields);
    Ok(())
}

/// Shows each waiting run's place in its session's line in its status
/// (`queuedForSlot.position`, in memory), one read of each line.
pub fn show_positions<'a>(layout: &Layout, runs: impl IntoIterator<Item = &'a mut RunSummary>) {
    let pools = pools(layout);
    let mut lines: HashMap<String, Vec<(String, usize)>> = HashMap::new();
    for run in runs {
        if status::slot_wait::queued_for_slot(&run.status).is_none() {
            continue;
        }
        let Some(session) = run.status.session_id.clone() else {
            continue;
        };
        let line = lines
            .entry(session.clone())
            .or_insert_with(|| pools.queue_positions(&session));
        if let Some((_, position)) = line.iter().find(|(id, _)| *id == run.id) {
            status::slot_wait::show_position(&mut run.status, *position);
        }
    }
}

/// A status with its place in line shown, when it waits for a slot (the
/// hook of an active listing: one read of the line per waiting run).
pub fn with_position(layout: &Layout, mut status: RunStatus) -> RunStatus {
    if status::slot_wait::queued_for_slot(&status).is_none() {
        return status;
    }
    let Some(session) = status.session_id.as_deref() else {
        return status;
    };
    let line = pools(layout).queue_positions(session);
    if let Some((_, position)) = line.iter().find(|(id, _)| *id == status.run_id) {
        status::slot_wait::show_position(&mut status, *position);
    }
    status
}

/// The capacity pools of the root (not through `admission`, which observes
/// runs through `runs`: this module is below both).
fn pools(layout: &Layout) -> capacity::Capacity {
    capacity::Capacity::new(layout.capacity_dir())
}
