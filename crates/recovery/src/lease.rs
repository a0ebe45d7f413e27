//! The session revival lease (as pi-subagents 0.49.0 keeps it): at most one
//! process at a time appends to a child session file.
//!
//! Layout under the lease root (`<state root>/session-leases`, passed in):
//!
//! ```text
//! <id>/owner.json                  the lease; exists <=> held (or left behind)
//! <id>.candidate-<token>/          transient, during acquisition
//! <id>.stale-<token>/              tombstone of a reclaimed lease (kept)
//! <id>.released-<token>/           transient, during release
//! ```
//!
//! `<id>` is the lowercase hex SHA-256 of the session file's real path.
//! Mutual exclusion comes from renaming a complete candidate directory onto
//! the lease name with `RENAME_NOREPLACE`; a holder is reclaimed only when it
//! is demonstrably gone (pid dead, or the pid now belongs to a process with
//! another start time), so a dead holder cannot wedge the session and a live
//! one cannot lose it.

use std::fs::{self, DirBuilder};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use process_identity::{Liveness, pid_liveness};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::contract::sha256_hex;
use crate::json::{integer, object};

/// Directory name of the lease root under a state root.
pub const LEASES_DIR: &str = "session-leases";
/// Owner record file inside a lease directory.
pub const OWNER_FILE: &str = "owner.json";
/// Environment variable that marks every writer process of a lease with the
/// lease token (see [`SessionLease::writer_env`]).
pub const WRITER_TOKEN_ENV: &str = "SUBAGENTS_REVIVAL_LEASE_TOKEN";
/// Acquisition attempts before giving up with a conflict (docs/protocol/recovery.md §6.4).
const ATTEMPTS: usize = 4;

/// `<state_root>/session-leases`.
pub fn lease_root(state_root: &Path) -> PathBuf {
    state_root.join(LEASES_DIR)
}

/// What a revival asks for (docs/protocol/recovery.md §6.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRequest {
    /// The child session file to append to.
    pub session_file: PathBuf,
    /// The new (revived) run.
    pub run_id: String,
    /// The run being revived.
    pub source_run_id: String,
    /// Identity of the parent session, when known.
    pub parent_session_id: Option<String>,
}

/// `writerState` of the owner record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WriterState {
    /// No writer process.
    None,
    /// A writer is being spawned; its pid is not known yet.
    Spawning,
    /// A writer runs with `writerPid`.
    Running,
}

/// The writer argument of [`SessionLease::update_writer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writer {
    /// The writer closed or failed to spawn.
    None,
    /// About to spawn a writer.
    Spawning,
    /// A writer runs with this pid.
    Running(u32),
}

/// `owner.json` (docs/protocol/recovery.md §6.3), plus our optional `bootId`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OwnerRecord {
    /// Always 1.
    pub version: u32,
    /// Random UUID v4 identifying this ownership.
    pub token: String,
    /// Real path of the session file.
    pub canonical_session_file: String,
    /// The revived run.
    pub run_id: String,
    /// The run being revived.
    pub source_run_id: String,
    /// Parent session, when the request had a non-empty one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_session_id: Option<String>,
    /// The acquiring process.
    pub pid: u32,
    /// Host name of the acquirer.
    pub hostname: String,
    /// Start identity of `pid` (`linux:<ticks>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process_start_identity: Option<String>,
    /// Boot id of the acquirer's kernel (our extension): a record from an
    /// earlier boot is gone whatever its pid now names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    /// Writer state.
    pub writer_state: WriterState,
    /// Writer pid, only when running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writer_pid: Option<u32>,
    /// Writer start identity, only when running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writer_process_start_identity: Option<String>,
    /// ISO-8601 UTC of `acquiredAtMs`.
    pub acquired_at: String,
    /// Acquisition time, ms since the epoch.
    pub acquired_at_ms: u64,
    /// Time of the last write, ms since the epoch.
    pub updated_at_ms: u64,
}

/// The canonical identity of a session file (docs/protocol/recovery.md §6.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CanonicalSession {
    /// Real path (absolute, symlinks resolved).
    pub path: PathBuf,
    /// Lowercase hex SHA-256 of the real path.
    pub id: String,
}

