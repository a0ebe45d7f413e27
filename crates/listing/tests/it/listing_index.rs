//! The listing index from outside, through `list_text` and the file on
//! disk: a large index is still used, and an index written by another
//! renderer is not.

use std::path::Path;
use std::time::{Duration, SystemTime};

use listing::list::{Hooks, ListOptions};
use listing::list_index::{TextOptions, index_path, list_text};
use status::Layout;
use status::model::{LISTING_FACTS, RunState, RunStatus, Step, write_status};

/// A finished run whose listing facts are frozen (no fan-out budget).
fn frozen(layout: &Layout, id: &str, error: Option<String>) {
    let dir = layout.run_dir(id);
    atomic_file::ensure_private_dir(&dir).unwrap();
    let mut status = RunStatus::new(id, RunState::Failed);
    status.mode = Some("single".into());
    status.last_update = Some(10);
    status.error = error;
    status.steps = Some(vec![Step {
        agent: "worker".into(),
        status: "failed".into(),
        ..Step::default()
    }]);
    status.process_terminal = Some(serde_json::json!({"state": "observed", "runId": id}));
    let facts = serde_json::json!({"frozenAt": status::now_ms()});
    status.extra.insert(LISTING_FACTS.into(), facts);
    write_status(&dir, &status).unwrap();
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

/// A listing that starts long after every status was written.
fn later() -> TextOptions<'static> {
    TextOptions {
        home: None,
        started: SystemTime::now() + Duration::from_secs(3600),
    }
}

fn listed(layout: &Layout) -> (Vec<String>, usize) {
    let listing = list_text(layout, &options(), &later()).unwrap();
    let blocks = listing.blocks().unwrap();
    (blocks, listing.indexed)
}

#[test]
fn an_index_of_a_few_mebibytes_is_read() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = Layout::new(tmp.path());
    // 24 rows of 100 KiB each: a 2.4 MiB index.
    for i in 0..24 {
        let error = format!("{i:02} {}", "x".repeat(100 * 1024));
        frozen(&layout, &format!("run-{i:02}"), Some(error));
    }
    let (live, indexed) = listed(&layout);
    assert_eq!((live.len(), indexed), (24, 0));
    let size = std::fs::metadata(index_path(&layout)).unwrap().len();
    assert!(size > 2 * 1024 * 1024, "{size}");
    let (warm, indexed) = listed(&layout);
    assert_eq!(indexed, 24, "every row taken from the index");
    // Not assert_eq!: a failure would print megabytes of blocks.
    assert!(warm == live, "the blocks differ from a live listing's");
}

