//! The listing index: `<root>/listing-index/finished-runs`, the rendered
//! `list --all` rows of finished runs whose listing facts are frozen, so a
//! full listing reads one file instead of every run's `status.json`.
//!
//! A row is used only while its run still looks exactly as when the row
//! was rendered: the run directory passes the same checks as a live read,
//! one `fstatat` of `status.json` matches the [`Stamp`] recorded when the
//! status was read, and the frozen fan-out counts still hold (the same
//! `stat`s a live listing makes). Anything else — a new, changed, missing,
//! active or unfrozen run — is read live as before, and the index is
//! rewritten (atomically, 0600 in a 0700 directory) when rows were added,
//! dropped or replaced. The index is a cache: a missing, truncated, corrupt
//! or foreign-version file, or one rendered for another runs directory,
//! `$HOME` or renderer, is ignored and rebuilt, never an error.
//!
//! The file lives beside `async-subagent-runs/`, not in it, so the
//! reference (which takes every directory there for a run) never meets it.
//! It holds what `list --all` prints for those runs and nothing more: no
//! task text (a status never holds any).
//!
//! Format (version 1, UTF-8): the line `subagents-listing-index 1`; a JSON
//! header line `{"runsDir", "home", "renderer", "rows"}`; per row, sorted
//! by run directory name, a JSON line (name, stamp, frozen fan-out facts,
//! sort rank and time, hidden, session, `text`: the byte length of the
//! block) followed by the block and a newline; then `end <fnv-1a 64 of
//! everything before, 16 hex digits>`. A reader that does not know the
//! version on the first line ignores the file; a writer of another version
//! replaces it.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use atomic_file::read::Stamp;
use serde::{Deserialize, Serialize};

use crate::Result;
use crate::layout::{Layout, files};
use crate::list::{
    FrozenFanout, ListOptions, RunSummary, Scan, UnreadableRun, keep, run_names, state_rank,
};

/// The index directory under the root.
pub const INDEX_DIR: &str = "listing-index";
/// The index file in [`INDEX_DIR`].
pub const INDEX_FILE: &str = "finished-runs";
/// The format version this build reads and writes.
pub const VERSION: u32 = 1;
/// The first line of a version-1 index.
const MAGIC: &str = "subagents-listing-index 1\n";
/// The largest index read (100,000 rows take ~40 MiB).
const INDEX_LIMIT: u64 = 256 * 1024 * 1024;

/// A status changed within this long before a listing started is read live
/// and not indexed (see [`settled`]).
pub const SETTLE_NS: i128 = 2_000_000_000;

/// `<root>/listing-index/finished-runs`.
pub fn index_path(layout: &Layout) -> PathBuf {
    layout.root().join(INDEX_DIR).join(INDEX_FILE)
}

/// What a text listing needs besides [`ListOptions`].
pub struct TextOptions<'a> {
    /// `$HOME`, shortened to `~` in paths.
    pub home: Option<&'a Path>,
    /// The wall clock at the start of the listing (see [`SETTLE_NS`]).
    pub started: SystemTime,
}

/// A full listing as text blocks (one per run, lines joined by `\n`), in
/// listing order.
#[derive(Debug, Default)]
pub struct TextListing {
    index: String,
    fresh: String,
    blocks: Vec<Block>,
    /// Sessions of the listed runs.
    pub sessions: BTreeSet<String>,
    /// Runs that could not be read, by name.
    pub unreadable: Vec<UnreadableRun>,
    /// Repairs that could not be written, one line each.
    pub skipped_repairs: Vec<String>,
    /// Rows taken from the index (the rest were read live).
    pub indexed: usize,
}

#[derive(Debug)]
enum Block {
    Index(Range<usize>),
    Fresh(Range<usize>),
}

impl TextListing {
    /// The blocks, in listing order.
    pub fn blocks(&self) -> impl ExactSizeIterator<Item = &str> {
        self.blocks.iter().map(|b| match b {
            Block::Index(r) => &self.index[r.clone()],
            Block::Fresh(r) => &self.fresh[r.clone()],
        })
    }
}

/// The lines of one run's block, as `list` prints them.
pub fn render(summary: &RunSummary, now: u64, home: Option<&Path>) -> String {
    crate::format::run_lines(summary, now, home).join("\n")
}

/// A [`Stamp`] as the index stores it: `[dev, ino, size, mode, uid,
/// mtime s, mtime ns, ctime s, ctime ns]`.
type StampRow = (u64, u64, u64, u32, u32, i64, i64, i64, i64);

fn stamp_row(s: &Stamp) -> StampRow {
    let (m, c) = (s.mtime, s.ctime);
    (s.dev, s.ino, s.size, s.mode, s.uid, m.0, m.1, c.0, c.1)
}