/// What [`inspect_lease`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseState {
    /// No lease directory.
    Free,
    /// A lease with a valid owner record (staleness is not judged).
    Owned(Box<OwnerRecord>),
    /// A lease directory whose owner record is missing or invalid.
    Unreadable,
}

/// Result of [`inspect_lease`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseInspection {
    /// The session's canonical identity.
    pub session: CanonicalSession,
    /// Its lease state.
    pub state: LeaseState,
}

/// Another revival holds the session (docs/protocol/recovery.md §6.4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseConflict {
    /// Real path of the session file.
    pub canonical_session_file: PathBuf,
    /// The holder, when its record was readable.
    pub holder: Option<OwnerRecord>,
}

impl std::fmt::Display for LeaseConflict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let session = self.canonical_session_file.display();
        let Some(h) = &self.holder else {
            return write!(
                f,
                "Direct revival of session '{session}' is blocked by an existing lease with unreadable owner metadata. Refusing to reclaim it without proof that the owner is stale."
            );
        };
        let parent = h
            .parent_session_id
            .as_ref()
            .map(|p| format!(", parent session '{p}'"))
            .unwrap_or_default();
        write!(
            f,
            "Direct revival of session '{session}' is already owned by run '{}' (source run '{}'{parent}, pid {} on {}). Wait for that revival to finish or start a separate continuation without reusing this session file.",
            h.run_id, h.source_run_id, h.pid, h.hostname
        )
    }
}

