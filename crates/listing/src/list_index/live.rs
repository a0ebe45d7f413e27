//! The runs a text listing reads live (no row of the index holds for
//! them): read, rendered and taken into the listing in name order.
//!
//! A finished run whose frozen facts still hold needs nothing but its
//! status and a few `stat`s: no repair, no hook, no write. When many runs
//! are read live (the first listing of a large history) those are read and
//! rendered by one thread per core, a chunk of names at a time: the main
//! thread and the workers claim the next unread chunk, and the main thread
//! takes the chunks in name order, so the listing, the index and the
//! scratch file are what one thread would make. Every other run (active,
//! unfrozen, facts no longer holding) is handed to the main thread as its
//! parsed status and goes on there as before: repairs, proofs and live
//! fan-out counts stay on one thread. Memory stays bounded: no chunk is
//! read more than [`AHEAD`] chunks past the one the main thread takes
//! next.

use std::collections::BTreeMap;
use std::io;
use std::path::Path;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

use atomic_file::read::Stamp;

use super::{Row, TextListing, record_head, settled};
use crate::list::{ListOptions, RunSummary, Scan, Scanned, UnreadableRun, keep_by, state_rank};
use status::Result;
use status::layout::Layout;
use status::model::RunStatus;

/// How many run names a worker reads at a time.
const CHUNK_RUNS: usize = 16;
/// How many chunks past the one the main thread takes next may be read
/// (and held) before it takes that one: enough work for the others while
/// one thread is held up for a scheduler's time slice.
const AHEAD: usize = 8;
/// Below this many runs to read live, one thread reads them all.
pub(super) const PARALLEL_AT: usize = 1024;
/// The most threads that read runs (the main thread among them).
const MOST_READERS: usize = 4;

/// What reading a run live needs; shared by the worker threads (no hook).
pub(super) struct Live<'a> {
    pub(super) layout: &'a Layout,
    pub(super) scan: &'a Scan,
    pub(super) now: u64,
    pub(super) all: bool,
    pub(super) session: Option<&'a str>,
    pub(super) home: Option<&'a Path>,
    /// When the listing started, in ns since the epoch (see [`settled`]).
    pub(super) started: i128,
    /// Whether rows can be indexed at all (UTF-8 paths).
    pub(super) indexable: bool,
}

/// A run read live and rendered, as the listing takes it in.
struct LiveRow {
    rank: u8,
    time: u64,
    /// The head line of its new index record (with its newline), when
    /// it is indexed.
    head: Option<String>,
    /// Its block; empty when hidden, or neither shown nor indexed.
    body: String,
    shown: bool,
    /// Its session, when shown.
    session: Option<String>,
}

/// What reading one run live gave.
enum Read {
    /// Not a run to list (not a directory, no status).
    Skip,
    /// A run that cannot be read.
    Unreadable(status::Error),
    /// A status the main thread goes on with: an active run, or a finished
    /// one without frozen facts that still hold.
    Parsed(Box<RunStatus>, Stamp),
    /// A finished run with frozen facts, rendered.
    Row(LiveRow),
}

/// Reads run `name` without a hook or a write: any thread may.
fn read(cx: &Live<'_>, name: &str) -> Read {
    match cx.scan.check_dir(cx.layout, name) {
        Ok(true) => {}
        Ok(false) => return Read::Skip,
        Err(e) => return Read::Unreadable(e),
    }
    let (status, stamp) = match cx.scan.read_status(cx.layout, name, true) {
        Ok(Some(read)) => read,
        Ok(None) => return Read::Skip,
        Err(e) => return Read::Unreadable(e),
    };
    match cx.scan.finish_frozen(cx.layout, name, status, stamp) {
        Ok(scanned) => match row(cx, name, scanned) {
            Ok(row) => Read::Row(row),
            Err(e) => Read::Unreadable(e),
        },
        Err(status) => Read::Parsed(status, stamp),
    }
}

