//! Behaviour at the edges that the other rule files leave out: the run
//! directory lookups, the process identities a status records, batch
//! writes, a damaged run processes file, the result-based repair, the
//! executor rule, and the JSON shapes the hand-written readers accept.

use std::path::Path;

use process_identity::ProcessIdentity;
use serde_json::json;
use status::model::{
    RunState, RunStatus, Step, parse_listed_status, parse_status, read_status, write_status,
    write_status_after,
};
use status::reconcile::{Options, Outcome, reconcile_run, stale_message};
use status::{Layout, index, layout, processes};

fn dead_identity() -> ProcessIdentity {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let identity = ProcessIdentity::of(child.id()).unwrap();
    child.wait().unwrap();
    identity
}

// Every path these tests create is built from the temp dir, not by the
// `Layout` under test: a mutant of it would create them elsewhere (in the
// source tree).
#[test]
fn the_run_dir_lookups_find_a_real_directory_and_refuse_an_unsafe_id() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = Layout::new(tmp.path());
    let r1 = tmp.path().join("async-subagent-runs").join("r1");
    std::fs::create_dir_all(&r1).unwrap();
    // A real directory an unsafe id would reach.
    std::fs::create_dir_all(tmp.path().join("up")).unwrap();
    assert_eq!(layout::exact_run_dir(&layout, "r1"), Some(r1.clone()));
    let (dir, meta) = layout::run_dir_under(&layout, "r1").unwrap();
    assert_eq!(dir, r1);
    assert!(meta.is_dir());
    assert!(layout::run_dir_under(&layout, "../up").is_none());
    assert!(layout::exact_run_dir(&layout, "missing").is_none());
}

#[test]
fn a_device_in_the_index_is_named_a_device() {
    // No mknod needed: an index that is a symlink to /dev is read through.
    let tmp = tempfile::tempdir().unwrap();
    let runs = tmp.path().join("async-subagent-runs");
    std::fs::create_dir_all(&runs).unwrap();
    std::os::unix::fs::symlink("/dev", runs.join(index::INDEX_DIR)).unwrap();
    let entries = index::read_index_entries(&runs).unwrap();
    assert!(
        entries.not_markers.contains(&("null".to_owned(), "device")),
        "{:?}",
        entries.not_markers
    );
}

#[test]
fn a_run_state_displays_as_its_wire_name() {
    assert_eq!(RunState::Running.to_string(), "running");
    assert_eq!(format!("{}", RunState::Rejected), "rejected");
}

fn foreign() -> ProcessIdentity {
    ProcessIdentity {
        pid: 4_242,
        start_time: 77,
        boot_id: Some("another-boot".into()),
        machine_id: Some("another-machine".into()),
        host: Some("elsewhere.example".into()),
    }
}

#[test]
fn a_status_names_every_identity_and_the_host_they_are_of() {
    let mut s = RunStatus::new("r1", RunState::Running);
    assert!(s.recorded_in_this_boot());
    assert_eq!(s.foreign_host(), None);
    s.runner_identity = Some(ProcessIdentity::current().unwrap());
    s.launcher_identity = Some(foreign());
    let pids: Vec<u32> = s.identities().map(|i| i.pid).collect();
    assert_eq!(pids, [std::process::id(), 4_242]);
    assert!(!s.recorded_in_this_boot());
    assert_eq!(s.foreign_host(), Some("elsewhere.example"));
}

#[test]
fn write_status_after_writes_the_status_with_its_batch() {
    let tmp = tempfile::tempdir().unwrap();
    let mut batch = atomic_file::Batch::new();
    batch.add(tmp.path().join("other.json"), b"{}".to_vec());
    let s = RunStatus::new("r1", RunState::Complete);
    write_status_after(batch, tmp.path(), &s).unwrap();
    assert_eq!(read_status(tmp.path()).unwrap(), Some(s));
    assert_eq!(std::fs::read(tmp.path().join("other.json")).unwrap(), b"{}");
}

