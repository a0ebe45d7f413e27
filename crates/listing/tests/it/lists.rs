//! Run listings against real run directories: which markers the active
//! listing gives back (only a finished run's with an observed proof: a
//! finished status alone is not proof that the run's processes are gone,
//! and such a run is listed as finishing),
//! filters, prefixes, and the errors of a broken root.

use listing::list::{Hooks, ListOptions, Resolved, list, load, resolve, run_names};
use status::model::{RunState, RunStatus, write_status};
use status::proof::ProofState;
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
    // Over by their status, not proven over: listed, marked finishing.
    let runs = list(&layout, &options()).unwrap().runs;
    let mut ids: Vec<&str> = runs.iter().map(|r| r.id.as_str()).collect();
    ids.sort();
    assert_eq!(ids, ["no-proof", "pending-proof"]);
    assert!(runs.iter().all(|r| listing::list::is_finishing(&r.status)));
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

/// A valid observed proof: the runner's close was seen.
fn observed(id: &str) -> serde_json::Value {
    serde_json::json!({
        "version": 1, "state": "observed", "runId": id,
        "runnerProcessInstanceId": "rid", "observedAt": 5,
        "instances": [{"kind": "runner", "processInstanceId": "rid",
                       "closeObservedAt": 4, "exitCode": 0, "signal": null}]
    })
}

fn run_with(layout: &Layout, id: &str, state: RunState, proof: Option<serde_json::Value>) {
    let dir = layout.run_dir(id);
    atomic_file::ensure_private_dir(&dir).unwrap();
    let mut status = RunStatus::new(id, state);
    status.last_update = Some(1);
    status.process_terminal = proof;
    write_status(&dir, &status).unwrap();
    index::create_marker(&dir).unwrap();
}

fn marker(layout: &Layout, id: &str) -> bool {
    layout.runs_dir().join(index::INDEX_DIR).join(id).exists()
}

#[test]
fn only_a_finished_observed_run_gives_its_marker_back() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = Layout::new(tmp.path());
    run_with(&layout, "done", RunState::Complete, Some(observed("done")));
    run_with(&layout, "live", RunState::Running, Some(observed("live")));
    let all = ListOptions {
        all: true,
        ..options()
    };
    list(&layout, &all).unwrap();
    assert!(marker(&layout, "done"), "a full listing releases nothing");
    let runs = list(&layout, &options()).unwrap().runs;
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].id, "live");
    assert!(!marker(&layout, "done"), "observed and finished: released");
    assert!(marker(&layout, "live"), "still running: kept");
    let summary = load(&layout, "done", false, 0, &Hooks::default())
        .unwrap()
        .expect("the run loads");
    assert_eq!(summary.proof().unwrap().state, ProofState::Observed);
}

#[test]
fn markers_of_vanished_or_statusless_runs_are_dropped_by_the_active_listing() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = Layout::new(tmp.path());
    run_with(&layout, "kept", RunState::Running, None);
    // A marker whose run directory is gone, and one whose status is missing.
    let gone = layout.run_dir("gone");
    atomic_file::ensure_private_dir(&gone).unwrap();
    index::create_marker(&gone).unwrap();
    std::fs::remove_dir(&gone).unwrap();
    let empty = layout.run_dir("empty");
    atomic_file::ensure_private_dir(&empty).unwrap();
    index::create_marker(&empty).unwrap();
    let all = ListOptions {
        all: true,
        ..options()
    };
    list(&layout, &all).unwrap();
    assert!(
        marker(&layout, "gone") && marker(&layout, "empty"),
        "--all releases nothing"
    );
    let runs = list(&layout, &options()).unwrap().runs;
    assert_eq!(
        runs.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        ["kept"]
    );
    assert!(!marker(&layout, "gone"));
    assert!(!marker(&layout, "empty"));
    assert!(marker(&layout, "kept"));
}

