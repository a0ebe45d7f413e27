//! `list --all` with a warm listing index streams the index: the heap it
//! holds at its peak grows by a few small numbers per finished run (its
//! name, where its row lies), never by the row's text. So does the first
//! listing, which reads every run live and builds the index: past
//! `SPILL_AT` bytes the rows' text goes to a scratch file. Counted by a
//! global allocator that tracks the bytes in use, not by time.

extern crate subagents_listing as listing;
use std::alloc::{GlobalAlloc, Layout as AllocLayout, System};
use std::os::unix::fs::DirBuilderExt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use listing::list::{Hooks, ListOptions};
use listing::list_index::{SPILL_AT, TextOptions, index_path, list_text};
use status::Layout;
use status::model::{LISTING_FACTS, RunState, RunStatus, Step, write_status};

struct Counting;

static IN_USE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
/// The counters are global: one test measures at a time.
static MEASURING: Mutex<()> = Mutex::new(());

/// Allocations made (not freed ones).
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

fn grew(by: usize) {
    ALLOCATIONS.fetch_add(1, Ordering::SeqCst);
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
/// block a little over `depth` × 5 bytes (a long working directory).
fn root(runs: usize, depth: usize) -> (tempfile::TempDir, Layout) {
    let tmp = tempfile::tempdir().unwrap();
    let layout = Layout::new(tmp.path());
    let first = layout.run_dir("run-00000");
    atomic_file::ensure_private_dir(&first).unwrap();
    let mut status = RunStatus::new("run-00000", RunState::Complete);
    status.mode = Some("single".into());
    status.last_update = Some(1_000);
    status.cwd = Some(format!("/work/{}", "deep/".repeat(depth)));
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

/// Long after every status was written: every row settled (indexed).
fn settled() -> TextOptions<'static> {
    TextOptions {
        home: None,
        started: SystemTime::now() + Duration::from_secs(3600),
    }
}

/// Before any status was written: no row settled, none indexed.
fn unsettled() -> TextOptions<'static> {
    TextOptions {
        home: None,
        started: SystemTime::now() - Duration::from_secs(3600),
    }
}

/// Every block of a listing, whole (outside any measurement).
fn blocks(layout: &Layout, text: &TextOptions<'_>) -> Vec<String> {
    list_text(layout, &options(), text)
        .unwrap()
        .blocks()
        .unwrap()
}

/// The most heap in use above what was in use before, over one
/// `list --all` that hands out every block; `indexed` of its rows came
/// from the index. Returns the peak and a checksum of the blocks.
fn peak_of_listing(
    layout: &Layout,
    text: &TextOptions<'_>,
    runs: usize,
    indexed: usize,
) -> (usize, u64) {
    let base = IN_USE.load(Ordering::SeqCst);
    PEAK.store(base, Ordering::SeqCst);
    let listing = list_text(layout, &options(), text).unwrap();
    assert_eq!(listing.indexed, indexed);
    let (mut blocks, mut bytes, mut sum) = (0, 0, 0u64);
    listing
        .for_each_block(|b| {
            blocks += 1;
            bytes += b.len();
            for byte in b.bytes() {
                sum = sum.wrapping_mul(31).wrapping_add(u64::from(byte));
            }
            Ok::<(), status::Error>(())
        })
        .unwrap();
    assert_eq!(blocks, runs);
    assert!(bytes > 300 * runs, "blocks of a few hundred bytes: {bytes}");
    drop(listing);
    (PEAK.load(Ordering::SeqCst) - base, sum)
}

/// [`peak_of_listing`] with a warm index (written by a listing before).
fn peak_of_warm_listing(layout: &Layout, runs: usize) -> usize {
    list_text(layout, &options(), &settled()).unwrap();
    peak_of_listing(layout, &settled(), runs, runs).0
}

/// [`peak_of_listing`] of a listing with no index, which writes it; checks
/// that it shows what the warm listing after it shows, from the index.
fn peak_of_first_listing(layout: &Layout, runs: usize) -> usize {
    let _ = std::fs::remove_file(index_path(layout));
    let (peak, sum) = peak_of_listing(layout, &settled(), runs, 0);
    let (_, warm) = peak_of_listing(layout, &settled(), runs, runs);
    assert_eq!(
        sum, warm,
        "the first listing shows what the index then holds"
    );
    peak
}

/// [`peak_of_listing`] of a listing that indexes nothing (every status
/// changed too recently): every block read live and shown.
fn peak_of_unsettled_listing(layout: &Layout, runs: usize) -> usize {
    let _ = std::fs::remove_file(index_path(layout));
    peak_of_listing(layout, &unsettled(), runs, 0).0
}

