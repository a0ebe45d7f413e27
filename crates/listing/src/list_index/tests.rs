//! Tests of the listing index.

use std::time::{Duration, SystemTime};

use super::*;
use crate::list::Hooks;
use status::model::{LISTING_FACTS, RunState, RunStatus, Step, write_status};

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
    let facts = serde_json::json!({"frozenAt": status::now_ms()});
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
    let blocks = listing.blocks().unwrap();
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
        text.replacen("subagents-listing-index 2", "subagents-listing-index 3", 1)
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

/// Rows in the file, as (rank, sort time, name).
fn row_keys(layout: &Layout) -> Vec<(u64, u64, String)> {
    let text = std::fs::read_to_string(index_path(layout)).unwrap();
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v.get("name").is_some())
        .map(|v| {
            let n = |k: &str| v[k].as_u64().unwrap();
            (
                n("rank"),
                n("sortTime"),
                v["name"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[test]
fn rows_are_stored_in_listing_order() {
    let (_tmp, layout) = root_with_runs();
    frozen(&layout, "f-complete-newer", RunState::Complete, 40);
    frozen(&layout, "g-complete-tie", RunState::Complete, 30);
    let live = without_index(&layout);
    let keys = row_keys(&layout);
    let names: Vec<&str> = keys.iter().map(|k| k.2.as_str()).collect();
    assert_eq!(
        names,
        [
            "b-failed",
            "c-stopped",
            "f-complete-newer",
            "a-done",
            "g-complete-tie"
        ],
        "failed and stopped first, then newest first, ties by name"
    );
    let (warm, indexed) = listed(&layout, &later());
    assert_eq!((indexed, &warm), (5, &live));
    // The same rows out of order: ignored and rebuilt.
    let text = std::fs::read_to_string(index_path(&layout)).unwrap();
    let good = text.clone();
    let mut lines: Vec<&str> = text.split_inclusive('\n').collect();
    // Rows are a head line and a block of four lines here: swap the first two rows.
    let row = |i: usize| 2 + i * 4..2 + (i + 1) * 4;
    let (first, second) = (lines[row(0)].to_vec(), lines[row(1)].to_vec());
    assert!(first[0].contains("b-failed") && second[0].contains("c-stopped"));
    lines.splice(row(0), second);
    lines.splice(row(1), first);
    let swapped: String = lines.concat();
    assert_ne!(swapped, good);
    atomic_file::write_private(&index_path(&layout), swapped.as_bytes()).unwrap();
    let (blocks, indexed) = listed(&layout, &later());
    assert_eq!((indexed, &blocks), (0, &live));
    assert_eq!(std::fs::read_to_string(index_path(&layout)).unwrap(), good);
}

#[test]
fn a_listing_with_a_limit_or_a_session_takes_rows_in_order() {
    let (_tmp, layout) = root_with_runs();
    let live = without_index(&layout);
    let mut opts = options();
    opts.limit = Some(2);
    let listing = list_text(&layout, &opts, &later()).unwrap();
    assert_eq!(listing.len(), 2);
    assert_eq!(listing.blocks().unwrap(), live[..2].to_vec());
    opts.limit = None;
    opts.session = Some("nobody".into());
    let listing = list_text(&layout, &opts, &later()).unwrap();
    assert!(listing.is_empty() && listing.blocks().unwrap().is_empty());
    assert_eq!(listing.indexed, 3, "the rows held; none is shown");
}

#[test]
fn runs_indexed_by_a_listing_that_shows_none_of_them_keep_their_blocks() {
    let (_tmp, layout) = root_with_runs();
    let live = without_index(&layout);
    std::fs::remove_file(index_path(&layout)).unwrap();
    let mut opts = options();
    opts.session = Some("nobody".into());
    let listing = list_text(&layout, &opts, &later()).unwrap();
    assert!(listing.is_empty());
    assert_eq!(header_rows(&layout), 3, "the frozen runs are indexed");
    let (warm, indexed) = listed(&layout, &later());
    assert_eq!(indexed, 3, "their rows hold");
    assert_eq!(warm, live);
}

/// A frozen run with a fan-out budget of 4 of which `used` are claimed,
/// its claims in `claims`, its descriptor written before the freeze.
fn budgeted(layout: &Layout, id: &str, claims: &Path, used: u64) {
    let dir = layout.run_dir(id);
    atomic_file::ensure_private_dir(&dir).unwrap();
    atomic_file::ensure_private_dir(claims).unwrap();
    for slot in 0..used {
        atomic_file::write_private(&claims.join(format!("{slot:06}.json")), b"{}").unwrap();
    }
    atomic_file::write_private(&dir.join(files::RUN_FANOUT_BUDGET), b"{}").unwrap();
    let mut status = frozen(layout, id, RunState::Complete, 50);
    status.run_fanout_budget =
        Some(serde_json::json!({"used": used, "limit": 4, "remaining": 4 - used}));
    let facts = serde_json::json!({"frozenAt": status::now_ms() + 1000, "fanoutClaimsDir": claims});
    status.extra.insert(LISTING_FACTS.into(), facts);
    write_status(&dir, &status).unwrap();
}

#[test]
fn a_budgeted_row_holds_only_while_its_claims_and_descriptor_do() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = Layout::new(tmp.path());
    let claims = layout.fanout_budgets_dir().join("b-budget/claims");
    budgeted(&layout, "b", &claims, 1);
    frozen(&layout, "plain", RunState::Complete, 10);
    let asked = std::cell::Cell::new(0);
    let live_count = |_: &Path| {
        asked.set(asked.get() + 1);
        Ok(Some(
            serde_json::json!({"used": 2, "limit": 4, "remaining": 2}),
        ))
    };
    let list = || {
        let mut opts = options();
        opts.hooks.fanout = Some(&live_count);
        let listing = list_text(&layout, &opts, &later()).unwrap();
        let blocks = listing.blocks().unwrap();
        let fanout = blocks[0].lines().find(|l| l.contains("fan-out")).unwrap();
        (listing.indexed, fanout.trim().to_owned())
    };
    let frozen_line = "Run fan-out: 1/4 used, 3 remaining";
    let live_line = "Run fan-out: 2/4 used, 2 remaining";
    assert_eq!(list(), (0, frozen_line.into()), "first listing: live");
    assert_eq!(list(), (2, frozen_line.into()), "then from the index");
    assert_eq!(asked.get(), 0, "frozen counts: the budget never counted");
    let next = claims.join("000001.json");
    // A nested run claims after the freeze: live.
    std::fs::write(&next, "{}").unwrap();
    assert_eq!(list(), (1, live_line.into()));
    assert_eq!(asked.get(), 1);
    std::fs::remove_file(&next).unwrap();
    assert_eq!(list(), (1, frozen_line.into()), "claims changed: read live");
    assert_eq!(list(), (2, frozen_line.into()), "and indexed again");
    // A claim at another slot also changes the directory: read live (and
    // the frozen counts still hold, so it is indexed again).
    std::fs::write(claims.join("000003.json"), "{}").unwrap();
    assert_eq!(list(), (1, frozen_line.into()));
    assert_eq!(list(), (2, frozen_line.into()));
    // The descriptor replaced (renamed over) after the freeze: live.
    let descriptor = layout.run_dir("b").join(files::RUN_FANOUT_BUDGET);
    let set_time = |t: SystemTime| {
        let file = std::fs::File::options().write(true).open(&descriptor);
        file.unwrap().set_modified(t).unwrap();
    };
    let after_freeze = SystemTime::now() + Duration::from_secs(60);
    let before_freeze = SystemTime::now() - Duration::from_secs(60);
    let replacement = layout.run_dir("b").join("replacement");
    std::fs::write(&replacement, "{}").unwrap();
    std::fs::File::options()
        .write(true)
        .open(&replacement)
        .unwrap()
        .set_modified(after_freeze)
        .unwrap();
    std::fs::rename(&replacement, &descriptor).unwrap();
    assert_eq!(list(), (1, live_line.into()));
    set_time(before_freeze);
    assert_eq!(list(), (1, frozen_line.into()), "descriptor older again");
    assert_eq!(list(), (2, frozen_line.into()));
    // Rewritten in place (the run directory unchanged): live too.
    let count = asked.get();
    std::fs::write(&descriptor, "{}").unwrap();
    set_time(after_freeze);
    assert_eq!(list(), (1, live_line.into()));
    assert_eq!(asked.get(), count + 1);
    set_time(before_freeze);
    assert_eq!(list(), (1, frozen_line.into()));
    assert_eq!(list(), (2, frozen_line.into()));
    // The claims directory gone: live.
    std::fs::remove_dir_all(&claims).unwrap();
    assert_eq!(list(), (1, live_line.into()));
}

#[test]
fn a_run_directory_opened_to_others_is_unreadable_as_when_read_live() {
    use std::os::unix::fs::PermissionsExt;
    let (_tmp, layout) = root_with_runs();
    without_index(&layout);
    assert_eq!(listed(&layout, &later()).1, 3);
    let dir = layout.run_dir("a-done");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let listing = list_text(&layout, &options(), &later()).unwrap();
    assert_eq!(listing.indexed, 2);
    assert_eq!(listing.unreadable.len(), 1);
    assert_eq!(listing.unreadable[0].id, "a-done");
    let warm = listing.blocks().unwrap();
    let _ = std::fs::remove_file(index_path(&layout));
    let cold = list_text(&layout, &options(), &later()).unwrap();
    assert_eq!(cold.blocks().unwrap(), warm);
    assert_eq!(cold.unreadable.len(), 1);
}

#[test]
fn a_version_1_index_is_neither_read_nor_touched() {
    let (_tmp, layout) = root_with_runs();
    let live = without_index(&layout);
    let ours = std::fs::read(index_path(&layout)).unwrap();
    // What a version-1 build leaves beside ours (rows in name order).
    let v1 = layout.root().join(INDEX_DIR).join("finished-runs");
    let text = String::from_utf8(ours.clone()).unwrap();
    let old = text.replacen("subagents-listing-index 2", "subagents-listing-index 1", 1);
    atomic_file::write_private(&v1, old.as_bytes()).unwrap();
    assert_eq!(listed(&layout, &later()), (live.clone(), 3));
    assert_eq!(std::fs::read_to_string(&v1).unwrap(), old, "left alone");
    // A version-1 file under our name: ignored, replaced by ours.
    atomic_file::write_private(&index_path(&layout), old.as_bytes()).unwrap();
    assert_eq!(listed(&layout, &later()), (live, 0));
    assert_eq!(std::fs::read(index_path(&layout)).unwrap(), ours);
}

#[test]
fn an_index_naming_a_run_twice_is_ignored() {
    let (_tmp, layout) = root_with_runs();
    let live = without_index(&layout);
    let good = std::fs::read_to_string(index_path(&layout)).unwrap();
    // The first row (b-failed, rank 2) again as a rank-4 row at the end,
    // with a checksum that matches: both rows would hold.
    let lines: Vec<&str> = good.split_inclusive('\n').collect();
    let first = &lines[2..6];
    let again = first[0].replacen("\"rank\":2", "\"rank\":4", 1);
    let mut rows: Vec<&str> = lines[..lines.len() - 1].to_vec();
    rows.push(&again);
    rows.extend_from_slice(&first[1..]);
    let body = rows.concat().replacen("\"rows\":3", "\"rows\":4", 1);
    let mut sum = Sum::new();
    sum.update(body.as_bytes());
    let forged = format!("{body}end {:016x}\n", sum.finish());
    atomic_file::write_private(&index_path(&layout), forged.as_bytes()).unwrap();
    let (blocks, indexed) = listed(&layout, &later());
    assert_eq!((indexed, &blocks), (0, &live));
    assert_eq!(std::fs::read_to_string(index_path(&layout)).unwrap(), good);
}

/// Pushes pieces of growing text to `spill` and returns their ranges.
fn fill(spill: &mut Spill, total: usize) -> Vec<(Range<u64>, String)> {
    let mut pieces = Vec::new();
    let mut i = 0;
    while (spill.len() as usize) < total {
        let piece = format!("row {i} {}", "x".repeat(i % 997));
        let at = spill.len();
        spill.push(piece.as_bytes());
        pieces.push((at..spill.len(), piece));
        i += 1;
    }
    spill.flush();
    pieces
}

#[test]
fn spilled_text_reads_back_as_pushed_and_leaves_no_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join(INDEX_DIR);
    let mut spill = Spill::new(dir.clone());
    let pieces = fill(&mut spill, 3 * SPILL_AT);
    assert!(spill.file.is_some(), "past SPILL_AT the text is in a file");
    assert!(spill.held.is_empty());
    let mut buf = Vec::new();
    // In listing order, not the order pushed.
    for (range, piece) in pieces.iter().rev() {
        assert_eq!(spill.text(range.clone(), &mut buf).unwrap(), piece);
    }
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
}

#[test]
fn a_spill_moves_its_text_to_the_file_at_spill_at_then_every_chunk() {
    let tmp = tempfile::tempdir().unwrap();
    let mut spill = Spill::new(tmp.path().join(INDEX_DIR));
    spill.push("a".repeat(SPILL_AT - 1).as_bytes());
    spill.flush();
    assert!(
        spill.file.is_none(),
        "under SPILL_AT a listing makes no file"
    );
    assert_eq!(spill.held.len(), SPILL_AT - 1);
    spill.push(b"b");
    assert!(spill.file.is_some(), "at SPILL_AT the text goes to a file");
    assert_eq!((spill.flushed(), spill.held.len()), (SPILL_AT as u64, 0));
    assert!(
        spill.held.capacity() <= 2 * CHUNK,
        "the buffer that held SPILL_AT is let go"
    );
    spill.push(&vec![b'c'; CHUNK - 1]);
    assert_eq!(spill.flushed(), SPILL_AT as u64, "then held up to a CHUNK");
    spill.push(b"d");
    let end = (SPILL_AT + CHUNK) as u64;
    assert_eq!((spill.flushed(), spill.len()), (end, end));
    let mut buf = Vec::new();
    let at = SPILL_AT as u64;
    assert_eq!(spill.text(at - 2..at + 1, &mut buf).unwrap(), "abc");
    assert_eq!(spill.text(end - 2..end, &mut buf).unwrap(), "cd");
}

#[test]
fn a_spill_that_cannot_make_its_file_holds_the_text() {
    let tmp = tempfile::tempdir().unwrap();
    // A regular file where the index directory would go.
    let blocker = tmp.path().join("not-a-dir");
    std::fs::write(&blocker, b"").unwrap();
    let mut spill = Spill::new(blocker.join(INDEX_DIR));
    let pieces = fill(&mut spill, 2 * SPILL_AT);
    assert!(spill.file.is_none());
    let mut buf = Vec::new();
    for (range, piece) in &pieces {
        assert_eq!(spill.text(range.clone(), &mut buf).unwrap(), piece);
    }
}

#[test]
fn a_spill_whose_file_fails_to_write_holds_the_rest() {
    use std::os::fd::AsRawFd;
    let tmp = tempfile::tempdir().unwrap();
    let mut spill = Spill::new(tmp.path().join(INDEX_DIR));
    let mut pieces = fill(&mut spill, SPILL_AT + 1000);
    // One piece straddles the end of the file: its start written, the
    // rest pushed after the write that fails.
    let at = spill.len();
    spill.push(b"straddling ");
    spill.flush();
    let flushed = spill.flushed();
    assert_eq!(flushed, spill.len());
    // The same file, opened read-only: every later write fails (EBADF).
    let (file, len) = spill.file.take().unwrap();
    let fd = format!("/proc/self/fd/{}", file.as_raw_fd());
    spill.file = Some((std::fs::File::open(fd).unwrap(), len));
    spill.push(b"piece");
    spill.flush();
    assert!(spill.dir.is_none(), "a failed write stops the spilling");
    assert_eq!(spill.flushed(), flushed);
    pieces.push((at..spill.len(), "straddling piece".into()));
    pieces.extend(fill(&mut spill, 2 * SPILL_AT + CHUNK));
    assert_eq!(spill.flushed(), flushed, "the rest is held");
    let mut buf = Vec::new();
    for (range, piece) in &pieces {
        assert_eq!(spill.text(range.clone(), &mut buf).unwrap(), piece);
    }
}

/// The index with its first row's head line padded (JSON whitespace) to
/// `len` bytes before its newline, checksum recomputed.
fn with_first_head_of(good: &str, len: usize) -> String {
    let lines: Vec<&str> = good.split_inclusive('\n').collect();
    let head = lines[2].trim_end_matches('\n');
    assert!(
        head.starts_with("{\"name\"") && head.ends_with('}'),
        "{head}"
    );
    let pad = " ".repeat(len - head.len());
    let padded = format!("{}{pad}}}\n", &head[..head.len() - 1]);
    assert_eq!(padded.len(), len + 1);
    let mut body = String::new();
    for (i, line) in lines[..lines.len() - 1].iter().enumerate() {
        body.push_str(if i == 2 { &padded } else { line });
    }
    let mut sum = Sum::new();
    sum.update(body.as_bytes());
    format!("{body}end {:016x}\n", sum.finish())
}

#[test]
fn a_row_line_of_the_longest_length_is_read_and_a_longer_one_is_not() {
    let (_tmp, layout) = root_with_runs();
    let live = without_index(&layout);
    let good = std::fs::read_to_string(index_path(&layout)).unwrap();
    for (len, indexed) in [(LINE_LIMIT, 3), (LINE_LIMIT + 1, 0)] {
        let forged = with_first_head_of(&good, len);
        atomic_file::write_private(&index_path(&layout), forged.as_bytes()).unwrap();
        let (blocks, n) = listed(&layout, &later());
        assert_eq!((n, &blocks), (indexed, &live), "a line of {len} bytes");
    }
}

#[test]
fn a_run_whose_row_line_would_be_too_long_is_read_live_and_the_others_indexed() {
    let (_tmp, layout) = root_with_runs();
    let mut long = frozen(&layout, "f-long-session", RunState::Complete, 5);
    long.session_id = Some("s".repeat(LINE_LIMIT));
    write_status(&layout.run_dir("f-long-session"), &long).unwrap();
    let live = without_index(&layout);
    assert_eq!(live.len(), 6);
    assert_eq!(header_rows(&layout), 3, "the long row is not written");
    let (warm, indexed) = listed(&layout, &later());
    assert_eq!((indexed, &warm), (3, &live));
}

/// The checksum as the format defines it, over the whole text at once.
fn reference_sum(bytes: &[u8]) -> u64 {
    let mix = |state: u64, word: u64| {
        let h = (state ^ word).wrapping_mul(0x0100_0000_01b3);
        h ^ (h >> 32)
    };
    let state = bytes.chunks(8).fold(0xcbf2_9ce4_8422_2325, |state, chunk| {
        let mut word = [0; 8];
        word[..chunk.len()].copy_from_slice(chunk);
        mix(state, u64::from_le_bytes(word))
    });
    mix(state, bytes.len() as u64)
}

#[test]
fn the_checksum_is_the_same_whatever_the_pieces_it_is_fed_in() {
    let text: Vec<u8> = (0..40u8).map(|b| b.wrapping_mul(37) ^ 0x5a).collect();
    for len in 0..=text.len() {
        let bytes = &text[..len];
        let want = reference_sum(bytes);
        // Whole, then cut in two anywhere, then in three anywhere.
        let mut sum = Sum::new();
        sum.update(bytes);
        assert_eq!(sum.finish(), want, "length {len}");
        for a in 0..=len {
            let mut sum = Sum::new();
            sum.update(&bytes[..a]);
            sum.update(&bytes[a..]);
            assert_eq!(sum.finish(), want, "length {len} cut at {a}");
            for b in a..=len {
                let mut sum = Sum::new();
                for piece in [&bytes[..a], &bytes[a..b], &bytes[b..]] {
                    sum.update(piece);
                }
                assert_eq!(sum.finish(), want, "length {len} cut at {a} and {b}");
            }
        }
    }
    assert_ne!(reference_sum(b""), reference_sum(&[0]), "the length counts");
}

#[test]
fn a_dismissed_run_with_a_long_error_is_indexed_hidden() {
    let (_tmp, layout) = root_with_runs();
    // Read live first (its name sorts first), its record alone in the
    // arena: a block longer than the record that holds no block.
    let mut dismissed = frozen(&layout, "0-dismissed", RunState::Failed, 60);
    dismissed.display_dismissed_at = Some(70);
    dismissed.error = Some("e".repeat(4096));
    write_status(&layout.run_dir("0-dismissed"), &dismissed).unwrap();
    let live = without_index(&layout);
    assert_eq!(live.len(), 5, "not shown");
    assert_eq!(header_rows(&layout), 4, "indexed, hidden");
    let text = std::fs::read_to_string(index_path(&layout)).unwrap();
    assert!(!text.contains("eeee"), "a hidden row holds no block");
    let (warm, indexed) = listed(&layout, &later());
    assert_eq!((indexed, &warm), (4, &live));
}

/// Run `id` (frozen, failed) whose one step has a context of `context`
/// bytes, with an error of `error` bytes. The block shows the context
/// twice (the run's and the step's) and the error once, so it can be
/// longer than the status file, which is capped at 16 MiB.
fn with_context_and_error(layout: &Layout, id: &str, context: usize, error: usize) {
    let mut status = frozen(layout, id, RunState::Failed, 10);
    let step = &mut status.steps.as_mut().unwrap()[0];
    step.extra
        .insert("context".into(), serde_json::json!("c".repeat(context)));
    status.error = Some("x".repeat(error));
    write_status(&layout.run_dir(id), &status).unwrap();
}

#[test]
fn a_block_of_the_longest_length_is_indexed_and_a_longer_one_is_not() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = Layout::new(tmp.path());
    with_context_and_error(&layout, "a-at-limit", 1, 1);
    let one = listed(&layout, &later()).0[0].len();
    // Each byte of context adds two to the block, each byte of error one.
    let context = BLOCK_LIMIT / 2 - 4096;
    let error = BLOCK_LIMIT - one - 2 * (context - 1) + 1;
    with_context_and_error(&layout, "a-at-limit", context, error);
    // The same length of name: the name is shown twice too.
    with_context_and_error(&layout, "b-past-lim", context, error + 1);
    frozen(&layout, "c-small", RunState::Complete, 5);
    let live = without_index(&layout);
    let lengths: Vec<usize> = live.iter().map(String::len).collect();
    assert_eq!(lengths[..2], [BLOCK_LIMIT, BLOCK_LIMIT + 1]);
    assert_eq!(header_rows(&layout), 2, "the longer block is not written");
    let (warm, indexed) = listed(&layout, &later());
    assert_eq!(indexed, 2);
    // Not assert_eq!: a failure would print 64 MiB of blocks.
    assert!(warm == live, "the blocks differ from a live listing's");
}

/// What a listing shows and leaves: blocks, unreadable runs, sessions,
/// skipped repairs, rows taken from the index, and the index it wrote.
type Outcome = (
    Vec<String>,
    Vec<(String, String)>,
    BTreeSet<String>,
    Vec<String>,
    usize,
    Vec<u8>,
);

/// A listing without an index read by `readers` threads (1: the main
/// thread alone).
fn listed_by(layout: &Layout, options: &ListOptions<'_>, readers: usize) -> Outcome {
    let _ = std::fs::remove_file(index_path(layout));
    live::READERS.set(Some(readers));
    let listing = list_text(layout, options, &later()).unwrap();
    live::READERS.set(None);
    let unreadable = listing.unreadable.iter();
    (
        listing.blocks().unwrap(),
        unreadable
            .map(|u| (u.id.clone(), u.error.clone()))
            .collect(),
        listing.sessions.clone(),
        listing.skipped_repairs.clone(),
        listing.indexed,
        std::fs::read(index_path(layout)).unwrap(),
    )
}

#[test]
fn threads_list_and_index_what_the_main_thread_alone_does() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = Layout::new(tmp.path());
    // Several chunks of frozen runs: equal times (kept in name order),
    // sessions, dismissed ones.
    for i in 0..300u64 {
        let state = [RunState::Complete, RunState::Failed, RunState::Stopped][i as usize % 3];
        let id = format!("run-{i:03}");
        let mut status = frozen(&layout, &id, state, i * 7 % 50);
        status.session_id = Some(format!("s{}", i % 4));
        if i % 10 == 0 {
            status.display_dismissed_at = Some(1);
        }
        write_status(&layout.run_dir(&id), &status).unwrap();
    }
    // Runs the main thread goes on with, and ones that are not listed.
    for (id, state) in [
        ("run-050a", RunState::Running),
        ("run-150a", RunState::Complete),
    ] {
        let dir = layout.run_dir(id);
        atomic_file::ensure_private_dir(&dir).unwrap();
        write_status(&dir, &RunStatus::new(id, state)).unwrap();
    }
    for id in ["run-010a", "run-011a", "run-100a", "run-290a"] {
        let broken = layout.run_dir(id);
        atomic_file::ensure_private_dir(&broken).unwrap();
        std::fs::write(broken.join("status.json"), "{").unwrap();
    }
    atomic_file::ensure_private_dir(&layout.run_dir("run-200a")).unwrap();
    std::fs::write(layout.run_dir("run-250a"), "not a directory").unwrap();
    let mut some = options();
    some.session = Some("s1".into());
    some.limit = Some(40);
    for options in [options(), some] {
        let alone = listed_by(&layout, &options, 1);
        assert!(alone.0.len() > 30, "{}", alone.0.len());
        assert_eq!(alone.1.len(), 4, "{:?}", alone.1);
        assert!(alone.5.len() > 300 * 100);
        for readers in [2, 3] {
            assert!(
                listed_by(&layout, &options, readers) == alone,
                "{readers} threads listed or indexed otherwise"
            );
        }
    }
}

