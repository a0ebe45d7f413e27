//! The line of runs waiting for a slot of one session's pool (our
//! extension; docs/protocol/capacity.md, "The queue"):
//! `<pool>/queue/<enqueuedAt, 16 digits>.<run id>.json`.
//!
//! The reference counts only `slot-<N>` directories, so it never sees the
//! line. A queued run holds no slot: its monitor waits, and takes one under
//! the pool lock when the runs ahead of it in the line (by enqueue time,
//! then run id, both in the entry's name) leave it a free index. Every
//! change to the line happens under the pool lock too.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use process_identity::{Liveness, ProcessIdentity};
use serde::{Deserialize, Serialize};

use crate::pool::{check_pool, list_slots, lock_pool};
use crate::runfiles::{StatusRead, read_status};
use crate::{Acquire, Capacity, CapacityError, SlotHandle, effective_limit};

/// The directory of the line, inside the pool.
pub const QUEUE_DIR: &str = "queue";

/// One entry of the line (`queue/<since>.<run id>.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueEntry {
    /// Always 1.
    pub version: u32,
    /// The waiting run.
    pub run_id: String,
    /// The session whose pool this is.
    pub owner_session_id: String,
    /// The run's directory.
    pub async_dir: String,
    /// When the run joined the line (ms since the epoch).
    pub enqueued_at: u64,
    /// The limit the run was launched with.
    pub limit: u32,
    /// The launcher that wrote the entry (it is the run's only trace until
    /// the run's status exists).
    #[serde(default)]
    pub enqueued_by_process: Option<ProcessIdentity>,
}

/// What [`Capacity::admit`] did.
#[derive(Debug)]
pub enum Admission {
    /// A slot was free and nobody waited for it: the run holds it.
    Slot(Box<SlotHandle>),
    /// The run joined the line.
    Queued(Queued),
}

/// A run's place in the line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Queued {
    /// When it joined (the entry's `enqueuedAt`).
    pub since: u64,
    /// 1-based place among the runs waiting in the line.
    pub position: usize,
}

/// What [`Capacity::take_turn`] found.
#[derive(Debug)]
pub enum Turn {
    /// The run's turn came: it holds this slot and has left the line.
    Admitted(Box<SlotHandle>),
    /// Still waiting, at this 1-based place.
    Waiting(usize),
    /// The run is not in the line any more (stopped, or given up).
    Gone,
}

/// Where an entry stands when the line is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Standing {
    /// Waiting, with a live monitor (or a live launcher still creating it).
    InLine,
    /// Its monitor is gone: it keeps its place for when its wait is
    /// restarted, but holds up nobody meanwhile.
    Asleep,
    /// Its run is over or never came to be: the entry is removed.
    Stale,
}

/// An entry's name, parsed.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct EntryName {
    since: u64,
    run_id: String,
}

impl EntryName {
    fn parse(name: &str) -> Option<Self> {
        let rest = name.strip_suffix(".json")?;
        let (since, run_id) = rest.split_once('.')?;
        let digits = since.len() == 16 && since.bytes().all(|b| b.is_ascii_digit());
        let safe = !run_id.is_empty() && !run_id.starts_with('.') && !run_id.contains('/');
        (digits && safe).then(|| Self {
            since: since.parse().unwrap_or(u64::MAX),
            run_id: run_id.to_owned(),
        })
    }

    fn file_name(&self) -> String {
        format!("{:016}.{}.json", self.since, self.run_id)
    }
}

fn io_error(op: &'static str, path: &Path, source: io::Error) -> CapacityError {
    atomic_file::Error {
        op,
        path: path.to_path_buf(),
        source,
    }
    .into()
}

/// The entries of a line in order; a missing line is empty.
fn list_entries(queue: &Path) -> Result<Vec<EntryName>, CapacityError> {
    check_pool(queue)?;
    let entries = match fs::read_dir(queue) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        other => other.map_err(|e| io_error("list", queue, e))?,
    };
    let mut names: Vec<EntryName> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| EntryName::parse(e.file_name().to_str()?))
        .collect();
    names.sort();
    Ok(names)
}

impl Capacity {
    /// The line of a session's pool.
    pub fn queue_dir(&self, session_id: &str) -> PathBuf {
        self.pool_dir(session_id).join(QUEUE_DIR)
    }