#[test]
fn listings_filter_by_session_and_hide_dismissed_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = Layout::new(tmp.path());
    for (id, session) in [("a1", "a"), ("a2", "a"), ("b1", "b")] {
        let dir = layout.run_dir(id);
        atomic_file::ensure_private_dir(&dir).unwrap();
        let mut status = RunStatus::new(id, RunState::Complete);
        status.session_id = Some(session.into());
        status.last_update = Some(1);
        if id == "a2" {
            status.display_dismissed_at = Some(5);
        }
        write_status(&dir, &status).unwrap();
    }
    let ids = |session: Option<&str>| -> Vec<String> {
        let options = ListOptions {
            all: true,
            session: session.map(str::to_owned),
            ..options()
        };
        let mut ids: Vec<String> = list(&layout, &options)
            .unwrap()
            .runs
            .into_iter()
            .map(|r| r.id)
            .collect();
        ids.sort();
        ids
    };
    assert_eq!(ids(None), ["a1", "b1"], "the dismissed run is hidden");
    assert_eq!(ids(Some("a")), ["a1"]);
    assert_eq!(ids(Some("b")), ["b1"]);
    assert_eq!(
        ids(Some("")),
        ["a1", "b1"],
        "an empty session filters nothing"
    );
}

#[test]
fn a_unique_prefix_resolves_and_loads() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = Layout::new(tmp.path());
    assert!(
        run_names(&layout).unwrap().is_empty(),
        "no runs directory yet"
    );
    run_with(&layout, "xyz123", RunState::Complete, None);
    assert_eq!(
        resolve(&layout, "xyz").unwrap(),
        Resolved::Run("xyz123".into())
    );
    assert_eq!(run_names(&layout).unwrap(), ["xyz123"]);
    let summary = load(&layout, "xyz123", false, 0, &Hooks::default()).unwrap();
    assert_eq!(summary.unwrap().id, "xyz123");
    assert!(
        load(&layout, "nope", false, 0, &Hooks::default())
            .unwrap()
            .is_none()
    );
}

#[test]
fn a_runs_path_that_is_not_a_directory_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = Layout::new(tmp.path().join("file-root"));
    std::fs::create_dir_all(layout.runs_dir().parent().unwrap()).unwrap();
    std::fs::write(layout.runs_dir(), "not a directory").unwrap();
    let err = run_names(&layout).unwrap_err();
    assert!(err.to_string().contains("async-subagent-runs"), "{err}");
}

fn observed_at(id: &str, at: u64) -> serde_json::Value {
    let mut proof = observed(id);
    proof["observedAt"] = serde_json::json!(at);
    proof
}

#[test]
fn without_frozen_facts_the_proof_sidecar_wins_over_the_status() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = Layout::new(tmp.path());
    // The status already projects an observed proof, but carries no
    // listing facts: the sidecar is still read.
    run_with(&layout, "r", RunState::Complete, Some(observed_at("r", 5)));
    let sidecar = layout.run_dir("r").join("process-terminal.json");
    atomic_file::write_json(&sidecar, &observed_at("r", 9)).unwrap();
    let all = ListOptions {
        all: true,
        ..options()
    };
    for runs in [
        list(&layout, &all).unwrap().runs,
        vec![
            load(&layout, "r", false, 0, &Hooks::default())
                .unwrap()
                .unwrap(),
        ],
    ] {
        let proof = runs[0].status.process_terminal.as_ref().unwrap();
        assert_eq!(proof["observedAt"], 9, "{proof}");
    }
}