thread_local! {
    /// Called with the index path between writing the index and reading
    /// its rows back (a listing that replaces it meanwhile).
    pub(super) static REPLACE_WRITTEN: std::cell::Cell<Option<fn(&Path)>> =
        const { std::cell::Cell::new(None) };
}

#[test]
fn a_listing_reads_back_the_index_it_wrote_and_no_other() {
    let (_tmp, layout) = root_with_runs();
    let expected = without_index(&layout);
    assert_eq!(expected.len(), 5);
    // Read back: the new records' blocks come from the index.
    let _ = std::fs::remove_file(index_path(&layout));
    let listing = list_text(&layout, &options(), &later()).unwrap();
    let indexed = listing.live.iter().filter(|l| l.indexed());
    assert_eq!(indexed.clone().count(), 3);
    assert!(indexed.clone().all(|l| l.in_index));
    assert_eq!(listing.blocks().unwrap(), expected);
    // Replaced before it is read back (here: by a file of the same length
    // with another checksum line, and by a shorter one): the blocks come
    // from the listing's own scratch text.
    let replacements: [fn(&Path); 2] = [
        |path| {
            let mut text = std::fs::read(path).unwrap();
            let at = text.len() - 5;
            text[at] = if text[at] == b'0' { b'1' } else { b'0' };
            std::fs::write(path, text).unwrap();
        },
        |path| std::fs::write(path, "subagents-listing-index 2\n").unwrap(),
    ];
    for replace in replacements {
        let _ = std::fs::remove_file(index_path(&layout));
        REPLACE_WRITTEN.set(Some(replace));
        let listing = list_text(&layout, &options(), &later()).unwrap();
        REPLACE_WRITTEN.set(None);
        assert!(listing.live.iter().all(|l| !l.in_index));
        assert_eq!(listing.blocks().unwrap(), expected);
    }
}