/// Why a lease operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseError {
    /// The session file has no real path (for example it does not exist).
    #[error("failed to resolve session file '{}': {source}", path.display())]
    Canonicalize {
        /// The session file as given.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Another holder owns the session.
    #[error("{0}")]
    Conflict(Box<LeaseConflict>),
    /// The lease on disk is no longer ours.
    #[error("Session revival lease ownership changed for run '{run_id}'.")]
    OwnershipChanged {
        /// Our run id.
        run_id: String,
    },
    /// A file-system step failed.
    #[error("failed to {op} '{}': {source}", path.display())]
    Io {
        /// What was attempted.
        op: &'static str,
        /// On which path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A private file write failed.
    #[error(transparent)]
    File(#[from] atomic_file::Error),
}

impl LeaseError {
    fn io(op: &'static str, path: &Path, source: io::Error) -> Self {
        LeaseError::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    }

    /// The conflict, when this is one.
    pub fn conflict(&self) -> Option<&LeaseConflict> {
        match self {
            LeaseError::Conflict(c) => Some(c),
            _ => None,
        }
    }
}

/// Resolves the real path of `session_file` and its lease id.
pub fn canonical_session(session_file: &Path) -> Result<CanonicalSession, LeaseError> {
    let path = fs::canonicalize(session_file).map_err(|source| LeaseError::Canonicalize {
        path: session_file.to_path_buf(),
        source,
    })?;
    let id = sha256_hex(path.as_os_str().as_bytes());
    Ok(CanonicalSession { path, id })
}

/// A held lease. Dropping it does not release (a killed runner cannot
/// either); call [`SessionLease::release`].
#[derive(Debug)]
pub struct SessionLease {
    root: PathBuf,
    session: CanonicalSession,
    owner: OwnerRecord,
}

impl SessionLease {
    /// The lease directory.
    pub fn lease_dir(&self) -> PathBuf {
        self.root.join(&self.session.id)
    }

    /// The owner record as last written.
    pub fn owner(&self) -> &OwnerRecord {
        &self.owner
    }

    /// The ownership token (for the handshake's `revivalLeaseToken`).
    pub fn token(&self) -> &str {
        &self.owner.token
    }

    /// The variable to set in the environment of every writer process
    /// spawned under this lease. It lets a contender prove that a holder
    /// which died in the `spawning` state left no writer behind.
    pub fn writer_env(&self) -> (&'static str, &str) {
        (WRITER_TOKEN_ENV, &self.owner.token)
    }

    /// The canonical session this lease covers.
    pub fn session(&self) -> &CanonicalSession {
        &self.session
    }

    /// Records the writer process (docs/protocol/recovery.md §6.7), atomically.
    pub fn update_writer(&mut self, writer: Writer) -> Result<(), LeaseError> {
        let owner_file = self.lease_dir().join(OWNER_FILE);
        match read_owner(&owner_file) {
            OwnerRead::Owner(on_disk) if on_disk.token == self.owner.token => {}
            _ => {
                return Err(LeaseError::OwnershipChanged {
                    run_id: self.owner.run_id.clone(),
                });
            }
        }
        let mut next = self.owner.clone();
        next.updated_at_ms = now_ms();
        (
            next.writer_state,
            next.writer_pid,
            next.writer_process_start_identity,
        ) = match writer {
            Writer::None => (WriterState::None, None, None),
            Writer::Spawning => (WriterState::Spawning, None, None),
            Writer::Running(pid) => (WriterState::Running, Some(pid), start_identity(pid)),
        };
        atomic_file::write_json(&owner_file, &next)?;
        self.owner = next;
        Ok(())
    }

    /// Gives the lease back if it is still ours (docs/protocol/recovery.md §6.8).
    /// `Ok(false)`: the record is not ours (or unreadable); nothing touched.
    pub fn release(self) -> Result<bool, LeaseError> {
        release_dir(&self.root, &self.session, &self.owner.token)
    }
}

/// Takes the lease of `request.session_file` under `lease_root`
/// (docs/protocol/recovery.md §6.4), reclaiming a demonstrably stale holder.
pub fn acquire_lease(
    lease_root: &Path,
    request: &LeaseRequest,
) -> Result<SessionLease, LeaseError> {
    let session = canonical_session(&request.session_file)?;
    let owner = new_owner(&session, request);
    let lease_dir = lease_root.join(&session.id);
    for _ in 0..ATTEMPTS {
        if try_create(lease_root, &session, &owner)? {
            return Ok(SessionLease {
                root: lease_root.to_path_buf(),
                session,
                owner,
            });
        }
        let holder = match read_owner(&lease_dir.join(OWNER_FILE)) {
            // Released between our rename and this read: try again.
            OwnerRead::NoLease => continue,
            OwnerRead::Unreadable => return Err(conflict(&session, None)),
            OwnerRead::Owner(holder) => holder,
        };
        if !demonstrably_stale(&holder) {
            return Err(conflict(&session, Some(*holder)));
        }
        let tombstone =
            lease_root.join(format!("{}.stale-{}", session.id, sanitise(&holder.token)));
        match rename_noreplace(&lease_dir, &tombstone) {
            Ok(()) => atomic_file::sync_dir(lease_root)?,
            // Another contender moved it first; the next attempt sees the result.
            Err(e) if is_taken_or_gone(&e) => {}
            Err(e) => return Err(LeaseError::io("reclaim stale lease", &lease_dir, e)),
        }
    }
    let holder = match read_owner(&lease_dir.join(OWNER_FILE)) {
        OwnerRead::Owner(holder) => Some(*holder),
        _ => None,
    };
    Err(conflict(&session, holder))
}

/// Reports whether the session is free, owned or unreadable (docs/protocol/recovery.md §6.9).
pub fn inspect_lease(
    lease_root: &Path,
    session_file: &Path,
) -> Result<LeaseInspection, LeaseError> {
    let session = canonical_session(session_file)?;
    let state = match read_owner(&lease_root.join(&session.id).join(OWNER_FILE)) {
        OwnerRead::NoLease => LeaseState::Free,
        OwnerRead::Unreadable => LeaseState::Unreadable,
        OwnerRead::Owner(owner) => LeaseState::Owned(owner),
    };
    Ok(LeaseInspection { session, state })
}

/// Releases the lease of `session_file` on behalf of the holder of `token`
/// (a launcher cleaning up after a runner it started). `Ok(false)` when the
/// lease is not held under that token.
pub fn release_lease(
    lease_root: &Path,
    session_file: &Path,
    token: &str,
) -> Result<bool, LeaseError> {
    let session = canonical_session(session_file)?;
    release_dir(lease_root, &session, token)
}

fn release_dir(root: &Path, session: &CanonicalSession, token: &str) -> Result<bool, LeaseError> {
    let lease_dir = root.join(&session.id);
    match read_owner(&lease_dir.join(OWNER_FILE)) {
        OwnerRead::Owner(owner) if owner.token == token => {}
        _ => return Ok(false),
    }
    // Move the lease away in one step so no contender ever sees a
    // half-deleted lease (which would read as unreadable), then delete it.
    let released = root.join(format!("{}.released-{}", session.id, sanitise(token)));
    // A release that crashed half-way may have left this name behind.
    remove_dir_if_exists(&released)?;
    rename_noreplace(&lease_dir, &released)
        .map_err(|e| LeaseError::io("release lease", &lease_dir, e))?;
    atomic_file::sync_dir(root)?;
    fs::remove_dir_all(&released)
        .map_err(|e| LeaseError::io("remove released lease", &released, e))?;
    Ok(!lease_dir.exists())
}

/// One attempt to create the lease; `Ok(false)` when the name is taken.
fn try_create(
    root: &Path,
    session: &CanonicalSession,
    owner: &OwnerRecord,
) -> Result<bool, LeaseError> {
    atomic_file::ensure_private_dir(root)?;
    let candidate = root.join(format!("{}.candidate-{}", session.id, owner.token));
    remove_dir_if_exists(&candidate)?;
    DirBuilder::new()
        .mode(atomic_file::DIR_MODE)
        .create(&candidate)
        .map_err(|e| LeaseError::io("create lease candidate", &candidate, e))?;
    let lease_dir = root.join(&session.id);
    let result = atomic_file::create_new_private(
        &candidate.join(OWNER_FILE),
        &atomic_file::to_pretty_json(owner),
    )
    .map_err(LeaseError::from)
    .and_then(|()| match rename_noreplace(&candidate, &lease_dir) {
        Ok(()) => atomic_file::sync_dir(root)
            .map(|()| true)
            .map_err(Into::into),
        Err(e) if is_taken(&e) || lease_dir.exists() => Ok(false),
        Err(e) => Err(LeaseError::io("create lease", &lease_dir, e)),
    });
    remove_dir_if_exists(&candidate)?;
    result
}

fn remove_dir_if_exists(dir: &Path) -> Result<(), LeaseError> {
    match fs::remove_dir_all(dir) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            Err(LeaseError::io("remove leftover lease directory", dir, e))
        }
        _ => Ok(()),
    }
}

