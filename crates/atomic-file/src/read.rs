//! Bounded, non-blocking reads of state files.
//!
//! A state root is data other processes (and, on a shared machine, other
//! users) can touch. A FIFO planted in place of `status.json` would block a
//! plain `open` forever, a device or a 300 MB file would stall every command,
//! and a symlink could point anywhere. Every reader of a state file goes
//! through [`read_file`] (or [`open_regular`] for logs, which are streamed):
//!
//! * open with `O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC`, so neither a symlink
//!   nor a FIFO is followed or waited on;
//! * `fstat` the handle and refuse anything that is not a regular file;
//! * refuse files over the cap ([`STATE_FILE_LIMIT`] by default) and read at
//!   most cap + 1 bytes, so a file growing under us is still bounded.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::escape_path;

/// The largest state file any reader accepts (16 MiB).
pub const STATE_FILE_LIMIT: u64 = 16 * 1024 * 1024;

/// Why a state file could not be read. Every message names the path, on one line.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// open/fstat/read failed.
    #[error("failed to read '{}': {source}", escape_path(path))]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The path is a symlink (never followed).
    #[error("failed to read '{}': is a symbolic link", escape_path(path))]
    Symlink {
        /// The file.
        path: PathBuf,
    },
    /// The path is a FIFO, device, socket or directory.
    #[error("failed to read '{}': not a regular file ({kind})", escape_path(path))]
    NotRegular {
        /// The file.
        path: PathBuf,
        /// What it is instead ("FIFO", "directory", ...).
        kind: &'static str,
    },
    /// The file is larger than the cap.
    #[error(
        "failed to read '{}': {} exceeds the {} limit for state files",
        escape_path(path),
        human_size(*size),
        human_size(*limit)
    )]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size (or at least cap + 1 when it grew while read).
        size: u64,
        /// The cap.
        limit: u64,
    },
    /// A state directory other users can write to or that another user owns.
    #[error(
        "refusing state directory '{}': {why}; fix it, or pass --allow-shared-root (or set SUBAGENTS_ALLOW_SHARED_ROOT=1) to trust it",
        escape_path(path)
    )]
    SharedDir {
        /// The directory.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// The file belongs to another user (see [`set_allow_foreign_owner`]).
    #[error(
        "failed to read '{}': owned by uid {uid}, not by this user (pass --allow-shared-root to trust it)",
        escape_path(path)
    )]
    ForeignOwner {
        /// The file.
        path: PathBuf,
        /// Its owner.
        uid: u32,
    },
}

impl ReadError {
    /// True when the file does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }

    /// The file the error is about.
    pub fn path(&self) -> &Path {
        match self {
            Self::Io { path, .. }
            | Self::Symlink { path }
            | Self::NotRegular { path, .. }
            | Self::TooLarge { path, .. }
            | Self::SharedDir { path, .. }
            | Self::ForeignOwner { path, .. } => path,
        }
    }

    /// The error as an `io::Error` without the path (for callers whose error
    /// type wraps one and names the path itself).
    pub fn into_io(self) -> io::Error {
        let reason = match self {
            Self::Io { source, .. } => return source,
            Self::Symlink { .. } => "is a symbolic link".to_owned(),
            Self::NotRegular { kind, .. } => format!("not a regular file ({kind})"),
            Self::TooLarge { size, limit, .. } => format!(
                "{} exceeds the {} limit for state files",
                human_size(size),
                human_size(limit)
            ),
            Self::SharedDir { why, .. } => why,
            Self::ForeignOwner { uid, .. } => format!(
                "owned by uid {uid}, not by this user (pass --allow-shared-root to trust it)"
            ),
        };
        io::Error::new(io::ErrorKind::InvalidData, reason)
    }
}

static ALLOW_FOREIGN_OWNER: AtomicBool = AtomicBool::new(false);

/// Trusts state files owned by other users (the `--allow-shared-root`
/// escape hatch). By default a file owned by neither this user nor root is
/// refused: on a shared root another user could have planted it.
pub fn set_allow_foreign_owner(allow: bool) {
    ALLOW_FOREIGN_OWNER.store(allow, Ordering::Relaxed);
}

