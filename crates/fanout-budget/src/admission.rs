//! Admission: all-or-nothing batch claims under the budget's file lock.
//!
//! The lock is held for as little as possible. Before it, a claimant
//! refuses a batch that already cannot fit (claims are never released, so
//! usage only grows: what does not fit now never will) and writes each
//! claim record, synced, to a hidden temp file in `claims/`. Under the lock
//! it only lists the slots and links each prepared record to a free slot
//! name (`linkat`, which fails on an existing name). The claims directory is
//! synced after the lock is released, before the claim is reported admitted;
//! a batch with a commit syncs it before its commit instead.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fs::{File, TryLockError};
use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::sync::mpsc;
use std::thread;
use std::time::Instant;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat};
use nix::sys::stat::Mode;
use nix::unistd::{UnlinkatFlags, linkat, unlinkat};
use serde_json::json;

use crate::budget::{fd_path, slot_name};
use crate::reference_lock::ReferenceLock;
use crate::{
    CommitError, Error, LOCK_FILE, LOCK_TIMEOUT, OpenBudget, Result, RunFanoutLimitError, Snapshot,
    Sources,
};

/// Prefix of a prepared claim record: `.claim.<pid>.<uuid>.tmp`. It never
/// matches a slot name, so neither we nor pi-subagents 0.49 count it.
pub(crate) const TEMP_PREFIX: &str = ".claim.";
const TEMP_SUFFIX: &str = ".tmp";

/// When a batch's slot names are made durable.
#[derive(Clone, Copy, PartialEq, Eq)]
enum SyncPoint {
    /// Under the lock, before the caller's commit records anything that
    /// relies on the claims.
    BeforeCommit,
    /// After the lock is released, before the claim returns: the plain
    /// claim has nothing to commit.
    AfterRelease,
}

impl OpenBudget {
    /// Claims one slot per local path (qualified with `parentPath`) as one
    /// all-or-nothing batch; returns the snapshot after the claim.
    ///
    /// Over the limit the error is [`Error::LimitReached`] and nothing is claimed.
    pub fn claim<S: AsRef<str>>(&self, paths: &[S]) -> Result<Snapshot> {
        self.claim_using(paths, &Sources::system())
    }

    /// [`OpenBudget::claim`] taking each slot's `claimId` and `claimedAt`
    /// from `sources` (golden snapshots pin them).
    pub fn claim_using<S: AsRef<str>>(
        &self,
        paths: &[S],
        sources: &Sources<'_>,
    ) -> Result<Snapshot> {
        self.admit(paths, sources, SyncPoint::AfterRelease, |after| Ok(*after))
    }

