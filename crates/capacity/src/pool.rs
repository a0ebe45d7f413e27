//! The files of one session's pool: the pool lock, slot directories, slot
//! claims, and the rename-then-delete release (docs/protocol/capacity.md §1, §4).

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AT_FDCWD, OFlag, RenameFlags, open, openat, renameat2};
use nix::sys::stat::Mode;
use process_identity::{Liveness, ProcessIdentity};
use serde::{Deserialize, Serialize};

use crate::CapacityError;
use crate::owner::OwnerRecord;

/// Lock file whose `flock` serialises every change to the pool. The kernel
/// drops the lock when its holder dies, so a crash cannot wedge the pool.
const LOCK_FILE: &str = ".lock";
const CLAIM_FILE: &str = "capacity.claim";
const OWNER_FILE: &str = "owner.json";
/// Prefix of the slot's second record of its run: `run.<generation>.<run id>`,
/// holding the reserving process (JSON, or `null`).
const RUN_NAME_PREFIX: &str = "run.";

fn io_error(op: &'static str, path: &Path, source: io::Error) -> CapacityError {
    atomic_file::Error {
        op,
        path: path.to_path_buf(),
        source,
    }
    .into()
}

/// Held while the pool is being changed; unlocks on drop or holder death.
pub(crate) struct PoolLock {
    _file: File,
}

/// Creates the pool directory if needed and takes its lock (blocking).
pub(crate) fn lock_pool(pool: &Path) -> Result<PoolLock, CapacityError> {
    atomic_file::ensure_private_dir(pool)?;
    check_pool(pool)?;
    let path = pool.join(LOCK_FILE);
    // An empty lock file: nothing to make durable (lost in a crash, it is
    // created again).
    match atomic_file::create_new_private_transient_name(&path, b"") {
        Err(e) if !e.is_already_exists() => return Err(e.into()),
        _ => {}
    }
    // Never blocks on a FIFO planted in place of the lock file.
    let file = atomic_file::read::open_lock_file(&path)
        .map_err(|e| io_error("open", &path, e.into_io()))?;
    file.lock().map_err(|e| io_error("lock", &path, e))?;
    Ok(PoolLock { _file: file })
}

/// One occupied slot directory.
#[derive(Debug)]
pub(crate) struct SlotDir {
    pub(crate) index: u64,
    pub(crate) path: PathBuf,
}

impl SlotDir {
    /// The owner record, or `None` when missing or broken (docs/protocol/capacity.md §3); an
    /// untrusted slot is an error ([`read_owner`]).
    pub(crate) fn owner(&self) -> Result<Option<OwnerRecord>, CapacityError> {
        read_owner(&self.path)
    }
}

/// Reads a slot's owner record. `Ok(None)` when the slot or its record is
/// gone, unreadable or broken (docs/protocol/capacity.md §3: such a slot still counts and is never
/// freed automatically).
///
/// The trust checks of the state root happen here, when a slot is read,
/// rather than for every slot at every command: the slot directory must be
/// a real directory (not a symlink) that only this user (or root) can
/// write, and `owner.json` a regular file, not a symlink, owned by this user
/// (or root) and not writable by group or others. Anything else is an
/// [`CapacityError::Untrusted`] error, since another user could have
/// planted or changed it.
pub(crate) fn read_owner(slot_dir: &Path) -> Result<Option<OwnerRecord>, CapacityError> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let dir = match open(slot_dir, flags, Mode::empty()) {
        Ok(fd) => File::from(fd),
        // With O_DIRECTORY a symlink may fail as ENOTDIR, as a file does.
        Err(Errno::ELOOP | Errno::ENOTDIR) => return Err(not_a_slot_directory(slot_dir)),
        Err(_) => return Ok(None),
    };
    let meta = dir
        .metadata()
        .map_err(|e| io_error("inspect", slot_dir, e))?;
    check_trusted("state directory", slot_dir, meta.mode(), meta.uid())?;
    let path = slot_dir.join(OWNER_FILE);
    let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
    let file = match openat(&dir, OWNER_FILE, flags, Mode::empty()) {
        Ok(fd) => File::from(fd),
        Err(Errno::ELOOP) => return Err(symlink_refused(&path)),
        Err(_) => return Ok(None),
    };
    let meta = file.metadata().map_err(|e| io_error("inspect", &path, e))?;
    if meta.is_file() {
        check_trusted("state file", &path, meta.mode(), meta.uid())?;
    }
    match atomic_file::read::read_opened(file, &path, atomic_file::read::STATE_FILE_LIMIT) {
        Ok(bytes) => Ok(OwnerRecord::parse(&bytes)),
        Err(_) => Ok(None),
    }
}