/// Whether [`set_allow_foreign_owner`] was turned on.
pub fn allow_foreign_owner() -> bool {
    ALLOW_FOREIGN_OWNER.load(Ordering::Relaxed)
}

/// Reads a whole state file, capped at [`STATE_FILE_LIMIT`].
pub fn read_file(path: &Path) -> Result<Vec<u8>, ReadError> {
    read_file_capped(path, STATE_FILE_LIMIT)
}

/// Reads a whole file, refusing one larger than `limit` bytes.
pub fn read_file_capped(path: &Path, limit: u64) -> Result<Vec<u8>, ReadError> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| open_error(path, e))?;
    // One fstat serves the kind, owner and size checks.
    let size = check_regular(&file, path)?.len();
    read_sized(file, path, limit, size)
}

/// Reads a file the caller opened itself (e.g. with `openat` relative to a
/// directory handle, with `O_NOFOLLOW | O_NONBLOCK`): checks through the
/// handle that it is a trusted regular file, then reads at most `limit` bytes.
/// `path` names the file in errors.
pub fn read_opened(file: File, path: &Path, limit: u64) -> Result<Vec<u8>, ReadError> {
    let size = check_regular(&file, path)?.len();
    read_sized(file, path, limit, size)
}

fn read_checked(file: File, path: &Path, limit: u64) -> Result<Vec<u8>, ReadError> {
    let io = |source| ReadError::Io {
        path: path.to_path_buf(),
        source,
    };
    let size = file.metadata().map_err(io)?.len();
    read_sized(file, path, limit, size)
}

/// Reads to the end (at most `limit` bytes) a regular file whose size was
/// just read from its handle: usually one `read`.
fn read_sized(mut file: File, path: &Path, limit: u64, size: u64) -> Result<Vec<u8>, ReadError> {
    let io = |source| ReadError::Io {
        path: path.to_path_buf(),
        source,
    };
    if size > limit {
        return Err(too_large(path, size, limit));
    }
    // Room for the whole file and one byte more, so a file that grew since
    // the fstat still ends in a short read rather than a reallocation.
    let mut bytes = vec![0u8; size as usize + 1];
    let mut filled = 0;
    loop {
        if filled == bytes.len() {
            if filled as u64 > limit {
                return Err(too_large(path, filled as u64, limit));
            }
            bytes.resize((filled * 2).min(limit as usize + 1).max(filled + 1), 0);
        }
        let wanted = bytes.len() - filled;
        match file.read(&mut bytes[filled..]) {
            Ok(0) => break,
            // A regular file with a size reads short only at its end: no
            // second read just to see EOF. (`/proc` files report size 0 and
            // may read short anywhere: they read on to EOF.)
            Ok(n) if n < wanted && size > 0 => {
                filled += n;
                break;
            }
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io(e)),
        }
    }
    if filled as u64 > limit {
        return Err(too_large(path, filled as u64, limit));
    }
    bytes.truncate(filled);
    Ok(bytes)
}

/// A directory opened once, so that the many files below it (a listing's
/// run directories) are reached by short relative lookups instead of one
/// whole-path walk each. Lookups below it never follow a symlink: `openat2`
/// with `RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH` where the kernel has it,
/// `O_NOFOLLOW` on the last component otherwise.
#[derive(Debug)]
pub struct DirHandle {
    file: File,
    path: PathBuf,
}

/// What `fstatat` says about an entry below a [`DirHandle`] (symlinks not
/// followed).
#[derive(Debug, Clone, Copy)]
pub struct EntryStat {
    /// `st_mode` (type and permission bits).
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Modification time, ms since the epoch (0 before it).
    pub modified_ms: u64,
}

impl EntryStat {
    /// A directory (not a symlink to one).
    pub fn is_dir(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFDIR
    }
}