#[test]
fn frozen_facts_whose_claims_are_the_budgets_directory_itself_hold() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = Layout::new(tmp.path());
    let claims = layout.fanout_budgets_dir();
    atomic_file::ensure_private_dir(&claims).unwrap();
    let dir = layout.run_dir("f");
    atomic_file::ensure_private_dir(&dir).unwrap();
    atomic_file::write_private(&dir.join("run-fanout-budget.json"), b"{}").unwrap();
    let mut status = RunStatus::new("f", RunState::Complete);
    status.process_terminal = Some(serde_json::json!({"state": "observed", "runId": "f"}));
    status.run_fanout_budget = Some(serde_json::json!({"used": 1, "limit": 4, "remaining": 3}));
    let facts =
        serde_json::json!({"frozenAt": status::now_ms() + 60_000, "fanoutClaimsDir": claims});
    status
        .extra
        .insert(status::model::LISTING_FACTS.into(), facts);
    write_status(&dir, &status).unwrap();
    let asked = std::cell::Cell::new(0);
    let live = |_: &std::path::Path| {
        asked.set(asked.get() + 1);
        Ok(Some(
            serde_json::json!({"used": 2, "limit": 4, "remaining": 2}),
        ))
    };
    let mut all = ListOptions {
        all: true,
        ..options()
    };
    all.hooks.fanout = Some(&live);
    let runs = list(&layout, &all).unwrap().runs;
    assert_eq!(
        runs[0].status.run_fanout_budget.as_ref().unwrap()["used"],
        1
    );
    assert_eq!(asked.get(), 0, "the frozen count holds");
    // A later claim in that directory: counted live.
    std::fs::write(claims.join("000001.json"), "{}").unwrap();
    let runs = list(&layout, &all).unwrap().runs;
    assert_eq!(
        runs[0].status.run_fanout_budget.as_ref().unwrap()["used"],
        2
    );
    assert_eq!(asked.get(), 1);
}

#[test]
fn a_full_listing_skips_unsafe_names_and_refuses_shared_run_directories() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let layout = Layout::new(tmp.path());
    run_with(&layout, "good", RunState::Complete, None);
    for name in [".hidden", "bad name", "shared"] {
        let dir = layout.runs_dir().join(name);
        atomic_file::ensure_private_dir(&dir).unwrap();
        write_status(&dir, &RunStatus::new(name, RunState::Complete)).unwrap();
    }
    let shared = layout.runs_dir().join("shared");
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    let all = ListOptions {
        all: true,
        ..options()
    };
    let listing = list(&layout, &all).unwrap();
    let ids: Vec<&str> = listing.runs.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["good"]);
    let bad: Vec<&str> = listing.unreadable.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(bad, ["shared"]);
    assert!(
        listing.unreadable[0].error.contains("writable"),
        "{:?}",
        listing.unreadable
    );
    let text = listing::list_index::TextOptions {
        home: None,
        started: std::time::SystemTime::now(),
    };
    let listing = listing::list_index::list_text(&layout, &all, &text).unwrap();
    let blocks = listing.blocks().unwrap();
    assert_eq!(blocks.len(), 1);
    assert!(blocks[0].starts_with("- good | complete"), "{blocks:?}");
    let bad: Vec<&str> = listing.unreadable.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(bad, ["shared"]);
}

fn dead_pid() -> u32 {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    pid
}

#[test]
fn a_full_listing_repairs_a_stale_run_only_when_asked() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = Layout::new(tmp.path());
    // A pi-subagents record whose runner is gone: stale.
    let dir = layout.run_dir("stale");
    atomic_file::ensure_private_dir(&dir).unwrap();
    let mut status = RunStatus::new("stale", RunState::Running);
    status.pid = Some(dead_pid());
    status.last_update = Some(1);
    write_status(&dir, &status).unwrap();
    // A run directory without a status yet: neither a run nor unreadable.
    atomic_file::ensure_private_dir(&layout.run_dir("empty")).unwrap();
    let before = std::fs::read(dir.join("status.json")).unwrap();
    let mut all = ListOptions {
        all: true,
        ..options()
    };
    let listing = list(&layout, &all).unwrap();
    assert!(listing.unreadable.is_empty(), "{:?}", listing.unreadable);
    assert_eq!(listing.runs.len(), 1);
    assert_eq!(listing.runs[0].status.state, RunState::Running);
    assert_eq!(std::fs::read(dir.join("status.json")).unwrap(), before);
    all.reconcile = true;
    let listing = list(&layout, &all).unwrap();
    assert!(listing.unreadable.is_empty(), "{:?}", listing.unreadable);
    assert_eq!(listing.runs[0].status.state, RunState::Failed);
}