fn conflict(session: &CanonicalSession, holder: Option<OwnerRecord>) -> LeaseError {
    LeaseError::Conflict(Box::new(LeaseConflict {
        canonical_session_file: session.path.clone(),
        holder,
    }))
}

fn new_owner(session: &CanonicalSession, request: &LeaseRequest) -> OwnerRecord {
    let now = now_ms();
    let pid = std::process::id();
    OwnerRecord {
        version: 1,
        token: uuid::Uuid::new_v4().to_string(),
        canonical_session_file: session.path.to_string_lossy().into_owned(),
        run_id: request.run_id.clone(),
        source_run_id: request.source_run_id.clone(),
        parent_session_id: request.parent_session_id.clone().filter(|p| !p.is_empty()),
        pid,
        hostname: hostname(),
        process_start_identity: start_identity(pid),
        boot_id: process_identity::boot_id(),
        writer_state: WriterState::None,
        writer_pid: None,
        writer_process_start_identity: None,
        acquired_at: iso_utc(now),
        acquired_at_ms: now,
        updated_at_ms: now,
    }
}

/// The stale-holder rule (docs/protocol/recovery.md §6.6).
fn demonstrably_stale(holder: &OwnerRecord) -> bool {
    if holder.hostname != hostname() {
        return false;
    }
    let rebooted = matches!(
        (&holder.boot_id, process_identity::boot_id()),
        (Some(recorded), Some(now)) if *recorded != now
    );
    if rebooted {
        // Every process of the earlier boot is gone, writers included.
        return true;
    }
    if !gone(holder.pid, holder.process_start_identity.as_deref()) {
        return false;
    }
    match holder.writer_state {
        WriterState::None => true,
        // The reference never reclaims here (a writer may exist whose pid
        // was never recorded). Records written by this crate (they carry
        // `bootId`) have writers marked with the token, so a scan can prove
        // that none exists. Records of other writers stay unreclaimable.
        WriterState::Spawning => {
            holder.boot_id.is_some()
                && !token_carried_by_a_process(&holder.token, holder_start(holder))
        }
        WriterState::Running => holder
            .writer_pid
            .is_some_and(|pid| gone(pid, holder.writer_process_start_identity.as_deref())),
    }
}