/// Refuses a pool directory that is a symlink or that another user could
/// write into, before anything in it is read or created.
pub(crate) fn check_pool(pool: &Path) -> Result<(), CapacityError> {
    match fs::symlink_metadata(pool) {
        Ok(meta) if meta.file_type().is_symlink() => Err(symlink_refused(pool)),
        Ok(meta) => check_trusted("state directory", pool, meta.mode(), meta.uid()),
        Err(_) => Ok(()),
    }
}

fn check_trusted(
    what: &'static str,
    path: &Path,
    mode: u32,
    uid: u32,
) -> Result<(), CapacityError> {
    match atomic_file::read::check_private_mode(path, mode, uid) {
        Ok(()) => Ok(()),
        Err(atomic_file::read::ReadError::SharedDir { why, .. }) => Err(CapacityError::Untrusted {
            what,
            path: path.to_path_buf(),
            why: format!(
                "{why}; fix it, or pass --allow-shared-root (or set SUBAGENTS_ALLOW_SHARED_ROOT=1) to trust it"
            ),
        }),
        Err(e) => Err(io_error("inspect", path, e.into_io())),
    }
}

/// A slot entry that would not open as a directory: a symlink, or a file.
fn not_a_slot_directory(path: &Path) -> CapacityError {
    match fs::symlink_metadata(path) {
        Ok(meta) if !meta.file_type().is_symlink() => CapacityError::Untrusted {
            what: "capacity slot entry",
            path: path.to_path_buf(),
            why: "it is not a directory".to_owned(),
        },
        _ => symlink_refused(path),
    }
}

fn symlink_refused(path: &Path) -> CapacityError {
    CapacityError::Untrusted {
        what: "capacity slot entry",
        path: path.to_path_buf(),
        why: "it is a symbolic link, which is never followed".to_owned(),
    }
}

pub(crate) fn write_owner(slot_dir: &Path, owner: &OwnerRecord) -> Result<(), CapacityError> {
    Ok(atomic_file::write_json(&slot_dir.join(OWNER_FILE), owner)?)
}

/// [`write_owner`] for a start binding: the content is fsynced, the slot
/// directory not. Lost in a crash, the record goes back to the unbound
/// reservation, whose reserving launcher is then dead; its run's release
/// verdict takes the runner from the run's proof instead.
pub(crate) fn write_started_owner(
    slot_dir: &Path,
    owner: &OwnerRecord,
) -> Result<(), CapacityError> {
    let bytes = atomic_file::to_pretty_json(owner);
    Ok(atomic_file::replace_private_with(
        &slot_dir.join(OWNER_FILE),
        &bytes,
        || {},
    )?)
}

fn slot_index(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("slot-")?;
    let all_digits = !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit());
    all_digits.then(|| digits.parse().ok()).flatten()
}

/// The occupied slots (directories named `slot-<N>`), by index. A missing
/// pool has none.
pub(crate) fn list_slots(pool: &Path) -> Result<Vec<SlotDir>, CapacityError> {
    check_pool(pool)?;
    let entries = match fs::read_dir(pool) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        other => other.map_err(|e| io_error("list", pool, e))?,
    };
    let mut slots = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| io_error("list", pool, e))?;
        let index = entry.file_name().to_str().and_then(slot_index);
        let kind = entry.file_type().ok();
        if index.is_some() && kind.is_some_and(|t| t.is_symlink()) {
            return Err(symlink_refused(&entry.path()));
        }
        if let (Some(index), true) = (index, kind.is_some_and(|t| t.is_dir())) {
            slots.push(SlotDir {
                index,
                path: entry.path(),
            });
        }
    }
    slots.sort_by_key(|s| s.index);
    Ok(slots)
}