/// A file of `len` bytes, each its offset's low byte mixed with its chunk
/// number (so a range read from the wrong place differs).
fn patterned_file(len: usize) -> (tempfile::NamedTempFile, Vec<u8>) {
    let bytes: Vec<u8> = (0..len)
        .map(|i| (i as u8) ^ ((i / CHUNK) as u8 * 31))
        .collect();
    let mut file = tempfile::NamedTempFile::new().unwrap();
    std::io::Write::write_all(&mut file, &bytes).unwrap();
    (file, bytes)
}

#[test]
fn chunks_give_the_files_bytes_for_any_range_and_refuse_one_past_its_end() {
    let len = 2 * CHUNK + 17;
    let (file, bytes) = patterned_file(len);
    let mut chunks = Chunks::new(file.as_file());
    let c = CHUNK as u64;
    // Forward, within a chunk, across chunks, longer than one, then backward.
    let ranges = [
        0..10,
        10..40,
        c - 5..c + 5,
        c + 5..c + 6,
        3..c + 100,
        2 * c..len as u64,
        1..2,
    ];
    for range in ranges {
        let want = &bytes[range.start as usize..range.end as usize];
        assert_eq!(chunks.get(range.clone()).unwrap(), want, "{range:?}");
    }
    let past = chunks.get(len as u64 - 1..len as u64 + 1).unwrap_err();
    assert_eq!(past.kind(), io::ErrorKind::UnexpectedEof);
}

#[test]
fn chunks_read_a_range_held_already_from_memory() {
    let (file, bytes) = patterned_file(2 * CHUNK);
    let mut chunks = Chunks::new(file.as_file());
    let c = CHUNK as u64;
    chunks.get(0..10).unwrap();
    // The file changes under the held chunk: the same range, at the chunk's
    // very start, comes from memory, so it is the bytes read first.
    std::os::unix::fs::FileExt::write_all_at(file.as_file(), &[0xee; 10], 0).unwrap();
    assert_eq!(chunks.get(0..10).unwrap(), &bytes[..10]);
    // The next blocks of the listing, up to the chunk's last byte: no read.
    for range in [10..40, 40..c - 1, c - 8..c] {
        chunks.get(range.clone()).unwrap();
        assert_eq!((chunks.start, chunks.len), (0, CHUNK), "{range:?}");
    }
    // One byte past it: the next chunk is read from the range's start.
    chunks.get(c - 2..c + 1).unwrap();
    assert_eq!((chunks.start, chunks.len), (c - 2, CHUNK), "read again");
}