    /// Admits a run as [`Capacity::acquire`] does, but never past the line:
    /// with runs waiting, a free index goes to them first. With `queue`, a
    /// run that gets no slot joins the line instead of being refused.
    /// `Ok(None)` when there is no limit (no slot is taken).
    pub fn admit(
        &self,
        request: &Acquire<'_>,
        queue: bool,
    ) -> Result<Option<Admission>, CapacityError> {
        let Some(limit) = effective_limit(request.limit) else {
            return Ok(None);
        };
        let pool = self.pool_dir(request.session_id);
        let _lock = lock_pool(&pool)?;
        let waiting = self.waiting_ahead(&pool, request.session_id, None)?;
        if waiting == 0 {
            match self.acquire_locked(&pool, request, limit) {
                Ok(handle) => return Ok(Some(Admission::Slot(Box::new(handle)))),
                Err(CapacityError::Exhausted(_)) if queue => {}
                Err(e) => return Err(e),
            }
        } else if !queue {
            let used = list_slots(&pool)?.len();
            if used + waiting < limit as usize {
                return self
                    .acquire_locked(&pool, request, limit)
                    .map(|h| Some(Admission::Slot(Box::new(h))));
            }
            return Err(CapacityError::Exhausted(crate::snapshot_of(&pool, limit)?));
        }
        let since = (self.clock)();
        self.write_entry(&pool, request, limit, since)?;
        Ok(Some(Admission::Queued(Queued {
            since,
            position: waiting + 1,
        })))
    }

    fn write_entry(
        &self,
        pool: &Path,
        request: &Acquire<'_>,
        limit: u32,
        since: u64,
    ) -> Result<(), CapacityError> {
        let queue = pool.join(QUEUE_DIR);
        atomic_file::ensure_private_dir(&queue)?;
        check_pool(&queue)?;
        let name = EntryName {
            since,
            run_id: request.run_id.to_owned(),
        };
        let entry = QueueEntry {
            version: 1,
            run_id: request.run_id.to_owned(),
            owner_session_id: request.session_id.to_owned(),
            async_dir: request.async_dir.to_string_lossy().into_owned(),
            enqueued_at: since,
            limit,
            enqueued_by_process: (self.reserving_process)(),
        };
        // Durable, name included: the order must survive a reboot.
        atomic_file::write_json(&queue.join(name.file_name()), &entry)?;
        Ok(())
    }

    /// How many runs wait in line ahead of `run_id` (all of them when
    /// `None`); stale entries are removed on the way. Under the pool lock.
    fn waiting_ahead(
        &self,
        pool: &Path,
        session_id: &str,
        run_id: Option<&str>,
    ) -> Result<usize, CapacityError> {
        let queue = pool.join(QUEUE_DIR);
        let mut ahead = 0;
        for name in list_entries(&queue)? {
            if Some(name.run_id.as_str()) == run_id {
                break;
            }
            match self.standing(&queue, &name, session_id) {
                Standing::InLine => ahead += 1,
                Standing::Asleep => {}
                Standing::Stale => {
                    atomic_file::remove_if_exists(&queue.join(name.file_name()))?;
                }
            }
        }
        Ok(ahead)
    }

    fn standing(&self, queue: &Path, name: &EntryName, session_id: &str) -> Standing {
        let dir = self.runs_dir().join(&name.run_id);
        match read_status(&dir) {
            StatusRead::Present(status) => {
                let waits = status::slot_wait::queued_for_slot(&status).is_some();
                let ours = status.session_id.as_deref().is_none_or(|s| s == session_id);
                if !waits || !ours || status.run_id != name.run_id {
                    return Standing::Stale;
                }
                let starter = status
                    .monitor_identity
                    .as_ref()
                    .or(status.launcher_identity.as_ref());
                match starter.map(ProcessIdentity::liveness) {
                    Some(Liveness::Dead) => Standing::Asleep,
                    _ => Standing::InLine,
                }
            }
            StatusRead::Unreadable(_) => Standing::Asleep,
            // The launcher writes the entry before the run's status: the
            // run is still being made while that launcher lives.
            StatusRead::Missing => {
                let entry = read_entry(&queue.join(name.file_name()));
                let launcher = entry.and_then(|e| e.enqueued_by_process);
                match launcher.as_ref().map(ProcessIdentity::liveness) {
                    Some(Liveness::Dead) => Standing::Stale,
                    None if status_dir_gone(&dir) => Standing::Stale,
                    _ => Standing::InLine,
                }
            }
        }
    }