#[test]
fn a_warm_listing_holds_a_few_bytes_per_run_not_its_rows() {
    let _one = MEASURING.lock().unwrap_or_else(|e| e.into_inner());
    let (few, many) = (400, 1600);
    let (_a, small) = root(few, 60);
    let (_b, large) = root(many, 60);
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

/// Per run, how much more heap the larger root's listing held at its peak.
fn growth(small: usize, large: usize, few: usize, many: usize) -> usize {
    large.saturating_sub(small) / (many - few)
}

#[test]
fn a_first_listing_holds_a_few_bytes_per_run_not_its_rows() {
    let _one = MEASURING.lock().unwrap_or_else(|e| e.into_inner());
    // Blocks of ~2 KB, so both roots read more than 2 × SPILL_AT of rows
    // live: the fixed cost of holding and spilling is in both peaks.
    let depth = 400;
    let few = 2 * SPILL_AT / 2000 + 100;
    let many = 3 * few;
    let (_a, small) = root(few, depth);
    let (_b, large) = root(many, depth);
    let (s, l) = (
        peak_of_first_listing(&small, few),
        peak_of_first_listing(&large, many),
    );
    let per_run = growth(s, l, few, many);
    // A name and a row's place and sort key (under 100 bytes each with the
    // vectors' slack); a new index record is over 2,000 bytes here.
    assert!(
        per_run <= 200,
        "peak heap of a first listing grew by {per_run} bytes per run ({s} at {few} runs, {l} at {many})"
    );
    // The same when nothing can be indexed: the blocks alone spill.
    let (s, l) = (
        peak_of_unsettled_listing(&small, few),
        peak_of_unsettled_listing(&large, many),
    );
    let per_run = growth(s, l, few, many);
    assert!(
        per_run <= 200,
        "peak heap of an unindexed listing grew by {per_run} bytes per run ({s} at {few} runs, {l} at {many})"
    );
    assert_eq!(blocks(&large, &unsettled()), blocks(&large, &settled()));
}

/// A root of `runs` finished runs whose statuses look like our runner's:
/// a step with its external process and its proof projection, the run's
/// proof with two instances, identities.
fn root_like_ours(runs: usize) -> (tempfile::TempDir, Layout) {
    let (tmp, layout) = root(1, 1);
    let first = layout.run_dir("run-00000");
    let proof = serde_json::json!({
        "version": 1, "state": "observed", "runId": "run-00000",
        "runnerProcessInstanceId": "60a49727-0669-4311-a170-22deb201067e",
        "observedAt": 1_796_023_884_755_u64,
        "instances": [
            {"kind": "runner", "processInstanceId": "60a49727-0669-4311-a170-22deb201067e",
             "closeObservedAt": 1_796_023_884_755_u64, "exitCode": 0, "signal": null},
            {"kind": "pi-writer", "processInstanceId": "60a49727-0669-4311-a170-22deb201067e-writer-0",
             "attempt": 0, "closeObservedAt": 1_796_023_884_751_u64, "exitCode": 0, "signal": null,
             "processTree": {"state": "observed", "mechanism": "posix-process-group",
                             "processGroupId": 19909, "verifiedAt": 1_796_023_884_751_u64}}
        ],
        "resumeDisposition": "unavailable"
    });
    let text = std::fs::read_to_string(first.join("status.json")).unwrap();
    let mut status: serde_json::Value = serde_json::from_str(&text).unwrap();
    status["processTerminal"] = proof.clone();
    status["steps"][0]["processTerminal"] = proof;
    status["steps"][0]["externalProcess"] = serde_json::json!({
        "pid": 19909, "startedAt": 1, "endedAt": 6, "durationMs": 5, "exitCode": 0,
        "identity": {"pid": 19909, "startTime": 564_360, "bootId": "b69fd98a-3b73-449e-b438-18aed00ed328"},
        "stdoutPath": "/tmp/run/external-0.stdout.log", "stderrPath": "/tmp/run/external-0.stderr.log"
    });
    for who in ["runnerIdentity", "monitorIdentity", "launcherIdentity"] {
        status[who] = serde_json::json!(
            {"pid": 19902, "startTime": 564_358, "bootId": "b69fd98a-3b73-449e-b438-18aed00ed328"}
        );
    }
    let bytes = serde_json::to_vec_pretty(&status).unwrap();
    std::fs::write(first.join("status.json"), &bytes).unwrap();
    for i in 1..runs {
        let dir = layout.run_dir(&format!("run-{i:05}"));
        std::fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
        std::fs::write(dir.join("status.json"), &bytes).unwrap();
    }
    (tmp, layout)
}

/// Allocations of a first listing (no index) that hands out every block.
fn allocations_of_first_listing(layout: &Layout, runs: usize) -> usize {
    let _ = std::fs::remove_file(index_path(layout));
    let before = ALLOCATIONS.load(Ordering::SeqCst);
    let listing = list_text(layout, &options(), &settled()).unwrap();
    let mut blocks = 0;
    listing
        .for_each_block(|_| {
            blocks += 1;
            Ok::<(), status::Error>(())
        })
        .unwrap();
    assert_eq!(blocks, runs);
    drop(listing);
    ALLOCATIONS.load(Ordering::SeqCst) - before
}

/// What reading a finished run live may allocate: its status read and
/// parsed (of the proofs, which a text listing does not show, only the
/// run's state and ids kept; the rest checked, not kept), its row rendered
/// once (a row that shows no time relative to now is the same at any
/// time: not rendered again to find out), its index record. Counted, not
/// timed: 81 here, against 218 when every row was rendered three times
/// and the proofs kept whole.
const FIRST_LISTING_ALLOCATIONS_PER_RUN: usize = 90;

#[test]
fn a_first_listing_allocates_a_bounded_number_of_times_per_run() {
    let _one = MEASURING.lock().unwrap_or_else(|e| e.into_inner());
    let (few, many) = (200, 600);
    let (_a, small) = root_like_ours(few);
    let (_b, large) = root_like_ours(many);
    let (s, l) = (
        allocations_of_first_listing(&small, few),
        allocations_of_first_listing(&large, many),
    );
    let per_run = (l - s) / (many - few);
    assert!(
        per_run <= FIRST_LISTING_ALLOCATIONS_PER_RUN,
        "a first listing made {per_run} allocations per run ({s} at {few} runs, {l} at {many})"
    );
}