/// The holder's start time in clock ticks since boot, from its recorded
/// `linux:<ticks>` identity.
fn holder_start(holder: &OwnerRecord) -> Option<u64> {
    holder
        .process_start_identity
        .as_deref()?
        .strip_prefix("linux:")?
        .parse()
        .ok()
}

/// Whether some live process may carry `WRITER_TOKEN_ENV=<token>`. Any
/// doubt (unreadable `/proc`, an unreadable environment of one of our own
/// processes) counts as "yes".
///
/// A writer is started by the holder after it took the lease, so a process
/// that started before the holder (`holder_start`, same boot) cannot be one:
/// it is skipped without reading its environment. This keeps long-lived
/// processes of our own user whose environment nobody may read (an
/// `ssh-agent`, anything non-dumpable) from blocking every reclaim.
fn token_carried_by_a_process(token: &str, holder_start: Option<u64>) -> bool {
    let needle = format!("{WRITER_TOKEN_ENV}={token}");
    let Ok(entries) = fs::read_dir("/proc") else {
        return true;
    };
    let me = nix::unistd::geteuid().as_raw();
    entries.flatten().any(|entry| {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            return false;
        };
        // init is never one of our writers, and in containers its
        // environment is unreadable even to its own user.
        if pid == 1
            || process_identity::read_stat(pid).is_ok_and(|s| {
                s.state == 'Z'
                    || s.state == 'X'
                    || holder_start.is_some_and(|start| s.start_time < start)
            })
        {
            return false;
        }
        match fs::read(entry.path().join("environ")) {
            Ok(env) => env.split(|b| *b == 0).any(|var| var == needle.as_bytes()),
            // Another user's process cannot be one of our writers.
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                use std::os::unix::fs::MetadataExt;
                entry.metadata().is_ok_and(|m| m.uid() == me)
            }
            Err(_) => false,
        }
    })
}

/// "Demonstrably gone" (docs/protocol/recovery.md §6.5). Identities are compared only
/// within one scheme (`linux:` vs `linux:`): a scheme mismatch proves nothing.
fn gone(pid: u32, recorded: Option<&str>) -> bool {
    match pid_liveness(pid) {
        Liveness::Dead => true,
        Liveness::Unknown | Liveness::Foreign => false,
        Liveness::Alive => match (recorded, start_identity(pid)) {
            (Some(recorded), Some(current)) => {
                scheme(recorded) == scheme(&current) && recorded != current
            }
            _ => false,
        },
    }
}

fn scheme(identity: &str) -> &str {
    identity.split_once(':').map_or("", |(s, _)| s)
}

/// `linux:<start ticks>` of a running pid.
fn start_identity(pid: u32) -> Option<String> {
    process_identity::read_stat(pid)
        .ok()
        .map(|stat| format!("linux:{}", stat.start_time))
}

fn hostname() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_default()
}

/// Every character outside `[A-Za-z0-9._-]` becomes `-`.
fn sanitise(token: &str) -> String {
    token
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '-'
            }
        })
        .collect()
}

enum OwnerRead {
    NoLease,
    Unreadable,
    Owner(Box<OwnerRecord>),
}

