//! Where a state root keeps things, the active-run markers and the event
//! log, and the clock every timestamp on disk uses.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::json;
use status::{Layout, events, index};

#[test]
fn every_directory_lives_where_the_reference_puts_it() {
    let layout = Layout::new("/t");
    assert_eq!(layout.root(), Path::new("/t"));
    assert_eq!(layout.runs_dir(), Path::new("/t/async-subagent-runs"));
    assert_eq!(layout.run_dir("r1"), Path::new("/t/async-subagent-runs/r1"));
    assert_eq!(
        layout.active_index_dir(),
        Path::new("/t/async-subagent-runs/.active-runs")
    );
    assert_eq!(
        index::marker_path(&layout.run_dir("r1")),
        Path::new("/t/async-subagent-runs/.active-runs/r1")
    );
    assert_eq!(
        layout.fanout_budgets_dir(),
        Path::new("/t/run-fanout-budgets")
    );
    assert_eq!(
        layout.capacity_dir(),
        Path::new("/t/session-active-async-capacity")
    );
    assert_eq!(layout.session_leases_dir(), Path::new("/t/session-leases"));
}

#[test]
fn a_marker_that_cannot_be_created_is_an_error_and_an_existing_one_is_kept() {
    let tmp = tempfile::tempdir().unwrap();
    // A name over the file system's 255-byte limit: the create fails
    // otherwise than "exists".
    let too_long = tmp.path().join("x".repeat(300));
    assert!(index::create_marker(&too_long).is_err());
    let run = tmp.path().join("r1");
    index::create_marker(&run).unwrap();
    let marker = index::marker_path(&run);
    std::fs::write(&marker, "kept").unwrap();
    index::create_marker(&run).unwrap();
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "kept");
}

#[test]
fn an_index_that_is_not_a_directory_is_an_error_not_empty() {
    let tmp = tempfile::tempdir().unwrap();
    assert_eq!(index::read_index(tmp.path()).unwrap(), Vec::<String>::new());
    std::fs::write(tmp.path().join(index::INDEX_DIR), "").unwrap();
    assert!(index::read_index(tmp.path()).is_err());
}

#[test]
fn an_event_log_past_the_state_file_cap_is_read_to_its_end() {
    // The log is append-only and may outgrow one state file's 16 MiB cap;
    // its reader still reaches the latest events.
    let tmp = tempfile::tempdir().unwrap();
    let line = format!("{}\n", "x".repeat(1023));
    let padding = line.repeat(17 * 1024);
    std::fs::write(tmp.path().join("events.jsonl"), padding).unwrap();
    events::append(tmp.path(), "subagent.run.completed", "r1", 7, json!({})).unwrap();
    let read = events::read_all(tmp.path());
    assert_eq!(read.len(), 1, "padding lines are not events");
    assert_eq!(
        read[0],
        json!({"type": "subagent.run.completed", "ts": 7, "runId": "r1"})
    );
}

#[test]
fn timestamps_are_epoch_milliseconds() {
    let ms = || {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
    };
    let before = ms();
    let now = status::now_ms();
    let after = ms();
    assert!(
        before <= now && now <= after,
        "{before} <= {now} <= {after}"
    );
}