/// The index's checksum (version 2): FNV-1a's multiply over 8-byte
/// little-endian words (the last zero-padded) with the high half folded in
/// after each, then the length.
fn fnv(bytes: &[u8]) -> u64 {
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

/// [`fnv`] itself pinned to values computed outside this code base (a
/// Python transcription of the format's definition), so the checksum the
/// tests compare the index with cannot drift along with the writer's.
#[test]
fn the_checksum_of_fixed_bytes_is_a_fixed_value() {
    assert_eq!(format!("{:016x}", fnv(b"")), "af63bd4c29620a93");
    assert_eq!(format!("{:016x}", fnv(b"abcdefgh")), "ff18c96fe56d3933");
    assert_eq!(format!("{:016x}", fnv(b"abcdefghij")), "8e406621cc5322df");
}

/// The index at `path` with one header field replaced, checksum
/// recomputed: intact, but written by another build (or with a row count
/// that does not match its rows).
fn rewrite_header(path: &Path, key: &str, value: serde_json::Value) {
    rewrite_line(path, 1, key, value);
}

/// [`rewrite_header`] for line `n` of the index (the first row's head is
/// line 2).
fn rewrite_line(path: &Path, n: usize, key: &str, value: serde_json::Value) {
    let text = std::fs::read_to_string(path).unwrap();
    let body_end = text.trim_end_matches('\n').rfind('\n').unwrap() + 1;
    let mut lines: Vec<String> = text[..body_end].split('\n').map(str::to_owned).collect();
    let mut line: serde_json::Value = serde_json::from_str(&lines[n]).unwrap();
    line[key] = value;
    lines[n] = line.to_string();
    let body = lines.join("\n");
    let out = format!("{body}end {:016x}\n", fnv(body.as_bytes()));
    atomic_file::write_private(path, out.as_bytes()).unwrap();
}

fn rewrite_renderer(path: &Path, renderer: &str) {
    rewrite_header(path, "renderer", serde_json::json!(renderer));
}

#[test]
fn an_index_written_by_another_renderer_is_not_used() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = Layout::new(tmp.path());
    frozen(&layout, "a", None);
    frozen(&layout, "b", Some("boom".into()));
    let (live, _) = listed(&layout);
    let (warm, indexed) = listed(&layout);
    assert_eq!((indexed, &warm), (2, &live), "the index as written is used");
    let path = index_path(&layout);
    let ours = std::fs::read_to_string(&path).unwrap();
    // Checks the rewrite itself: the same renderer keeps the index usable.
    let header: serde_json::Value = serde_json::from_str(ours.lines().nth(1).unwrap()).unwrap();
    rewrite_renderer(&path, header["renderer"].as_str().unwrap());
    assert_eq!(listed(&layout).1, 2);
    for other in ["", "xyzzy", "0123456789abcdef"] {
        rewrite_renderer(&path, other);
        let (blocks, indexed) = listed(&layout);
        assert_eq!((indexed, &blocks), (0, &live), "renderer {other:?}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), ours, "rebuilt");
    }
}

fn in_session(layout: &Layout, id: &str, session: &str) {
    frozen(layout, id, None);
    let dir = layout.run_dir(id);
    let mut status = status::model::read_status(&dir).unwrap().unwrap();
    status.session_id = Some(session.into());
    write_status(&dir, &status).unwrap();
}

#[test]
fn a_session_filter_applies_to_indexed_and_live_rows_alike() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = Layout::new(tmp.path());
    in_session(&layout, "a1", "sa");
    in_session(&layout, "a2", "sa");
    in_session(&layout, "b1", "sb");
    frozen(&layout, "none", None);
    let listing = |session: Option<&str>| {
        let options = ListOptions {
            session: session.map(str::to_owned),
            ..options()
        };
        let listing = list_text(&layout, &options, &later()).unwrap();
        let ids: Vec<String> = listing
            .blocks()
            .unwrap()
            .iter()
            .map(|b| b.split(' ').nth(1).unwrap().to_owned())
            .collect();
        let sessions: Vec<String> = listing.sessions.iter().cloned().collect();
        (ids, sessions, listing.indexed)
    };
    for round in ["live", "indexed"] {
        let (ids, sessions, indexed) = listing(None);
        assert_eq!(ids, ["a1", "a2", "b1", "none"], "{round}");
        assert_eq!(sessions, ["sa", "sb"], "{round}");
        assert_eq!(indexed, if round == "live" { 0 } else { 4 });
        let (ids, sessions, _) = listing(Some("sa"));
        assert_eq!(
            (ids, sessions),
            (vec!["a1".to_owned(), "a2".into()], vec!["sa".to_owned()]),
            "{round}"
        );
        let (ids, sessions, _) = listing(Some("sb"));
        assert_eq!(
            (ids, sessions),
            (vec!["b1".to_owned()], vec!["sb".to_owned()]),
            "{round}"
        );
        let (ids, _, _) = listing(Some(""));
        assert_eq!(ids.len(), 4, "an empty session filters nothing ({round})");
    }
}

#[test]
fn a_row_that_shows_a_time_relative_to_now_is_not_indexed() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = Layout::new(tmp.path());
    frozen(&layout, "r", None);
    // A failed run whose step still says running, last active at 5 000:
    // its line reads "active now" at 5 000 and "active 10m ago" later.
    let dir = layout.run_dir("r");
    let mut status = status::model::read_status(&dir).unwrap().unwrap();
    let step = &mut status.steps.as_mut().unwrap()[0];
    step.status = "running".into();
    step.extra
        .insert("lastActivityAt".into(), serde_json::json!(5_000));
    write_status(&dir, &status).unwrap();
    let at = |now: u64| {
        let options = ListOptions { now, ..options() };
        let listing = list_text(&layout, &options, &later()).unwrap();
        let block = listing.blocks().unwrap()[0].clone();
        (block, listing.indexed)
    };
    let (block, _) = at(5_000);
    assert!(block.contains("| running | active now"), "{block}");
    let (block, indexed) = at(605_000);
    assert!(block.contains("| running | active 10m ago"), "{block}");
    assert_eq!(indexed, 0);
}

fn inode(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).unwrap().ino()
}