/// Reads an owner record; anything breaking docs/protocol/recovery.md §6.3 is unreadable, and so is a
/// lease directory another user could have planted (a symlink, not a
/// directory, writable by others or owned by someone else): only nothing at
/// all at the lease's name is no lease, since anything there blocks every
/// acquirer.
fn read_owner(owner_file: &Path) -> OwnerRead {
    let Some(dir) = owner_file.parent() else {
        return OwnerRead::Unreadable;
    };
    match fs::symlink_metadata(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return OwnerRead::NoLease,
        Ok(meta) if meta.is_dir() && atomic_file::read::check_private_meta(dir, &meta).is_ok() => {}
        _ => return OwnerRead::Unreadable,
    }
    let bytes = match atomic_file::read::read_file(owner_file) {
        Ok(bytes) => bytes,
        // Released between the two looks.
        Err(_) if !dir.exists() => return OwnerRead::NoLease,
        Err(_) => return OwnerRead::Unreadable,
    };
    match parse_owner(&bytes) {
        Some(owner) => OwnerRead::Owner(Box::new(owner)),
        None => OwnerRead::Unreadable,
    }
}

/// Parses an owner record; `None` for anything breaking docs/protocol/recovery.md §6.3 (an unreadable
/// owner). Touches no file (fuzzing entry point).
pub fn parse_owner(bytes: &[u8]) -> Option<OwnerRecord> {
    serde_json::from_slice::<Value>(bytes)
        .ok()
        .filter(valid_owner)
        .and_then(|v| serde_json::from_value::<OwnerRecord>(v).ok())
}

/// The rules of docs/protocol/recovery.md §6.3 on the raw JSON.
fn valid_owner(value: &Value) -> bool {
    let Some(map) = object(value) else {
        return false;
    };
    let string = |key: &str| map.get(key).is_some_and(Value::is_string);
    let optional_string = |key: &str| map.get(key).is_none_or(Value::is_string);
    let pid = |key: &str| {
        map.get(key)
            .and_then(integer)
            .is_some_and(|p| p > 0 && p <= i64::from(u32::MAX))
    };
    let count = |key: &str| map.get(key).and_then(integer).is_some_and(|n| n >= 0);
    let writer_ok = match map.get("writerState").and_then(Value::as_str) {
        Some("running") => pid("writerPid") && optional_string("writerProcessStartIdentity"),
        Some("none" | "spawning") => {
            !map.contains_key("writerPid") && !map.contains_key("writerProcessStartIdentity")
        }
        _ => false,
    };
    map.get("version").and_then(integer) == Some(1)
        && [
            "token",
            "canonicalSessionFile",
            "runId",
            "sourceRunId",
            "hostname",
            "acquiredAt",
        ]
        .iter()
        .all(|k| string(k))
        && ["parentSessionId", "processStartIdentity", "bootId"]
            .iter()
            .all(|k| optional_string(k))
        && pid("pid")
        && count("acquiredAtMs")
        && count("updatedAtMs")
        && writer_ok
}

/// `rename` that fails with `EEXIST` instead of replacing an existing
/// (possibly empty) directory. Falls back to plain `rename` where the file
/// system lacks `RENAME_NOREPLACE`; lease and tombstone directories are
/// never empty, and `rename` does not replace a non-empty directory.
fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    use nix::fcntl::{AT_FDCWD, RenameFlags, renameat2};
    match renameat2(AT_FDCWD, from, AT_FDCWD, to, RenameFlags::RENAME_NOREPLACE) {
        Ok(()) => Ok(()),
        Err(nix::errno::Errno::EINVAL | nix::errno::Errno::ENOSYS) => fs::rename(from, to),
        Err(errno) => Err(io::Error::from(errno)),
    }
}

fn is_taken(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EEXIST | libc::ENOTEMPTY))
}

