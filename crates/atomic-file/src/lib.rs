#![doc = include_str!("../README.md")]
//!
//! Private, crash-safe file writes shared by every state-writing crate.
//!
//! Every state file of subagents goes through this crate so that one rule holds
//! everywhere: a reader sees either the old file or the new one, never a torn
//! write, and nothing is readable by other users.
//!
//! * [`write_private`] / [`write_json`]: temp file in the target's directory,
//!   created `O_EXCL` with mode 0600, written, fsynced, renamed over the target,
//!   then the directory is fsynced.
//! * [`defer_dir_sync`]: several files written into one new directory share
//!   a single directory fsync.
//! * [`Batch`] / [`write_private_batch`]: several files written as
//!   [`write_private`] does, their writeback started together so their
//!   fsyncs share journal commits, renamed in order, each directory
//!   fsynced once.
//! * [`create_new_private`]: the same durability for files that must not exist
//!   yet (claim slots, lock-free ownership records).
//! * [`replace_private_with`] / [`create_new_private_transient_name`]: the
//!   content fsynced, the directory not, for records whose loss in a crash
//!   leaves a state the readers already handle (see each caller).
//! * [`append_private`]: one `write` of a whole line to an `O_APPEND` file
//!   (events.jsonl), created 0600.
//! * [`ensure_private_dir`]: `mkdir -p` whose new components are 0700.
//! * [`scratch_private`]: an unnamed 0600 file for data too large to hold
//!   in memory, gone when closed.
//! * [`read`]: the other direction: bounded reads that never follow a
//!   symlink, never block on a FIFO and refuse anything but a regular file.
//! * [`escape_path`] / [`escape`]: control characters in paths and ids
//!   escaped, so every error message stays on one line.
//!
//! JSON is pretty-printed with two spaces and no trailing newline, the format
//! pi-subagents writes, so both tools read each other's files.
#![warn(missing_docs)]

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::Serialize;

pub mod read;

/// Mode of every file this crate creates.
pub const FILE_MODE: u32 = 0o600;
/// Mode of every directory this crate creates.
pub const DIR_MODE: u32 = 0o700;

/// A failed file operation: what was attempted, on which path, and why.
#[derive(Debug, thiserror::Error)]
#[error("failed to {op} '{}': {source}", escape_path(path))]
pub struct Error {
    /// The operation, as a verb phrase ("write", "rename temp file onto").
    pub op: &'static str,
    /// The path the operation was applied to.
    pub path: PathBuf,
    /// The underlying cause.
    #[source]
    pub source: io::Error,
}

impl Error {
    fn new(op: &'static str, path: &Path, source: io::Error) -> Self {
        Self {
            op,
            path: path.to_path_buf(),
            source,
        }
    }

    /// True when the cause is "already exists" (see [`create_new_private`]).
    pub fn is_already_exists(&self) -> bool {
        self.source.kind() == io::ErrorKind::AlreadyExists
    }

    /// True when the cause is "not found".
    pub fn is_not_found(&self) -> bool {
        self.source.kind() == io::ErrorKind::NotFound
    }
}

/// `path` for a one-line message: control characters (newline, tab, ESC...)
/// are written as Rust escapes (`\n`), everything else as is.
pub fn escape_path(path: &Path) -> String {
    escape(&path.to_string_lossy())
}

