//! A held reservation: bind it to a runner, or roll it back (docs/protocol/capacity.md §4.3–4.5).

use std::path::{Path, PathBuf};

use crate::decision::CapacityAction;
use crate::owner::{Kind, OwnerRecord};
use crate::pool::{
    SlotDir, lock_pool, read_owner, release_slot, with_claim, write_owner, write_started_owner,
};
use crate::{CapacityError, Snapshot};

/// One slot reserved by [`crate::Capacity::acquire`] or [`crate::Capacity::transfer`].
#[derive(Debug)]
pub struct SlotHandle {
    pool: PathBuf,
    slot_dir: PathBuf,
    owner: OwnerRecord,
    /// The source run's record, for a handle made by a transfer.
    source: Option<OwnerRecord>,
    rolled_back: bool,
    limit: u32,
    clock: fn() -> u64,
}

impl SlotHandle {
    pub(crate) fn new(
        pool: &Path,
        slot_dir: PathBuf,
        owner: OwnerRecord,
        source: Option<OwnerRecord>,
        limit: u32,
        clock: fn() -> u64,
    ) -> Self {
        Self {
            pool: pool.to_path_buf(),
            slot_dir,
            owner,
            source,
            rolled_back: false,
            limit,
            clock,
        }
    }

    /// The owner record as this handle last wrote or saw it.
    pub fn owner(&self) -> &OwnerRecord {
        &self.owner
    }

    /// The slot directory (`<pool>/slot-<N>`).
    pub fn slot_dir(&self) -> &Path {
        &self.slot_dir
    }

    /// The limit snapshots of this handle report (0 = unlimited).
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// True when the handle came from a transfer.
    pub fn is_transfer(&self) -> bool {
        self.source.is_some()
    }

    /// Whether a runner was bound or the workflow was marked started.
    pub fn is_started(&self) -> bool {
        self.owner.is_started()
    }

    /// Usage of this handle's pool, counted without changing anything.
    pub fn count(&self) -> Result<Snapshot, CapacityError> {
        crate::snapshot_of(&self.pool, self.limit)
    }

    /// Binds the slot to the spawned runner. The record is persisted before
    /// the handle believes it, and a failed write is returned.
    pub fn mark_started(&mut self, runner_process_instance_id: &str) -> Result<(), CapacityError> {
        if runner_process_instance_id.is_empty() {
            return Err(CapacityError::EmptyRunnerId);
        }
        let now = (self.clock)();
        let bound = self.rewrite_matching(|owner| {
            owner.runner_process_instance_id = Some(runner_process_instance_id.to_owned());
            owner.runner_started_at = Some(now);
        });
        match bound {
            Ok(Some(next)) => {
                self.owner = next;
                Ok(())
            }
            Ok(None) => Err(CapacityError::RunOwnershipChanged(
                self.owner.run_id.clone(),
            )),
            Err(CapacityError::File(source)) => Err(CapacityError::Bind {
                runner: runner_process_instance_id.to_owned(),
                source,
            }),
            Err(e) => Err(e),
        }
    }

    /// Carries out [`crate::decide_after_spawn`]'s answer: binds the runner,
    /// or rolls back (a refused rollback is not an error).
    pub fn apply(&mut self, action: &CapacityAction) -> Result<(), CapacityError> {
        match action {
            CapacityAction::MarkStarted(runner) => self.mark_started(runner),
            CapacityAction::Rollback => self.rollback().map(drop),
        }
    }

    /// Marks a workflow slot started (sets only `runnerStartedAt`).
    pub fn mark_workflow_started(&mut self) -> Result<(), CapacityError> {
        let changed = || CapacityError::WorkflowOwnershipChanged(self.owner.run_id.clone());
        if self.owner.kind != Kind::Workflow {
            return Err(changed());
        }
        let now = (self.clock)();
        match self.rewrite_matching(|owner| owner.runner_started_at = Some(now)) {
            Ok(Some(next)) => {
                self.owner = next;
                Ok(())
            }
            Ok(None) => Err(changed()),
            Err(CapacityError::File(source)) => Err(CapacityError::MarkWorkflow {
                run_id: self.owner.run_id.clone(),
                source,
            }),
            Err(e) => Err(e),
        }
    }

    /// Under the pool lock and the slot claim: applies `change` to the
    /// on-disk owner if it still is this handle's, and writes it.
    fn rewrite_matching(
        &self,
        change: impl FnOnce(&mut OwnerRecord),
    ) -> Result<Option<OwnerRecord>, CapacityError> {
        let _lock = lock_pool(&self.pool)?;
        let written = with_claim(&self.slot_dir, || {
            let disk = read_owner(&self.slot_dir)?.filter(|o| o.identity_matches(&self.owner));
            let Some(mut next) = disk else {
                return Ok(None);
            };
            change(&mut next);
            write_started_owner(&self.slot_dir, &next)?;
            Ok(Some(next))
        })?;
        Ok(written.flatten())
    }

    /// Frees the slot if its run is already provably over: a run can end
    /// before its launcher binds the runner, and the finalizer could not
    /// free a slot that was not bound yet. Reads the run's files only when
    /// its proof exists. `Ok(true)` when the slot went.
    pub fn release_if_over(&mut self) -> Result<bool, CapacityError> {
        let proof = Path::new(&self.owner.async_dir).join("process-terminal.json");
        if self.rolled_back || !proof.exists() {
            return Ok(false);
        }
        let _lock = lock_pool(&self.pool)?;
        let Some(owner) = read_owner(&self.slot_dir)?.filter(|o| o.identity_matches(&self.owner))
        else {
            return Ok(false);
        };
        let released = crate::release_if_releasable(
            &self.pool,
            &self.own_slot(),
            &owner,
            &std::collections::HashSet::new(),
        )?;
        self.rolled_back |= released;
        Ok(released)
    }

    /// Undoes an unstarted reservation: frees the slot, or for a transfer
    /// writes the source run's record back. `Ok(false)` when the slot was
    /// started, already rolled back, claimed, or no longer this handle's.
    pub fn rollback(&mut self) -> Result<bool, CapacityError> {
        if self.owner.is_started() || self.rolled_back {
            return Ok(false);
        }
        let _lock = lock_pool(&self.pool)?;
        let done = with_claim(&self.slot_dir, || {
            let disk = read_owner(&self.slot_dir)?
                .filter(|o| o.identity_matches(&self.owner) && !o.is_started());
            if disk.is_none() {
                return Ok(false);
            }
            match &self.source {
                Some(source) => write_owner(&self.slot_dir, source)?,
                None => release_slot(&self.pool, &self.own_slot())?,
            }
            Ok(true)
        })?
        .unwrap_or(false);
        if done {
            self.rolled_back = true;
            if let Some(source) = &self.source {
                self.owner = source.clone();
            }
        }
        Ok(done)
    }

    fn own_slot(&self) -> SlotDir {
        SlotDir {
            index: self.owner.slot,
            path: self.slot_dir.clone(),
        }
    }
}