    /// The monitor of a queued run: takes a slot when its turn has come
    /// (the runs in line ahead of it leave a free index below `limit`),
    /// and leaves the line with it; all under the pool lock.
    pub fn take_turn(&self, request: &Acquire<'_>) -> Result<Turn, CapacityError> {
        let limit = effective_limit(request.limit).unwrap_or(u32::MAX);
        let pool = self.pool_dir(request.session_id);
        let _lock = lock_pool(&pool)?;
        let queue = pool.join(QUEUE_DIR);
        let names = list_entries(&queue)?;
        let Some(mine) = names.iter().find(|n| n.run_id == request.run_id) else {
            return Ok(Turn::Gone);
        };
        let ahead = self.waiting_ahead(&pool, request.session_id, Some(request.run_id))?;
        let mut free = (limit as usize).saturating_sub(list_slots(&pool)?.len());
        if ahead >= free && ahead < limit as usize {
            // Slots of runs that are over are freed only by a reconcile.
            let snapshot =
                self.reconcile_locked(&pool, request.session_id, limit, request.live_workflows)?;
            free = (limit as usize).saturating_sub(snapshot.used);
        }
        if ahead >= free {
            return Ok(Turn::Waiting(ahead + 1));
        }
        let taken: std::collections::HashSet<u64> =
            list_slots(&pool)?.iter().map(|s| s.index).collect();
        let Some(handle) = self.take_free_slot(&pool, request, limit, &taken)? else {
            return Ok(Turn::Waiting(ahead + 1));
        };
        atomic_file::remove_if_exists(&queue.join(mine.file_name()))?;
        Ok(Turn::Admitted(Box::new(handle)))
    }

    /// Whether `run_id`'s turn may have come, from two directory listings
    /// and no lock: fewer entries ahead of it in the line than free slots.
    /// Entries ahead whose monitor is gone hold up nobody, which only
    /// [`Capacity::take_turn`] tells, so a `false` here is no proof that the
    /// turn has not come: a waiter still calls `take_turn` now and then.
    /// It keeps every waiter from taking the pool lock on every change.
    pub fn may_be_my_turn(&self, request: &Acquire<'_>) -> bool {
        let limit = effective_limit(request.limit).unwrap_or(u32::MAX) as usize;
        let pool = self.pool_dir(request.session_id);
        let Ok(names) = list_entries(&pool.join(QUEUE_DIR)) else {
            return true;
        };
        let Some(ahead) = names.iter().position(|n| n.run_id == request.run_id) else {
            // Gone from the line: `take_turn` says so.
            return true;
        };
        let used = list_slots(&pool).map_or(0, |s| s.len());
        ahead < limit.saturating_sub(used)
    }

    /// Removes `run_id` from the line, running `while_locked` first (under
    /// the pool lock, so no monitor takes the run's turn meanwhile).
    /// `Ok(false)` when the run was not in the line: its turn had come.
    pub fn leave_queue<E>(
        &self,
        session_id: &str,
        run_id: &str,
        while_locked: impl FnOnce() -> Result<(), E>,
    ) -> Result<Result<bool, E>, CapacityError> {
        let pool = self.pool_dir(session_id);
        let queue = pool.join(QUEUE_DIR);
        if !queue.is_dir() {
            return Ok(Ok(false));
        }
        let _lock = lock_pool(&pool)?;
        let names = list_entries(&queue)?;
        let Some(mine) = names.iter().find(|n| n.run_id == run_id) else {
            return Ok(Ok(false));
        };
        if let Err(e) = while_locked() {
            return Ok(Err(e));
        }
        atomic_file::remove_if_exists(&queue.join(mine.file_name()))?;
        Ok(Ok(true))
    }