/// `text` with control characters escaped (see [`escape_path`]).
pub fn escape(text: &str) -> String {
    if !text.chars().any(char::is_control) {
        return text.to_owned();
    }
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().collect()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Creates `dir` and any missing parents; components created here get mode 0700.
pub fn ensure_private_dir(dir: &Path) -> Result<()> {
    DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(dir)
        .map_err(|e| Error::new("create directory", dir, e))
}

thread_local! {
    /// The directory whose fsync [`DeferredDirSync`] postpones on this thread.
    static DEFERRED_DIR: std::cell::RefCell<Option<PathBuf>> =
        const { std::cell::RefCell::new(None) };
}

/// Postpones the directory fsync of [`write_private`] for files directly in
/// one directory, on this thread, until [`DeferredDirSync::commit`] (or
/// drop), which fsyncs the directory once.
///
/// Each file is still fsynced before its rename, so a reader never sees a
/// torn file; only the durability of the names waits for the commit. Meant
/// for a new directory filled with several files that nothing points to yet
/// (a run directory before its active marker exists).
#[must_use = "commit the deferred directory sync"]
pub struct DeferredDirSync {
    dir: Option<PathBuf>,
}

/// Starts deferring the directory fsyncs of `dir` (see [`DeferredDirSync`]).
pub fn defer_dir_sync(dir: &Path) -> DeferredDirSync {
    DEFERRED_DIR.with(|d| *d.borrow_mut() = Some(dir.to_path_buf()));
    DeferredDirSync {
        dir: Some(dir.to_path_buf()),
    }
}

impl DeferredDirSync {
    /// Ends the deferral and fsyncs the directory once.
    pub fn commit(mut self) -> Result<()> {
        self.finish()
    }

    fn finish(&mut self) -> Result<()> {
        let Some(dir) = self.dir.take() else {
            return Ok(());
        };
        DEFERRED_DIR.with(|d| *d.borrow_mut() = None);
        sync_dir(&dir)
    }
}

impl Drop for DeferredDirSync {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

fn is_deferred(dir: &Path) -> bool {
    DEFERRED_DIR.with(|d| d.borrow().as_deref() == Some(dir))
}

/// Atomically replaces `path` with `bytes` (mode 0600, fsynced, directory fsynced).
pub fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    write_private_with(path, bytes, || {})
}

/// [`write_private`] that calls `before_rename` once the temp file is written
/// and synced, just before it is renamed onto `path`. Crash tests use it to
/// die inside the write; a torn target must still be impossible.
pub fn write_private_with(path: &Path, bytes: &[u8], before_rename: impl FnOnce()) -> Result<()> {
    replace_private_with(path, bytes, before_rename)?;
    let dir = parent_of(path);
    if is_deferred(dir) {
        return Ok(());
    }
    sync_dir(dir)
}

/// Several files written durably together, each as [`write_private`]
/// writes one, for a process that writes them in series anyway.
///
/// [`Batch::commit`] writes every temp file first (0600, `O_EXCL`, in the
/// target's directory, created 0700 if missing), starts the writeback of
/// all of them (`sync_file_range(SYNC_FILE_RANGE_WRITE)`), then fsyncs
/// each (in windows of a few dozen files, so that the descriptors held
/// open stay bounded), renames them onto their targets in the order they
/// were added, and
/// fsyncs each distinct directory once, after its last rename. The fsyncs
/// are the same as one [`write_private`] per file (minus the repeated
/// directory fsyncs); starting all writebacks first lets the file system
/// allocate the blocks of every file in one journal transaction instead of
/// one per fsync, which roughly halves the time of five small files on
/// ext4.
///
/// Every file is complete and fsynced before the first rename, so a reader
/// that sees a file of the batch also finds every file added before it
/// complete. After a crash of the machine that holds only as far as the
/// file system keeps renames in order (ext4 and xfs journal them in
/// order); within one directory the single directory fsync makes them
/// durable together. A failure before the renames leaves every target as
/// it was; a failed rename leaves the targets added before it replaced
/// (complete, but their directory not fsynced: a crash right after may
/// bring back the old names) and the rest as they were. No temp file stays
/// behind either way.
#[derive(Debug, Default)]
#[must_use = "commit the batch"]
pub struct Batch {
    targets: Vec<(PathBuf, Vec<u8>)>,
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `path` with `bytes`, to be renamed after the targets added before.
    pub fn add(&mut self, path: impl Into<PathBuf>, bytes: impl Into<Vec<u8>>) -> &mut Self {
        self.targets.push((path.into(), bytes.into()));
        self
    }

    /// Adds `path` with `value` as [`write_json`] writes it.
    pub fn add_json<T: Serialize + ?Sized>(
        &mut self,
        path: impl Into<PathBuf>,
        value: &T,
    ) -> &mut Self {
        self.add(path, to_pretty_json(value))
    }

    /// The number of targets added.
    pub fn len(&self) -> usize {
        self.targets.len()
    }

    /// True when nothing was added.
    pub fn is_empty(&self) -> bool {
        self.targets.is_empty()
    }

    /// Writes, fsyncs and renames every target (see [`Batch`]).
    pub fn commit(self) -> Result<()> {
        self.commit_with(|| {})
    }

    /// [`Batch::commit`] that calls `before_rename` once every temp file is
    /// written and fsynced, just before the first rename (crash tests die
    /// there; no target of the batch may then have changed).
    pub fn commit_with(self, before_rename: impl FnOnce()) -> Result<()> {
        let mut staged = Vec::with_capacity(self.targets.len());
        // A window's files are closed once fsynced: a batch of any size
        // holds at most one window of descriptors open.
        for window in self.targets.chunks(BATCH_OPEN_FILES) {
            let from = staged.len();
            for (path, bytes) in window {
                staged.push(stage_private(path, bytes)?);
            }
            for file in &mut staged[from..] {
                file.sync()?;
            }
        }
        before_rename();
        for file in &mut staged {
            file.rename()?;
        }
        let mut synced: Vec<&Path> = Vec::new();
        for dir in self.targets.iter().map(|(path, _)| parent_of(path)) {
            if synced.contains(&dir) {
                continue;
            }
            if !is_deferred(dir) {
                sync_dir(dir)?;
            }
            synced.push(dir);
        }
        Ok(())
    }
}

/// How many temp files of a [`Batch`] are written (and held open) before
/// they are fsynced and closed: the writebacks of up to this many start
/// together, and a batch larger than the process's open-file limit still
/// commits.
const BATCH_OPEN_FILES: usize = 32;

/// A file of a [`Batch`] written under a temp name next to its target, its
/// writeback started, not yet fsynced nor renamed (see [`stage_private`]).
/// Dropped before it is renamed, the temp file is removed.
#[derive(Debug)]
struct Staged {
    path: PathBuf,
    tmp: PathBuf,
    file: Option<File>,
    empty: bool,
    renamed: bool,
}

/// The first half of [`write_private`]: writes `bytes` to a new temp file
/// in `path`'s directory (created 0700 if missing; the file 0600,
/// `O_EXCL`) and starts its writeback without waiting for it. Nothing at
/// `path` changes until it is renamed.
fn stage_private(path: &Path, bytes: &[u8]) -> Result<Staged> {
    ensure_private_dir(parent_of(path))?;
    let tmp = temp_path(path);
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .custom_flags(libc::O_CLOEXEC)
        .open(&tmp)
        .map_err(|e| Error::new("create", &tmp, e))?;
    let mut staged = Staged {
        path: path.to_path_buf(),
        tmp,
        file: None,
        empty: bytes.is_empty(),
        renamed: false,
    };
    file.write_all(bytes)
        .map_err(|e| Error::new("write", &staged.tmp, e))?;
    if !staged.empty {
        start_writeback(&file);
    }
    staged.file = Some(file);
    Ok(staged)
}

impl Staged {
    /// Fsyncs and closes the temp file. An empty new file has no data to
    /// flush; the directory fsync after the rename makes it durable.
    fn sync(&mut self) -> Result<()> {
        let Some(file) = self.file.take() else {
            return Ok(());
        };
        if self.empty {
            return Ok(());
        }
        file.sync_all()
            .map_err(|e| Error::new("write", &self.tmp, e))
    }

    fn rename(&mut self) -> Result<()> {
        fs::rename(&self.tmp, &self.path)
            .map_err(|e| Error::new("rename temp file onto", &self.path, e))?;
        self.renamed = true;
        Ok(())
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.renamed {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

/// Starts writing `file`'s dirty pages without waiting for them. Only a
/// hint: the fsync that follows is what makes the data durable, so where
/// the call is unsupported nothing changes but the timing.
fn start_writeback(file: &File) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: a plain system call on a descriptor `file` owns.
        let _ =
            unsafe { libc::sync_file_range(file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE) };
    }
    #[cfg(not(target_os = "linux"))]
    let _ = file;
}

/// Writes `targets` as one [`Batch`]: all complete and fsynced before the
/// first rename, renamed in the order given, each directory fsynced once.
pub fn write_private_batch(targets: &[(&Path, &[u8])]) -> Result<()> {
    let mut batch = Batch::new();
    for (path, bytes) in targets {
        batch.add(*path, *bytes);
    }
    batch.commit()
}

/// [`write_private_with`] without the directory fsync: the new content is
/// fsynced before the rename (a crash never leaves a torn or empty file in
/// its place), but the rename itself may be lost in a crash, leaving the
/// previous version. Only for records whose previous version (or absence)
/// is still a correct state after a crash, when every process of the run is
/// gone anyway; the next directory fsync in the same directory makes the
/// rename durable too.
pub fn replace_private_with(path: &Path, bytes: &[u8], before_rename: impl FnOnce()) -> Result<()> {
    let dir = parent_of(path);
    ensure_private_dir(dir)?;
    let tmp = temp_path(path);
    let written = write_new_file(&tmp, bytes).and_then(|()| {
        before_rename();
        fs::rename(&tmp, path).map_err(|e| Error::new("rename temp file onto", path, e))
    });
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written
}

/// [`write_private`] of content too large to hold twice: `fill` streams it
/// into the temp file (buffered), which is then fsynced, renamed onto
/// `path` and the directory fsynced. A failed `fill` leaves no file.
pub fn write_private_streamed(
    path: &Path,
    fill: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> Result<()> {
    let dir = parent_of(path);
    ensure_private_dir(dir)?;
    let tmp = temp_path(path);
    let written = (|| {
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(FILE_MODE)
            .open(&tmp)
            .map_err(|e| Error::new("create", &tmp, e))?;
        let mut out = io::BufWriter::with_capacity(1 << 16, file);
        fill(&mut out)
            .and_then(|()| out.into_inner().map_err(|e| e.into_error()))
            .and_then(|file| file.sync_all())
            .map_err(|e| Error::new("write", &tmp, e))?;
        fs::rename(&tmp, path).map_err(|e| Error::new("rename temp file onto", path, e))
    })();
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
        return written;
    }
    sync_dir(dir)
}

/// [`create_new_private`] without the directory fsync: the file's content
/// is durable before anyone can rely on it, its name is not. For transient
/// records (a claim removed again moments later) whose loss in a crash is
/// harmless.
pub fn create_new_private_transient_name(path: &Path, bytes: &[u8]) -> Result<()> {
    write_new_file(path, bytes)
}

/// Writes `value` as [`write_json`] does (temp file, 0600, rename: a reader
/// sees the old file or the new one) but without any fsync. Only for records
/// that coordinate processes that are alive right now (the startup
/// handshake): a crash ends those processes, and whatever such a record says
/// afterwards is stale anyway.
pub fn write_json_transient<T: Serialize + ?Sized>(path: &Path, value: &T) -> Result<()> {
    let dir = parent_of(path);
    ensure_private_dir(dir)?;
    let tmp = temp_path(path);
    let written = write_new_file_unsynced(&tmp, &to_pretty_json(value)).and_then(|()| {
        fs::rename(&tmp, path).map_err(|e| Error::new("rename temp file onto", path, e))
    });
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written
}

fn write_new_file_unsynced(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .open(path)
        .map_err(|e| Error::new("create", path, e))?;
    let result = file
        .write_all(bytes)
        .map_err(|e| Error::new("write", path, e));
    if result.is_err() {
        let _ = fs::remove_file(path);
    }
    result
}

/// Serialises `value` as pretty JSON (2 spaces, no trailing newline) and
/// writes it with [`write_private`].
pub fn write_json<T: Serialize + ?Sized>(path: &Path, value: &T) -> Result<()> {
    write_private(path, &to_pretty_json(value))
}

/// Pretty JSON exactly as the state files store it: 2-space indent, no trailing newline.
pub fn to_pretty_json<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    // Serialising plain data structures to memory cannot fail.
    serde_json::to_vec_pretty(value).unwrap_or_else(|e| panic!("failed to serialise JSON: {e}"))
}

/// Creates `path` only if it does not exist (`O_EXCL`), writes `bytes`, fsyncs
/// the file and its directory. A partial file is removed on error.
pub fn create_new_private(path: &Path, bytes: &[u8]) -> Result<()> {
    write_new_file(path, bytes)?;
    sync_dir(parent_of(path))
}

/// Appends `bytes` with a single `write` to `path` (created 0600 if missing).
///
/// Lines shorter than `PIPE_BUF`-ish sizes from concurrent appenders do not
/// interleave on local file systems because the file is opened `O_APPEND`.
/// A write cut short (a full disk) is cut off again, so a failed append
/// leaves no torn line that would also spoil the next one.
pub fn append_private(path: &Path, bytes: &[u8]) -> Result<()> {
    // O_NONBLOCK: opening a FIFO planted in place of the file fails at once
    // (ENXIO) instead of waiting for a reader; O_NOFOLLOW: no symlink.
    let mut file = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| Error::new("open for append", path, e))?;
    let regular = file.metadata().map(|m| m.is_file());
    if !regular.map_err(|e| Error::new("open for append", path, e))? {
        let e = io::Error::new(io::ErrorKind::InvalidInput, "not a regular file");
        return Err(Error::new("open for append", path, e));
    }
    let before = file.metadata().map(|m| m.len()).ok();
    let mut written = 0;
    while written < bytes.len() {
        match file.write(&bytes[written..]) {
            Ok(0) => {
                undo_partial(&file, before, written);
                return Err(Error::new(
                    "append to",
                    path,
                    io::ErrorKind::WriteZero.into(),
                ));
            }
            Ok(n) => written += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                undo_partial(&file, before, written);
                return Err(Error::new("append to", path, e));
            }
        }
    }
    Ok(())
}