fn row_stamp(r: StampRow) -> Stamp {
    Stamp {
        dev: r.0,
        ino: r.1,
        size: r.2,
        mode: r.3,
        uid: r.4,
        mtime: (r.5, r.6),
        ctime: (r.7, r.8),
    }
}

/// One row's JSON line.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RowHead<'a> {
    #[serde(borrow)]
    name: Cow<'a, str>,
    stamp: StampRow,
    fanout: FrozenFanout,
    rank: u8,
    sort_time: u64,
    hidden: bool,
    #[serde(borrow)]
    session: Option<Cow<'a, str>>,
    text: usize,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Header<'a> {
    #[serde(borrow)]
    runs_dir: Cow<'a, str>,
    #[serde(borrow)]
    home: Option<Cow<'a, str>>,
    #[serde(borrow)]
    renderer: Cow<'a, str>,
    rows: usize,
}

/// FNV-1a, 64 bits: the index's checksum and the renderer's fingerprint.
#[derive(Clone, Copy)]
struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }

    fn update(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// Identifies the code that renders rows: the sources of the renderer and
/// of what feeds it, and the crate version. A build whose rendering differs
/// never takes another build's rows.
fn renderer() -> String {
    let mut h = Fnv::new();
    for source in [
        env!("CARGO_PKG_VERSION"),
        include_str!("format.rs"),
        include_str!("list.rs"),
        include_str!("model.rs"),
        include_str!("list_index.rs"),
    ] {
        h.update(source.as_bytes());
        h.update(&[0]);
    }
    format!("{:016x}", h.0)
}

/// Nanoseconds since the epoch.
fn nanos(t: SystemTime) -> i128 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as i128,
        Err(e) => -(e.duration().as_nanos() as i128),
    }
}

/// Whether a status read with `stamp` may be indexed. A later change of the
/// file is seen by comparing stamps only if it cannot leave the stamp as it
/// was: every write, `chmod` or rename onto the name sets the change time of
/// the inode that ends up there to the kernel's clock at that moment, and
/// userspace cannot set it back. That clock is coarse (a timer tick; whole
/// seconds on some file systems), so a status changed in the same tick as
/// the read that recorded it — e.g. rewritten in place or renamed over
/// twice (reusing the inode number) by a live pi-subagents within a few
/// milliseconds — could keep the same stamp. Only a status whose change
/// time lies at least [`SETTLE_NS`] before the listing started (and so
/// before the read) is indexed: any change after the read then carries a
/// later change time than the one recorded. (A wall clock stepped back by
/// more than that could defeat it; the row would then be wrong until the
/// status changes again.)
fn settled(stamp: &Stamp, started: i128) -> bool {
    stamp.ctime_ns() + SETTLE_NS <= started
}

/// The parsed index: its text (checksum verified) and a cursor over rows.
struct Parsed {
    text: String,
    at: usize,
    left: usize,
    /// Where the trailer starts: the rows must end exactly there.
    end: usize,
}

/// One indexed row: where its record (head line, block, newline) and its
/// block lie in the index text.
struct Row<'a> {
    head: RowHead<'a>,
    record: Range<usize>,
    block: Range<usize>,
}

impl Parsed {
    /// The index at `path` when it is version 1, intact, and rendered for
    /// `runs_dir`, `home` and this renderer.
    fn read(path: &Path, runs_dir: &str, home: Option<&str>, renderer: &str) -> Option<Self> {
        let bytes = atomic_file::read::read_file_capped(path, INDEX_LIMIT).ok()?;
        let text = String::from_utf8(bytes).ok()?;
        let body = text.strip_prefix(MAGIC)?;
        let trailer = body.strip_suffix('\n')?.rfind('\n')? + 1;
        let sum = body[trailer..]
            .strip_prefix("end ")?
            .strip_suffix('\n')
            .and_then(|h| u64::from_str_radix(h, 16).ok())?;
        let end = MAGIC.len() + trailer;
        let mut h = Fnv::new();
        h.update(&text.as_bytes()[..end]);
        if h.0 != sum {
            return None;
        }
        let line = body[..trailer].find('\n')?;
        let header: Header<'_> = serde_json::from_str(&body[..line]).ok()?;
        let ours = header.runs_dir == runs_dir
            && header.home.as_deref() == home
            && header.renderer == renderer;
        if !ours {
            return None;
        }
        let (at, left) = (MAGIC.len() + line + 1, header.rows);
        Some(Self {
            text,
            at,
            left,
            end,
        })
    }

    /// Whether every row was read and they ended where the trailer starts.
    fn read_through(&self) -> bool {
        self.left == 0 && self.at == self.end
    }