#[test]
fn a_run_processes_file_that_cannot_be_read_is_an_error_not_absent() {
    let tmp = tempfile::tempdir().unwrap();
    assert!(processes::read(tmp.path()).unwrap().is_none());
    std::fs::create_dir(tmp.path().join(processes::FILE)).unwrap();
    let err = processes::read(tmp.path()).unwrap_err().to_string();
    assert!(err.contains(processes::FILE), "{err}");
}

/// A run directory where the reference keeps them, so it has a result path.
fn reference_run_dir(root: &Path) -> std::path::PathBuf {
    let dir = root.join("async-subagent-runs").join("r1");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn the_result_repair_needs_an_active_run_and_its_result_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = reference_run_dir(tmp.path());
    // Active, runner alive, no result file: nothing to repair from.
    let mut s = RunStatus::new("r1", RunState::Running);
    s.last_update = Some(1_000);
    s.runner_identity = Some(ProcessIdentity::current().unwrap());
    write_status(&dir, &s).unwrap();
    let outcome = reconcile_run(&dir, Options::at(2_000)).unwrap();
    assert!(matches!(outcome, Outcome::Unchanged(_)), "{outcome:?}");
    // A dangling symlink is no result file either: the repair, which would
    // refuse to read it, is not even tried.
    let results = tmp.path().join("async-subagent-results");
    std::fs::create_dir_all(&results).unwrap();
    std::os::unix::fs::symlink(tmp.path().join("nowhere"), results.join("r1.json")).unwrap();
    let outcome = reconcile_run(&dir, Options::at(2_000)).unwrap();
    assert!(matches!(outcome, Outcome::Unchanged(_)), "{outcome:?}");
    std::fs::remove_file(results.join("r1.json")).unwrap();
    // Finished, with a result file: the status stands.
    std::fs::write(
        results.join("r1.json"),
        json!({"id": "r1", "success": false, "exitCode": 3}).to_string(),
    )
    .unwrap();
    let done = RunStatus::new("r1", RunState::Complete);
    write_status(&dir, &done).unwrap();
    let outcome = reconcile_run(&dir, Options::at(2_000)).unwrap();
    assert!(matches!(outcome, Outcome::Unchanged(_)), "{outcome:?}");
    assert_eq!(read_status(&dir).unwrap(), Some(done));
}

#[test]
fn only_a_non_local_executor_holds_off_the_liveness_verdict() {
    let mut s = RunStatus::new("r1", RunState::Running);
    s.last_update = Some(1_000);
    s.runner_identity = Some(dead_identity());
    s.extra.insert("executor".into(), json!("local"));
    assert!(stale_message(&s, Options::at(2_000)).is_some());
    s.extra.insert("executor".into(), json!("slurm"));
    assert_eq!(stale_message(&s, Options::at(2_000)), None);
}

#[test]
fn a_step_deserializes_on_its_own() {
    let step: Step = serde_json::from_value(json!({"agent": "a1", "status": "running"})).unwrap();
    assert_eq!(step.agent, "a1");
    assert_eq!(step.status, "running");
}

#[test]
fn steps_that_are_no_list_are_refused_naming_what_was_expected() {
    let text = json!({"runId": "r1", "state": "running", "steps": 5}).to_string();
    let err = parse_status(Path::new("s.json"), &text)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("steps") && err.contains("expected a sequence"),
        "{err}"
    );
}

#[test]
fn a_listed_run_proof_keeps_every_scalar_as_it_was() {
    for value in [
        json!(true),
        json!(false),
        json!(7),
        json!(-7),
        json!(1.5),
        json!("odd"),
        json!("esc\"aped"),
    ] {
        let text = json!({"runId": "r1", "state": "running", "processTerminal": value}).to_string();
        let listed = parse_listed_status(Path::new("s.json"), &text).unwrap();
        assert_eq!(listed.process_terminal, Some(value.clone()), "{value}");
    }
}
