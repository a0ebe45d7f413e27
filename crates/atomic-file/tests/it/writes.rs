//! The writers without a full fsync chain (transient records, streamed
//! content, a deferred directory sync) against real files: each still
//! writes the whole content privately and leaves no temp file.

extern crate subagents_atomic_file as atomic_file;
use std::io::Write;
use std::path::Path;
use test_support::mode;

use atomic_file::{
    create_new_private_transient_name, defer_dir_sync, write_json_transient, write_private_streamed,
};

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn a_transient_json_record_replaces_the_file_whole_and_privately() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("runner-ack.json");
    write_json_transient(&path, &serde_json::json!({"state": "ready"})).unwrap();
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        "{\n  \"state\": \"ready\"\n}"
    );
    write_json_transient(&path, &serde_json::json!({"state": "acknowledged"})).unwrap();
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        "{\n  \"state\": \"acknowledged\"\n}"
    );
    assert_eq!(mode(&path), 0o600);
    assert_eq!(names(tmp.path()), ["runner-ack.json"]);
}

#[test]
fn a_transient_name_is_created_once_and_never_overwritten() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join(".claim");
    create_new_private_transient_name(&path, b"first").unwrap();
    let err = create_new_private_transient_name(&path, b"second").unwrap_err();
    assert!(err.is_already_exists(), "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), b"first");
    assert_eq!(mode(&path), 0o600);
}

#[test]
fn streamed_content_is_written_whole_or_not_at_all() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("index.json");
    write_private_streamed(&path, |out: &mut dyn Write| {
        for i in 0..10_000 {
            writeln!(out, "row {i}")?;
        }
        Ok(())
    })
    .unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.lines().count(), 10_000);
    assert!(text.ends_with("row 9999\n"));
    assert_eq!(mode(&path), 0o600);

    let failed = write_private_streamed(&path, |out: &mut dyn Write| {
        out.write_all(b"half")?;
        Err(std::io::Error::other("fill failed"))
    });
    assert!(failed.is_err());
    assert_eq!(std::fs::read_to_string(&path).unwrap(), text, "untouched");
    assert_eq!(names(tmp.path()), ["index.json"], "no temp file left");
}

#[test]
fn a_deferred_directory_sync_reports_its_failure_at_commit() {
    let tmp = tempfile::tempdir().unwrap();
    defer_dir_sync(tmp.path()).commit().unwrap();
    let gone = tmp.path().join("gone");
    let err = defer_dir_sync(&gone).commit().unwrap_err();
    assert!(err.is_not_found(), "{err}");
}

/// An append neither follows a symlink planted in place of the file nor
/// waits for a reader of a FIFO planted there; a device is refused too.
#[test]
fn an_append_never_follows_a_symlink_or_waits_on_a_fifo() {
    let tmp = tempfile::tempdir().unwrap();
    let target = tmp.path().join("elsewhere.jsonl");
    std::fs::write(&target, "").unwrap();
    let link = tmp.path().join("events.jsonl");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let err = atomic_file::append_private(&link, b"{}\n").unwrap_err();
    assert!(
        err.to_string().starts_with("failed to open for append"),
        "{err}"
    );
    assert_eq!(std::fs::read(&target).unwrap(), b"");

    let fifo = tmp.path().join("fifo.jsonl");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let err = atomic_file::append_private(&fifo, b"{}\n").unwrap_err();
    assert!(
        err.to_string().starts_with("failed to open for append"),
        "{err}"
    );

    let err = atomic_file::append_private(Path::new("/dev/null"), b"{}\n").unwrap_err();
    assert!(err.to_string().contains("not a regular file"), "{err}");
}
