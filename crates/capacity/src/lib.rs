#![doc = include_str!("../README.md")]
//!
//! The per-session cap on active background runs (docs/protocol/capacity.md).
//!
//! A parent session may hold at most `limit` top-level async runs at once.
//! Each admitted run occupies a slot directory
//! `<root>/<sha256(session id)>/slot-<N>/owner.json` from admission until
//! there is proof it finished: a terminal status **and** a verified process
//! exit ([`release_verdict`]). The root is `<state root>/session-active-async-capacity`.
//! The run's `status.json` and `process-terminal.json` are read through the
//! `status` crate; a run holds its slot while
//! `status::RunState::holds_capacity` (queued, running, paused).
//!
//! * [`Capacity::acquire`] takes the first free slot (reconciling the pool
//!   first when every index below the limit is occupied) or fails with [`CapacityError::Exhausted`]
//!   (`Active async run capacity exhausted: U/L used.`).
//! * [`SlotHandle::mark_started`] binds the slot to the spawned runner;
//!   [`SlotHandle::rollback`] frees an unstarted slot (or gives a transferred
//!   slot back to its source); [`decide_after_spawn`] picks between them.
//! * [`Capacity::transfer`] moves a finished run's slot to its revival.
//! * [`Capacity::reconcile`] frees every slot whose verdict is releasable;
//!   [`Capacity::count`] only counts; [`Capacity::inspect`] explains one run.
//! * [`Capacity::admit`] admits a run without passing the runs waiting in
//!   the session's line (`<pool>/queue/`, our extension), or puts it in the
//!   line; [`Capacity::take_turn`] is the waiting run's side, and
//!   [`Capacity::leave_queue`] takes a run out of the line.
//!
//! Every change to a pool happens under an `flock` on `<pool>/.lock`, which
//! the kernel releases when its holder dies, and under the reference's
//! per-slot `capacity.claim` (taken over when its recorded holder is provably
//! dead). Slots are built in a hidden directory and renamed into place, so a
//! crash never leaves a half-made slot.
#![warn(missing_docs)]

mod decision;
mod handle;
mod owner;
mod pool;
mod queue;
mod runfiles;
#[cfg(test)]
mod tests;
mod verdict;

use std::collections::HashSet;
use std::path::{Component, Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use process_identity::ProcessIdentity;
use serde::Serialize;

pub use decision::{CapacityAction, SpawnOutcome, decide_after_spawn};
pub use handle::SlotHandle;
pub use owner::{Kind, OwnerRecord, session_key};
pub use queue::{Admission, QUEUE_DIR, QueueEntry, Queued, Turn};
pub use verdict::{ReleaseState, Verdict, release_verdict};

use pool::{SlotDir, list_slots, lock_pool, read_owner, with_claim};
use runfiles::{StatusRead, read_status};

/// Errors of this crate. The texts the reference defines are kept verbatim.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CapacityError {
    /// Every slot below the limit is occupied.
    #[error("Active async run capacity exhausted: {}/{} used.", .0.used, .0.limit)]
    Exhausted(Snapshot),
    /// `mark_started` found the slot claimed or owned by someone else.
    #[error("Active async capacity ownership changed for run '{0}'.")]
    RunOwnershipChanged(String),
    /// `mark_workflow_started` found the slot claimed, owned by someone else,
    /// or not a workflow slot.
    #[error("Active async capacity ownership changed for workflow '{0}'.")]
    WorkflowOwnershipChanged(String),
    /// The transfer source is still queued/running or not what its slot says.
    #[error("Active async capacity source '{0}' is not transferable.")]
    NotTransferable(String),
    /// Another operation holds the source slot's claim.
    #[error("Active async capacity transfer is already in progress for run '{0}'.")]
    TransferInProgress(String),
    /// `mark_started` could not persist the binding; the slot stays unbound.
    #[error("failed to bind active async capacity to runner '{runner}': {source}")]
    Bind {
        /// The runner process instance id.
        runner: String,
        /// The write failure.
        #[source]
        source: atomic_file::Error,
    },
    /// `mark_workflow_started` could not persist the start.
    #[error("failed to mark async workflow '{run_id}' started: {source}")]
    MarkWorkflow {
        /// The workflow run id.
        run_id: String,
        /// The write failure.
        #[source]
        source: atomic_file::Error,
    },
    /// `mark_started` was given an empty runner id.
    #[error("failed to bind active async capacity: the runner process instance id is empty")]
    EmptyRunnerId,
    /// A file operation on the pool failed.
    #[error(transparent)]
    File(#[from] atomic_file::Error),
    /// A pool, slot directory or owner record another user could have
    /// planted or changed (a symlink, foreign-owned, or writable by group or
    /// others); checked when it is read.
    #[error("refusing {what} '{}': {why}", atomic_file::escape_path(path))]
    Untrusted {
        /// "state directory", "state file" or "capacity slot entry".
        what: &'static str,
        /// The refused path.
        path: PathBuf,
        /// What is wrong with it, and what to do.
        why: String,
    },
}

/// Usage of one session's pool; serialises as `{used, limit, slots}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Snapshot {
    /// Occupied slot directories, readable or not.
    pub used: usize,
    /// The limit; 0 means unlimited.
    pub limit: u32,
    /// One entry per occupied slot, by index.
    pub slots: Vec<SlotSummary>,
}