/// Truncates a partial append away, unless another appender wrote meanwhile.
fn undo_partial(file: &File, before: Option<u64>, written: usize) {
    let Some(before) = before else { return };
    let now = file.metadata().map(|m| m.len()).ok();
    if written > 0 && now == Some(before + written as u64) {
        let _ = file.set_len(before);
    }
}

/// An unnamed private file (mode 0600, read and write) in `dir`, created
/// 0700 if missing, for scratch data too large to hold in memory. Opened
/// `O_TMPFILE`, so it never has a name and vanishes with its last
/// descriptor, even when the process is killed; where the file system
/// lacks `O_TMPFILE`, a new temp name removed again at once.
pub fn scratch_private(dir: &Path) -> Result<File> {
    ensure_private_dir(dir)?;
    let unnamed = OpenOptions::new()
        .read(true)
        .write(true)
        .mode(FILE_MODE)
        .custom_flags(libc::O_TMPFILE | libc::O_CLOEXEC)
        .open(dir);
    match unnamed {
        Ok(file) => return Ok(file),
        // Not supported here (the kernel or the file system): use a name.
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EOPNOTSUPP | libc::EISDIR | libc::EINVAL)
            ) => {}
        Err(e) => return Err(Error::new("create a scratch file in", dir, e)),
    }
    let tmp = temp_path(&dir.join("scratch"));
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)
        .map_err(|e| Error::new("create", &tmp, e))?;
    fs::remove_file(&tmp).map_err(|e| Error::new("remove", &tmp, e))?;
    Ok(file)
}

