//! Active-run capacity at launch: which session a run belongs to, taking a
//! slot before anything is spawned, and settling it after the spawn.

use std::collections::HashSet;
use std::io::IsTerminal;
use std::path::Path;

use capacity::{
    Acquire, Capacity, CapacityAction, CapacityError, Kind, SlotHandle, SpawnOutcome,
    decide_after_spawn,
};
use status::Layout;

use crate::error::{Detail, Error, ErrorKind, Result};

/// The session a launch belongs to: `--session` / `$SUBAGENTS_SESSION_ID`,
/// else the controlling terminal of stdin, else `default`.
pub fn session_id(flag: Option<&str>) -> String {
    if let Some(id) = flag.filter(|s| !s.is_empty()) {
        return id.to_owned();
    }
    if std::io::stdin().is_terminal()
        && let Ok(tty) = std::fs::read_link("/proc/self/fd/0")
    {
        return format!("tty:{}", tty.display());
    }
    "default".to_owned()
}

/// The capacity pools of a state root.
pub fn pools(layout: &Layout) -> Capacity {
    Capacity::new(layout.capacity_dir())
}

/// The cap of a launch without a limit: it still takes a slot, so a later
/// `--max-active N` in the same session counts it.
const UNLIMITED: u32 = u32::MAX;

/// What a launch was given by [`admit`].
pub enum Admitted {
    /// A slot (`None`: a nested launch, which takes none).
    Slot(Option<Box<SlotHandle>>),
    /// A place in the session's queue.
    Queued(capacity::Queued),
}

/// Takes a slot for `run_id` (also without a limit, so every top-level run
/// of the session is counted), never past the runs waiting in the
/// session's queue; with `queue`, a launch that gets no slot joins the
/// queue instead of being refused. Exit 3 with the snapshot when the
/// session is full, exit 1 naming the slot when it cannot be written: a run
/// that is not counted would let the session run over its limit.
pub fn admit(
    layout: &Layout,
    session: &str,
    limit: Option<u32>,
    run_id: &str,
    run_dir: &Path,
    queue: bool,
) -> Result<Admitted> {
    observe_holders_of_a_full_pool(layout, session, limit);
    let limited = limit.filter(|l| *l > 0);
    let request = Acquire {
        session_id: session,
        limit: Some(limited.unwrap_or(UNLIMITED)),
        run_id,
        kind: Kind::Runner,
        async_dir: run_dir,
        live_workflows: &HashSet::new(),
    };
    match pools(layout).admit(&request, queue) {
        Ok(None) => Ok(Admitted::Slot(None)),
        Ok(Some(capacity::Admission::Slot(handle))) => Ok(Admitted::Slot(Some(handle))),
        Ok(Some(capacity::Admission::Queued(queued))) => Ok(Admitted::Queued(queued)),
        Err(e @ CapacityError::Exhausted(_)) => Err(capacity_error(e)),
        Err(other) => Err(Error::failed(format!(
            "failed to launch run: failed to take an active-run capacity slot: {other}"
        ))),
    }
}

/// Takes a run that never started out of its session's queue.
pub fn leave_queue(layout: &Layout, session: &str, run_id: &str) {
    let _ = pools(layout).leave_queue(session, run_id, || Ok::<(), ()>(()));
}

/// A full pool may be held by runs whose monitor was killed: let the
/// observer finalize those first, so their slots can be released by the
/// acquire's own reconciliation instead of refusing the run.
fn observe_holders_of_a_full_pool(layout: &Layout, session: &str, limit: Option<u32>) {
    let Some(limit) = limit.filter(|l| *l > 0) else {
        return;
    };
    let pools = pools(layout);
    // Only a full pool needs its holders: count the slots first, and read
    // their owners (one file per slot) only when none is free.
    if pools.used(session).is_ok_and(|used| used < limit as usize) {
        return;
    }
    let Ok(snapshot) = pools.count(session, Some(limit)) else {
        return;
    };
    if snapshot.used < limit as usize {
        return;
    }
    for run_id in snapshot.slots.iter().filter_map(|s| s.run_id.as_deref()) {
        crate::runs::observe(layout, run_id);
    }
}