#[test]
fn the_index_is_rewritten_only_when_its_rows_change() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = Layout::new(tmp.path());
    for id in ["a", "b", "c"] {
        frozen(&layout, id, None);
    }
    let path = index_path(&layout);
    listed(&layout);
    let written = inode(&path);
    let (_, indexed) = listed(&layout);
    assert_eq!(indexed, 3);
    assert_eq!(inode(&path), written, "nothing changed: not rewritten");
    // The last run by name is deleted: its row goes.
    std::fs::remove_dir_all(layout.run_dir("c")).unwrap();
    let (blocks, indexed) = listed(&layout);
    assert_eq!((blocks.len(), indexed), (2, 2));
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(!text.contains("\"name\":\"c\""), "{text}");
    assert_ne!(inode(&path), written);
    // Every run deleted: the index is rewritten empty.
    for id in ["a", "b"] {
        std::fs::remove_dir_all(layout.run_dir(id)).unwrap();
    }
    let (blocks, _) = listed(&layout);
    assert!(blocks.is_empty());
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("\"rows\":0"), "{text}");
}

#[test]
fn a_listing_started_before_the_epoch_indexes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = Layout::new(tmp.path());
    frozen(&layout, "a", None);
    // A clock set a century back: every status changed after the listing
    // started, so none has settled.
    let text = TextOptions {
        home: None,
        started: SystemTime::UNIX_EPOCH - Duration::from_secs(100 * 365 * 24 * 3600),
    };
    for _ in 0..2 {
        let listing = list_text(&layout, &options(), &text).unwrap();
        assert_eq!((listing.blocks().unwrap().len(), listing.indexed), (1, 0));
    }
    assert!(!index_path(&layout).exists());
}

#[test]
fn an_intact_index_whose_row_count_is_wrong_is_rebuilt() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = Layout::new(tmp.path());
    for id in ["a", "b", "c"] {
        frozen(&layout, id, None);
    }
    let (live, _) = listed(&layout);
    let path = index_path(&layout);
    let good = std::fs::read_to_string(&path).unwrap();
    // Version 2 checks every row before it copies any: a count that does not
    // match ignores the whole file, which the listing then rebuilds.
    for (rows, indexed) in [(4, 0), (2, 0)] {
        rewrite_header(&path, "rows", serde_json::json!(rows));
        let (blocks, n) = listed(&layout);
        assert_eq!((n, &blocks), (indexed, &live), "rows {rows}");
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            good,
            "rows {rows}: rebuilt"
        );
    }
}

#[test]
fn an_intact_index_whose_row_is_shorter_than_its_block_is_rebuilt() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = Layout::new(tmp.path());
    for id in ["a", "b"] {
        frozen(&layout, id, None);
    }
    let (live, _) = listed(&layout);
    let path = index_path(&layout);
    let good = std::fs::read_to_string(&path).unwrap();
    let head: serde_json::Value = serde_json::from_str(good.lines().nth(2).unwrap()).unwrap();
    let text = head["text"].as_u64().unwrap();
    rewrite_line(&path, 2, "text", serde_json::json!(text - 1));
    let (blocks, indexed) = listed(&layout);
    assert_eq!((indexed, &blocks), (0, &live));
    assert_eq!(std::fs::read_to_string(&path).unwrap(), good, "rebuilt");
}

/// A run that is read live at every listing: `state` (active, or finished
/// without frozen facts).
fn live_run(layout: &Layout, id: &str, state: RunState) {
    let dir = layout.run_dir(id);
    atomic_file::ensure_private_dir(&dir).unwrap();
    write_status(&dir, &RunStatus::new(id, state)).unwrap();
}

/// A change made to a file through a handle of its own.
type InPlace<'a> = dyn Fn(&mut std::fs::File) + 'a;

