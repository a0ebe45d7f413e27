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
    let dir = runs_dir.join(INDEX_DIR);
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err("read active-run index", &dir, e)),
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| io_err("read active-run index", &dir, e))?;
        let is_file = entry.file_type().map(|t| t.is_file()).unwrap_or(false);
        if let (true, Some(name)) = (is_file, entry.file_name().to_str()) {
            names.push(name.to_owned());
        }
    }
    names.sort();
    Ok(names)
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
}