/// Removes `path`; a missing file is not an error.
pub fn remove_if_exists(path: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(Error::new("remove", path, e)),
        _ => Ok(()),
    }
}

/// Fsyncs a directory so a rename or create inside it survives a crash.
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::new("sync directory", dir, e))
}

fn write_new_file(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .open(path)
        .map_err(|e| Error::new("create", path, e))?;
    // An empty new file has no data to flush; the directory fsync that
    // follows makes its creation durable.
    let result = file
        .write_all(bytes)
        .and_then(|()| {
            if bytes.is_empty() {
                Ok(())
            } else {
                file.sync_all()
            }
        })
        .map_err(|e| Error::new("write", path, e));
    if result.is_err() {
        let _ = fs::remove_file(path);
    }
    result
}

fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut random = [0u8; 8];
    // A weak suffix only risks an EEXIST retry-free failure; the fallback keeps pid uniqueness.
    if getrandom::fill(&mut random).is_err() {
        random = u64::from(std::process::id()).to_le_bytes();
    }
    let suffix: String = random.iter().map(|b| format!("{b:02x}")).collect();
    parent_of(path).join(format!(".{name}.{}.{suffix}.tmp", std::process::id()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn write_json_is_private_pretty_and_leaves_no_temp_file() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/b");
        let file = dir.join("status.json");
        write_json(&file, &serde_json::json!({"state": "running", "n": 1})).unwrap();
        assert_eq!(
            fs::read_to_string(&file).unwrap(),
            "{\n  \"state\": \"running\",\n  \"n\": 1\n}"
        );
        assert_eq!(mode(&file), 0o600);
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&tmp.path().join("a")), 0o700);
        let names: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("status.json")]);
    }

    #[test]
    fn write_private_replaces_and_tightens_an_existing_file() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("x");
        fs::write(&file, "old").unwrap();
        fs::set_permissions(&file, fs::Permissions::from_mode(0o644)).unwrap();
        write_private(&file, b"new").unwrap();
        assert_eq!(fs::read(&file).unwrap(), b"new");
        assert_eq!(mode(&file), 0o600);
    }

    #[test]
    fn failed_rename_leaves_target_and_no_temp_file() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("is-a-dir");
        fs::create_dir(&target).unwrap();
        fs::write(target.join("keep"), "x").unwrap();
        let err = write_private(&target, b"data").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("failed to rename temp file onto"),
            "{err}"
        );
        let names: Vec<_> = fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    #[test]
    fn before_rename_sees_the_temp_file_and_the_old_target() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("status.json");
        write_private(&file, b"old").unwrap();
        let mut seen = Vec::new();
        write_private_with(&file, b"new", || {
            seen = fs::read_dir(tmp.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            assert_eq!(fs::read(&file).unwrap(), b"old");
        })
        .unwrap();
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert!(seen.iter().any(|n| n.ends_with(".tmp")), "{seen:?}");
        assert_eq!(fs::read(&file).unwrap(), b"new");
    }

    #[test]
    fn create_new_private_refuses_an_existing_file() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("000001.json");
        create_new_private(&file, b"{}").unwrap();
        let err = create_new_private(&file, b"{}").unwrap_err();
        assert!(err.is_already_exists());
        assert_eq!(mode(&file), 0o600);
    }

    #[test]
    fn append_private_appends_whole_lines() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("events.jsonl");
        append_private(&file, b"{\"a\":1}\n").unwrap();
        append_private(&file, b"{\"b\":2}\n").unwrap();
        assert_eq!(fs::read_to_string(&file).unwrap(), "{\"a\":1}\n{\"b\":2}\n");
        assert_eq!(mode(&file), 0o600);
    }

    #[test]
    fn a_scratch_file_is_private_unnamed_and_readable_back() {
        use std::os::unix::fs::FileExt;
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("scratch-dir");
        let file = scratch_private(&dir).unwrap();
        assert_eq!(mode(&dir), DIR_MODE);
        assert_eq!(
            file.metadata().unwrap().permissions().mode() & 0o777,
            FILE_MODE
        );
        file.write_all_at(b"hello", 0).unwrap();
        let mut back = [0u8; 5];
        file.read_exact_at(&mut back, 0).unwrap();
        assert_eq!(&back, b"hello");
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 0, "no name left");
    }

    /// Where the file system has `O_TMPFILE`, the scratch file never gets a
    /// name, not even for a moment: a watcher of the directory sees no
    /// entry created or removed.
    #[test]
    fn a_scratch_file_never_has_a_name_where_unnamed_files_exist() {
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        use std::os::unix::ffi::OsStrExt;
        let tmp = tempfile::tempdir().unwrap();
        let probe = OpenOptions::new()
            .read(true)
            .write(true)
            .mode(FILE_MODE)
            .custom_flags(libc::O_TMPFILE)
            .open(tmp.path());
        if probe.is_err() {
            eprintln!("no O_TMPFILE in {}: nothing to check", tmp.path().display());
            return;
        }
        // SAFETY: plain system calls on a descriptor this test owns.
        let watch = unsafe {
            OwnedFd::from_raw_fd(libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC))
        };
        let dir = std::ffi::CString::new(tmp.path().as_os_str().as_bytes()).unwrap();
        let mask = libc::IN_CREATE | libc::IN_DELETE | libc::IN_MOVED_TO;
        // SAFETY: as above; `dir` is a valid C string.
        let added = unsafe { libc::inotify_add_watch(watch.as_raw_fd(), dir.as_ptr(), mask) };
        assert!(
            added >= 0,
            "failed to watch: {}",
            io::Error::last_os_error()
        );

        let file = scratch_private(tmp.path()).unwrap();
        drop(file);

        let mut events = [0u8; 4096];
        // SAFETY: reads into a buffer of the length given.
        let read =
            unsafe { libc::read(watch.as_raw_fd(), events.as_mut_ptr().cast(), events.len()) };
        let error = io::Error::last_os_error();
        assert_eq!(read, -1, "the scratch file had a name in the directory");
        assert_eq!(error.raw_os_error(), Some(libc::EAGAIN), "{error}");
    }

    fn names_in(dir: &Path) -> Vec<String> {
        let mut names: Vec<_> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_batch_writes_every_target_private_and_leaves_no_temp_file() {
        let tmp = tempfile::tempdir().unwrap();
        let run = tmp.path().join("run");
        let nested = tmp.path().join("a/b");
        let mut batch = Batch::new();
        batch
            .add(run.join("one.json"), b"1".to_vec())
            .add_json(nested.join("two.json"), &serde_json::json!({"n": 2}))
            .add(run.join("empty"), Vec::new())
            .add(run.join("one.json"), b"1 again".to_vec());
        assert_eq!(batch.len(), 4);
        batch.commit().unwrap();
        assert_eq!(fs::read(run.join("one.json")).unwrap(), b"1 again");
        assert_eq!(
            fs::read_to_string(nested.join("two.json")).unwrap(),
            "{\n  \"n\": 2\n}"
        );
        assert_eq!(fs::read(run.join("empty")).unwrap(), b"");
        for file in [
            run.join("one.json"),
            nested.join("two.json"),
            run.join("empty"),
        ] {
            assert_eq!(mode(&file), FILE_MODE, "{}", file.display());
        }
        for dir in [&run, &nested, &tmp.path().join("a")] {
            assert_eq!(mode(dir), DIR_MODE, "{}", dir.display());
        }
        assert_eq!(names_in(&run), ["empty", "one.json"]);
        assert_eq!(names_in(&nested), ["two.json"]);
    }

    #[test]
    fn write_private_batch_replaces_existing_targets() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
        fs::write(&a, "old").unwrap();
        fs::set_permissions(&a, fs::Permissions::from_mode(0o644)).unwrap();
        write_private_batch(&[(&a, b"new a"), (&b, b"new b")]).unwrap();
        assert_eq!(fs::read(&a).unwrap(), b"new a");
        assert_eq!(fs::read(&b).unwrap(), b"new b");
        assert_eq!(mode(&a), FILE_MODE);
    }

    /// Before the first rename every temp file is complete and no target
    /// has changed; the renames then land in the order the targets were
    /// added (a watcher sees them in that order).
    #[test]
    fn a_batch_renames_complete_files_in_the_order_given() {
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        use std::os::unix::ffi::OsStrExt;
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        fs::write(dir.join("c"), "old c").unwrap();
        // SAFETY: plain system calls on a descriptor this test owns.
        let watch = unsafe {
            OwnedFd::from_raw_fd(libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC))
        };
        let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).unwrap();
        // SAFETY: as above; `path` is a valid C string.
        let added =
            unsafe { libc::inotify_add_watch(watch.as_raw_fd(), path.as_ptr(), libc::IN_MOVED_TO) };
        assert!(
            added >= 0,
            "failed to watch: {}",
            io::Error::last_os_error()
        );

        let mut batch = Batch::new();
        batch
            .add(dir.join("c"), b"new c".to_vec())
            .add(dir.join("a"), b"new a".to_vec())
            .add(dir.join("b"), b"new b".to_vec());
        let mut before = Vec::new();
        batch
            .commit_with(|| {
                for name in names_in(dir) {
                    before.push((name.clone(), fs::read_to_string(dir.join(&name)).unwrap()));
                }
            })
            .unwrap();
        let temps: Vec<_> = before.iter().filter(|(n, _)| n.ends_with(".tmp")).collect();
        assert_eq!(temps.len(), 3, "{before:?}");
        let mut contents: Vec<_> = temps.iter().map(|(_, text)| text.as_str()).collect();
        contents.sort();
        assert_eq!(contents, ["new a", "new b", "new c"]);
        assert!(
            before.contains(&("c".to_owned(), "old c".to_owned())),
            "{before:?}"
        );
        assert_eq!(before.len(), 4, "{before:?}");

        let mut events = [0u8; 4096];
        // SAFETY: reads into a buffer of the length given.
        let read =
            unsafe { libc::read(watch.as_raw_fd(), events.as_mut_ptr().cast(), events.len()) };
        assert!(read > 0, "no rename seen: {}", io::Error::last_os_error());
        let mut renamed = Vec::new();
        let mut at = 0;
        let header = std::mem::size_of::<libc::inotify_event>();
        while at + header <= read as usize {
            // SAFETY: the kernel wrote a whole event at `at`; read unaligned.
            let event: libc::inotify_event =
                unsafe { std::ptr::read_unaligned(events[at..].as_ptr().cast()) };
            let name = &events[at + header..at + header + event.len as usize];
            let name = name.split(|b| *b == 0).next().unwrap_or_default();
            renamed.push(String::from_utf8_lossy(name).into_owned());
            at += header + event.len as usize;
        }
        assert_eq!(renamed, ["c", "a", "b"]);
        assert_eq!(names_in(dir), ["a", "b", "c"]);
    }

    /// A rename that fails in the middle: the targets before it are
    /// replaced and complete, the one that failed and those after it are
    /// as they were, and no temp file is left.
    #[test]
    fn a_failed_rename_in_a_batch_leaves_no_half_written_target_and_no_temp_file() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let blocker = dir.join("b");
        fs::create_dir(&blocker).unwrap();
        fs::write(blocker.join("keep"), "x").unwrap();
        fs::write(dir.join("c"), "old c").unwrap();
        let err = write_private_batch(&[
            (&dir.join("a"), b"new a"),
            (&blocker, b"new b"),
            (&dir.join("c"), b"new c"),
        ])
        .unwrap_err();
        assert_eq!(err.op, "rename temp file onto");
        assert!(
            err.to_string().starts_with(&format!(
                "failed to rename temp file onto '{}': ",
                blocker.display()
            )),
            "{err}"
        );
        assert_eq!(fs::read(dir.join("a")).unwrap(), b"new a");
        assert_eq!(fs::read(blocker.join("keep")).unwrap(), b"x");
        assert_eq!(fs::read(dir.join("c")).unwrap(), b"old c");
        assert_eq!(names_in(dir), ["a", "b", "c"]);
    }

    /// A target that cannot even be staged (its directory cannot be made)
    /// fails the batch before any rename: no target changes, no temp file
    /// stays in any directory.
    #[test]
    fn a_batch_that_fails_before_the_renames_changes_no_target() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        fs::write(dir.join("a"), "old a").unwrap();
        fs::write(dir.join("not-a-dir"), "file").unwrap();
        let mut batch = Batch::new();
        batch
            .add(dir.join("a"), b"new a".to_vec())
            .add(dir.join("sub/b"), b"new b".to_vec())
            .add(dir.join("not-a-dir/c"), b"new c".to_vec())
            .add(dir.join("d"), b"new d".to_vec());
        let err = batch.commit().unwrap_err();
        assert!(
            err.to_string().starts_with("failed to create directory"),
            "{err}"
        );
        assert_eq!(fs::read(dir.join("a")).unwrap(), b"old a");
        assert_eq!(names_in(dir), ["a", "not-a-dir", "sub"]);
        assert!(names_in(&dir.join("sub")).is_empty());
    }

    #[test]
    fn a_staged_file_changes_nothing_and_leaves_nothing_when_dropped() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run");
        let target = dir.join("status.json");
        fs::create_dir(&dir).unwrap();
        fs::write(&target, "old").unwrap();
        let staged = stage_private(&target, b"new").unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"old");
        let names = names_in(&dir);
        assert_eq!(names.len(), 2, "{names:?}");
        assert!(
            names[0].starts_with(".status.json.") && names[0].ends_with(".tmp"),
            "{names:?}"
        );
        drop(staged);
        assert_eq!(names_in(&dir), ["status.json"]);
        assert_eq!(fs::read(&target).unwrap(), b"old");
    }

    #[test]
    fn remove_if_exists_ignores_missing() {
        let tmp = tempfile::tempdir().unwrap();
        remove_if_exists(&tmp.path().join("nope")).unwrap();
    }
}
