//! The active-run index: `<runs dir>/.active-runs/<run-id>` marker files.
//!
//! A marker means "this run's runner may still exist". It is created before
//! the runner is spawned and released only once an `observed` process-terminal
//! proof exists, so an active listing reads markers instead of every status.

use std::io;
use std::path::{Path, PathBuf};

use crate::io_err;

/// Name of the index directory inside the runs directory.
pub const INDEX_DIR: &str = ".active-runs";

/// The marker path of a run directory.
pub fn marker_path(run_dir: &Path) -> PathBuf {
    let parent = run_dir.parent().unwrap_or(Path::new("."));
    let name = run_dir.file_name().unwrap_or_default();
    parent.join(INDEX_DIR).join(name)
}

/// Creates the marker (never truncates an existing one).
pub fn create_marker(run_dir: &Path) -> crate::Result<()> {
    let marker = marker_path(run_dir);
    atomic_file::ensure_private_dir(marker.parent().unwrap_or(Path::new(".")))?;
    match atomic_file::create_new_private(&marker, b"") {
        Err(e) if !e.is_already_exists() => Err(e.into()),
        _ => Ok(()),
    }
}

/// Deletes the marker; a missing marker is fine.
pub fn release_marker(run_dir: &Path) -> crate::Result<()> {
    atomic_file::remove_if_exists(&marker_path(run_dir))?;
    Ok(())
}

/// True when the run has a marker.
pub fn has_marker(run_dir: &Path) -> bool {
    marker_path(run_dir).is_file()
}

/// Names of the markers under `runs_dir` (regular files only); none when the
/// index does not exist.
pub fn read_index(runs_dir: &Path) -> crate::Result<Vec<String>> {
    Ok(read_index_entries(runs_dir)?.markers)
}

/// What the index directory holds: the markers, and the entries that are
/// no marker because they are not regular files.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct IndexEntries {
    /// Names of the markers (regular files), sorted.
    pub markers: Vec<String>,
    /// Entries that are not regular files (a directory, FIFO, symlink...),
    /// by name, with what they are instead; sorted.
    pub not_markers: Vec<(String, &'static str)>,
}

/// [`read_index`], keeping the entries that are not regular files, so a
/// listing can show a run whose marker was damaged instead of dropping it.
pub fn read_index_entries(runs_dir: &Path) -> crate::Result<IndexEntries> {
    let dir = runs_dir.join(INDEX_DIR);
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(IndexEntries::default()),
        Err(e) => return Err(io_err("read active-run index", &dir, e)),
    };
    let mut found = IndexEntries::default();
    for entry in entries {
        let entry = entry.map_err(|e| io_err("read active-run index", &dir, e))?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        match entry.file_type() {
            Ok(kind) if kind.is_file() => found.markers.push(name),
            Ok(kind) => found.not_markers.push((name, kind_name(kind))),
            Err(_) => found.not_markers.push((name, "unknown type")),
        }
    }
    found.markers.sort();
    found.not_markers.sort();
    Ok(found)
}

/// What a directory entry that is not a regular file is.
fn kind_name(kind: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_dir() {
        "directory"
    } else if kind.is_symlink() {
        "symbolic link"
    } else if kind.is_fifo() {
        "FIFO"
    } else if kind.is_socket() {
        "socket"
    } else if kind.is_block_device() || kind.is_char_device() {
        "device"
    } else {
        "unknown type"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_read_release() {
        let tmp = tempfile::tempdir().unwrap();
        let run = tmp.path().join("r1");
        create_marker(&run).unwrap();
        create_marker(&run).unwrap();
        assert_eq!(read_index(tmp.path()).unwrap(), vec!["r1".to_string()]);
        assert!(has_marker(&run));
        release_marker(&run).unwrap();
        release_marker(&run).unwrap();
        assert!(read_index(tmp.path()).unwrap().is_empty());
    }

    #[test]
    fn entries_that_are_not_regular_files_are_kept_with_their_kind() {
        let tmp = tempfile::tempdir().unwrap();
        create_marker(&tmp.path().join("r1")).unwrap();
        let index = tmp.path().join(INDEX_DIR);
        std::fs::create_dir(index.join("r2")).unwrap();
        std::os::unix::fs::symlink(index.join("r1"), index.join("r3")).unwrap();
        let found = read_index_entries(tmp.path()).unwrap();
        assert_eq!(found.markers, ["r1"]);
        assert_eq!(
            found.not_markers,
            [
                ("r2".to_owned(), "directory"),
                ("r3".to_owned(), "symbolic link")
            ]
        );
        assert_eq!(read_index(tmp.path()).unwrap(), ["r1"]);
    }
}