/// The row of a run read live: its block rendered once, and its index
/// record when the run may be indexed.
fn row(cx: &Live<'_>, name: &str, scanned: Scanned) -> Result<LiveRow> {
    let summary: RunSummary = scanned.summary;
    let (lines, timed) = crate::format::run_lines_timed(&summary, cx.now, cx.home);
    let block = lines.join("\n");
    let alone = scanned.from_status_alone.filter(|a| {
        cx.indexable
            && settled(&a.stamp, cx.started)
            && a.claims.as_ref().is_none_or(|c| settled(c, cx.started))
            // A row that shows a time relative to now is never indexed.
            && !timed
    });
    let shown = keep_by(&summary, cx.all, cx.session);
    let hidden = summary.status.display_dismissed_at.is_some();
    let head = alone.and_then(|a| record_head(name, &summary, a, &block, hidden));
    // A row not shown and not indexed needs no text.
    let body = if hidden || (head.is_none() && !shown) {
        String::new()
    } else {
        block
    };
    if u32::try_from(body.len()).is_err() {
        let e = io::Error::new(io::ErrorKind::InvalidData, "a listing row over 4 GiB");
        return Err(crate::io_err(
            "render the listing row of",
            &cx.layout.run_dir(name),
            e,
        ));
    }
    let status = &summary.status;
    Ok(LiveRow {
        rank: state_rank(status),
        time: status.sort_time(),
        head,
        body,
        shown,
        session: status.session_id.clone().filter(|_| shown),
    })
}

/// Takes what reading run `name` (the `i`th) gave into `out`, going on
/// with a parsed status first (repairs, hooks). Returns whether it made a
/// new index record, or `None` when the run is not listed.
fn take(
    out: &mut TextListing,
    cx: &Live<'_>,
    options: &ListOptions<'_>,
    i: usize,
    name: &str,
    read: Read,
) -> Option<bool> {
    let unreadable = |out: &mut TextListing, e: &status::Error| {
        let dir = cx.layout.run_dir(name);
        out.unreadable.push(UnreadableRun::new(name, &dir, e));
    };
    let row = match read {
        Read::Skip => return None,
        Read::Unreadable(e) => {
            unreadable(out, &e);
            return None;
        }
        Read::Row(row) => row,
        Read::Parsed(status, stamp) => {
            let skipped = &mut out.skipped_repairs;
            let finished = cx
                .scan
                .finish(cx.layout, name, *status, stamp, options, skipped);
            match finished.and_then(|s| s.map(|s| row(cx, name, s)).transpose()) {
                Ok(Some(row)) => row,
                Ok(None) => return None,
                Err(e) => {
                    unreadable(out, &e);
                    return None;
                }
            }
        }
    };
    Some(out.push_live(i, row))
}

impl TextListing {
    /// Appends a row read live: its text to the spill, its place to the
    /// live rows. Returns whether it made a new index record.
    fn push_live(&mut self, i: usize, row: LiveRow) -> bool {
        let made = row.head.is_some();
        let at = self.spill.len();
        if let Some(head) = &row.head {
            self.spill.push(head.as_bytes());
        }
        self.spill.push(row.body.as_bytes());
        if made {
            self.spill.push(b"\n");
        }
        if let Some(session) = row.session
            && !self.sessions.contains(&session)
        {
            self.sessions.insert(session);
        }
        if row.shown || made {
            self.live.push(Row {
                rank: row.rank,
                time: row.time,
                name: i as u32,
                at,
                head: row.head.map_or(0, |h| h.len() as u32),
                block: row.body.len() as u32,
                shown: row.shown,
                in_index: false,
            });
        }
        made
    }
}

/// Reads every run of `names` not `covered` live into `out`, in name
/// order. Returns whether any made a new index record.
pub(super) fn read_all(
    out: &mut TextListing,
    cx: &Live<'_>,
    options: &ListOptions<'_>,
    names: &[String],
    covered: &[bool],
) -> bool {
    let todo = covered.iter().filter(|c| !**c).count();
    let readers = readers(todo);
    let chunk = |c: usize| {
        let end = names.len().min((c + 1) * CHUNK_RUNS);
        (c * CHUNK_RUNS..end)
            .filter(|&i| !covered[i])
            .map(|i| (i, read(cx, &names[i])))
            .collect::<Vec<_>>()
    };
    let chunks = names.len().div_ceil(CHUNK_RUNS);
    let mut changed = false;
    let mut take_all = |reads: Vec<(usize, Read)>| {
        for (i, read) in reads {
            changed |= take(out, cx, options, i, &names[i], read) == Some(true);
        }
    };
    if readers < 2 {
        (0..chunks).for_each(|c| take_all(chunk(c)));
        return changed;
    }
    in_order(readers, chunks, chunk, take_all);
    changed
}