#[test]
fn an_index_changed_in_place_after_its_check_ends_the_listing_with_an_error() {
    use std::io::{Seek, SeekFrom, Write};
    let tmp = tempfile::tempdir().unwrap();
    let layout = Layout::new(tmp.path());
    frozen(&layout, "a", Some("boom".into()));
    frozen(&layout, "b", None);
    live_run(&layout, "c-running", RunState::Running);
    let (live, _) = listed(&layout);
    let path = index_path(&layout);
    let good = std::fs::read(&path).unwrap();
    let text = String::from_utf8(good.clone()).unwrap();
    let rows_at = text.find('\n').unwrap() + 1;
    let rows_at = rows_at + text[rows_at..].find('\n').unwrap() + 1;
    let block_at = rows_at + text[rows_at..].find('\n').unwrap() + 1;
    let last_head = text.rfind("{\"name\":").unwrap();
    let last_block_at = last_head + text[last_head..].find('\n').unwrap() + 1;
    let changes: [(&str, &InPlace<'_>); 3] = [
        ("cut after its header", &|f| {
            f.set_len(rows_at as u64).unwrap()
        }),
        ("cut inside its last block", &|f| {
            f.set_len(last_block_at as u64 + 4).unwrap()
        }),
        ("a block no longer UTF-8", &|f| {
            f.seek(SeekFrom::Start(block_at as u64)).unwrap();
            f.write_all(b"\xff\xfe").unwrap();
        }),
    ];
    for (what, change) in changes {
        atomic_file::write_private(&path, &good).unwrap();
        let listing = list_text(&layout, &options(), &later()).unwrap();
        assert_eq!(listing.indexed, 2, "{what}");
        assert_eq!((listing.len(), listing.is_empty()), (3, false), "{what}");
        assert_eq!(listing.blocks().unwrap(), live, "{what}: before the change");
        // Changed in place by another program (the same inode): the file
        // checked no longer reads back as checked.
        change(&mut std::fs::File::options().write(true).open(&path).unwrap());
        let err = listing.blocks().unwrap_err().to_string();
        assert!(
            err.starts_with("failed to read the listing index"),
            "{what}: {err}"
        );
        assert!(err.contains(&path.display().to_string()), "{what}: {err}");
    }
}

#[test]
fn a_row_larger_than_a_read_chunk_is_taken_from_the_index() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = Layout::new(tmp.path());
    // 300 KiB: more than the 256 KiB read at once.
    frozen(&layout, "big", Some("y".repeat(300 * 1024)));
    frozen(&layout, "small", None);
    let (live, _) = listed(&layout);
    assert!(live.iter().any(|b| b.len() > 300 * 1024));
    let (warm, indexed) = listed(&layout);
    assert_eq!(indexed, 2);
    assert!(warm == live, "the blocks differ from a live listing's");
}

#[test]
fn a_run_frozen_after_the_index_was_written_is_indexed_and_live_runs_cause_no_rewrite() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = Layout::new(tmp.path());
    frozen(&layout, "a", None);
    live_run(&layout, "b-running", RunState::Running);
    live_run(&layout, "c-unfrozen", RunState::Complete);
    let path = index_path(&layout);
    let (live, _) = listed(&layout);
    let written = inode(&path);
    let (warm, indexed) = listed(&layout);
    assert_eq!((indexed, &warm), (1, &live));
    assert_eq!(
        inode(&path),
        written,
        "runs read live add no row: not rewritten"
    );
    // A run frozen after the index was written: its row is added.
    frozen(&layout, "d", None);
    let (with_d, indexed) = listed(&layout);
    assert_eq!((with_d.len(), indexed), (4, 1));
    assert_ne!(inode(&path), written, "a row added: rewritten");
    let (warm, indexed) = listed(&layout);
    assert_eq!((indexed, &warm), (2, &with_d));
}

#[test]
fn a_damaged_index_is_rewritten_even_when_no_run_is_indexed() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = Layout::new(tmp.path());
    live_run(&layout, "a-running", RunState::Running);
    let path = index_path(&layout);
    atomic_file::ensure_private_dir(path.parent().unwrap()).unwrap();
    atomic_file::write_private(&path, b"subagents-listing-index 2\n{damaged").unwrap();
    let (blocks, indexed) = listed(&layout);
    assert_eq!((blocks.len(), indexed), (1, 0));
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(lines[1].contains("\"rows\":0"), "{text}");
    let body_len = text.len() - lines[2].len() - 1;
    assert_eq!(
        lines[2],
        format!("end {:016x}", fnv(&text.as_bytes()[..body_len]))
    );
}

#[test]
fn the_checksum_written_is_the_one_the_format_names() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = Layout::new(tmp.path());
    // Rows of several lengths, so that lines and blocks start at every
    // offset within an 8-byte word.
    for (i, id) in ["a", "bb", "ccc", "dddd", "eeeee", "f", "g", "h"]
        .iter()
        .enumerate()
    {
        frozen(&layout, id, Some("e".repeat(i)));
    }
    listed(&layout);
    let text = std::fs::read_to_string(index_path(&layout)).unwrap();
    let body_end = text.trim_end_matches('\n').rfind('\n').unwrap() + 1;
    assert_eq!(
        &text[body_end..],
        format!("end {:016x}\n", fnv(&text.as_bytes()[..body_end]))
    );
}

#[test]
fn an_index_repeating_a_row_of_a_deleted_run_is_not_used() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = Layout::new(tmp.path());
    for id in ["a", "b", "c"] {
        frozen(&layout, id, None);
    }
    listed(&layout);
    let path = index_path(&layout);
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::remove_dir_all(layout.run_dir("c")).unwrap();
    let (live, _) = listed(&layout);
    // The last row (run c's, gone), head line and block, twice: the same
    // name under the same rank and time.
    let body_end = text.trim_end_matches('\n').rfind('\n').unwrap() + 1;
    let last_row = text[..body_end].rfind("{\"name\":\"c\"").unwrap();
    let row = &text[last_row..body_end];
    let body = format!("{}{row}", &text[..body_end]).replacen("\"rows\":3", "\"rows\":4", 1);
    let forged = format!("{body}end {:016x}\n", fnv(body.as_bytes()));
    atomic_file::write_private(&path, forged.as_bytes()).unwrap();
    let (blocks, indexed) = listed(&layout);
    assert_eq!((indexed, &blocks), (0, &live));
}

