//! The fault-injection points the crash tests stop a writer at. Alone in
//! its binary: the hook is process-wide and set once.

extern crate subagents_status as status;
use std::sync::Mutex;

use status::model::{RunState, RunStatus, write_status};
use status::proof::{Candidate, ProofState, RunnerClose, finalize, no_leases, write_candidate};

static SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn record(point: &str) {
    SEEN.lock().unwrap().push(point.to_owned());
}

#[test]
fn the_hook_sees_the_status_write_and_the_written_proof() {
    status::install_fault_hook(record);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run-1");
    std::fs::create_dir(&dir).unwrap();
    write_status(&dir, &RunStatus::new("run-1", RunState::Complete)).unwrap();
    assert_eq!(*SEEN.lock().unwrap(), ["mid-status-write"]);
    let candidate = Candidate {
        version: 1,
        run_id: "run-1".into(),
        runner_process_instance_id: "r".into(),
        writers: Default::default(),
        expected_writers: Some([("0".to_owned(), 0)].into()),
        session_file: None,
        revival_lease_token: None,
        revival_lease_release_acknowledged: None,
    };
    write_candidate(&dir, &candidate).unwrap();
    let close = RunnerClose {
        process_instance_id: "r".into(),
        close_observed_at: 5,
        exit_code: Some(0),
        signal: None,
        observer: None,
    };
    let proof = finalize(&dir, "run-1", &close, &no_leases, 6);
    assert_eq!(proof.state, ProofState::Observed);
    // The proof is written before the overlay rewrites the status.
    assert_eq!(
        *SEEN.lock().unwrap(),
        ["mid-status-write", "after-proof", "mid-status-write"]
    );
}
