//! `list --all` with a warm listing index streams the index: the heap it
//! holds at its peak grows by a few small numbers per finished run (its
//! name, where its row lies), never by the row's text. Counted by a global
//! allocator that tracks the bytes in use, not by time.

use std::alloc::{GlobalAlloc, Layout as AllocLayout, System};
use std::os::unix::fs::DirBuilderExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use status::Layout;
use status::list::{Hooks, LISTING_FACTS, ListOptions};
use status::list_index::{TextOptions, list_text};
use status::model::{RunState, RunStatus, Step, write_status};

struct Counting;

static IN_USE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(by: usize) {
    let now = IN_USE.fetch_add(by, Ordering::SeqCst) + by;
    PEAK.fetch_max(now, Ordering::SeqCst);
}

// SAFETY: every call is passed on to the system allocator unchanged; only
// the sizes are counted.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: AllocLayout) -> *mut u8 {
        // SAFETY: as the caller promised.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: AllocLayout) {
        // SAFETY: as the caller promised.
        unsafe { System.dealloc(ptr, layout) };
        IN_USE.fetch_sub(layout.size(), Ordering::SeqCst);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: AllocLayout, new_size: usize) -> *mut u8 {
        // SAFETY: as the caller promised.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            IN_USE.fetch_sub(layout.size(), Ordering::SeqCst);
            grew(new_size);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// A root of `runs` finished runs with frozen listing facts, each row's
/// block a few hundred bytes (a long working directory).
fn root(runs: usize) -> (tempfile::TempDir, Layout) {
    let tmp = tempfile::tempdir().unwrap();
    let layout = Layout::new(tmp.path());
    let first = layout.run_dir("run-00000");
    atomic_file::ensure_private_dir(&first).unwrap();
    let mut status = RunStatus::new("run-00000", RunState::Complete);
    status.mode = Some("single".into());
    status.last_update = Some(1_000);
    status.cwd = Some(format!("/work/{}", "deep/".repeat(60)));
    status.steps = Some(vec![Step {
        agent: "worker".into(),
        status: "complete".into(),
        duration_ms: Some(1500),
        ..Step::default()
    }]);
    status.process_terminal = Some(serde_json::json!({"state": "observed", "runId": "run-00000"}));
    let facts = serde_json::json!({"frozenAt": status::now_ms()});
    status.extra.insert(LISTING_FACTS.into(), facts);
    write_status(&first, &status).unwrap();
    let source = first.join("status.json");
    for i in 1..runs {
        let dir = layout.run_dir(&format!("run-{i:05}"));
        std::fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
        std::fs::copy(&source, dir.join("status.json")).unwrap();
    }
    (tmp, layout)
}

/// The most heap in use above what was in use before, over a warm
/// `list --all` that reads every row and hands out every block.
fn peak_of_warm_listing(layout: &Layout, runs: usize) -> usize {
    let options = ListOptions {
        all: true,
        session: None,
        limit: None,
        reconcile: false,
        now: 5_000,
        hooks: Hooks::default(),
    };
    // Long after every status was written: every row settled.
    let text = TextOptions {
        home: None,
        started: SystemTime::now() + Duration::from_secs(3600),
    };
    list_text(layout, &options, &text).unwrap();
    let base = IN_USE.load(Ordering::SeqCst);
    PEAK.store(base, Ordering::SeqCst);
    let listing = list_text(layout, &options, &text).unwrap();
    assert_eq!(listing.indexed, runs);
    let (mut blocks, mut bytes) = (0, 0);
    listing
        .for_each_block(|b| {
            blocks += 1;
            bytes += b.len();
            Ok::<(), status::Error>(())
        })
        .unwrap();
    assert_eq!(blocks, runs);
    assert!(bytes > 300 * runs, "blocks of a few hundred bytes: {bytes}");
    drop(listing);
    PEAK.load(Ordering::SeqCst) - base
}

#[test]
fn a_warm_listing_holds_a_few_bytes_per_run_not_its_rows() {
    let (few, many) = (400, 1600);
    let (_a, small) = root(few);
    let (_b, large) = root(many);
    let small = peak_of_warm_listing(&small, few);
    let large = peak_of_warm_listing(&large, many);
    let per_run = large.saturating_sub(small) / (many - few);
    // A name and a row's place (under 100 bytes each with the vectors'
    // slack); a row of the index is over 500 bytes here.
    assert!(
        per_run <= 200,
        "peak heap grew by {per_run} bytes per run ({small} at {few} runs, {large} at {many})"
    );
}
