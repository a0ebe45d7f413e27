//! Admission: all-or-nothing batch claims under the budget's file lock.

use std::collections::BTreeSet;
use std::fs::{File, TryLockError};
use std::io;
use std::os::fd::OwnedFd;
use std::thread;
use std::time::{Duration, Instant};

use nix::fcntl::{OFlag, openat};
use nix::sys::stat::Mode;
use nix::unistd::{UnlinkatFlags, unlinkat};
use serde_json::json;

use crate::budget::{fd_path, slot_name};
use crate::reference_lock::ReferenceLock;
use crate::{
    CommitError, Error, LOCK_FILE, LOCK_TIMEOUT, OpenBudget, Result, RunFanoutLimitError, Snapshot,
    Sources,
};

/// Longest pause between two attempts at a held lock.
const MAX_POLL: Duration = Duration::from_millis(20);

impl OpenBudget {
    /// Claims one slot per local path (qualified with `parentPath`) as one
    /// all-or-nothing batch; returns the snapshot after the claim.
    ///
    /// Over the limit the error is [`Error::LimitReached`] and nothing is claimed.
    pub fn claim<S: AsRef<str>>(&self, paths: &[S]) -> Result<Snapshot> {
        self.claim_with_commit(paths, |after| Ok(*after))
    }

    /// [`OpenBudget::claim`] taking each slot's `claimId` and `claimedAt`
    /// from `sources` (golden snapshots pin them).
    pub fn claim_using<S: AsRef<str>>(
        &self,
        paths: &[S],
        sources: &Sources<'_>,
    ) -> Result<Snapshot> {
        self.claim_with_commit_using(paths, sources, |after| Ok(*after))
    }

    /// Like [`OpenBudget::claim`], then runs `commit` with the snapshot after
    /// the claim while still holding the lock; if `commit` fails the batch's
    /// slot files are removed and its error is returned as [`Error::Commit`].
    ///
    /// An empty batch takes no lock and claims nothing: `commit` gets the
    /// current snapshot.
    pub fn claim_with_commit<S, T, F>(&self, paths: &[S], commit: F) -> Result<T>
    where
        S: AsRef<str>,
        F: FnOnce(&Snapshot) -> Result<T, CommitError>,
    {
        self.claim_with_commit_using(paths, &Sources::system(), commit)
    }

    /// [`OpenBudget::claim_with_commit`] taking each slot's `claimId` and
    /// `claimedAt` from `sources`.
    pub fn claim_with_commit_using<S, T, F>(
        &self,
        paths: &[S],
        sources: &Sources<'_>,
        commit: F,
    ) -> Result<T>
    where
        S: AsRef<str>,
        F: FnOnce(&Snapshot) -> Result<T, CommitError>,
    {
        if paths.is_empty() {
            return commit(&self.snapshot()?).map_err(Error::Commit);
        }
        let qualified: Vec<String> = paths
            .iter()
            .map(|p| self.descriptor.qualify(p.as_ref()))
            .collect();
        let _lock = AdmissionLock::acquire(self)?;
        let claims = self.open_claims()?;
        let mut taken = self.taken_slots(&claims)?;
        let before = Snapshot::new(taken.len() as u64, self.descriptor.limit);
        if qualified.len() as u64 > before.remaining {
            return Err(RunFanoutLimitError::new(&qualified, before).into());
        }
        let mut created = Vec::with_capacity(qualified.len());
        let result = self
            .place_all(&claims, &qualified, sources, &mut taken, &mut created)
            .and_then(|()| {
                let after = Snapshot::new(before.used + created.len() as u64, before.limit);
                commit(&after).map_err(Error::Commit)
            });
        if result.is_err() {
            roll_back(&claims, &created);
        }
        result
    }

    fn place_all(
        &self,
        claims: &OwnedFd,
        qualified: &[String],
        sources: &Sources<'_>,
        taken: &mut BTreeSet<u32>,
        created: &mut Vec<u32>,
    ) -> Result<()> {
        let mut next = 0;
        for path in qualified {
            let slot = self.place(claims, path, sources, taken, next, created)?;
            next = slot + 1;
        }
        Ok(())
    }

    /// Creates the first free slot file at or after `from`; the exclusive
    /// create is a second barrier behind the lock.
    fn place(
        &self,
        claims: &OwnedFd,
        path: &str,
        sources: &Sources<'_>,
        taken: &mut BTreeSet<u32>,
        from: u32,
        created: &mut Vec<u32>,
    ) -> Result<u32> {
        let limit = u32::try_from(self.descriptor.limit).unwrap_or(u32::MAX);
        let record = json!({
            "version": 1,
            "claimId": (sources.uuid)(),
            "path": path,
            "claimedAt": (sources.now_ms)(),
        });
        let bytes = format!("{record}\n");
        for slot in (from..limit).filter(|s| !taken.contains(s)) {
            let name = slot_name(slot);
            match atomic_file::create_new_private(&fd_path(claims).join(&name), bytes.as_bytes()) {
                Ok(()) => {
                    taken.insert(slot);
                    created.push(slot);
                    return Ok(slot);
                }
                Err(e) if e.is_already_exists() => continue,
                Err(e) => {
                    // Only a failed directory sync leaves the new file behind.
                    if e.op == "sync directory" {
                        created.push(slot);
                    }
                    let file = self.claims_path().join(&name);
                    return Err(Error::io("create claim slot", file, e.source));
                }
            }
        }
        Err(Error::NoFreeSlot {
            path: path.to_string(),
            limit: self.descriptor.limit,
        })
    }
}

