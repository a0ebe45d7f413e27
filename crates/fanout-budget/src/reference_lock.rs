//! The pi-subagents 0.49 admission lock: a directory `admission.lock/` with
//! `owner.json` (`{"pid","token"}`) inside.
//!
//! Our claimers serialise among themselves on a `flock` (see `admission.rs`);
//! while holding it they also take this directory lock so that a 0.49 process
//! claiming on the same budget and one of ours exclude each other. The
//! protocol is the reference's: `mkdir` wins; a lock whose owner is dead, or
//! that has no valid owner and is older than [`STALE_AFTER`], is moved aside
//! to `admission.stale-<uuid>` and removed; release removes the lock only if
//! `owner.json` still carries our token.
//!
//! One rule is stronger than the reference's: a lock older than
//! [`STALE_AFTER`] is reclaimed even when its owner pid is alive, because a
//! recycled pid would otherwise block the budget forever (a real holder keeps
//! the lock for milliseconds).

use std::fs;
use std::io::{self, ErrorKind};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::errno::Errno;
use nix::sys::signal::kill;
use nix::unistd::Pid;
use serde_json::{Value, json};

use crate::budget::random_uuid;
use crate::{Error, Result};

/// Name of the reference's lock directory in a budget directory.
pub const REFERENCE_LOCK_DIR: &str = "admission.lock";
/// Name of the owner record inside [`REFERENCE_LOCK_DIR`].
pub const OWNER_FILE: &str = "owner.json";
/// Age after which a lock without a valid owner (or, in our rule, any lock)
/// is taken to be abandoned; the reference's 60 s.
pub const STALE_AFTER: Duration = Duration::from_secs(60);

/// Longest pause between two attempts at a held directory lock.
const MAX_POLL: Duration = Duration::from_millis(10);

/// A held reference directory lock; dropping it releases the lock.
#[derive(Debug)]
pub struct ReferenceLock {
    budget_dir: PathBuf,
    token: String,
}

/// What [`ReferenceLock::try_acquire`] found.
enum Attempt {
    Taken(ReferenceLock),
    Held,
}