    /// The next row, or `None` at the end or at a malformed record (the
    /// rest is then read live).
    fn next_row(&mut self) -> Option<Row<'_>> {
        if self.left == 0 {
            return None;
        }
        let start = self.at;
        let parsed = self.text[start..].find('\n').and_then(|line| {
            let head: RowHead<'_> = serde_json::from_str(&self.text[start..start + line]).ok()?;
            let block = start + line + 1..start + line + 1 + head.text;
            let whole = self.text.get(block.clone()).is_some()
                && self.text.as_bytes().get(block.end) == Some(&b'\n');
            whole.then_some((head, block))
        });
        let Some((head, block)) = parsed else {
            // Malformed: the rest is read live and the index rewritten.
            self.left = 0;
            self.end = usize::MAX;
            return None;
        };
        self.at = block.end + 1;
        self.left -= 1;
        Some(Row {
            head,
            record: start..block.end + 1,
            block,
        })
    }
}

/// A record of the index being written.
enum Record {
    /// Copied from the old index.
    Kept(Range<usize>),
    /// Rendered in this listing.
    New(Range<usize>),
}

/// `list --all` as text: rows of finished runs from the index where they
/// still hold, every other run read live (and reconciled when
/// `options.reconcile`), sorted as the reference sorts. Rewrites the index
/// when it gained, lost or replaced rows; a failed write is ignored (the
/// next listing reads those runs live again).
pub fn list_text(
    layout: &Layout,
    options: &ListOptions<'_>,
    text: &TextOptions<'_>,
) -> Result<TextListing> {
    let names = run_names(layout)?;
    let mut out = TextListing::default();
    let Some(scan) = Scan::open(layout) else {
        return Ok(out);
    };
    let runs_dir = layout.runs_dir();
    let home = text.home.map(|h| h.to_str());
    // Paths that are not UTF-8 cannot be recorded in the header: no index.
    let keys = match (runs_dir.to_str(), home) {
        (Some(dir), None) => Some((dir, None)),
        (Some(dir), Some(Some(home))) => Some((dir, Some(home))),
        _ => None,
    };
    let renderer = renderer();
    let path = index_path(layout);
    let mut parsed = keys.and_then(|(dir, home)| Parsed::read(&path, dir, home, &renderer));
    let mut changed = parsed.is_none();
    let started = nanos(text.started);
    let mut records = Vec::new();
    let mut keyed: Vec<(u8, std::cmp::Reverse<u64>, Block)> = Vec::new();
    // Rows come sorted by name, as `names` do: one pass over both.
    let mut pending = next_pending(&mut parsed);
    for name in names {
        let dir = layout.run_dir(&name);
        match scan.check_dir(layout, &name) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => {
                out.unreadable.push(UnreadableRun::new(&name, &dir, &e));
                continue;
            }
        }
        while pending.as_ref().is_some_and(|p| p.name < name) {
            changed = true;
            pending = next_pending(&mut parsed);
        }
        if let Some(row) = pending.take_if(|p| p.name == name) {
            pending = next_pending(&mut parsed);
            let rel = format!("{name}/{}", files::STATUS);
            let same = scan.runs.stamp(&rel).is_ok_and(|s| s == row.stamp);
            if same && row.fanout.is_current(&dir, Some((&scan, &name))) {
                out.indexed += 1;
                records.push(Record::Kept(row.record));
                if !row.hidden && session_kept(row.session.as_deref(), options) {
                    if let Some(session) = row.session {
                        out.sessions.insert(session);
                    }
                    let time = std::cmp::Reverse(row.sort_time);
                    keyed.push((row.rank, time, Block::Index(row.block)));
                }
                continue;
            }
            changed = true;
        }
        let scanned = match scan.load_checked(layout, &name, options, &mut out.skipped_repairs) {
            Ok(Some(scanned)) => scanned,
            Ok(None) => continue,
            Err(e) => {
                out.unreadable.push(UnreadableRun::new(&name, &dir, &e));
                continue;
            }
        };
        let summary = scanned.summary;
        let block = render(&summary, options.now, text.home);
        let indexable = scanned
            .from_status_alone
            .filter(|(stamp, _)| keys.is_some() && settled(stamp, started))
            .filter(|_| {
                // A row that shows a time relative to now is never indexed.
                render(&summary, 0, text.home) == block
                    && render(&summary, u64::MAX, text.home) == block
            });
        let kept = keep(&summary, options);
        let start = out.fresh.len();
        if let Some((stamp, fanout)) = indexable {
            let head = RowHead {
                name: Cow::Borrowed(&name),
                stamp: stamp_row(&stamp),
                fanout,
                rank: state_rank(&summary.status),
                sort_time: summary.status.sort_time(),
                hidden: summary.status.display_dismissed_at.is_some(),
                session: summary.status.session_id.as_deref().map(Cow::Borrowed),
                // A hidden row is never shown: its block is not kept.
                text: if summary.status.display_dismissed_at.is_some() {
                    0
                } else {
                    block.len()
                },
            };
            let line = serde_json::to_string(&head).unwrap_or_default();
            out.fresh.push_str(&line);
            out.fresh.push('\n');
            changed = true;
            let at = out.fresh.len();
            if head.text == block.len() {
                out.fresh.push_str(&block);
            }
            out.fresh.push('\n');
            records.push(Record::New(start..out.fresh.len()));
            if kept {
                keyed.push(keyed_row(&summary, Block::Fresh(at..at + block.len())));
                note_session(&mut out.sessions, &summary);
            }
            continue;
        }
        if kept {
            out.fresh.push_str(&block);
            keyed.push(keyed_row(&summary, Block::Fresh(start..out.fresh.len())));
            note_session(&mut out.sessions, &summary);
        }
    }
    if pending.is_some() || parsed.as_ref().is_some_and(|p| !p.read_through()) {
        // Rows of runs that are gone, or a malformed tail.
        changed = true;
    }
    let old = parsed.map(|p| p.text).unwrap_or_default();
    if changed && let Some((dir, home)) = keys {
        let had_index = !old.is_empty();
        if had_index || !records.is_empty() {
            let _ = write_index(&path, dir, home, &renderer, &records, &old, &out.fresh);
        }
    }
    // Stable: runs of equal rank and time stay in name order.
    keyed.sort_by_key(|(rank, time, _)| (*rank, *time));
    if let Some(limit) = options.limit {
        keyed.truncate(limit);
    }
    out.blocks = keyed.into_iter().map(|(_, _, b)| b).collect();
    out.index = old;
    Ok(out)
}

