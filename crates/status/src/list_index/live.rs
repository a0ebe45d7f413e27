//! The runs a text listing reads live (no row of the index holds for
//! them): read, rendered and taken into the listing in name order.
//!
//! A finished run whose frozen facts still hold needs nothing but its
//! status and a few `stat`s: no repair, no hook, no write. When many runs
//! are read live (the first listing of a large history) those are read and
//! rendered by one thread per core, a chunk of names at a time: the main
//! thread reads every n-th chunk itself and takes the chunks of all in
//! name order, so the listing, the index and the scratch file are what one
//! thread would make. Every other run (active, unfrozen, facts no longer
//! holding) is handed to the main thread as its parsed status and goes on
//! there as before: repairs, proofs and live fan-out counts stay on one
//! thread. Memory stays bounded: a worker is at most [`AHEAD`] chunks
//! ahead of the main thread.

use std::io;
use std::path::Path;
use std::sync::mpsc::{Receiver, sync_channel};

use atomic_file::read::Stamp;

use super::{Row, TextListing, record_head, settled};
use crate::Result;
use crate::layout::Layout;
use crate::list::{ListOptions, RunSummary, Scan, Scanned, UnreadableRun, keep_by, state_rank};
use crate::model::RunStatus;

/// How many run names a worker reads at a time.
const CHUNK_RUNS: usize = 16;
/// How many read chunks a worker may hold that the main thread has not
/// taken yet.
const AHEAD: usize = 2;
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
    Unreadable(crate::Error),
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
    let unreadable = |out: &mut TextListing, e: &crate::Error| {
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
    std::thread::scope(|s| {
        // Reader `r` reads chunks r, r + readers, ...: reader 0 is the main
        // thread, which reads its own chunks between taking the others'
        // (one thread per core, none left waiting), in order.
        let results: Vec<Receiver<Vec<(usize, Read)>>> = (1..readers)
            .map(|r| {
                let (send, results) = sync_channel(AHEAD);
                s.spawn(move || {
                    for c in (r..chunks).step_by(readers) {
                        // The main thread stopped taking: stop too.
                        if send.send(chunk(c)).is_err() {
                            return;
                        }
                    }
                });
                results
            })
            .collect();
        for c in 0..chunks {
            let reads = match c % readers {
                0 => chunk(c),
                r => match results[r - 1].recv() {
                    Ok(reads) => reads,
                    // A worker that panicked sends no more; the scope then
                    // propagates its panic once the others have stopped.
                    Err(_) => return,
                },
            };
            take_all(reads);
        }
    });
    changed
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