fn is_taken_or_gone(e: &io::Error) -> bool {
    is_taken(e) || e.kind() == io::ErrorKind::NotFound
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ`, as JavaScript's `toISOString`.
fn iso_utc(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days as i64);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms % 1000
    )
}

/// Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_processes_older_than_the_holder_are_passed_over_by_the_writer_scan() {
        // A writer the holder started in the same clock tick as itself has
        // the holder's start time: it must still count.
        let token = format!("scan-{}", std::process::id());
        let mut writer = std::process::Command::new("sleep")
            .arg("60")
            .env(WRITER_TOKEN_ENV, &token)
            .spawn()
            .unwrap();
        // Until the child has exec'ed, its environment is still ours.
        let environ = format!("/proc/{}/environ", writer.id());
        let needle = format!("{WRITER_TOKEN_ENV}={token}");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !fs::read(&environ)
            .is_ok_and(|env| env.split(|b| *b == 0).any(|var| var == needle.as_bytes()))
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the writer never exec'ed"
            );
            std::thread::yield_now();
        }
        let start = process_identity::read_stat(writer.id()).unwrap().start_time;
        let carried = [
            token_carried_by_a_process(&token, None),
            token_carried_by_a_process(&token, Some(start)),
            token_carried_by_a_process(&token, Some(start + 1)),
        ];
        writer.kill().unwrap();
        writer.wait().unwrap();
        assert_eq!(carried, [true, true, false]);
        let mut holder = new_owner(
            &CanonicalSession {
                path: "/s".into(),
                id: "x".into(),
            },
            &LeaseRequest {
                session_file: "/s".into(),
                run_id: "r".into(),
                source_run_id: "s".into(),
                parent_session_id: None,
            },
        );
        holder.process_start_identity = Some(format!("linux:{start}"));
        assert_eq!(holder_start(&holder), Some(start));
        holder.process_start_identity = Some(format!("win:{start}"));
        assert_eq!(holder_start(&holder), None);
    }

    #[test]
    fn iso_time_matches_javascript() {
        assert_eq!(iso_utc(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso_utc(1_764_460_800_123), "2025-11-30T00:00:00.123Z");
        assert_eq!(iso_utc(951_782_400_000), "2000-02-29T00:00:00.000Z");
        // The first days of a (March-based) year, where the century term
        // of the day count decides which year it is.
        assert_eq!(iso_utc(5_097_600_000), "1970-03-01T00:00:00.000Z");
        assert_eq!(iso_utc(920_246_400_000), "1999-03-01T00:00:00.000Z");
        assert_eq!(iso_utc(4_107_542_400_000), "2100-03-01T00:00:00.000Z");
        assert_eq!(iso_utc(1_735_689_599_999), "2024-12-31T23:59:59.999Z");
        assert_eq!(iso_utc(13_574_608_496_789), "2400-02-29T12:34:56.789Z");
    }

    #[test]
    fn tokens_are_sanitised_for_tombstone_names() {
        assert_eq!(sanitise("a/b c.d_e-f"), "a-b-c.d_e-f");
    }

    #[test]
    fn owner_rules_make_records_unreadable() {
        let good = serde_json::json!({
            "version": 1, "token": "t", "canonicalSessionFile": "/s", "runId": "r",
            "sourceRunId": "s", "pid": 5, "hostname": "h", "writerState": "none",
            "acquiredAt": "x", "acquiredAtMs": 1, "updatedAtMs": 2
        });
        assert!(valid_owner(&good));
        let mut bad = good.clone();
        bad["writerPid"] = 7.into();
        assert!(!valid_owner(&bad), "writer pid while not running");
        bad["writerState"] = "running".into();
        assert!(valid_owner(&bad));
        bad["pid"] = 0.into();
        assert!(!valid_owner(&bad), "non-positive pid");
        let mut bad = good.clone();
        bad["writerState"] = "running".into();
        assert!(!valid_owner(&bad), "running without a writer pid");
        // Each rule on its own: one broken field makes the record unreadable
        // whatever the others say.
        let breaks: [(&str, serde_json::Value); 9] = [
            ("version", 2.into()),
            ("token", 1.into()),
            ("hostname", serde_json::Value::Null),
            ("bootId", 1.into()),
            ("pid", (i64::from(u32::MAX) + 1).into()),
            ("pid", 1.5.into()),
            ("acquiredAtMs", (-1).into()),
            ("updatedAtMs", "1".into()),
            ("writerState", "stopped".into()),
        ];
        for (key, value) in breaks {
            let mut bad = good.clone();
            bad[key] = value;
            assert!(!valid_owner(&bad), "{key}: {}", bad[key]);
        }
    }
}