/// One occupied slot as a snapshot shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SlotSummary {
    /// N of `slot-<N>`.
    pub slot: u64,
    /// Whether `owner.json` is readable (an unreadable slot is never freed automatically).
    pub readable: bool,
    /// The holding run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// Kind of the holding run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<Kind>,
    /// Transfer generation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
    /// The bound runner.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runner_process_instance_id: Option<String>,
}

impl SlotSummary {
    fn of(slot: &SlotDir) -> Result<Self, CapacityError> {
        let owner = slot.owner()?;
        Ok(Self {
            slot: slot.index,
            readable: owner.is_some(),
            run_id: owner.as_ref().map(|o| o.run_id.clone()),
            kind: owner.as_ref().map(|o| o.kind),
            generation: owner.as_ref().map(|o| o.generation),
            runner_process_instance_id: owner.and_then(|o| o.runner_process_instance_id),
        })
    }
}

/// Resolves the `maxActiveAsyncRunsPerSession` setting: a positive integer is
/// a limit; anything else (absent, 0, negative, fractional, not a number) is
/// unlimited (`None`).
pub fn resolve_limit(value: Option<&serde_json::Value>) -> Option<u32> {
    let limit = value?.as_u64()?;
    u32::try_from(limit).ok().filter(|l| *l > 0)
}

fn effective_limit(limit: Option<u32>) -> Option<u32> {
    limit.filter(|l| *l > 0)
}

/// Admission of a new run ([`Capacity::acquire`]).
#[derive(Debug, Clone, Copy)]
pub struct Acquire<'a> {
    /// The parent session identity owning the pool.
    pub session_id: &'a str,
    /// The limit; `None` or 0 means unlimited (no slot is taken).
    pub limit: Option<u32>,
    /// The new run's id.
    pub run_id: &'a str,
    /// What kind of run is admitted.
    pub kind: Kind,
    /// The new run's directory.
    pub async_dir: &'a Path,
    /// Workflow run ids whose controllers are live in this process.
    pub live_workflows: &'a HashSet<String>,
}

/// Revival of a finished run into a new one ([`Capacity::transfer`]).
#[derive(Debug, Clone, Copy)]
pub struct Transfer<'a> {
    /// The parent session identity owning the pool.
    pub session_id: &'a str,
    /// The limit, used when no source slot exists and a new one is acquired.
    pub limit: Option<u32>,
    /// The run being revived.
    pub source_run_id: &'a str,
    /// The revival's run id.
    pub run_id: &'a str,
    /// The revival's run directory.
    pub async_dir: &'a Path,
    /// Workflow run ids whose controllers are live in this process.
    pub live_workflows: &'a HashSet<String>,
}

/// Which run [`Capacity::inspect`] explains.
#[derive(Debug, Clone, Copy)]
pub struct InspectQuery<'a> {
    /// The run id.
    pub run_id: &'a str,
    /// Restrict to this session's pool; all pools when `None`.
    pub session_id: Option<&'a str>,
    /// Also match slots recording this run directory.
    pub async_dir: Option<&'a Path>,
}

/// How an inspected run relates to a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Relation {
    /// The slot is held by the run.
    Current,
    /// The slot was transferred away from the run.
    Source,
    /// No slot records the run.
    None,
}

/// The answer of [`Capacity::inspect`].
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Inspection {
    /// The matching slot's owner.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<OwnerRecord>,
    /// How the run relates to the slot.
    pub relation: Relation,
    /// The matching slot directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slot_dir: Option<PathBuf>,
    /// The release verdict for the run.
    pub release: Verdict,
}