    /// Like [`OpenBudget::claim`], then runs `commit` with the snapshot after
    /// the claim while still holding the lock; if `commit` fails the batch's
    /// slot files are removed and its error is returned as [`Error::Commit`].
    /// The claims are durable before `commit` runs.
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
        self.admit(paths, sources, SyncPoint::BeforeCommit, commit)
    }

    fn admit<S, T, F>(
        &self,
        paths: &[S],
        sources: &Sources<'_>,
        sync: SyncPoint,
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
        let claims = self.open_claims()?;
        let listing = self.list_claims(&claims)?;
        for name in &listing.dead_temps {
            let _ = unlinkat(&claims, name.as_os_str(), UnlinkatFlags::NoRemoveDir);
        }
        self.refuse_early(listing.slots.len(), &qualified)?;
        let mut prepared = Prepared::write(self, &claims, &qualified, sources)?;
        // Others may have filled the budget while the records were synced.
        self.refuse_early(self.taken_slots(&claims)?.len(), &qualified)?;
        let lock = AdmissionLock::acquire(self)?;
        let mut taken = self.taken_slots(&claims)?;
        let before = Snapshot::new(taken.len() as u64, self.descriptor.limit);
        if qualified.len() as u64 > before.remaining {
            return Err(RunFanoutLimitError::new(&qualified, before).into());
        }
        let mut created = Vec::with_capacity(qualified.len());
        let result = self
            .place_all(&mut prepared, &mut taken, &mut created)
            .and_then(|()| {
                if sync == SyncPoint::BeforeCommit {
                    self.sync_claims(&claims)?;
                }
                let after = Snapshot::new(before.used + created.len() as u64, before.limit);
                commit(&after).map_err(Error::Commit)
            });
        if result.is_err() {
            roll_back(&claims, &created);
            return result;
        }
        drop(lock);
        if sync == SyncPoint::AfterRelease
            && let Err(e) = self.sync_claims(&claims)
        {
            // Never reported admitted: give the slots back. Someone who saw
            // them meanwhile refused or took a later slot, which is safe.
            roll_back(&claims, &created);
            return Err(e);
        }
        result
    }

    /// Refuses, without the lock, a batch that does not fit next to `used`
    /// slots seen in the claims directory. Usage never shrinks (claims are
    /// never released; only a batch that fails before it is admitted
    /// removes its slots again), so the locked count could only confirm the
    /// refusal, and a refusal never waits for the lock.
    fn refuse_early(&self, used: usize, qualified: &[String]) -> Result<()> {
        let now = Snapshot::new(used as u64, self.descriptor.limit);
        if qualified.len() as u64 > now.remaining {
            return Err(RunFanoutLimitError::new(qualified, now).into());
        }
        Ok(())
    }

    fn place_all(
        &self,
        prepared: &mut Prepared<'_>,
        taken: &mut BTreeSet<u32>,
        created: &mut Vec<u32>,
    ) -> Result<()> {
        let mut next = 0;
        for index in 0..prepared.names.len() {
            let slot = self.place(prepared, index, taken, next, created)?;
            next = slot + 1;
        }
        Ok(())
    }

    /// Links prepared record `index` to the first free slot at or after
    /// `from`; `linkat` fails on an existing name, a second barrier behind
    /// the lock.
    fn place(
        &self,
        prepared: &Prepared<'_>,
        index: usize,
        taken: &mut BTreeSet<u32>,
        from: u32,
        created: &mut Vec<u32>,
    ) -> Result<u32> {
        let limit = u32::try_from(self.descriptor.limit).unwrap_or(u32::MAX);
        let temp = prepared.names[index].as_str();
        for slot in (from..limit).filter(|s| !taken.contains(s)) {
            let name = slot_name(slot);
            match linkat(
                prepared.claims,
                temp,
                prepared.claims,
                name.as_str(),
                AtFlags::empty(),
            ) {
                Ok(()) => {
                    taken.insert(slot);
                    created.push(slot);
                    return Ok(slot);
                }
                Err(Errno::EEXIST) => continue,
                Err(e) => {
                    let file = self.claims_path().join(&name);
                    return Err(Error::io("create claim slot", file, e.into()));
                }
            }
        }
        Err(Error::NoFreeSlot {
            path: prepared.paths[index].clone(),
            limit: self.descriptor.limit,
        })
    }

    /// Fsyncs the claims directory, making the batch's slot names durable
    /// (their content was synced when prepared).
    fn sync_claims(&self, claims: &OwnedFd) -> Result<()> {
        let dir = File::from(
            claims
                .try_clone()
                .map_err(|e| Error::io("sync directory", self.claims_path(), e))?,
        );
        dir.sync_all()
            .map_err(|e| Error::io("sync directory", self.claims_path(), e))
    }
}

/// The batch's claim records, written and synced under hidden temp names
/// before the lock is taken; dropping removes the temp names (placed
/// records keep their slot name).
struct Prepared<'a> {
    claims: &'a OwnedFd,
    paths: Vec<String>,
    names: Vec<String>,
}

impl<'a> Prepared<'a> {
    fn write(
        budget: &OpenBudget,
        claims: &'a OwnedFd,
        qualified: &[String],
        sources: &Sources<'_>,
    ) -> Result<Self> {
        let mut prepared = Self {
            claims,
            paths: qualified.to_vec(),
            names: Vec::with_capacity(qualified.len()),
        };
        for path in qualified {
            let record = json!({
                "version": 1,
                "claimId": (sources.uuid)(),
                "path": path,
                "claimedAt": (sources.now_ms)(),
            });
            let name = format!(
                "{TEMP_PREFIX}{}.{}{TEMP_SUFFIX}",
                std::process::id(),
                crate::budget::random_uuid()
            );
            let written = write_synced(claims, &name, format!("{record}\n").as_bytes());
            let Err(e) = written else {
                prepared.names.push(name);
                continue;
            };
            let _ = unlinkat(claims, name.as_str(), UnlinkatFlags::NoRemoveDir);
            return Err(Error::io(
                "write claim record",
                budget.claims_path().join(&name),
                e,
            ));
        }
        Ok(prepared)
    }
}

impl Drop for Prepared<'_> {
    fn drop(&mut self) {
        for name in &self.names {
            let _ = unlinkat(self.claims, name.as_str(), UnlinkatFlags::NoRemoveDir);
        }
    }
}

/// Creates `name` in `dir` (never following or replacing anything), writes
/// `bytes` and fsyncs the file.
fn write_synced(dir: &OwnedFd, name: &str, bytes: &[u8]) -> io::Result<()> {
    let flags =
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = openat(dir, name, flags, Mode::from_bits_truncate(0o600))?;
    let mut file = File::from(fd);
    file.write_all(bytes)?;
    file.sync_all()
}

