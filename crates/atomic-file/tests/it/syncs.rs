//! Which fsyncs each kind of write makes, counted by `strace -f -y` on a
//! re-execution of this test binary that does the writes: a durability
//! rule (a file synced before its rename, its directory after, a deferred
//! directory once) cannot be seen any other way short of a crash.
//! Skipped, with the reason printed, where strace is missing or cannot
//! trace.

use std::path::{Path, PathBuf};

use test_support::reexec;
extern crate subagents_atomic_file as atomic_file;

/// The directory the re-executed test writes in.
const DIR_ENV: &str = "ATOMIC_FILE_SYNCS_DIR";
/// Left in that directory by the re-executed test once its writes are done.
const DONE: &str = "done";

/// The calls of `trace` named `call` (`fsync`, `sync_file_range`), each as
/// the path of the descriptor it was made on.
fn paths_of(trace: &str, call: &str) -> Vec<String> {
    trace
        .lines()
        .filter_map(|line| line.split_once(&format!("{call}(")).map(|(_, rest)| rest))
        .filter_map(|rest| {
            let start = rest.find('<')? + 1;
            let end = rest.find(">")?;
            Some(rest[start..end].to_owned())
        })
        .collect()
}

/// Runs test `name` of this module again under strace, in `dir`; returns
/// the trace, or `None` (printing why) when strace cannot run here.
fn traced(name: &str, dir: &Path) -> Option<String> {
    let test = reexec::test_name(module_path!(), name);
    let log = dir.join("strace.log");
    let env = [(DIR_ENV, dir.as_os_str())];
    let (out, trace) = reexec::under_strace(&test, "fsync,sync_file_range", &log, &env)?;
    assert!(out.status.success(), "the traced writes failed: {out:?}");
    // The body ran (a wrong test name would run nothing and exit 0).
    assert!(
        dir.join(DONE).exists(),
        "the traced test did not run: {out:?}"
    );
    Some(trace)
}

/// In the re-executed process: the directory to write in.
fn child_dir() -> PathBuf {
    PathBuf::from(std::env::var_os(DIR_ENV).expect("run by `traced`"))
}

fn count(paths: &[String], path: &Path) -> usize {
    let path = path.to_string_lossy();
    paths.iter().filter(|p| **p == path).count()
}

/// The temp files of `dir` (names starting with `.`) that `paths` holds.
fn temp_files_in(paths: &[String], dir: &Path) -> usize {
    let prefix = format!("{}/.", dir.to_string_lossy());
    paths.iter().filter(|p| p.starts_with(&prefix)).count()
}

#[test]
fn a_deferred_directory_is_synced_once_at_the_commit_and_others_at_each_write() {
    let name = "a_deferred_directory_is_synced_once_at_the_commit_and_others_at_each_write";
    if reexec::is_rerun(&reexec::test_name(module_path!(), name)) {
        let dir = child_dir();
        let deferred = atomic_file::defer_dir_sync(&dir.join("run"));
        atomic_file::write_private(&dir.join("run/a.json"), b"{}").unwrap();
        atomic_file::write_private(&dir.join("run/b.json"), b"{}").unwrap();
        atomic_file::write_private(&dir.join("other/c.json"), b"{}").unwrap();
        deferred.commit().unwrap();
        std::fs::write(dir.join(DONE), "").unwrap();
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().canonicalize().unwrap();
    std::fs::create_dir(root.join("run")).unwrap();
    std::fs::create_dir(root.join("other")).unwrap();
    let Some(trace) = traced(name, &root) else {
        return;
    };
    let fsyncs = paths_of(&trace, "fsync");
    assert_eq!(count(&fsyncs, &root.join("run")), 1, "{trace}");
    assert_eq!(count(&fsyncs, &root.join("other")), 1, "{trace}");
    assert_eq!(temp_files_in(&fsyncs, &root.join("run")), 2, "{trace}");
    assert_eq!(temp_files_in(&fsyncs, &root.join("other")), 1, "{trace}");
    // The deferred directory's one sync comes after every write in it.
    let last = fsyncs.last().map(String::as_str);
    assert_eq!(last, Some(root.join("run").to_str().unwrap()), "{trace}");
}

#[test]
fn a_deferral_dropped_without_its_commit_still_syncs_the_directory() {
    let name = "a_deferral_dropped_without_its_commit_still_syncs_the_directory";
    if reexec::is_rerun(&reexec::test_name(module_path!(), name)) {
        let dir = child_dir();
        let deferred = atomic_file::defer_dir_sync(&dir);
        atomic_file::write_private(&dir.join("a.json"), b"{}").unwrap();
        drop(deferred);
        std::fs::write(dir.join(DONE), "").unwrap();
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().canonicalize().unwrap();
    let Some(trace) = traced(name, &root) else {
        return;
    };
    let fsyncs = paths_of(&trace, "fsync");
    assert_eq!(count(&fsyncs, &root), 1, "{trace}");
}

#[test]
fn a_batch_starts_the_writeback_of_each_file_with_data_and_syncs_each_directory_once() {
    let name = "a_batch_starts_the_writeback_of_each_file_with_data_and_syncs_each_directory_once";
    if reexec::is_rerun(&reexec::test_name(module_path!(), name)) {
        let dir = child_dir();
        let mut batch = atomic_file::Batch::new();
        assert!(batch.is_empty());
        batch
            .add(dir.join("one/a.json"), b"{\"a\":1}".to_vec())
            .add(dir.join("one/b.json"), b"{\"b\":2}".to_vec())
            .add(dir.join("one/empty"), Vec::new())
            .add(dir.join("two/c.json"), b"{\"c\":3}".to_vec());
        assert!(!batch.is_empty());
        assert_eq!(batch.len(), 4);
        batch.commit().unwrap();
        std::fs::write(dir.join(DONE), "").unwrap();
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().canonicalize().unwrap();
    std::fs::create_dir(root.join("one")).unwrap();
    std::fs::create_dir(root.join("two")).unwrap();
    let Some(trace) = traced(name, &root) else {
        return;
    };
    let fsyncs = paths_of(&trace, "fsync");
    let writebacks = paths_of(&trace, "sync_file_range");
    // Three files hold data; the empty one has none to flush (the
    // directory's sync makes it durable).
    assert_eq!(
        temp_files_in(&writebacks, &root.join("one"))
            + temp_files_in(&writebacks, &root.join("two")),
        3,
        "{trace}"
    );
    assert_eq!(temp_files_in(&fsyncs, &root.join("one")), 2, "{trace}");
    assert_eq!(temp_files_in(&fsyncs, &root.join("two")), 1, "{trace}");
    assert_eq!(count(&fsyncs, &root.join("one")), 1, "{trace}");
    assert_eq!(count(&fsyncs, &root.join("two")), 1, "{trace}");
    assert_eq!(std::fs::read(root.join("one/empty")).unwrap(), b"");
}
