//! Tests of the listing index.

use std::time::{Duration, SystemTime};

use super::*;
use crate::list::{Hooks, LISTING_FACTS};
use crate::model::{RunState, RunStatus, Step, write_status};

/// A finished run whose listing facts are frozen (no fan-out budget).
fn frozen(layout: &Layout, id: &str, state: RunState, update: u64) -> RunStatus {
    let dir = layout.run_dir(id);
    atomic_file::ensure_private_dir(&dir).unwrap();
    let mut status = RunStatus::new(id, state);
    status.mode = Some("single".into());
    status.last_update = Some(update);
    status.steps = Some(vec![Step {
        agent: "worker".into(),
        status: state.to_string(),
        duration_ms: Some(1500),
        ..Step::default()
    }]);
    status.process_terminal = Some(serde_json::json!({"state": "observed", "runId": id}));
    let facts = serde_json::json!({"frozenAt": crate::now_ms()});
    status.extra.insert(LISTING_FACTS.into(), facts);
    write_status(&dir, &status).unwrap();
    status
}

fn options() -> ListOptions<'static> {
    ListOptions {
        all: true,
        session: None,
        limit: None,
        reconcile: false,
        now: 5_000,
        hooks: Hooks::default(),
    }
}

/// A listing that starts long after every status was written, so every
/// frozen run has settled.
fn later() -> TextOptions<'static> {
    TextOptions {
        home: None,
        started: SystemTime::now() + Duration::from_secs(3600),
    }
}

fn listed(layout: &Layout, text: &TextOptions<'_>) -> (Vec<String>, usize) {
    let listing = list_text(layout, &options(), text).unwrap();
    let blocks = listing.blocks().map(str::to_owned).collect();
    (blocks, listing.indexed)
}

/// What a listing without any index shows (and the index it leaves).
fn without_index(layout: &Layout) -> Vec<String> {
    let _ = std::fs::remove_file(index_path(layout));
    let (blocks, indexed) = listed(layout, &later());
    assert_eq!(indexed, 0);
    blocks
}

fn root_with_runs() -> (tempfile::TempDir, Layout) {
    let tmp = tempfile::tempdir().unwrap();
    let layout = Layout::new(tmp.path());
    frozen(&layout, "a-done", RunState::Complete, 30);
    frozen(&layout, "b-failed", RunState::Failed, 20);
    frozen(&layout, "c-stopped", RunState::Stopped, 10);
    // An active run and an unfrozen finished one are always read live.
    let dir = layout.run_dir("d-running");
    atomic_file::ensure_private_dir(&dir).unwrap();
    write_status(&dir, &RunStatus::new("d-running", RunState::Running)).unwrap();
    let dir = layout.run_dir("e-unfrozen");
    atomic_file::ensure_private_dir(&dir).unwrap();
    write_status(&dir, &RunStatus::new("e-unfrozen", RunState::Complete)).unwrap();
    (tmp, layout)
}

fn header_rows(layout: &Layout) -> usize {
    let text = std::fs::read_to_string(index_path(layout)).unwrap();
    let header: serde_json::Value = serde_json::from_str(text.lines().nth(1).unwrap()).unwrap();
    header["rows"].as_u64().unwrap() as usize
}

#[test]
fn frozen_rows_come_from_the_index_and_match_a_live_listing() {
    let (_tmp, layout) = root_with_runs();
    let live = without_index(&layout);
    assert_eq!(live.len(), 5);
    assert_eq!(
        header_rows(&layout),
        3,
        "only the three frozen runs are indexed"
    );
    let (warm, indexed) = listed(&layout, &later());
    assert_eq!(indexed, 3);
    assert_eq!(warm, live);
    let mode = |p: &Path| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    };
    assert_eq!(mode(&index_path(&layout)), 0o600);
    assert_eq!(mode(index_path(&layout).parent().unwrap()), 0o700);
}

#[test]
fn a_changed_status_is_read_live_and_its_row_replaced() {
    let (_tmp, layout) = root_with_runs();
    without_index(&layout);
    // Same size, same modification time: only the stamp's inode and change
    // time tell the new file from the old.
    let path = layout.run_dir("b-failed").join(files::STATUS);
    let before = std::fs::metadata(&path).unwrap();
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("worker", "wrkr2");
    atomic_file::write_private(&path, text.as_bytes()).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(before.modified().unwrap())
        .unwrap();
    let (warm, indexed) = listed(&layout, &later());
    assert_eq!(indexed, 2, "the changed run is read live");
    assert!(warm.iter().any(|b| b.contains("wrkr2")), "{warm:?}");
    let (again, indexed) = listed(&layout, &later());
    assert_eq!((indexed, &again), (3, &warm), "and indexed again");
    assert_eq!(without_index(&layout), warm);
}

