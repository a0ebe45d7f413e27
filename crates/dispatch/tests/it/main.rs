//! The dispatch record: round trip, the strict reader, hostile files.

mod optional_fields;

use std::path::Path;

use subagents_dispatch::{Dispatch, Error, Executor, FILE, read, record_node, write};

fn record() -> Dispatch {
    Dispatch::slurm(
        "4711",
        Some("main".into()),
        Some("lab".into()),
        1_700_000_000_123,
    )
}

fn put(dir: &Path, text: &str) {
    std::fs::write(dir.join(FILE), text).unwrap();
}

fn field_of(e: Error) -> String {
    match e {
        Error::Invalid { field, .. } => field,
        other => panic!("expected an invalid-field error, got {other}"),
    }
}

#[test]
fn a_written_record_reads_back_and_is_private() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), &record()).unwrap();
    assert_eq!(read(dir.path()).unwrap(), Some(record()));
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(dir.path().join(FILE))
            .unwrap()
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);
}

#[test]
fn a_local_run_has_no_record() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(read(dir.path()).unwrap(), None);
}

#[test]
fn the_node_is_added_only_for_the_recorded_job() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), &record()).unwrap();
    assert!(!record_node(dir.path(), "4712", "n1").unwrap());
    assert_eq!(read(dir.path()).unwrap().unwrap().node, None);
    assert!(record_node(dir.path(), "4711", "n2").unwrap());
    let read = read(dir.path()).unwrap().unwrap();
    assert_eq!(read.node.as_deref(), Some("n2"));
    assert_eq!(read.executor, Executor::Slurm);
    assert_eq!(read.submitted_at, 1_700_000_000_123);
}

#[test]
fn unknown_keys_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let mut value = serde_json::to_value(record()).unwrap();
    value["extra"] = serde_json::json!(1);
    put(dir.path(), &value.to_string());
    let e = read(dir.path()).unwrap_err();
    assert!(e.to_string().contains("extra"), "{e}");
}

#[test]
fn wrong_fields_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (serde_json::json!({"version": 2}), "version"),
        (serde_json::json!({"executor": "kubernetes"}), "executor"),
        (serde_json::json!({"jobId": "12; rm -rf /"}), "jobId"),
        (serde_json::json!({"jobId": 12}), "jobId"),
        (serde_json::json!({"node": "../n1"}), "node"),
        (serde_json::json!({"partition": "-p"}), "partition"),
        (serde_json::json!({"submittedAt": -1}), "submittedAt"),
    ];
    for (patch, field) in cases {
        let mut value = serde_json::to_value(record()).unwrap();
        for (k, v) in patch.as_object().unwrap() {
            value[k] = v.clone();
        }
        put(dir.path(), &value.to_string());
        assert_eq!(field_of(read(dir.path()).unwrap_err()), field, "{patch}");
    }
}

#[test]
fn malformed_json_and_trailing_bytes_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    put(dir.path(), "{\"version\": 1,");
    assert!(read(dir.path()).is_err());
    let text = serde_json::to_string(&record()).unwrap();
    put(dir.path(), &format!("{text} {{}}"));
    assert!(read(dir.path()).is_err());
}

#[test]
fn a_symlink_or_fifo_is_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("elsewhere.json");
    std::fs::write(&target, serde_json::to_string(&record()).unwrap()).unwrap();
    std::os::unix::fs::symlink(&target, dir.path().join(FILE)).unwrap();
    assert!(matches!(read(dir.path()), Err(Error::Read(_))));
    std::fs::remove_file(dir.path().join(FILE)).unwrap();
    nix_mkfifo(&dir.path().join(FILE));
    assert!(matches!(read(dir.path()), Err(Error::Read(_))));
}

fn nix_mkfifo(path: &Path) {
    let status = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
fn an_executors_name_is_the_one_in_the_file() {
    // `as_str` names the executor in status and listings; it must be the
    // very word the file holds, or a reader of one would not match the other.
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), &record()).unwrap();
    let text = std::fs::read_to_string(dir.path().join(FILE)).unwrap();
    let value: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(value["executor"], Executor::Slurm.as_str());
    assert_eq!(Executor::Slurm.as_str(), "slurm");
}