/// The nullable fields of an index row's head line (`session`, `claims`),
/// its flag `hidden`, and the header's nullable `home`, each absent,
/// `null`, of the wrong type and empty in an otherwise intact index
/// (checksum recomputed). A key that is missing or of the wrong type is
/// damage: the index is not used (every row read live) and is rebuilt. A
/// well-typed value is a row as some build wrote it, and is used as it
/// reads (`null` session: a run of no session; `hidden: true`: not shown).
#[test]
fn each_nullable_row_field_absent_null_wrong_or_empty() {
    use serde_json::{Value, json};
    const REBUILT: Option<&[&str]> = None;
    let every: &[&str] = &["a1", "a2", "b1"];
    // (line, key, value or absent, `None`: rebuilt, else the rows a
    // `--session sa` listing shows from the row as written)
    type Case<'a> = (usize, &'a str, Option<Value>, Option<&'a [&'a str]>);
    let cases: [Case<'_>; 14] = [
        (2, "session", None, REBUILT),
        (2, "session", Some(Value::Null), Some(&["a2"])),
        (2, "session", Some(json!(7)), REBUILT),
        (2, "session", Some(json!("")), Some(&["a2"])),
        (2, "claims", None, REBUILT),
        (2, "claims", Some(json!("x")), REBUILT),
        (2, "claims", Some(json!({})), REBUILT),
        (2, "hidden", None, REBUILT),
        (2, "hidden", Some(Value::Null), REBUILT),
        (2, "hidden", Some(json!("false")), REBUILT),
        (2, "hidden", Some(json!(true)), Some(&["a2"])),
        (1, "home", None, REBUILT),
        (1, "home", Some(json!("")), REBUILT),
        (1, "home", Some(json!(7)), REBUILT),
    ];
    for (line, key, value, used) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let layout = Layout::new(tmp.path());
        in_session(&layout, "a1", "sa");
        in_session(&layout, "a2", "sa");
        in_session(&layout, "b1", "sb");
        let listing = |session: Option<&str>| {
            let options = ListOptions {
                session: session.map(str::to_owned),
                ..options()
            };
            let listing = list_text(&layout, &options, &later()).unwrap();
            let ids: Vec<String> = listing
                .blocks()
                .unwrap()
                .iter()
                .map(|b| b.split(' ').nth(1).unwrap().to_owned())
                .collect();
            (ids, listing.indexed)
        };
        assert_eq!(
            listing(None),
            (every.iter().map(|s| s.to_string()).collect(), 0)
        );
        let path = index_path(&layout);
        let text = std::fs::read_to_string(&path).unwrap();
        let head: Value = serde_json::from_str(text.lines().nth(2).unwrap()).unwrap();
        assert_eq!(head["name"], "a1", "the first row is a1's");
        match &value {
            None => remove_key(&path, line, key),
            Some(v) => rewrite_line(&path, line, key, v.clone()),
        }
        let case = format!("{key} = {value:?}");
        let (ids, indexed) = listing(Some("sa"));
        match used {
            None => {
                assert_eq!(
                    (ids, indexed),
                    (vec!["a1".to_owned(), "a2".into()], 0),
                    "{case}"
                );
                assert_eq!(
                    listing(None).1,
                    3,
                    "{case}: rebuilt, the index serves again"
                );
            }
            Some(rows) => assert_eq!(
                (ids, indexed),
                (rows.iter().map(|s| s.to_string()).collect(), 3),
                "{case}"
            ),
        }
    }
}

/// [`rewrite_line`], taking `key` out of line `n` instead.
fn remove_key(path: &Path, n: usize, key: &str) {
    let text = std::fs::read_to_string(path).unwrap();
    let body_end = text.trim_end_matches('\n').rfind('\n').unwrap() + 1;
    let mut lines: Vec<String> = text[..body_end].split('\n').map(str::to_owned).collect();
    let mut line: serde_json::Value = serde_json::from_str(&lines[n]).unwrap();
    line.as_object_mut().unwrap().remove(key);
    lines[n] = line.to_string();
    let body = lines.join("\n");
    let out = format!("{body}end {:016x}\n", fnv(body.as_bytes()));
    atomic_file::write_private(path, out.as_bytes()).unwrap();
}