impl ReferenceLock {
    /// Takes `<budget_dir>/admission.lock/`, waiting for a live holder until
    /// `deadline`, reclaiming a dead or stale one at once.
    pub fn acquire(budget_dir: &Path, deadline: Instant) -> Result<Self> {
        let mut pause = Duration::from_millis(1);
        loop {
            if let Attempt::Taken(lock) = Self::try_acquire(budget_dir)? {
                return Ok(lock);
            }
            if Instant::now() >= deadline {
                return Err(Error::LockTimeout {
                    dir: budget_dir.to_path_buf(),
                });
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(MAX_POLL);
        }
    }

    /// The token written to `owner.json` by this acquisition.
    pub fn token(&self) -> &str {
        &self.token
    }

    fn try_acquire(budget_dir: &Path) -> Result<Attempt> {
        let lock = budget_dir.join(REFERENCE_LOCK_DIR);
        match fs::DirBuilder::new().mode(0o700).create(&lock) {
            Ok(()) => return Self::write_owner(budget_dir, &lock).map(Attempt::Taken),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
            Err(e) => return Err(Error::io("create admission lock directory", lock, e)),
        }
        if !is_stale(&lock)? {
            return Ok(Attempt::Held);
        }
        match move_aside_and_remove(budget_dir, &lock) {
            // Reclaimed: try again at once, as the reference does.
            Ok(()) => Self::try_acquire_once_more(budget_dir),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(Attempt::Held),
            Err(e) => Err(Error::io("reclaim admission lock", lock, e)),
        }
    }

    /// After a reclaim, one more `mkdir` without another reclaim round.
    fn try_acquire_once_more(budget_dir: &Path) -> Result<Attempt> {
        let lock = budget_dir.join(REFERENCE_LOCK_DIR);
        match fs::DirBuilder::new().mode(0o700).create(&lock) {
            Ok(()) => Self::write_owner(budget_dir, &lock).map(Attempt::Taken),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(Attempt::Held),
            Err(e) => Err(Error::io("create admission lock directory", lock, e)),
        }
    }

    fn write_owner(budget_dir: &Path, lock: &Path) -> Result<Self> {
        let token = random_uuid();
        let record = json!({
            "pid": std::process::id(),
            "token": token,
            "createdAt": now_ms(),
        });
        // Written under a temporary name and renamed, so a reader never sees
        // a half-written owner; compact JSON without a newline, like 0.49.
        let tmp = lock.join(format!(".owner-{token}.tmp"));
        let written = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .and_then(|mut f| io::Write::write_all(&mut f, record.to_string().as_bytes()))
            .and_then(|()| fs::rename(&tmp, lock.join(OWNER_FILE)));
        if let Err(e) = written {
            let _ = fs::remove_dir_all(lock);
            return Err(Error::io(
                "write admission lock owner",
                lock.join(OWNER_FILE),
                e,
            ));
        }
        Ok(Self {
            budget_dir: budget_dir.to_path_buf(),
            token,
        })
    }
}

impl Drop for ReferenceLock {
    fn drop(&mut self) {
        let lock = self.budget_dir.join(REFERENCE_LOCK_DIR);
        // A lock reclaimed and re-taken by someone else is theirs to remove.
        if read_owner(&lock).is_some_and(|o| o.token == self.token) {
            let _ = move_aside_and_remove(&self.budget_dir, &lock);
        }
    }
}

/// A valid owner record: a positive pid and a non-empty token.
struct Owner {
    pid: i32,
    token: String,
}

fn read_owner(lock: &Path) -> Option<Owner> {
    let text = atomic_file::read::read_to_string(&lock.join(OWNER_FILE)).ok()?;
    let value: Value = serde_json::from_str(&text).ok()?;
    let pid = value.get("pid")?.as_i64()?;
    let token = value.get("token")?.as_str()?;
    if pid <= 0 || pid > i64::from(i32::MAX) || token.is_empty() {
        return None;
    }
    Some(Owner {
        pid: i32::try_from(pid).ok()?,
        token: token.to_string(),
    })
}

/// The reference's staleness rule, plus ours for an old lock with a live pid.
fn is_stale(lock: &Path) -> Result<bool> {
    let age = match fs::symlink_metadata(lock) {
        Ok(meta) if !meta.is_dir() => return Ok(true),
        Ok(meta) => age_of(&meta),
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(Error::io("inspect admission lock", lock.to_path_buf(), e)),
    };
    if age > STALE_AFTER {
        return Ok(true);
    }
    Ok(read_owner(lock).is_some_and(|owner| !owner_alive(owner.pid)))
}

/// A pid probe: alive unless the process does not exist (EPERM is alive).
fn owner_alive(pid: i32) -> bool {
    !matches!(kill(Pid::from_raw(pid), None), Err(Errno::ESRCH))
}

fn age_of(meta: &fs::Metadata) -> Duration {
    let mtime = UNIX_EPOCH + Duration::new(meta.mtime().max(0) as u64, meta.mtime_nsec() as u32);
    SystemTime::now().duration_since(mtime).unwrap_or_default()
}

/// Renames `lock` to `admission.stale-<uuid>` and removes it; the rename is
/// the atomic step, so two reclaimers cannot both remove a fresh lock.
fn move_aside_and_remove(budget_dir: &Path, lock: &Path) -> io::Result<()> {
    let aside = budget_dir.join(format!("admission.stale-{}", random_uuid()));
    fs::rename(lock, &aside)?;
    match fs::symlink_metadata(&aside) {
        Ok(meta) if meta.is_dir() => fs::remove_dir_all(&aside),
        _ => fs::remove_file(&aside),
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The owner record of the reference's lock (`{pid, token,
    /// createdAt}`): only a positive pid and a non-empty token make an
    /// owner whose death makes a fresh lock stale; each absent, `null`, of
    /// the wrong type or empty makes none (the lock then goes stale by age
    /// alone). `createdAt` is not read: the directory's age counts.
    #[test]
    fn an_owner_needs_a_positive_pid_and_a_non_empty_token() {
        let tmp = tempfile::tempdir().unwrap();
        let lock = tmp.path().join(REFERENCE_LOCK_DIR);
        fs::create_dir(&lock).unwrap();
        let full = json!({"pid": 4242, "token": "t-1", "createdAt": 1_767_225_600_777u64});
        let owner_of = |record: &Value| {
            fs::write(lock.join(OWNER_FILE), record.to_string()).unwrap();
            read_owner(&lock).map(|o| (o.pid, o.token))
        };
        assert_eq!(owner_of(&full), Some((4242, "t-1".to_owned())));
        let mut no_time = full.clone();
        no_time.as_object_mut().unwrap().remove("createdAt");
        assert_eq!(owner_of(&no_time), Some((4242, "t-1".to_owned())));
        for (field, bad) in [
            (
                "pid",
                vec![
                    Value::Null,
                    json!("4242"),
                    json!(0),
                    json!(-1),
                    json!(1u64 << 31),
                    json!(42.5),
                ],
            ),
            ("token", vec![Value::Null, json!(7), json!("")]),
        ] {
            let mut absent = full.clone();
            absent.as_object_mut().unwrap().remove(field);
            assert_eq!(owner_of(&absent), None, "{field} absent");
            for value in bad {
                let mut broken = full.clone();
                broken[field] = value.clone();
                assert_eq!(owner_of(&broken), None, "{field} = {value}");
            }
        }
    }

    /// After a reclaim, a lock that another claimer took meanwhile is held
    /// (wait for it), and any other failure is an error.
    #[test]
    fn the_retry_after_a_reclaim_tells_held_from_failed() {
        let tmp = tempfile::tempdir().unwrap();
        fs::create_dir(tmp.path().join(REFERENCE_LOCK_DIR)).unwrap();
        let held = ReferenceLock::try_acquire_once_more(tmp.path()).unwrap();
        assert!(matches!(held, Attempt::Held));
        let gone = tmp.path().join("gone");
        let err = ReferenceLock::try_acquire_once_more(&gone).err().unwrap();
        assert!(
            matches!(
                err,
                Error::Io {
                    op: "create admission lock directory",
                    ..
                }
            ),
            "{err:?}"
        );
    }

    /// A lock released between our mkdir and our look is not stale (try
    /// again); a lock that cannot be inspected is an error.
    #[test]
    fn a_vanished_lock_is_not_stale_and_an_uninspectable_one_is_an_error() {
        let tmp = tempfile::tempdir().unwrap();
        let lock = tmp.path().join(REFERENCE_LOCK_DIR);
        assert!(!is_stale(&lock).unwrap());
        let file = tmp.path().join("file");
        fs::write(&file, "").unwrap();
        let err = is_stale(&file.join(REFERENCE_LOCK_DIR)).unwrap_err();
        assert!(
            matches!(
                err,
                Error::Io {
                    op: "inspect admission lock",
                    ..
                }
            ),
            "{err:?}"
        );
    }
}