/// Builds `slot-<N>` from a hidden directory holding a complete `owner.json`,
/// renamed into place without replacing anything, so a crash never leaves an
/// owner-less slot. `Ok(false)` when `slot-<N>` already exists.
pub(crate) fn create_slot(pool: &Path, owner: &OwnerRecord) -> Result<bool, CapacityError> {
    let target = pool.join(format!("slot-{}", owner.slot));
    let staging = pool.join(format!(
        ".slot-{}.creating-{}",
        owner.slot,
        uuid::Uuid::new_v4()
    ));
    atomic_file::ensure_private_dir(&staging)?;
    // Before owner.json, whose directory fsync makes this name durable too.
    write_run_name(&staging, owner)?;
    // The reference's first write: pretty JSON with a trailing newline.
    let mut bytes = atomic_file::to_pretty_json(owner);
    bytes.push(b'\n');
    atomic_file::create_new_private(&staging.join(OWNER_FILE), &bytes)?;
    #[cfg(test)]
    crate::tests::hooks::slot_staged();
    let renamed = renameat2(
        AT_FDCWD,
        &staging,
        AT_FDCWD,
        &target,
        RenameFlags::RENAME_NOREPLACE,
    );
    match renamed {
        // The pool is not fsynced: a slot lost in a crash held a run that
        // the crash ended, and a staging directory left behind is swept.
        // `owner.json` and its name in the staging directory are durable,
        // so a slot that survives is never owner-less.
        Ok(()) => Ok(true),
        Err(errno) => {
            let _ = fs::remove_dir_all(&staging);
            if errno == nix::errno::Errno::EEXIST || errno == nix::errno::Errno::ENOTEMPTY {
                Ok(false)
            } else {
                Err(io_error("rename slot into", &target, errno.into()))
            }
        }
    }
}

/// The run a slot holds, as its second record says, for when `owner.json`
/// is damaged.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RecordedRun {
    /// The generation of the reservation or transfer that wrote it.
    pub(crate) generation: u64,
    /// The run.
    pub(crate) run_id: String,
    /// The process that made that reservation, when its record is readable.
    pub(crate) reserver: Option<ProcessIdentity>,
}

/// Whether `run_id` can be part of a file name as it is.
fn name_safe(run_id: &str) -> bool {
    !run_id.is_empty()
        && run_id.len() <= 200
        && run_id != "."
        && run_id != ".."
        && !run_id.contains(['/', '\0'])
}

/// Records `owner`'s run in the slot a second time, in a file name
/// (`run.<generation>.<run id>`) that a damaged `owner.json` cannot take
/// with it; its content is the reserving process. No fsync: the caller's
/// next write in `slot_dir` (owner.json) fsyncs the directory, and the
/// content only names a process alive now, which a crash ends anyway.
pub(crate) fn write_run_name(slot_dir: &Path, owner: &OwnerRecord) -> Result<(), CapacityError> {
    if !name_safe(&owner.run_id) {
        return Ok(());
    }
    let name = format!("{RUN_NAME_PREFIX}{}.{}", owner.generation, owner.run_id);
    atomic_file::write_json_transient(&slot_dir.join(name), &owner.reserved_by_process)?;
    Ok(())
}

/// The latest run recorded by [`write_run_name`] in a slot, if any.
pub(crate) fn recorded_run(slot_dir: &Path) -> Option<RecordedRun> {
    let entries = fs::read_dir(slot_dir).ok()?;
    let (generation, run_id) = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let (generation, run_id) = name.strip_prefix(RUN_NAME_PREFIX)?.split_once('.')?;
            let generation = generation.parse::<u64>().ok()?;
            name_safe(run_id).then(|| (generation, run_id.to_owned()))
        })
        .max()?;
    let path = slot_dir.join(format!("{RUN_NAME_PREFIX}{generation}.{run_id}"));
    let reserver = atomic_file::read::read_file(&path)
        .ok()
        .and_then(|bytes| serde_json::from_slice::<Option<ProcessIdentity>>(&bytes).ok())
        .flatten();
    Some(RecordedRun {
        generation,
        run_id,
        reserver,
    })
}