#[test]
fn a_status_changed_just_now_is_not_indexed() {
    let (_tmp, layout) = root_with_runs();
    let now = TextOptions {
        home: None,
        started: SystemTime::now(),
    };
    let (blocks, indexed) = listed(&layout, &now);
    assert_eq!(indexed, 0);
    assert_eq!(blocks.len(), 5);
    assert!(
        !index_path(&layout).exists(),
        "statuses written within {SETTLE_NS} ns are read live and not indexed"
    );
}

#[test]
fn deleted_and_dismissed_runs_drop_out() {
    let (_tmp, layout) = root_with_runs();
    without_index(&layout);
    std::fs::remove_dir_all(layout.run_dir("a-done")).unwrap();
    let mut dismissed = frozen(&layout, "c-stopped", RunState::Stopped, 10);
    dismissed.display_dismissed_at = Some(40);
    write_status(&layout.run_dir("c-stopped"), &dismissed).unwrap();
    let (warm, indexed) = listed(&layout, &later());
    assert_eq!(indexed, 1);
    assert_eq!(warm.len(), 3, "{warm:?}");
    assert!(
        !warm
            .iter()
            .any(|b| b.contains("a-done") || b.contains("c-stopped"))
    );
    assert_eq!(header_rows(&layout), 2, "the dismissed run stays, hidden");
    let (again, indexed) = listed(&layout, &later());
    assert_eq!((indexed, again), (2, warm));
}

#[test]
fn a_damaged_or_foreign_index_is_ignored_and_rebuilt() {
    let (_tmp, layout) = root_with_runs();
    let live = without_index(&layout);
    let good = std::fs::read(index_path(&layout)).unwrap();
    let text = String::from_utf8(good.clone()).unwrap();
    let flipped = text.replacen("failed", "fai1ed", 1);
    let damaged: Vec<Vec<u8>> = vec![
        good[..good.len() - 3].to_vec(),
        good[..good.len() / 2].to_vec(),
        flipped.into_bytes(),
        // A newer writer's version: this reader ignores it and writes its own.
        text.replacen("subagents-listing-index 1", "subagents-listing-index 2", 1)
            .into_bytes(),
        text.replacen("\"rows\":3", "\"rows\":4", 1).into_bytes(),
        Vec::new(),
        b"\xff\xfe not text".to_vec(),
    ];
    for bytes in damaged {
        atomic_file::write_private(&index_path(&layout), &bytes).unwrap();
        let (blocks, indexed) = listed(&layout, &later());
        assert_eq!(
            (indexed, &blocks),
            (0, &live),
            "{}",
            String::from_utf8_lossy(&bytes)
        );
        assert_eq!(std::fs::read(index_path(&layout)).unwrap(), good, "rebuilt");
    }
}

#[test]
fn an_index_for_another_home_or_root_path_is_not_used() {
    let (_tmp, layout) = root_with_runs();
    without_index(&layout);
    let home = TextOptions {
        home: Some(Path::new("/elsewhere")),
        started: later().started,
    };
    assert_eq!(listed(&layout, &home).1, 0);
    assert_eq!(listed(&layout, &home).1, 3, "rebuilt for that home");
    let other = Layout::new(
        layout
            .root()
            .join("../")
            .join(layout.root().file_name().unwrap()),
    );
    let listing = list_text(&other, &options(), &home).unwrap();
    assert_eq!(listing.indexed, 0, "rows name the runs directory as given");
}

#[test]
fn the_index_holds_no_status_text_beyond_the_rows() {
    let (_tmp, layout) = root_with_runs();
    let mut secret = frozen(&layout, "f-secret", RunState::Complete, 5);
    secret
        .extra
        .insert("task".into(), serde_json::json!("do the secret thing"));
    write_status(&layout.run_dir("f-secret"), &secret).unwrap();
    without_index(&layout);
    let text = std::fs::read_to_string(index_path(&layout)).unwrap();
    assert_eq!(header_rows(&layout), 4);
    assert!(!text.contains("secret thing"), "{text}");
}