/// An indexed row met on the way, owned (the index text is borrowed only
/// while parsing it).
struct Pending {
    name: String,
    stamp: Stamp,
    fanout: FrozenFanout,
    record: Range<usize>,
    block: Range<usize>,
    rank: u8,
    sort_time: u64,
    hidden: bool,
    session: Option<String>,
}

fn next_pending(parsed: &mut Option<Parsed>) -> Option<Pending> {
    let Row {
        head,
        record,
        block,
    } = parsed.as_mut()?.next_row()?;
    Some(Pending {
        name: head.name.into_owned(),
        stamp: row_stamp(head.stamp),
        fanout: head.fanout,
        record,
        block,
        rank: head.rank,
        sort_time: head.sort_time,
        hidden: head.hidden,
        session: head.session.map(Cow::into_owned),
    })
}

fn keyed_row(summary: &RunSummary, block: Block) -> (u8, std::cmp::Reverse<u64>, Block) {
    let rank = state_rank(&summary.status);
    (rank, std::cmp::Reverse(summary.status.sort_time()), block)
}

fn note_session(sessions: &mut BTreeSet<String>, summary: &RunSummary) {
    if let Some(session) = &summary.status.session_id
        && !sessions.contains(session)
    {
        sessions.insert(session.clone());
    }
}

/// [`keep`]'s session filter for a row that is not hidden.
fn session_kept(session: Option<&str>, options: &ListOptions<'_>) -> bool {
    options
        .session
        .as_deref()
        .is_none_or(|s| s.is_empty() || session == Some(s))
}

fn write_index(
    path: &Path,
    runs_dir: &str,
    home: Option<&str>,
    renderer: &str,
    records: &[Record],
    old: &str,
    fresh: &str,
) -> atomic_file::Result<()> {
    let header = Header {
        runs_dir: Cow::Borrowed(runs_dir),
        home: home.map(Cow::Borrowed),
        renderer: Cow::Borrowed(renderer),
        rows: records.len(),
    };
    let header = serde_json::to_string(&header).unwrap_or_default();
    atomic_file::write_private_streamed(path, |out| {
        let mut h = Fnv::new();
        let mut put = |bytes: &[u8]| {
            h.update(bytes);
            out.write_all(bytes)
        };
        put(MAGIC.as_bytes())?;
        put(header.as_bytes())?;
        put(b"\n")?;
        for record in records {
            match record {
                Record::Kept(r) => put(old[r.clone()].as_bytes())?,
                Record::New(r) => put(fresh[r.clone()].as_bytes())?,
            }
        }
        let sum = h.0;
        writeln!(out, "end {sum:016x}")
    })
}

#[cfg(test)]
mod tests;