/// Removes hidden leftovers of crashed creations and releases. Called under
/// the pool lock, when no creation of this version is in flight.
pub(crate) fn sweep_leftovers(pool: &Path) {
    let Ok(entries) = fs::read_dir(pool) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(".slot-")
            && (name.contains(".creating-") || name.contains(".released-"))
        {
            // Best effort: a concurrent reference process may be deleting it too.
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

/// Frees a slot: rename it out of the way first (a new `slot-<N>` may appear
/// at once and is never touched), then delete the renamed directory.
pub(crate) fn release_slot(pool: &Path, slot: &SlotDir) -> Result<(), CapacityError> {
    let hidden = pool.join(format!(
        ".slot-{}.released-{}",
        slot.index,
        uuid::Uuid::new_v4()
    ));
    fs::rename(&slot.path, &hidden).map_err(|e| io_error("rename", &slot.path, e))?;
    // Not fsynced: a release lost in a crash brings back the slot of a run
    // that is over, and the next reconcile frees it again.
    fs::remove_dir_all(&hidden).map_err(|e| io_error("remove", &hidden, e))
}

/// Contents of `capacity.claim` written by this version. The reference writes
/// a bare UUID, which never parses as this and is never reclaimed.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ClaimRecord {
    claim_token: String,
    holder: ProcessIdentity,
}

/// Runs `op` while holding the slot claim (docs/protocol/capacity.md §4.2). `Ok(None)` when the claim is
/// held by a live process (or by the reference) or the slot is gone. A claim
/// left by a process of this version that provably died is taken over.
pub(crate) fn with_claim<T>(
    slot_dir: &Path,
    op: impl FnOnce() -> Result<T, CapacityError>,
) -> Result<Option<T>, CapacityError> {
    let path = slot_dir.join(CLAIM_FILE);
    let token = uuid::Uuid::new_v4().to_string();
    if !create_claim(&path, &token)? {
        return Ok(None);
    }
    #[cfg(test)]
    crate::tests::hooks::claim_taken();
    let result = op();
    drop_claim(&path, &token)?;
    result.map(Some)
}

fn create_claim(path: &Path, token: &str) -> Result<bool, CapacityError> {
    let holder =
        ProcessIdentity::current().map_err(|e| io_error("identify process for", path, e))?;
    let record = ClaimRecord {
        claim_token: token.to_owned(),
        holder,
    };
    let bytes = atomic_file::to_pretty_json(&record);
    for attempt in 0..2 {
        // Content durable (a claim that survives a crash names its dead
        // holder and is taken over), name not: a claim lost in a crash was
        // held by a process the crash ended.
        match atomic_file::create_new_private_transient_name(path, &bytes) {
            Ok(()) => return Ok(true),
            Err(e) if e.is_not_found() => return Ok(false),
            Err(e) if e.is_already_exists() && attempt == 0 && claim_holder_is_dead(path) => {
                atomic_file::remove_if_exists(path)?;
            }
            Err(e) if e.is_already_exists() => return Ok(false),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(false)
}

fn claim_holder_is_dead(path: &Path) -> bool {
    atomic_file::read::read_file(path)
        .ok()
        .and_then(|bytes| serde_json::from_slice::<ClaimRecord>(&bytes).ok())
        .is_some_and(|claim| claim.holder.liveness() == Liveness::Dead)
}

fn drop_claim(path: &Path, token: &str) -> Result<(), CapacityError> {
    let ours = match atomic_file::read::read_file(path) {
        Err(e) if e.is_not_found() => return Ok(()),
        Err(e) => return Err(io_error("read", path, e.into_io())),
        Ok(bytes) => {
            serde_json::from_slice::<ClaimRecord>(&bytes).is_ok_and(|c| c.claim_token == token)
        }
    };
    if ours {
        atomic_file::remove_if_exists(path)?;
    }
    Ok(())
}

#[cfg(test)]
pub(crate) fn claim_path(slot_dir: &Path) -> PathBuf {
    slot_dir.join(CLAIM_FILE)
}