fn system_now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn random_token() -> String {
    uuid::Uuid::new_v4().to_string()
}

fn current_process() -> Option<ProcessIdentity> {
    ProcessIdentity::current().ok()
}

/// The capacity pools under one root directory.
#[derive(Debug, Clone)]
pub struct Capacity {
    root: PathBuf,
    clock: fn() -> u64,
    reservation_token: fn() -> String,
    reserving_process: fn() -> Option<ProcessIdentity>,
}

impl Capacity {
    /// Pools under `root` (`<state root>/session-active-async-capacity`).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            clock: system_now_ms,
            reservation_token: random_token,
            reserving_process: current_process,
        }
    }

    /// Uses `clock` (milliseconds since the epoch) for `reservedAt` and
    /// `runnerStartedAt`.
    pub fn with_clock(mut self, clock: fn() -> u64) -> Self {
        self.clock = clock;
        self
    }

    /// Uses `token` for the `reservationToken` of new reservations (random
    /// v4 UUIDs by default). Tokens tell reservations apart, so a source
    /// that repeats itself is only fit for one reservation per pool.
    pub fn with_reservation_tokens(mut self, token: fn() -> String) -> Self {
        self.reservation_token = token;
        self
    }

    /// Uses `process` for `reservedByProcess` (this process by default). The
    /// record decides whether an unstarted slot's holder died, so only a
    /// caller that owns every such decision (golden snapshots) changes it.
    pub fn with_reserving_process(mut self, process: fn() -> Option<ProcessIdentity>) -> Self {
        self.reserving_process = process;
        self
    }

    /// The pool directory of a session.
    pub fn pool_dir(&self, session_id: &str) -> PathBuf {
        self.root.join(session_key(session_id))
    }

    /// Admits a run: occupies the first free slot below the limit, after
    /// reconciling the pool if none is free. `Ok(None)` when there is no limit.
    pub fn acquire(&self, request: &Acquire<'_>) -> Result<Option<SlotHandle>, CapacityError> {
        let Some(limit) = effective_limit(request.limit) else {
            return Ok(None);
        };
        let pool = self.pool_dir(request.session_id);
        let _lock = lock_pool(&pool)?;
        self.acquire_locked(&pool, request, limit).map(Some)
    }

    fn acquire_locked(
        &self,
        pool: &Path,
        request: &Acquire<'_>,
        limit: u32,
    ) -> Result<SlotHandle, CapacityError> {
        // Reconciling reads every slot's run files; it is needed only when no
        // index below the limit is free, since it can only free slots. So an
        // admission costs one directory listing and one slot creation, however
        // many runs the session has active.
        let occupied = list_slots(pool)?;
        if occupied.len() < limit as usize {
            pool::sweep_leftovers(pool);
            let taken: HashSet<u64> = occupied.iter().map(|s| s.index).collect();
            if let Some(handle) = self.take_free_slot(pool, request, limit, &taken)? {
                return Ok(handle);
            }
        }
        let snapshot =
            self.reconcile_locked(pool, request.session_id, limit, request.live_workflows)?;
        if snapshot.used >= limit as usize {
            return Err(CapacityError::Exhausted(snapshot));
        }
        let taken: HashSet<u64> = snapshot.slots.iter().map(|s| s.slot).collect();
        match self.take_free_slot(pool, request, limit, &taken)? {
            Some(handle) => Ok(handle),
            None => Err(CapacityError::Exhausted(snapshot_of(pool, limit)?)),
        }
    }

    /// Creates the first slot below `limit` that is not in `taken`. Only the
    /// indices believed free are tried: a slot created meanwhile (by the
    /// reference, which does not take our pool lock) just moves us on.
    fn take_free_slot(
        &self,
        pool: &Path,
        request: &Acquire<'_>,
        limit: u32,
        taken: &HashSet<u64>,
    ) -> Result<Option<SlotHandle>, CapacityError> {
        let token = (self.reservation_token)();
        for slot in (0..u64::from(limit)).filter(|i| !taken.contains(i)) {
            let owner = self.new_owner(request, &token, slot);
            if pool::create_slot(pool, &owner)? {
                let slot_dir = pool.join(format!("slot-{slot}"));
                return Ok(Some(SlotHandle::new(
                    pool, slot_dir, owner, None, limit, self.clock,
                )));
            }
        }
        Ok(None)
    }

    fn new_owner(&self, request: &Acquire<'_>, token: &str, slot: u64) -> OwnerRecord {
        OwnerRecord {
            version: 1,
            reservation_token: token.to_owned(),
            owner_session_id: request.session_id.to_owned(),
            owner_session_key: session_key(request.session_id),
            slot,
            run_id: request.run_id.to_owned(),
            source_run_id: None,
            generation: 0,
            kind: request.kind,
            async_dir: request.async_dir.to_string_lossy().into_owned(),
            reserved_at: (self.clock)(),
            runner_process_instance_id: None,
            runner_started_at: None,
            reserved_by_process: (self.reserving_process)(),
            extra: serde_json::Map::new(),
        }
    }

    /// Moves the source run's slot to the revival (generation + 1). Without
    /// a source slot this acquires a new `runner` slot instead. Neither
    /// reconciles nor checks the limit when a source slot exists.
    pub fn transfer(&self, request: &Transfer<'_>) -> Result<Option<SlotHandle>, CapacityError> {
        let pool = self.pool_dir(request.session_id);
        let limit = effective_limit(request.limit);
        let lock = match (pool.is_dir(), limit) {
            (false, None) => return Ok(None),
            _ => lock_pool(&pool)?,
        };
        for slot in list_slots(&pool)? {
            let source = slot.owner()?.filter(|o| {
                o.owner_session_id == request.session_id && o.run_id == request.source_run_id
            });
            if let Some(source) = source {
                return self.transfer_slot(&pool, slot, source, request).map(Some);
            }
        }
        let Some(limit) = limit else { return Ok(None) };
        let acquire = Acquire {
            session_id: request.session_id,
            limit: Some(limit),
            run_id: request.run_id,
            kind: Kind::Runner,
            async_dir: request.async_dir,
            live_workflows: request.live_workflows,
        };
        let handle = self.acquire_locked(&pool, &acquire, limit);
        drop(lock);
        handle.map(Some)
    }

    fn transfer_slot(
        &self,
        pool: &Path,
        slot: SlotDir,
        source: OwnerRecord,
        request: &Transfer<'_>,
    ) -> Result<SlotHandle, CapacityError> {
        let not_transferable = || CapacityError::NotTransferable(request.source_run_id.to_owned());
        let moved = with_claim(&slot.path, || {
            let disk = read_owner(&slot.path)?.filter(|o| o.identity_matches(&source));
            let disk = disk.ok_or_else(not_transferable)?;
            if !source_is_transferable(&disk, request.source_run_id) {
                return Err(not_transferable());
            }
            let next = self.transferred(&disk, request);
            // Named first: owner.json's directory fsync covers the name.
            pool::write_run_name(&slot.path, &next)?;
            pool::write_owner(&slot.path, &next)?;
            Ok((disk, next))
        })?;
        let (old, next) = moved
            .ok_or_else(|| CapacityError::TransferInProgress(request.source_run_id.to_owned()))?;
        let limit = effective_limit(request.limit).unwrap_or(0);
        Ok(SlotHandle::new(
            pool,
            slot.path,
            next,
            Some(old),
            limit,
            self.clock,
        ))
    }

    fn transferred(&self, old: &OwnerRecord, request: &Transfer<'_>) -> OwnerRecord {
        OwnerRecord {
            run_id: request.run_id.to_owned(),
            source_run_id: Some(request.source_run_id.to_owned()),
            generation: old.generation + 1,
            kind: Kind::Runner,
            async_dir: request.async_dir.to_string_lossy().into_owned(),
            reserved_at: (self.clock)(),
            runner_process_instance_id: None,
            runner_started_at: None,
            reserved_by_process: (self.reserving_process)(),
            ..old.clone()
        }
    }

    /// Frees every slot of the session whose verdict is releasable and
    /// returns the usage afterwards. A missing pool is not created.
    pub fn reconcile(
        &self,
        session_id: &str,
        limit: Option<u32>,
        live_workflows: &HashSet<String>,
    ) -> Result<Snapshot, CapacityError> {
        let limit = effective_limit(limit).unwrap_or(0);
        let pool = self.pool_dir(session_id);
        if !pool.is_dir() {
            return snapshot_of(&pool, limit);
        }
        let _lock = lock_pool(&pool)?;
        self.reconcile_locked(&pool, session_id, limit, live_workflows)
    }

    /// Frees the session's slots whose run is provably over, as
    /// [`Capacity::reconcile`] does, but passes over the slots of
    /// `listed_active`: runs the caller has just read as active, whose slots
    /// the verdict would keep (one that ended since keeps its slot until the
    /// next reconcile, as if it had ended a moment later). Takes no snapshot:
    /// a listing frees slots on its way and counts none of them.
    pub fn release_over(
        &self,
        session_id: &str,
        listed_active: &HashSet<String>,
    ) -> Result<(), CapacityError> {
        let pool = self.pool_dir(session_id);
        if !pool.is_dir() {
            return Ok(());
        }
        let _lock = lock_pool(&pool)?;
        self.release_locked(&pool, session_id, &HashSet::new(), listed_active)?;
        pool::sweep_leftovers(&pool);
        Ok(())
    }

    fn reconcile_locked(
        &self,
        pool: &Path,
        session_id: &str,
        limit: u32,
        live_workflows: &HashSet<String>,
    ) -> Result<Snapshot, CapacityError> {
        self.release_locked(pool, session_id, live_workflows, &HashSet::new())?;
        pool::sweep_leftovers(pool);
        snapshot_of(pool, limit)
    }

    fn release_locked(
        &self,
        pool: &Path,
        session_id: &str,
        live_workflows: &HashSet<String>,
        listed_active: &HashSet<String>,
    ) -> Result<(), CapacityError> {
        let key = session_key(session_id);
        for slot in list_slots(pool)? {
            let Some(owner) = slot.owner()? else {
                self.reclaim_damaged(pool, &key, &slot, listed_active)?;
                continue;
            };
            let ours = owner.owner_session_id == session_id
                && owner.owner_session_key == key
                && owner.slot == slot.index;
            let listed = owner.kind == Kind::Runner && listed_active.contains(&owner.run_id);
            if ours && !listed {
                release_if_releasable(pool, &slot, &owner, live_workflows)?;
            }
        }
        Ok(())
    }

    /// Frees the slot `run_id` holds in the session's pool when its verdict
    /// is releasable (the run's finalizer calls this right after its proof
    /// is durable, so no reader has to repair the count later). `slot` is
    /// the index the launcher took, when known: only that slot is read;
    /// otherwise the pool's slots are read until the run's is found.
    /// Returns whether a slot was freed. A missing pool is not created, and
    /// a slot whose claim is held elsewhere is left to the next reconcile.
    pub fn release_run(
        &self,
        session_id: &str,
        run_id: &str,
        slot: Option<u64>,
    ) -> Result<bool, CapacityError> {
        let pool = self.pool_dir(session_id);
        if !pool.is_dir() {
            return Ok(false);
        }
        let _lock = lock_pool(&pool)?;
        let held = |s: &SlotDir| -> Result<Option<OwnerRecord>, CapacityError> {
            Ok(s.owner()?.filter(|o| {
                o.run_id == run_id && o.owner_session_id == session_id && o.slot == s.index
            }))
        };
        let hinted = slot.map(|index| SlotDir {
            index,
            path: pool.join(format!("slot-{index}")),
        });
        let found = match hinted {
            Some(s) => held(&s)?.map(|o| (s, o)),
            None => None,
        };
        let found = match found {
            Some(found) => Some(found),
            None => {
                let mut found = None;
                for s in list_slots(&pool)? {
                    if let Some(owner) = held(&s)? {
                        found = Some((s, owner));
                        break;
                    }
                }
                found
            }
        };
        let Some((slot, owner)) = found else {
            return Ok(false);
        };
        release_if_releasable(&pool, &slot, &owner, &HashSet::new())
    }

    /// Frees a slot whose `owner.json` is damaged (a FIFO or directory in
    /// its place, oversize, not UTF-8, not an owner record) once the run its
    /// second record names ([`pool::recorded_run`]) is provably over
    /// ([`verdict::damaged_owner_verdict`]). A slot without that record (one
    /// the reference made) is kept, as before.
    fn reclaim_damaged(
        &self,
        pool: &Path,
        key: &str,
        slot: &SlotDir,
        listed_active: &HashSet<String>,
    ) -> Result<(), CapacityError> {
        let Some(recorded) = pool::recorded_run(&slot.path) else {
            return Ok(());
        };
        if listed_active.contains(&recorded.run_id) {
            return Ok(());
        }
        let verdict = verdict::damaged_owner_verdict(&recorded, key, &self.runs_dir());
        if verdict.state != ReleaseState::Releasable {
            return Ok(());
        }
        with_claim(&slot.path, || {
            let still = read_owner(&slot.path)?.is_none()
                && pool::recorded_run(&slot.path).as_ref() == Some(&recorded);
            if still {
                pool::release_slot(pool, slot)?;
            }
            Ok(())
        })?;
        Ok(())
    }

    /// The runs directory next to this capacity root
    /// (`<state root>/async-subagent-runs`).
    fn runs_dir(&self) -> PathBuf {
        self.root
            .parent()
            .unwrap_or(Path::new("/"))
            .join("async-subagent-runs")
    }

    /// Counts the session's slots without changing anything.
    pub fn count(&self, session_id: &str, limit: Option<u32>) -> Result<Snapshot, CapacityError> {
        snapshot_of(
            &self.pool_dir(session_id),
            effective_limit(limit).unwrap_or(0),
        )
    }

    /// How many slots the session holds, from one listing of its pool: no
    /// slot's owner is read. Read-only.
    pub fn used(&self, session_id: &str) -> Result<usize, CapacityError> {
        Ok(list_slots(&self.pool_dir(session_id))?.len())
    }

    /// Explains whether a run holds a slot and whether it could be freed.
    /// Read-only.
    pub fn inspect(
        &self,
        query: &InspectQuery<'_>,
        live_workflows: &HashSet<String>,
    ) -> Result<Inspection, CapacityError> {
        let wanted_dir = query.async_dir.map(normalize);
        for pool in self.pools(query.session_id)? {
            for slot in list_slots(&pool)? {
                let Some(owner) = slot.owner()? else { continue };
                let same_dir = wanted_dir
                    .as_ref()
                    .is_some_and(|d| *d == normalize(Path::new(&owner.async_dir)));
                let current = owner.run_id == query.run_id || same_dir;
                let source = owner.source_run_id.as_deref() == Some(query.run_id);
                if current || source {
                    let release = if current {
                        release_verdict(&owner, live_workflows)
                    } else {
                        Verdict::not_owned(format!("slot was transferred to {}", owner.run_id))
                    };
                    let relation = if current {
                        Relation::Current
                    } else {
                        Relation::Source
                    };
                    return Ok(Inspection {
                        owner: Some(owner),
                        relation,
                        slot_dir: Some(slot.path),
                        release,
                    });
                }
            }
        }
        Ok(Inspection {
            owner: None,
            relation: Relation::None,
            slot_dir: None,
            release: Verdict::not_owned("no active-capacity slot records this run"),
        })
    }

    fn pools(&self, session_id: Option<&str>) -> Result<Vec<PathBuf>, CapacityError> {
        if let Some(session_id) = session_id {
            return Ok(vec![self.pool_dir(session_id)]);
        }
        let entries = match std::fs::read_dir(&self.root) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            other => other.map_err(|source| atomic_file::Error {
                op: "list",
                path: self.root.clone(),
                source,
            })?,
        };
        let mut pools: Vec<PathBuf> = entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.path())
            .collect();
        pools.sort();
        Ok(pools)
    }
}