/// Calls `take` with `read(c)` for every chunk `c` in order, the chunks
/// read by up to `readers` threads (this one among them). A panic of any
/// reader ends it (and is propagated) instead of leaving the others
/// waiting; a worker that cannot be started (a process or memory limit)
/// is one reader fewer, not a failed listing.
fn in_order(
    readers: usize,
    chunks: usize,
    read: impl Fn(usize) -> Reads + Sync,
    mut take: impl FnMut(Reads),
) {
    let queue = Queue::new(chunks);
    std::thread::scope(|s| {
        // Armed before the first worker starts: a worker waiting for this
        // thread to take a chunk must hear of any panic here.
        let _failed = FailOnPanic(&queue);
        for n in 1..readers {
            let worker = || {
                let _failed = FailOnPanic(&queue);
                while let Some(c) = queue.claim() {
                    queue.done(c, read(c));
                }
            };
            // This thread reads whatever no worker claims.
            if spawn_reader(s, n, worker).is_err() {
                break;
            }
        }
        for c in 0..chunks {
            // Reads a chunk itself while the next one to take is not ready.
            let Some(reads) = queue.take(c, &read) else {
                return;
            };
            take(reads);
        }
    });
}

/// Starts the `n`th worker (from 1) in `scope`; an error when the system
/// cannot make one more thread.
fn spawn_reader<'scope>(
    scope: &'scope std::thread::Scope<'scope, '_>,
    n: usize,
    worker: impl FnOnce() + Send + 'scope,
) -> io::Result<()> {
    #[cfg(test)]
    if SPAWNABLE.get().is_some_and(|most| n > most) {
        return Err(io::ErrorKind::WouldBlock.into());
    }
    #[cfg(not(test))]
    let _ = n;
    std::thread::Builder::new()
        .spawn_scoped(scope, worker)
        .map(drop)
}

/// Read chunks and who reads which: any thread claims the next unread
/// chunk (so one that is held up holds up only the chunk it is reading),
/// at most [`AHEAD`] chunks past the one the main thread takes next; the
/// main thread takes them in order.
struct Queue {
    state: Mutex<QueueState>,
    changed: Condvar,
}

/// Chunks read and not taken yet, by number.
type Reads = Vec<(usize, Read)>;

struct QueueState {
    chunks: usize,
    /// The next chunk to claim.
    next: usize,
    /// The next chunk to take.
    taken: usize,
    done: BTreeMap<usize, Reads>,
    /// A worker panicked.
    failed: bool,
}