/// What identifies one version of a file to a cache: device, inode, size,
/// owner, mode and the modification and change times to the nanosecond.
/// Userspace can set the modification time but never the change time: any
/// write, `chmod` or rename onto the name gives the (new) inode the
/// kernel's current time as its change time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    /// `st_dev`.
    pub dev: u64,
    /// `st_ino`.
    pub ino: u64,
    /// `st_size`.
    pub size: u64,
    /// `st_mode` (type and permission bits).
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Modification time: seconds and nanoseconds since the epoch.
    pub mtime: (i64, i64),
    /// Change time: seconds and nanoseconds since the epoch.
    pub ctime: (i64, i64),
}

impl Stamp {
    /// The stamp of a file's metadata.
    pub fn of(meta: &std::fs::Metadata) -> Self {
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mode: meta.mode(),
            uid: meta.uid(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }

    /// The change time in nanoseconds since the epoch (negative before it).
    pub fn ctime_ns(&self) -> i128 {
        i128::from(self.ctime.0) * 1_000_000_000 + i128::from(self.ctime.1)
    }
}

impl DirHandle {
    /// Opens `path` (which must be a directory).
    pub fn open(path: &Path) -> io::Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(path)?;
        Ok(Self {
            file,
            path: path.to_path_buf(),
        })
    }

    /// The directory's path, as opened.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `fstat` of the directory itself.
    pub fn metadata(&self) -> io::Result<std::fs::Metadata> {
        self.file.metadata()
    }

    /// [`read_file_capped`] of `rel` below this directory; errors name the
    /// whole path.
    pub fn read_file(&self, rel: &str, limit: u64) -> Result<Vec<u8>, ReadError> {
        let path = self.path.join(rel);
        let file = self.open_below(rel).map_err(|e| open_error(&path, e))?;
        read_opened(file, &path, limit)
    }

    /// [`DirHandle::read_file`] that also returns the [`Stamp`] of the file
    /// read, from the same `fstat` of its handle that checked it (taken
    /// before the read: a change made while reading moves the change time on).
    pub fn read_file_stamped(&self, rel: &str, limit: u64) -> Result<(Vec<u8>, Stamp), ReadError> {
        let path = self.path.join(rel);
        let file = self.open_below(rel).map_err(|e| open_error(&path, e))?;
        let meta = check_regular(&file, &path)?;
        let stamp = Stamp::of(&meta);
        Ok((read_sized(file, &path, limit, meta.len())?, stamp))
    }

    /// The [`Stamp`] of `rel` below this directory: one
    /// `fstatat(rel, AT_SYMLINK_NOFOLLOW)`.
    pub fn stamp(&self, rel: &str) -> io::Result<Stamp> {
        let st = self.fstatat(rel)?;
        Ok(Stamp {
            dev: st.st_dev,
            ino: st.st_ino,
            size: st.st_size.max(0) as u64,
            mode: st.st_mode,
            uid: st.st_uid,
            mtime: (st.st_mtime, st.st_mtime_nsec),
            ctime: (st.st_ctime, st.st_ctime_nsec),
        })
    }

    /// `fstatat(rel, AT_SYMLINK_NOFOLLOW)` below this directory.
    pub fn stat(&self, rel: &str) -> io::Result<EntryStat> {
        let st = self.fstatat(rel)?;
        let ms = (st.st_mtime.max(0) as u64) * 1000 + (st.st_mtime_nsec.max(0) as u64) / 1_000_000;
        Ok(EntryStat {
            mode: st.st_mode,
            uid: st.st_uid,
            modified_ms: ms,
        })
    }

