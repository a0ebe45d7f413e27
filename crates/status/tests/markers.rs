//! The active listing releases a finished run's marker only on an observed
//! process-terminal proof: a finished status alone is not proof that the
//! run's processes are gone (the monitor may still be verifying them).

use status::list::{Hooks, ListOptions, list};
use status::model::{RunState, RunStatus, write_status};
use status::{Layout, index};

fn options() -> ListOptions<'static> {
    ListOptions {
        all: false,
        session: None,
        limit: None,
        reconcile: false,
        now: 0,
        hooks: Hooks::default(),
    }
}

fn finished_run(layout: &Layout, id: &str, proof: Option<serde_json::Value>) {
    let dir = layout.run_dir(id);
    atomic_file::ensure_private_dir(&dir).unwrap();
    let mut status = RunStatus::new(id, RunState::Complete);
    status.last_update = Some(1);
    status.process_terminal = proof;
    write_status(&dir, &status).unwrap();
    index::create_marker(&dir).unwrap();
}

#[test]
fn a_finished_run_without_an_observed_proof_keeps_its_marker() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = Layout::new(tmp.path());
    finished_run(&layout, "no-proof", None);
    let pending = serde_json::json!({
        "version": 1, "state": "pending", "runId": "pending-proof",
        "runnerProcessInstanceId": "rid"
    });
    finished_run(&layout, "pending-proof", Some(pending));
    let runs = list(&layout, &options()).unwrap();
    assert!(runs.is_empty(), "finished runs are not listed as active");
    for id in ["no-proof", "pending-proof"] {
        let marker = layout.runs_dir().join(index::INDEX_DIR).join(id);
        assert!(marker.exists(), "{id}: marker released without proof");
    }
    assert_eq!(
        index::read_index(&layout.runs_dir()).unwrap().len(),
        2,
        "both runs stay in the active index"
    );
}