/// What a listing of `claims/` found.
pub(crate) struct Listing {
    /// Slot numbers of the entries named like a slot file.
    pub(crate) slots: BTreeSet<u32>,
    /// Prepared records whose writer no longer exists.
    pub(crate) dead_temps: Vec<OsString>,
}

/// The pid in a prepared record's name, `.claim.<pid>.<uuid>.tmp`.
pub(crate) fn temp_owner(name: &str) -> Option<i32> {
    let rest = name.strip_prefix(TEMP_PREFIX)?.strip_suffix(TEMP_SUFFIX)?;
    rest.split_once('.')?.0.parse().ok().filter(|pid| *pid > 0)
}

/// Whether a process with `pid` exists (EPERM: it does, as another user).
pub(crate) fn pid_alive(pid: i32) -> bool {
    !matches!(
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None),
        Err(Errno::ESRCH)
    )
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
    /// Waits for both locks until [`LOCK_TIMEOUT`] has passed.
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

    /// Takes the flock at once if it is free; otherwise a helper thread
    /// blocks in `flock` (the kernel hands the lock over the moment it is
    /// released, where polling would leave it idle between polls) while
    /// this thread waits for it until `deadline`.
    fn acquire_flock(budget: &OpenBudget, deadline: Instant) -> Result<File> {
        let path = || budget.descriptor.directory.join(LOCK_FILE);
        let file = Self::open_lock(budget)?;
        match file.try_lock() {
            Ok(()) => return Ok(file),
            Err(TryLockError::WouldBlock) => {}
            Err(TryLockError::Error(e)) => return Err(Error::io("lock admission lock", path(), e)),
        }
        // The clone shares the open file description, so the lock it takes
        // is held through `file` too.
        let waiter = file
            .try_clone()
            .map_err(|e| Error::io("lock admission lock", path(), e))?;
        let (tx, rx) = mpsc::channel();
        thread::Builder::new()
            .name("admission-lock".into())
            .spawn(move || {
                let locked = loop {
                    match waiter.lock() {
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        other => break other,
                    }
                };
                // After a timeout nobody receives: dropping `waiter` then
                // closes the last handle and releases the lock at once.
                let _ = tx.send(locked);
            })
            .map_err(|e| Error::io("lock admission lock", path(), e))?;
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(Ok(())) => Ok(file),
            Ok(Err(e)) => Err(Error::io("lock admission lock", path(), e)),
            Err(_) => Err(Error::LockTimeout {
                dir: budget.descriptor.directory.clone(),
            }),
        }
    }

    fn open_lock(budget: &OpenBudget) -> Result<File> {
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
        Ok(file)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn budget(tmp: &tempfile::TempDir) -> OpenBudget {
        crate::create_budget(&tmp.path().join("budgets"), "r", 3).unwrap()
    }

    fn prepare<'a>(budget: &OpenBudget, claims: &'a OwnedFd) -> Prepared<'a> {
        Prepared::write(budget, claims, &["p".to_string()], &Sources::system()).unwrap()
    }

    /// `linkat` is the second barrier: a slot file that appeared after the
    /// claimer listed the slots is skipped, not overwritten and not an error.
    #[test]
    fn a_slot_taken_behind_the_listing_is_skipped() {
        let tmp = tempfile::tempdir().unwrap();
        let budget = budget(&tmp);
        let claims = budget.open_claims().unwrap();
        let prepared = prepare(&budget, &claims);
        fs::write(budget.claims_path().join("000000.json"), "{}\n").unwrap();
        let (mut taken, mut created) = (BTreeSet::new(), Vec::new());
        let slot = budget
            .place(&prepared, 0, &mut taken, 0, &mut created)
            .unwrap();
        assert_eq!((slot, created), (1, vec![1]));
        assert_eq!(
            fs::read_to_string(budget.claims_path().join("000000.json")).unwrap(),
            "{}\n"
        );
        let placed = fs::read_to_string(budget.claims_path().join("000001.json")).unwrap();
        assert!(placed.contains(r#""path":"p""#), "{placed}");
        drop(prepared);
        let names: Vec<_> = fs::read_dir(budget.claims_path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 2, "the temp name is gone: {names:?}");
    }

    /// A link that fails for another reason than "exists" is reported as
    /// that failure, not mistaken for a full budget.
    #[test]
    fn a_failed_link_is_an_io_error_not_exhaustion() {
        let tmp = tempfile::tempdir().unwrap();
        let budget = budget(&tmp);
        let claims = budget.open_claims().unwrap();
        let prepared = prepare(&budget, &claims);
        // The prepared record vanished (ENOENT).
        fs::remove_file(budget.claims_path().join(&prepared.names[0])).unwrap();
        let (mut taken, mut created) = (BTreeSet::new(), Vec::new());
        let err = budget
            .place(&prepared, 0, &mut taken, 0, &mut created)
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

    /// Records prepared by a claimant that died before placing them are
    /// removed by the next claimant once stale; a live claimant's, and a
    /// fresh one, are left alone.
    #[test]
    fn records_of_dead_claimants_are_swept_and_live_ones_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let budget = budget(&tmp);
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let dead_name = format!("{TEMP_PREFIX}{dead}.x{TEMP_SUFFIX}");
        let live_name = format!("{TEMP_PREFIX}{}.y{TEMP_SUFFIX}", std::process::id());
        let young_name = format!("{TEMP_PREFIX}{dead}.z{TEMP_SUFFIX}");
        let old = std::time::SystemTime::now() - crate::STALE_AFTER * 2;
        for name in [&dead_name, &live_name, &young_name] {
            let file = fs::File::create(budget.claims_path().join(name)).unwrap();
            if name != &young_name {
                file.set_modified(old).unwrap();
            }
        }
        assert_eq!(budget.claim(&["a"]).unwrap(), Snapshot::new(1, 3));
        assert!(!budget.claims_path().join(&dead_name).exists());
        assert!(budget.claims_path().join(&live_name).exists());
        // A fresh one may belong to a claimant in another pid namespace.
        assert!(budget.claims_path().join(&young_name).exists());
        assert_eq!(temp_owner(&live_name), Some(std::process::id() as i32));
        assert_eq!(temp_owner(".claim.0.x.tmp"), None);
        assert_eq!(temp_owner("000001.json"), None);
    }

    /// The thread of this process named `admission-lock` once it sleeps in
    /// `flock(2)` (its `/proc/self/task/<tid>/syscall` names the call only
    /// while it is blocked in it).
    fn blocked_lock_waiter() -> Option<i32> {
        for task in fs::read_dir("/proc/self/task").ok()? {
            let dir = task.ok()?.path();
            let comm = fs::read_to_string(dir.join("comm")).unwrap_or_default();
            let call = fs::read_to_string(dir.join("syscall")).unwrap_or_default();
            let number = call.split_whitespace().next().unwrap_or_default();
            if comm.trim_end() == "admission-lock" && number == libc::SYS_flock.to_string() {
                return dir.file_name()?.to_str()?.parse().ok();
            }
        }
        None
    }

    static HANDLED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

    extern "C" fn count(_: libc::c_int) {
        HANDLED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// A signal that interrupts the wait for the admission lock (a handler
    /// installed without `SA_RESTART`: `flock` fails with `EINTR`) does not
    /// end the wait: the claim still waits for the holder and is admitted.
    #[test]
    fn a_signal_during_the_lock_wait_does_not_fail_the_claim() {
        use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
        let action = SigAction::new(
            SigHandler::Handler(count),
            SaFlags::empty(),
            SigSet::empty(),
        );
        // SAFETY: the handler only bumps an atomic; no other test uses SIGUSR2.
        unsafe { sigaction(Signal::SIGUSR2, &action) }.unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let budget = budget(&tmp);
        let holder = fs::File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(budget.descriptor.directory.join(crate::LOCK_FILE))
            .unwrap();
        holder.lock().unwrap();
        let result = thread::scope(|s| {
            let claim = s.spawn(|| budget.claim(&["a"]));
            let deadline = Instant::now() + std::time::Duration::from_secs(20);
            let tid = loop {
                if let Some(tid) = blocked_lock_waiter() {
                    break tid;
                }
                assert!(Instant::now() < deadline, "no thread waits in flock");
                thread::yield_now();
            };
            // SAFETY: tgkill with this process's id, a live thread of it,
            // and a signal whose handler only counts.
            let sent = unsafe { libc::tgkill(libc::getpid(), tid, libc::SIGUSR2) };
            assert_eq!(sent, 0, "{}", io::Error::last_os_error());
            // The handler ran, so flock returned EINTR; then the waiter is
            // back in flock (or, with the retry gone, out of the wait).
            while HANDLED.load(std::sync::atomic::Ordering::SeqCst) == 0 {
                assert!(Instant::now() < deadline, "the signal was not handled");
                thread::yield_now();
            }
            while blocked_lock_waiter().is_none() && !claim.is_finished() {
                assert!(
                    Instant::now() < deadline,
                    "the waiter neither waits nor ends"
                );
                thread::yield_now();
            }
            holder.unlock().unwrap();
            claim.join().unwrap()
        });
        assert_eq!(result.unwrap(), Snapshot::new(1, 3));
    }
}