    fn fstatat(&self, rel: &str) -> io::Result<libc::stat> {
        let name = c_name(rel)?;
        let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
        // SAFETY: a valid directory descriptor, a NUL-terminated name and a
        // buffer of the right type that fstatat fills on success.
        let rc = unsafe {
            libc::fstatat(
                self.file.as_raw_fd(),
                name.as_ptr(),
                st.as_mut_ptr(),
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fstatat returned 0, so it filled the buffer.
        Ok(unsafe { st.assume_init() })
    }

    fn open_below(&self, rel: &str) -> io::Result<File> {
        let name = c_name(rel)?;
        let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC;
        // The kernel's `struct open_how` (libc's is non-exhaustive).
        #[repr(C)]
        struct OpenHow {
            flags: u64,
            mode: u64,
            resolve: u64,
        }
        let how = OpenHow {
            flags: flags as u64,
            mode: 0,
            resolve: libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_BENEATH,
        };
        // SAFETY: openat2 with a valid descriptor, a NUL-terminated name and
        // an `open_how` of the size passed.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                self.file.as_raw_fd(),
                name.as_ptr(),
                &how as *const OpenHow,
                std::mem::size_of::<OpenHow>(),
            )
        };
        let fd = if fd >= 0 {
            fd as i32
        } else {
            let e = io::Error::last_os_error();
            // No openat2 (old kernel, or a seccomp filter that hides it):
            // plain openat, which refuses a symlink as the last component.
            if !matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EPERM)) {
                return Err(e);
            }
            // SAFETY: as above, with openat's arguments.
            let fd = unsafe { libc::openat(self.file.as_raw_fd(), name.as_ptr(), flags) };
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            fd
        };
        // SAFETY: a descriptor the kernel just opened for us, owned from here.
        Ok(unsafe { File::from_raw_fd(fd) })
    }
}

fn c_name(rel: &str) -> io::Result<std::ffi::CString> {
    std::ffi::CString::new(rel)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in a file name"))
}

/// Reads a file the user named on the command line (a spec, a descriptor, the
/// input of `validate`): symlinks are followed and any owner is accepted, but
/// a FIFO, device or directory is refused at once and the size is capped at
/// [`STATE_FILE_LIMIT`].
pub fn read_input_file(path: &Path) -> Result<Vec<u8>, ReadError> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| open_error(path, e))?;
    check_kind(&file, path)?;
    read_checked(file, path, STATE_FILE_LIMIT)
}

/// [`read_file`] as UTF-8 text.
pub fn read_to_string(path: &Path) -> Result<String, ReadError> {
    String::from_utf8(read_file(path)?).map_err(|e| ReadError::Io {
        path: path.to_path_buf(),
        source: io::Error::new(io::ErrorKind::InvalidData, e.utf8_error()),
    })
}

/// [`read_file`] with a missing file as `None`.
pub fn read_optional(path: &Path) -> Result<Option<Vec<u8>>, ReadError> {
    match read_file(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e),
    }
}

/// Opens `path` for reading without following a symlink or blocking on a
/// FIFO, and checks through the handle that it is a regular file owned by
/// this user (or root). For files read in a stream (logs, events) that have
/// no size cap.
pub fn open_regular(path: &Path) -> Result<File, ReadError> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| open_error(path, e))?;
    check_regular(&file, path)?;
    Ok(file)
}

/// Opens (creating 0600 if missing) a lock file for `flock`, without
/// following a symlink or blocking on a FIFO; refuses anything that is not a
/// regular file.
pub fn open_lock_file(path: &Path) -> Result<File, ReadError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(crate::FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| open_error(path, e))?;
    check_regular(&file, path)?;
    Ok(file)
}

fn open_error(path: &Path, source: io::Error) -> ReadError {
    // O_NOFOLLOW on a symlink fails with ELOOP; an O_NONBLOCK write-open of a
    // FIFO without a reader fails with ENXIO.
    match source.raw_os_error() {
        Some(libc::ELOOP) => ReadError::Symlink {
            path: path.to_path_buf(),
        },
        Some(libc::ENXIO) => ReadError::NotRegular {
            path: path.to_path_buf(),
            kind: "FIFO or device",
        },
        _ => ReadError::Io {
            path: path.to_path_buf(),
            source,
        },
    }
}

fn check_regular(file: &File, path: &Path) -> Result<std::fs::Metadata, ReadError> {
    let meta = check_kind(file, path)?;
    if !trusted_owner(meta.uid()) {
        return Err(ReadError::ForeignOwner {
            path: path.to_path_buf(),
            uid: meta.uid(),
        });
    }
    Ok(meta)
}