/// Under the pool lock: frees `slot` when `owner`'s verdict is releasable
/// and the slot is still `owner`'s under its claim. The claim (one fsync)
/// is taken only for a slot that goes.
fn release_if_releasable(
    pool: &Path,
    slot: &SlotDir,
    owner: &OwnerRecord,
    live_workflows: &HashSet<String>,
) -> Result<bool, CapacityError> {
    if release_verdict(owner, live_workflows).state != ReleaseState::Releasable {
        return Ok(false);
    }
    let released = with_claim(&slot.path, || {
        let still = read_owner(&slot.path)?.is_some_and(|o| o.identity_matches(owner));
        if still {
            pool::release_slot(pool, slot)?;
        }
        Ok(still)
    })?;
    Ok(released.unwrap_or(false))
}

fn source_is_transferable(owner: &OwnerRecord, source_run_id: &str) -> bool {
    let StatusRead::Present(status) = read_status(Path::new(&owner.async_dir)) else {
        return false;
    };
    // A paused source is the one a resume takes over: not active, though
    // it holds its slot (see `status::RunState::holds_capacity`).
    status.run_id == source_run_id && !status.state.is_active()
}

fn snapshot_of(pool: &Path, limit: u32) -> Result<Snapshot, CapacityError> {
    let slots = list_slots(pool)?
        .iter()
        .map(SlotSummary::of)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Snapshot {
        used: slots.len(),
        limit,
        slots,
    })
}

/// Lexical path resolution like Node's `path.resolve` (no symlinks followed).
fn normalize(path: &Path) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut out = PathBuf::new();
    for component in absolute.components() {
        match component {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}