impl Queue {
    fn new(chunks: usize) -> Self {
        Self {
            state: Mutex::new(QueueState {
                chunks,
                next: 0,
                taken: 0,
                done: BTreeMap::new(),
                failed: false,
            }),
            changed: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A worker's next chunk to read, once it is within [`AHEAD`] of the
    /// next one to take; `None` when all are claimed (or a worker failed).
    fn claim(&self) -> Option<usize> {
        let mut state = self.lock();
        loop {
            if state.failed || state.next >= state.chunks {
                return None;
            }
            if state.next < state.taken + AHEAD {
                state.next += 1;
                return Some(state.next - 1);
            }
            state = self
                .changed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    fn done(&self, c: usize, reads: Reads) {
        self.lock().done.insert(c, reads);
        self.changed.notify_all();
    }

    /// Chunk `c` (the next in order), reading unclaimed chunks with `read`
    /// while it is not ready; `None` when a worker failed.
    fn take(&self, c: usize, read: &impl Fn(usize) -> Reads) -> Option<Reads> {
        let mut state = self.lock();
        loop {
            if let Some(reads) = state.done.remove(&c) {
                state.taken = c + 1;
                drop(state);
                self.changed.notify_all();
                return Some(reads);
            }
            if state.failed {
                return None;
            }
            if state.next < state.chunks && state.next < state.taken + AHEAD {
                let mine = state.next;
                state.next += 1;
                drop(state);
                let reads = read(mine);
                state = self.lock();
                state.done.insert(mine, reads);
                continue;
            }
            state = self
                .changed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// Fails the [`Queue`] when dropped by a panicking thread, so no other
/// thread waits for the chunk it was reading (or for it to take one).
struct FailOnPanic<'a>(&'a Queue);

impl Drop for FailOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.lock().failed = true;
            self.0.changed.notify_all();
        }
    }
}

/// How many threads read `todo` runs (the main thread and workers): the
/// main thread alone below [`PARALLEL_AT`], else one per core, at most
/// [`MOST_READERS`].
fn readers(todo: usize) -> usize {
    #[cfg(test)]
    if let Some(n) = READERS.get() {
        return n;
    }
    if todo < PARALLEL_AT {
        return 1;
    }
    std::thread::available_parallelism().map_or(1, |n| n.get().min(MOST_READERS))
}

#[cfg(test)]
thread_local! {
    /// Tests: how many threads (this one among them) this thread's
    /// listings read with, whatever the number of runs.
    pub(super) static READERS: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

#[cfg(test)]
thread_local! {
    /// Tests: how many workers this thread's listings can start before
    /// the system refuses one more thread.
    static SPAWNABLE: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A worker that cannot be started (the system out of threads) once
    /// others run: the listing goes on with fewer readers, every chunk
    /// taken in order, instead of a panic that left the started workers
    /// waiting (and the listing hung) for a thread that never took a chunk.
    #[test]
    fn a_reader_thread_that_cannot_be_started_leaves_its_chunks_to_the_others() {
        for (readers, spawnable) in [(4, 1), (2, 0), (4, 2)] {
            SPAWNABLE.set(Some(spawnable));
            let mut taken = Vec::new();
            in_order(
                readers,
                100,
                |c| vec![(c, Read::Skip)],
                |reads| taken.extend(reads.iter().map(|r| r.0)),
            );
            SPAWNABLE.set(None);
            assert_eq!(taken, (0..100).collect::<Vec<_>>(), "{readers} readers");
        }
    }

    #[test]
    fn chunks_are_taken_in_order_whoever_reads_them() {
        for readers in [1, 2, 3, 5] {
            let mut taken = Vec::new();
            let read = |c: usize| {
                // Uneven work, so chunks are done out of order.
                let mut sum = 0u64;
                for i in 0..(c % 7) * 20_000 {
                    sum = std::hint::black_box(sum.wrapping_add(i as u64));
                }
                std::hint::black_box(sum);
                vec![(c, Read::Skip)]
            };
            in_order(readers, 300, read, |reads| {
                taken.extend(reads.iter().map(|r| r.0))
            });
            assert_eq!(taken, (0..300).collect::<Vec<_>>(), "{readers} readers");
        }
    }

    /// The point of the readers: while one thread is held up reading a
    /// chunk, another reads the next. Chunk 0's read waits (10 s at most)
    /// for chunk 1 to be read by another thread; one thread alone would
    /// wait it out.
    #[test]
    fn a_chunk_held_up_does_not_hold_up_the_next() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let second_read_meanwhile = AtomicBool::new(false);
        let first_done = AtomicBool::new(false);
        let read = |c: usize| {
            if c == 0 {
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
                while !second_read_meanwhile.load(Ordering::SeqCst)
                    && std::time::Instant::now() < deadline
                {
                    std::thread::yield_now();
                }
                first_done.store(true, Ordering::SeqCst);
            } else if c == 1 && !first_done.load(Ordering::SeqCst) {
                second_read_meanwhile.store(true, Ordering::SeqCst);
            }
            vec![(c, Read::Skip)]
        };
        let mut taken = Vec::new();
        in_order(2, 4, read, |reads| taken.extend(reads.iter().map(|r| r.0)));
        assert_eq!(taken, [0, 1, 2, 3]);
        assert!(
            second_read_meanwhile.load(Ordering::SeqCst),
            "chunk 1 was read only after chunk 0"
        );
    }

    #[test]
    fn a_reader_that_panics_ends_the_listing_instead_of_leaving_the_others_waiting() {
        for (readers, bad) in [(2, 0), (2, 7), (3, 40), (4, 99)] {
            let ended = std::panic::catch_unwind(|| {
                let read = |c: usize| {
                    assert!(c != bad, "chunk {c} unreadable");
                    Vec::new()
                };
                in_order(readers, 100, read, |_| {});
            });
            assert!(ended.is_err(), "{readers} readers, chunk {bad}");
        }
    }
}