/// Moves the slot of `source` to the revival `run_id` (or takes a new one
/// when the source holds none and a limit is set).
pub fn transfer(
    layout: &Layout,
    session: &str,
    limit: Option<u32>,
    source: &str,
    run_id: &str,
    run_dir: &Path,
) -> Result<Option<SlotHandle>> {
    let request = capacity::Transfer {
        session_id: session,
        limit,
        source_run_id: source,
        run_id,
        async_dir: run_dir,
        live_workflows: &HashSet::new(),
    };
    pools(layout).transfer(&request).map_err(capacity_error)
}

/// What the user can change when the session is full.
pub const CAPACITY_HINT: &str = "run with --queue to wait for a slot instead; the limit is --max-active N or $SUBAGENTS_MAX_ACTIVE (0 = no limit), per session (--session ID or $SUBAGENTS_SESSION_ID); a slot is freed only when its run has finished and its exit was observed (see `subagents capacity`). Runs started inside a run take no slot.";

/// Maps a capacity error; exhaustion is exit 3 carrying the snapshot.
pub fn capacity_error(e: CapacityError) -> Error {
    match e {
        CapacityError::Exhausted(snapshot) => {
            let message = format!(
                "failed to launch run: {}",
                CapacityError::Exhausted(snapshot.clone())
            );
            let notes = snapshot
                .slots
                .iter()
                .map(|slot| {
                    format!(
                        "slot-{}: run {}",
                        slot.slot,
                        slot.run_id.as_deref().unwrap_or("<unreadable owner>")
                    )
                })
                .collect();
            Error {
                notes,
                ..Error::of(ErrorKind::CapacityFull, message)
                    .with_detail(Detail::Capacity(snapshot))
                    .with_hint(CAPACITY_HINT)
            }
        }
        other => Error::failed(format!("failed to update active-run capacity: {other}")),
    }
}

/// What is known about the runner after a spawn attempt.
pub struct Spawned<'a> {
    /// The launch failed.
    pub failed: bool,
    /// Runner pid, when a runner existed.
    pub pid: Option<u32>,
    /// Runner instance id.
    pub runner_process_instance_id: Option<&'a str>,
    /// The runner never started work.
    pub did_not_proceed: bool,
    /// The runner is provably gone.
    pub termination_observed: bool,
}

impl<'a> Spawned<'a> {
    /// A runner that reported ready (and, for a revival, proceeded).
    pub fn started(pid: u32, runner_process_instance_id: &'a str) -> Self {
        Self {
            failed: false,
            pid: Some(pid),
            runner_process_instance_id: Some(runner_process_instance_id),
            did_not_proceed: false,
            termination_observed: false,
        }
    }
}

/// Rolls the slot back only when the runner provably never proceeded and is
/// provably gone (docs/protocol/handshake.md §8); otherwise binds it to the runner, and the
/// run's observed proof frees it later.
pub fn settle(handle: Option<SlotHandle>, spawned: &Spawned<'_>) -> Result {
    let Some(mut handle) = handle else {
        return Ok(());
    };
    let outcome = SpawnOutcome {
        failed: spawned.failed,
        pid: spawned.pid,
        runner_process_instance_id: spawned.runner_process_instance_id,
        startup_did_not_proceed: spawned.did_not_proceed,
        termination_observed: spawned.termination_observed,
    };
    let action = decide_after_spawn(&outcome);
    let result = match &action {
        CapacityAction::Rollback => handle.rollback().map(|_| ()),
        // A run that ended before its runner was bound here could not have
        // its slot freed by its finalizer: free it now.
        CapacityAction::MarkStarted(_) => handle
            .apply(&action)
            .and_then(|()| handle.release_if_over().map(drop)),
    };
    result.map_err(|e| Error::failed(format!("failed to settle active-run capacity: {e}")))
}

/// Frees every slot of `sessions` whose run is provably over.
pub fn release_finished<'a>(layout: &Layout, sessions: impl IntoIterator<Item = &'a str>) {
    let capacity = pools(layout);
    let unique: HashSet<&str> = sessions.into_iter().collect();
    for session in unique {
        let _ = capacity.reconcile(session, None, &HashSet::new());
    }
}

/// [`release_finished`] for a listing: the slots of `listed_active`, runs it
/// has just read as active, are passed over without reading their runs
/// again (the verdict would keep them).
pub fn release_over<'a>(
    layout: &Layout,
    sessions: impl IntoIterator<Item = &'a str>,
    listed_active: &HashSet<String>,
) {
    let capacity = pools(layout);
    let unique: HashSet<&str> = sessions.into_iter().collect();
    for session in unique {
        let _ = capacity.release_over(session, listed_active);
    }
}