fn check_kind(file: &File, path: &Path) -> Result<std::fs::Metadata, ReadError> {
    let meta = file.metadata().map_err(|source| ReadError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let kind = meta.file_type();
    if !kind.is_file() {
        let kind = if kind.is_fifo() {
            "FIFO"
        } else if kind.is_dir() {
            "directory"
        } else if kind.is_socket() {
            "socket"
        } else if kind.is_char_device() || kind.is_block_device() {
            "device"
        } else {
            "special file"
        };
        return Err(ReadError::NotRegular {
            path: path.to_path_buf(),
            kind,
        });
    }
    Ok(meta)
}

/// Refuses a state directory that another user could plant files in: one
/// writable by group or others, or owned by neither this user nor root
/// (unless [`set_allow_foreign_owner`] was turned on). A missing directory
/// is fine.
pub fn check_private_dir(dir: &Path) -> Result<(), ReadError> {
    let Ok(meta) = std::fs::metadata(dir) else {
        return Ok(());
    };
    check_private_meta(dir, &meta)
}

/// [`check_private_dir`] with the directory's metadata already at hand.
pub fn check_private_meta(dir: &Path, meta: &std::fs::Metadata) -> Result<(), ReadError> {
    check_private_mode(dir, meta.mode(), meta.uid())
}

/// [`check_private_meta`] from a mode and an owner (e.g. an [`EntryStat`]).
pub fn check_private_mode(dir: &Path, mode: u32, uid: u32) -> Result<(), ReadError> {
    if allow_foreign_owner() {
        return Ok(());
    }
    let refuse = |why: String| {
        Err(ReadError::SharedDir {
            path: dir.to_path_buf(),
            why,
        })
    };
    let mode = mode & 0o7777;
    if mode & 0o022 != 0 {
        return refuse(format!(
            "it is writable by group or others (mode {mode:04o})"
        ));
    }
    if !trusted_owner(uid) {
        // SAFETY: geteuid has no failure modes and no memory effects.
        let me = unsafe { libc::geteuid() };
        return refuse(format!(
            "it is owned by uid {uid}, not by this user (uid {me})"
        ));
    }
    Ok(())
}

/// True when a file or directory owned by `uid` may be trusted: ours, root's,
/// or anyone's once [`set_allow_foreign_owner`] was turned on.
pub fn trusted_owner(uid: u32) -> bool {
    uid == effective_uid() || uid == 0 || allow_foreign_owner()
}

/// This process's effective uid, asked once (listings check thousands of files).
fn effective_uid() -> u32 {
    static EUID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    // SAFETY: geteuid has no failure modes and no memory effects.
    *EUID.get_or_init(|| unsafe { libc::geteuid() })
}

fn too_large(path: &Path, size: u64, limit: u64) -> ReadError {
    ReadError::TooLarge {
        path: path.to_path_buf(),
        size,
        limit,
    }
}

/// `318 MiB`, `12 KiB`, `900 bytes`.
pub fn human_size(bytes: u64) -> String {
    const MIB: u64 = 1024 * 1024;
    if bytes >= MIB {
        format!("{} MiB", bytes / MIB)
    } else if bytes >= 1024 {
        format!("{} KiB", bytes / 1024)
    } else {
        format!("{bytes} bytes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;
    use std::process::Command;

    #[test]
    fn a_dir_handle_reads_below_without_following_symlinks() {
        let tmp = tempfile::tempdir().unwrap();
        let runs = tmp.path().join("runs");
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(runs.join("r1")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(runs.join("r1/status.json"), "{}").unwrap();
        std::fs::write(outside.join("status.json"), "planted").unwrap();
        symlink(&outside, runs.join("r2")).unwrap();
        symlink(outside.join("status.json"), runs.join("r1/link.json")).unwrap();
        mkfifo(&runs.join("r1/fifo.json"));
        let handle = DirHandle::open(&runs).unwrap();
        assert_eq!(handle.read_file("r1/status.json", 100).unwrap(), b"{}");
        // A symlinked directory on the way, or as the file itself: refused.
        for rel in ["r2/status.json", "r1/link.json"] {
            let err = handle.read_file(rel, 100).unwrap_err();
            assert!(matches!(err, ReadError::Symlink { .. }), "{rel}: {err}");
            assert_eq!(err.path(), runs.join(rel));
        }
        let err = handle.read_file("r1/fifo.json", 100).unwrap_err();
        assert!(
            matches!(err, ReadError::NotRegular { kind: "FIFO", .. }),
            "{err}"
        );
        assert!(
            handle
                .read_file("r1/none.json", 100)
                .unwrap_err()
                .is_not_found()
        );
        assert!(
            handle.read_file("r1/status.json", 1).is_err(),
            "the cap holds"
        );
        assert!(handle.stat("r1").unwrap().is_dir());
        assert!(
            !handle.stat("r2").unwrap().is_dir(),
            "a symlink is not followed"
        );
        let stat = handle.stat("r1/status.json").unwrap();
        assert!(stat.modified_ms > 0 && !stat.is_dir());
    }

    fn mkfifo(path: &Path) {
        assert!(Command::new("mkfifo").arg(path).status().unwrap().success());
    }

    #[test]
    fn reads_a_regular_file() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("status.json");
        std::fs::write(&file, "{}").unwrap();
        assert_eq!(read_file(&file).unwrap(), b"{}");
        assert_eq!(read_to_string(&file).unwrap(), "{}");
    }

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let tmp = tempfile::tempdir().unwrap();
        let fifo = tmp.path().join("status.json");
        mkfifo(&fifo);
        let err = read_file(&fifo).unwrap_err();
        assert!(
            matches!(err, ReadError::NotRegular { kind: "FIFO", .. }),
            "{err}"
        );
        assert!(
            err.to_string().contains("not a regular file (FIFO)"),
            "{err}"
        );
        let lock = open_lock_file(&fifo).unwrap_err();
        assert!(matches!(lock, ReadError::NotRegular { .. }), "{lock}");
    }

    #[test]
    fn devices_directories_and_symlinks_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(matches!(
            read_file(Path::new("/dev/zero")).unwrap_err(),
            ReadError::NotRegular { kind: "device", .. }
        ));
        assert!(matches!(
            read_file(tmp.path()).unwrap_err(),
            ReadError::NotRegular {
                kind: "directory",
                ..
            }
        ));
        let target = tmp.path().join("target");
        std::fs::write(&target, "x").unwrap();
        let link = tmp.path().join("link");
        symlink(&target, &link).unwrap();
        assert!(matches!(
            read_file(&link).unwrap_err(),
            ReadError::Symlink { .. }
        ));
        assert!(matches!(
            open_lock_file(&link).unwrap_err(),
            ReadError::Symlink { .. }
        ));
    }

    #[test]
    fn oversize_files_are_refused_naming_size_and_limit() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("status.json");
        let big = File::create(&file).unwrap();
        big.set_len(318 * 1024 * 1024).unwrap();
        let err = read_file(&file).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "failed to read '{}': 318 MiB exceeds the 16 MiB limit for state files",
                file.display()
            )
        );
        std::fs::write(&file, "12345").unwrap();
        assert!(matches!(
            read_file_capped(&file, 4).unwrap_err(),
            ReadError::TooLarge {
                size: 5,
                limit: 4,
                ..
            }
        ));
        assert_eq!(read_file_capped(&file, 5).unwrap(), b"12345");
    }

    #[test]
    fn shared_state_directories_are_refused() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("runs");
        assert!(check_private_dir(&dir).is_ok(), "missing is fine");
        crate::ensure_private_dir(&dir).unwrap();
        assert!(check_private_dir(&dir).is_ok());
        for mode in [0o777, 0o1777, 0o720, 0o702] {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
            let err = check_private_dir(&dir).unwrap_err().to_string();
            assert!(
                err.contains("writable by group or others") && err.contains("--allow-shared-root"),
                "{mode:o}: {err}"
            );
        }
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(
            check_private_dir(&dir).is_ok(),
            "readable by others is fine"
        );
    }

    #[test]
    fn escaping_keeps_one_line() {
        assert_eq!(crate::escape("plain/path"), "plain/path");
        assert_eq!(crate::escape("a\nb\r\u{1b}[2J"), "a\\nb\\r\\u{1b}[2J");
    }

    /// Only absence is `None`: a file that is there but cannot be read as
    /// a state file is an error, not "missing".
    #[test]
    fn only_a_missing_file_is_none() {
        let tmp = tempfile::tempdir().unwrap();
        let err = read_optional(tmp.path()).unwrap_err();
        assert!(!err.is_not_found(), "{err}");
        assert!(
            matches!(
                err,
                ReadError::NotRegular {
                    kind: "directory",
                    ..
                }
            ),
            "{err}"
        );
    }

    /// Files of this user and root's are trusted, other users' are not.
    #[test]
    fn only_this_user_and_root_are_trusted_owners() {
        // SAFETY: geteuid has no failure modes and no memory effects.
        let me = unsafe { libc::geteuid() };
        assert_eq!(effective_uid(), me);
        assert!(trusted_owner(me) && trusted_owner(0));
        let other = if me == 4242 { 4243 } else { 4242 };
        assert!(!trusted_owner(other));
    }

    /// A file far larger than memory (sparse) is refused from its size,
    /// never read or given a buffer.
    #[test]
    fn a_huge_sparse_file_is_refused_without_being_read() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("status.json");
        File::create(&file).unwrap().set_len(1 << 40).unwrap();
        assert!(matches!(
            read_file(&file).unwrap_err(),
            ReadError::TooLarge {
                size: 0x100_0000_0000,
                limit: STATE_FILE_LIMIT,
                ..
            }
        ));
    }

    /// `/proc` files report size 0 and are read to their end all the same.
    #[test]
    fn a_proc_file_is_read_whole_and_capped() {
        let path = Path::new("/proc/self/cmdline");
        let expected = std::fs::read(path).unwrap();
        assert!(expected.len() > 3);
        assert_eq!(read_file(path).unwrap(), expected);
        let cap = expected.len() as u64 - 1;
        assert!(matches!(
            read_file_capped(path, cap).unwrap_err(),
            ReadError::TooLarge { limit, .. } if limit == cap
        ));
    }

    /// A `/proc` file exactly as long as the cap (a power of two, where the
    /// growing buffer is full at exactly the cap) is read, not refused.
    #[test]
    fn a_proc_file_exactly_at_the_cap_is_read() {
        // `cat - <57 bytes>`: a command line of 4 + 2 + 58 = 64 bytes.
        let arg = "a".repeat(57);
        let mut cat = Command::new("cat")
            .args(["-", &arg])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let path = PathBuf::from(format!("/proc/{}/cmdline", cat.id()));
        // The exec that `spawn` waited for sets the command line a moment
        // after it closes the descriptors: until then it reads empty.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::fs::read(&path).unwrap().is_empty() {
            assert!(std::time::Instant::now() < deadline, "no command line");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let read = read_file_capped(&path, 64);
        drop(cat.stdin.take());
        cat.wait().unwrap();
        assert_eq!(read.unwrap(), format!("cat\0-\0{arg}\0").into_bytes());
    }

    /// A file named on the command line: symlinks are followed, but a FIFO
    /// or a directory is refused at once and the size is capped.
    #[test]
    fn input_files_follow_symlinks_and_refuse_fifos_and_directories() {
        let tmp = tempfile::tempdir().unwrap();
        let spec = tmp.path().join("spec.json");
        std::fs::write(&spec, "{\"a\":1}").unwrap();
        let link = tmp.path().join("link.json");
        symlink(&spec, &link).unwrap();
        assert_eq!(read_input_file(&link).unwrap(), b"{\"a\":1}");
        let fifo = tmp.path().join("fifo.json");
        mkfifo(&fifo);
        assert!(matches!(
            read_input_file(&fifo).unwrap_err(),
            ReadError::NotRegular { kind: "FIFO", .. }
        ));
        assert!(matches!(
            read_input_file(tmp.path()).unwrap_err(),
            ReadError::NotRegular {
                kind: "directory",
                ..
            }
        ));
        let big = tmp.path().join("big.json");
        File::create(&big)
            .unwrap()
            .set_len(STATE_FILE_LIMIT + 1)
            .unwrap();
        assert!(matches!(
            read_input_file(&big).unwrap_err(),
            ReadError::TooLarge { .. }
        ));
    }

    /// A socket cannot be opened (`ENXIO`): refused as not a regular file.
    #[test]
    fn a_socket_is_refused_as_not_a_regular_file() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("status.json");
        let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let err = read_file(&path).unwrap_err();
        assert!(matches!(err, ReadError::NotRegular { .. }), "{err}");
    }

    /// `open_regular` hands back the open file, and refuses what
    /// `read_file` refuses.
    #[test]
    fn open_regular_opens_regular_files_only() {
        let tmp = tempfile::tempdir().unwrap();
        let log = tmp.path().join("events.jsonl");
        std::fs::write(&log, "line\n").unwrap();
        let mut text = String::new();
        open_regular(&log)
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text, "line\n");
        let link = tmp.path().join("link");
        symlink(&log, &link).unwrap();
        assert!(matches!(
            open_regular(&link).unwrap_err(),
            ReadError::Symlink { .. }
        ));
        let fifo = tmp.path().join("fifo");
        mkfifo(&fifo);
        assert!(matches!(
            open_regular(&fifo).unwrap_err(),
            ReadError::NotRegular { kind: "FIFO", .. }
        ));
    }

    /// A lock file's handle is not inherited by a program started while it
    /// is open (`O_CLOEXEC`).
    #[test]
    fn a_lock_file_handle_is_not_inherited() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("pool.lock");
        let lock = open_lock_file(&path).unwrap();
        let out = Command::new("ls")
            .args(["-l", "/proc/self/fd/"])
            .output()
            .unwrap();
        drop(lock);
        let listing = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && listing.contains("/proc/"),
            "{listing}"
        );
        assert!(!listing.contains("pool.lock"), "{listing}");
    }

    /// Stamps and entry times are the file's own metadata, to the
    /// nanosecond (change time) and the millisecond (modification time).
    #[test]
    fn stamps_and_entry_times_are_the_files_metadata() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("status.json");
        std::fs::write(&file, "{}").unwrap();
        let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(1_234_567);
        File::options()
            .write(true)
            .open(&file)
            .unwrap()
            .set_modified(at)
            .unwrap();
        let handle = DirHandle::open(tmp.path()).unwrap();
        assert_eq!(handle.path(), tmp.path());
        assert_eq!(handle.stat("status.json").unwrap().modified_ms, 1_234_567);
        let meta = std::fs::metadata(&file).unwrap();
        let (bytes, stamp) = handle.read_file_stamped("status.json", 100).unwrap();
        assert_eq!(bytes, b"{}");
        assert_eq!(stamp, Stamp::of(&meta));
        assert_eq!(handle.stamp("status.json").unwrap(), stamp);
        assert_eq!(stamp.mtime, (1_234, 567_000_000));
        assert_eq!(
            stamp.ctime_ns(),
            i128::from(meta.ctime()) * 1_000_000_000 + i128::from(meta.ctime_nsec())
        );
        assert!(matches!(
            handle.read_file_stamped("status.json", 1).unwrap_err(),
            ReadError::TooLarge { .. }
        ));
        // A regular file is not a directory to open.
        assert!(DirHandle::open(&file).is_err());
    }

    #[test]
    fn sizes_are_named_in_bytes_kib_or_mib() {
        assert_eq!(human_size(900), "900 bytes");
        assert_eq!(human_size(1023), "1023 bytes");
        assert_eq!(human_size(1024), "1 KiB");
        assert_eq!(human_size(1024 * 1024 - 1), "1023 KiB");
        assert_eq!(human_size(1024 * 1024), "1 MiB");
        assert_eq!(human_size(3 * 1024 * 1024 + 5), "3 MiB");
    }

    #[test]
    fn missing_files_are_none_and_errors_stay_on_one_line() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("a\nb");
        assert!(read_optional(&file).unwrap().is_none());
        let err = read_file(&file).unwrap_err();
        assert!(err.is_not_found());
        assert!(!err.to_string().contains('\n'), "{err}");
        assert!(err.to_string().contains("a\\nb"), "{err}");
    }
}