    /// Whether `run_id` has an entry in the session's line. Read-only.
    pub fn is_queued(&self, session_id: &str, run_id: &str) -> bool {
        list_entries(&self.queue_dir(session_id))
            .is_ok_and(|names| names.iter().any(|n| n.run_id == run_id))
    }

    /// The line of a session as `(run id, 1-based position)`, in order.
    /// Read-only: every entry counts, asleep or not.
    pub fn queue_positions(&self, session_id: &str) -> Vec<(String, usize)> {
        list_entries(&self.queue_dir(session_id))
            .unwrap_or_default()
            .into_iter()
            .enumerate()
            .map(|(i, n)| (n.run_id, i + 1))
            .collect()
    }
}

fn status_dir_gone(dir: &Path) -> bool {
    dir.symlink_metadata().is_err()
}

fn read_entry(path: &Path) -> Option<QueueEntry> {
    let bytes = atomic_file::read::read_file(path).ok()?;
    serde_json::from_slice(&bytes).ok()
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    fn request<'a>(run_id: &'a str, dir: &'a Path, live: &'a HashSet<String>) -> Acquire<'a> {
        Acquire {
            session_id: "s",
            limit: Some(1),
            run_id,
            kind: crate::Kind::Runner,
            async_dir: dir,
            live_workflows: live,
        }
    }

    fn admit(pools: &Capacity, run_id: &str, queue: bool) -> Result<Admission, CapacityError> {
        let (dir, live) = (Path::new("/nonexistent"), HashSet::new());
        pools
            .admit(&request(run_id, dir, &live), queue)
            .map(Option::unwrap)
    }

    fn turn(pools: &Capacity, run_id: &str) -> Turn {
        let (dir, live) = (Path::new("/nonexistent"), HashSet::new());
        pools.take_turn(&request(run_id, dir, &live)).unwrap()
    }

    #[test]
    fn the_line_is_first_in_first_out_and_no_slot() {
        let tmp = tempfile::tempdir().unwrap();
        // Entries whose run has no status yet stand in line while their
        // launcher (this process) lives.
        let pools = Capacity::new(tmp.path().join("session-active-async-capacity"));
        let Admission::Slot(mut first) = admit(&pools, "a", true).unwrap() else {
            panic!("a free slot is taken");
        };
        let queued = |id| match admit(&pools, id, true).unwrap() {
            Admission::Queued(q) => q.position,
            Admission::Slot(_) => panic!("{id} passed the line"),
        };
        assert_eq!((queued("b"), queued("c")), (1, 2));
        assert_eq!(pools.used("s").unwrap(), 1, "the line is not a slot");
        assert!(matches!(
            admit(&pools, "d", false),
            Err(CapacityError::Exhausted(_))
        ));
        assert!(matches!(turn(&pools, "c"), Turn::Waiting(2)));
        assert!(first.rollback().unwrap());
        // A free slot with b ahead: c still waits, and no launch passes b.
        assert!(matches!(turn(&pools, "c"), Turn::Waiting(2)));
        assert!(matches!(
            admit(&pools, "d", false),
            Err(CapacityError::Exhausted(_))
        ));
        assert!(matches!(turn(&pools, "b"), Turn::Admitted(_)));
        assert!(matches!(turn(&pools, "b"), Turn::Gone));
        assert!(matches!(turn(&pools, "c"), Turn::Waiting(1)));
        let left = pools.leave_queue("s", "c", || Ok::<(), ()>(())).unwrap();
        assert_eq!(left, Ok(true));
        assert!(matches!(turn(&pools, "c"), Turn::Gone));
        assert!(pools.queue_positions("s").is_empty());
    }

    #[test]
    fn names_order_by_time_then_id() {
        let a = EntryName::parse("0000000000000002.b.json").unwrap();
        let b = EntryName::parse("0000000000000002.c.json").unwrap();
        let c = EntryName::parse("0000000000000010.a.json").unwrap();
        let mut names = vec![c.clone(), b.clone(), a.clone()];
        names.sort();
        assert_eq!(names, [a.clone(), b, c]);
        assert_eq!(a.file_name(), "0000000000000002.b.json");
        for bad in [
            "2.b.json",
            "0000000000000002..x.json",
            "0000000000000002.b",
            "x",
        ] {
            assert_eq!(EntryName::parse(bad), None, "{bad}");
        }
    }
}