fn roll_back(claims: &OwnedFd, created: &[u32]) {
    for slot in created {
        // Best effort, as in the reference: the original error is what matters.
        let _ = unlinkat(
            claims,
            slot_name(*slot).as_str(),
            UnlinkatFlags::NoRemoveDir,
        );
    }
    let _ = atomic_file::sync_dir(&fd_path(claims));
}

/// The admission lock: an exclusive `flock` on `<budget dir>/admission.flock`
/// (our claimers), then the reference's directory lock `admission.lock/`
/// (pi-subagents 0.49 claimers on the same budget).
///
/// The kernel drops the flock when the holder exits or dies, so there is no
/// staleness guess among our processes. Dropping releases the directory lock
/// first (fields drop in order), then the flock.
struct AdmissionLock {
    _reference: ReferenceLock,
    _file: File,
}

impl AdmissionLock {
    /// Polls for both locks until [`LOCK_TIMEOUT`] has passed.
    fn acquire(budget: &OpenBudget) -> Result<Self> {
        let deadline = Instant::now() + LOCK_TIMEOUT;
        let file = Self::acquire_flock(budget, deadline)?;
        let reference =
            ReferenceLock::acquire(&fd_path(&budget.dir), deadline).map_err(|e| match e {
                Error::LockTimeout { .. } => Error::LockTimeout {
                    dir: budget.descriptor.directory.clone(),
                },
                other => other,
            })?;
        Ok(Self {
            _reference: reference,
            _file: file,
        })
    }

    fn acquire_flock(budget: &OpenBudget, deadline: Instant) -> Result<File> {
        let mut pause = Duration::from_millis(1);
        loop {
            if let Some(file) = Self::try_flock(budget)? {
                return Ok(file);
            }
            if Instant::now() >= deadline {
                return Err(Error::LockTimeout {
                    dir: budget.descriptor.directory.clone(),
                });
            }
            thread::sleep(pause);
            pause = (pause * 2).min(MAX_POLL);
        }
    }

    fn try_flock(budget: &OpenBudget) -> Result<Option<File>> {
        let path = || budget.descriptor.directory.join(LOCK_FILE);
        // O_NONBLOCK: a FIFO in place of the lock is refused below, not waited on.
        let flags = OFlag::O_RDWR
            | OFlag::O_CREAT
            | OFlag::O_NOFOLLOW
            | OFlag::O_NONBLOCK
            | OFlag::O_CLOEXEC;
        let fd = openat(
            &budget.dir,
            LOCK_FILE,
            flags,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(|e| Error::io("open admission lock", path(), e.into()))?;
        let file = File::from(fd);
        if !file.metadata().is_ok_and(|m| m.is_file()) {
            let e = io::Error::new(io::ErrorKind::InvalidInput, "not a regular file");
            return Err(Error::io("open admission lock", path(), e));
        }
        match file.try_lock() {
            Ok(()) => Ok(Some(file)),
            Err(TryLockError::WouldBlock) => Ok(None),
            Err(TryLockError::Error(e)) => Err(Error::io("lock admission lock", path(), e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn budget(tmp: &tempfile::TempDir) -> OpenBudget {
        crate::create_budget(&tmp.path().join("budgets"), "r", 3).unwrap()
    }

    /// The exclusive create is the second barrier: a slot file that appeared
    /// after the claimer listed the slots is skipped, not overwritten and not
    /// an error.
    #[test]
    fn a_slot_taken_behind_the_listing_is_skipped() {
        let tmp = tempfile::tempdir().unwrap();
        let budget = budget(&tmp);
        let claims = budget.open_claims().unwrap();
        fs::write(budget.claims_path().join("000000.json"), "{}\n").unwrap();
        let (mut taken, mut created) = (BTreeSet::new(), Vec::new());
        let slot = budget
            .place(
                &claims,
                "p",
                &Sources::system(),
                &mut taken,
                0,
                &mut created,
            )
            .unwrap();
        assert_eq!((slot, created), (1, vec![1]));
        assert_eq!(
            fs::read_to_string(budget.claims_path().join("000000.json")).unwrap(),
            "{}\n"
        );
    }

    /// A create that fails for another reason than "exists" is reported as
    /// that failure, not mistaken for a full budget.
    #[test]
    fn a_failed_create_is_an_io_error_not_exhaustion() {
        let tmp = tempfile::tempdir().unwrap();
        let budget = budget(&tmp);
        let gone = tmp.path().join("gone");
        fs::create_dir(&gone).unwrap();
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        let claims = nix::fcntl::open(&gone, flags, Mode::empty()).unwrap();
        // Nothing can be created in a removed directory (ENOENT).
        fs::remove_dir(&gone).unwrap();
        let (mut taken, mut created) = (BTreeSet::new(), Vec::new());
        let err = budget
            .place(
                &claims,
                "p",
                &Sources::system(),
                &mut taken,
                0,
                &mut created,
            )
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::Io {
                    op: "create claim slot",
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(created.is_empty());
    }
}
