//! The listing index: `<root>/listing-index/finished-runs-v2`, the rendered
//! `list --all` rows of finished runs whose listing facts are frozen, so a
//! full listing reads one file instead of every run's `status.json`.
//!
//! A row is used only while its run still looks exactly as when the row
//! was rendered: the run directory passes the same checks as a live read,
//! one `fstatat` of `status.json` matches the [`Stamp`] recorded when the
//! status was read, the persisted fan-out descriptor was not replaced since
//! the freeze, and one `fstatat` of the budget's claims directory matches
//! the stamp recorded when the frozen counts were last seen to hold (an
//! added claim changes the directory's times). Anything else — a new,
//! changed, missing, active or unfrozen run — is read live as before, and
//! the index is rewritten (atomically, 0600 in a 0700 directory) when rows
//! were added, dropped or replaced. The index is a cache: a missing,
//! truncated, corrupt, misordered or foreign-version file, or one rendered
//! for another runs directory, `$HOME` or renderer, is ignored and rebuilt,
//! never an error.
//!
//! Memory does not grow with the index: its rows are kept in listing order,
//! so a listing reads the file twice in blocks — once to check every row
//! (keeping a few numbers per row that holds), once to copy the rows to
//! the output, merged with the few rows read live — and a rewrite streams
//! it a third time into the new file. Nor does it grow with the rows read
//! live: past [`SPILL_AT`] bytes their text (blocks and new records) goes
//! to an unnamed scratch file in the index directory (see `Spill`), and
//! only a few numbers per row stay in memory, so the first listing of a
//! large history (no index yet, or one written by another build) holds no
//! more than a warm one. A listing that wrote the index shows the rows it
//! wrote from the new file, in chunks (when the file at the path is still
//! the one written: its length and checksum line), not with one read of
//! the scratch file per row.
//!
//! The file lives beside `async-subagent-runs/`, not in it, so the
//! reference (which takes every directory there for a run) never meets it.
//! It holds what `list --all` prints for those runs and nothing more: no
//! task text (a status never holds any).
//!
//! Format (version 2, UTF-8): the line `subagents-listing-index 2`; a JSON
//! header line `{"runsDir", "home", "renderer", "rows"}`; per row, in
//! listing order (state rank, then newest first, then run directory name),
//! a JSON line (name, stamp, frozen fan-out facts, claims directory stamp,
//! sort rank and time, hidden, session, `text`: the byte length of the
//! block) followed by the block and a newline; then `end <checksum of
//! everything before, 16 hex digits>` (see `Sum`). Version 1 (rows in
//! name order, no claims stamp) lived in `finished-runs`; each version has
//! its own file name, so builds of either version never read the other's
//! rows, and a reader that does not know the version on the first line
//! ignores the file.

use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use atomic_file::read::Stamp;
use serde::{Deserialize, Serialize};

use crate::list::{
    Alone, FrozenFanout, ListOptions, RunSummary, Scan, UnreadableRun, run_names, state_rank,
};
use status::Result;
use status::layout::{Layout, files};

/// The index directory under the root.
pub(crate) const INDEX_DIR: &str = "listing-index";
/// The index file in [`INDEX_DIR`] (one name per format version).
pub(crate) const INDEX_FILE: &str = "finished-runs-v2";
/// The format version this build reads and writes.
pub const VERSION: u32 = 2;
/// The first line of a version-2 index.
const MAGIC: &str = "subagents-listing-index 2\n";
/// The longest header or row line read; a longer row is never written.
const LINE_LIMIT: usize = 1 << 20;
/// The longest block read; a longer one is never written.
const BLOCK_LIMIT: usize = 16 << 20;
/// How much of the index is read at once.
const CHUNK: usize = 256 << 10;
/// How much text of runs read live a listing holds in memory before it
/// moves it to a scratch file (see `Spill`).
pub const SPILL_AT: usize = 1 << 20;

/// A status changed within this long before a listing started is read live
/// and not indexed (see [`settled`]).
pub(crate) const SETTLE_NS: i128 = 2_000_000_000;

/// `<root>/listing-index/finished-runs-v2`.
pub fn index_path(layout: &Layout) -> PathBuf {
    layout.root().join(INDEX_DIR).join(INDEX_FILE)
}

/// What a text listing needs besides [`ListOptions`].
pub struct TextOptions<'a> {
    /// `$HOME`, shortened to `~` in paths.
    pub home: Option<&'a Path>,
    /// The wall clock at the start of the listing: a status changed less
    /// than 2 s before it is read live and not indexed.
    pub started: SystemTime,
}

/// A full listing as text blocks (one per run, lines joined by `\n`),
/// streamed in listing order by [`TextListing::for_each_block`].
#[derive(Debug, Default)]
pub struct TextListing {
    /// Sessions of the listed runs.
    pub sessions: BTreeSet<String>,
    /// Runs that could not be read, by name.
    pub unreadable: Vec<UnreadableRun>,
    /// Repairs that could not be written, one line each.
    pub skipped_repairs: Vec<String>,
    /// Rows taken from the index (the rest were read live).
    pub indexed: usize,
    names: Vec<String>,
    /// The index as checked (the same file even if replaced since).
    index: Option<(File, PathBuf)>,
    kept: Vec<Row>,
    live: Vec<Row>,
    spill: Spill,
    len: usize,
}

/// A row and its place in the listing: for a row of the index that still
/// holds, where its record lies in the index; for a run read live, where
/// its text lies in the [`Spill`] — its new record when it is indexed
/// (`head > 0`), else its block alone.
#[derive(Debug)]
struct Row {
    rank: u8,
    time: u64,
    /// Index into the sorted run names.
    name: u32,
    /// Where its record (head line, block, newline) or lone block starts.
    at: u64,
    /// The head line's length with its newline (0: a lone block).
    head: u32,
    block: u32,
    shown: bool,
    /// Its record lies in the index (`at` is its place there), not in the
    /// spill: a row of the index, or a live row whose record a listing
    /// wrote and reads back (see [`TextListing::reread`]).
    in_index: bool,
}

impl Row {
    fn record(&self) -> Range<u64> {
        self.at..self.block().end + 1
    }

    fn block(&self) -> Range<u64> {
        let start = self.at + u64::from(self.head);
        start..start + u64::from(self.block)
    }

    /// Whether a live row has a new index record.
    fn indexed(&self) -> bool {
        self.head > 0
    }

    fn key(&self) -> Key {
        (self.rank, Reverse(self.time), self.name)
    }
}

/// Listing order: state rank, newest first, then name (names are indices
/// into the sorted names, so their order is the names' order).
type Key = (u8, Reverse<u64>, u32);

/// A row to emit, from the old index or from the spill.
enum Item<'a> {
    Kept(&'a Row),
    Live(&'a Row),
}

/// `a` and `b` (each in listing order) merged into listing order.
fn merged<'a>(
    a: impl Iterator<Item = &'a Row>,
    b: impl Iterator<Item = &'a Row>,
) -> impl Iterator<Item = Item<'a>> {
    let (mut a, mut b) = (a.peekable(), b.peekable());
    std::iter::from_fn(move || match (a.peek(), b.peek()) {
        (Some(k), Some(l)) if k.key() < l.key() => a.next().map(Item::Kept),
        (Some(_), Some(_)) | (None, Some(_)) => b.next().map(Item::Live),
        (Some(_), None) => a.next().map(Item::Kept),
        (None, None) => None,
    })
}

impl TextListing {
    /// How many blocks the listing shows.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it shows none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Calls `f` with every block, in listing order: rows of the index are
    /// read from it in chunks, so memory does not grow with the rows. The
    /// index is only ever replaced by a rename, so the file checked is the
    /// file read here; one that fails to read back as checked (changed in
    /// place by another program) ends the listing with an error.
    pub fn for_each_block<E: From<status::Error>>(
        &self,
        mut f: impl FnMut(&str) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E> {
        let mut chunks = self.index.as_ref().map(|(file, _)| Chunks::new(file));
        let mut buf = Vec::new();
        let shown_kept = self.kept.iter().filter(|k| k.shown);
        let shown_live = self.live.iter().filter(|l| l.shown);
        for item in merged(shown_kept, shown_live).take(self.len) {
            match item {
                Item::Live(l) if !l.in_index => f(self.spill.text(l.block(), &mut buf)?)?,
                Item::Kept(k) | Item::Live(k) => {
                    let (read, path) = (chunks.as_mut(), self.index.as_ref().map(|i| &i.1));
                    let (Some(chunks), Some(path)) = (read, path) else {
                        continue;
                    };
                    let bytes = chunks
                        .get(k.block())
                        .map_err(|e| crate::io_err("read the listing index", path, e))?;
                    let text = std::str::from_utf8(bytes).map_err(|e| {
                        let e = io::Error::new(io::ErrorKind::InvalidData, e);
                        crate::io_err("read the listing index", path, e)
                    })?;
                    f(text)?;
                }
            }
        }
        Ok(())
    }

    /// Every block, collected (tests and snapshots; a listing streams them).
    pub fn blocks(&self) -> Result<Vec<String>> {
        let mut out = Vec::new();
        self.for_each_block(|b| {
            out.push(b.to_owned());
            Ok::<(), status::Error>(())
        })?;
        Ok(out)
    }
}

/// Ranges of a file read in increasing order, [`CHUNK`] bytes at a time.
struct Chunks<'a> {
    file: &'a File,
    buf: Vec<u8>,
    start: u64,
    len: usize,
}

impl<'a> Chunks<'a> {
    fn new(file: &'a File) -> Self {
        Self {
            file,
            buf: Vec::new(),
            start: 0,
            len: 0,
        }
    }

    fn get(&mut self, range: Range<u64>) -> io::Result<&[u8]> {
        let end = self.start + self.len as u64;
        if range.start < self.start || range.end > end {
            let want = CHUNK.max((range.end - range.start) as usize);
            self.buf.resize(want, 0);
            let mut filled = 0;
            while filled < want {
                match self
                    .file
                    .read_at(&mut self.buf[filled..], range.start + filled as u64)
                {
                    Ok(0) => break,
                    Ok(n) => filled += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            (self.start, self.len) = (range.start, filled);
            if (filled as u64) < range.end - range.start {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
        let from = (range.start - self.start) as usize;
        Ok(&self.buf[from..from + (range.end - range.start) as usize])
    }
}

/// The text of the runs a listing reads live (their blocks, and their new
/// index records), addressed by offset as if in one file: held in memory
/// up to [`SPILL_AT`] bytes (a warm listing reads few runs live and never
/// goes further), then moved to an unnamed private file in the index
/// directory ([`atomic_file::scratch_private`]) and appended there in
/// [`CHUNK`]s. So a listing that reads every run live holds a few numbers
/// per run, not its text; the file goes with the listing (or its process).
/// Where no scratch file can be made or written (a read-only root, a full
/// disk) the rest of the text stays in memory, as it always did.
#[derive(Debug, Default)]
struct Spill {
    /// Text not in the file (all of it while there is none).
    held: Vec<u8>,
    /// The scratch file and how much of the text it holds.
    file: Option<(File, u64)>,
    /// Where the scratch file goes; `None` once it failed.
    dir: Option<PathBuf>,
}

impl Spill {
    fn new(dir: PathBuf) -> Self {
        Self {
            dir: Some(dir),
            ..Self::default()
        }
    }

    /// How much of the text is in the file.
    fn flushed(&self) -> u64 {
        self.file.as_ref().map_or(0, |f| f.1)
    }

    /// The offset the next byte pushed gets.
    fn len(&self) -> u64 {
        self.flushed() + self.held.len() as u64
    }

    fn push(&mut self, bytes: &[u8]) {
        self.held.extend_from_slice(bytes);
        let limit = if self.file.is_some() { CHUNK } else { SPILL_AT };
        if self.held.len() < limit {
            return;
        }
        if self.file.is_none()
            && let Some(dir) = &self.dir
        {
            match atomic_file::scratch_private(dir) {
                Ok(file) => self.file = Some((file, 0)),
                Err(_) => self.dir = None,
            }
        }
        self.flush();
        if self.held.is_empty() && self.held.capacity() > 2 * CHUNK {
            self.held = Vec::with_capacity(2 * CHUNK);
        }
    }

    /// Moves the held text to the scratch file, unless there is none or it
    /// failed (then the text stays held).
    fn flush(&mut self) {
        let Some((file, len)) = &mut self.file else {
            return;
        };
        if self.dir.is_none() || self.held.is_empty() {
            return;
        }
        match file.write_all_at(&self.held, *len) {
            Ok(()) => {
                *len += self.held.len() as u64;
                self.held.clear();
            }
            Err(_) => self.dir = None,
        }
    }

    /// The text at `range`: from memory, or read from the file into `buf`.
    fn text<'a>(&'a self, range: Range<u64>, buf: &'a mut Vec<u8>) -> Result<&'a str> {
        let flushed = self.flushed();
        let read = |e| {
            let dir = self.dir.as_deref().unwrap_or(Path::new(INDEX_DIR));
            crate::io_err("read the listing's scratch file in", dir, e)
        };
        let held = |r: Range<u64>| {
            let r = (r.start - flushed) as usize..(r.end - flushed) as usize;
            self.held
                .get(r)
                .ok_or_else(|| read(io::ErrorKind::UnexpectedEof.into()))
        };
        let bytes = match &self.file {
            Some((file, _)) if range.start < flushed => {
                // A record may straddle the end of the file after a failed write.
                let split = range.end.min(flushed);
                buf.resize((split - range.start) as usize, 0);
                file.read_exact_at(buf, range.start).map_err(read)?;
                if range.end > flushed {
                    buf.extend_from_slice(held(flushed..range.end)?);
                }
                &buf[..]
            }
            _ => held(range)?,
        };
        std::str::from_utf8(bytes).map_err(|e| read(io::Error::new(io::ErrorKind::InvalidData, e)))
    }
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
    /// The claims directory's stamp (a run with a budget only).
    #[serde(deserialize_with = "Option::deserialize")]
    claims: Option<StampRow>,
    rank: u8,
    sort_time: u64,
    hidden: bool,
    // Required (null for none), as every key: a row without it is damage,
    // not a run without a session that a session filter would then drop.
    #[serde(borrow, deserialize_with = "Option::deserialize")]
    session: Option<Cow<'a, str>>,
    text: usize,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Header<'a> {
    #[serde(borrow)]
    runs_dir: Cow<'a, str>,
    #[serde(borrow, deserialize_with = "Option::deserialize")]
    home: Option<Cow<'a, str>>,
    #[serde(borrow)]
    renderer: Cow<'a, str>,
    rows: usize,
}

/// The index's checksum: FNV-1a's multiply over 8-byte little-endian words
/// (the last zero-padded) with the high half folded in after each, then the
/// length. A changed word always changes it (each step is a bijection of
/// the state); it guards against damage, not against forgery.
#[derive(Clone, Copy)]
struct Sum {
    state: u64,
    tail: [u8; 8],
    held: usize,
    total: u64,
}

impl Sum {
    fn new() -> Self {
        Self {
            state: 0xcbf2_9ce4_8422_2325,
            tail: [0; 8],
            held: 0,
            total: 0,
        }
    }

    fn mix(&mut self, word: u64) {
        let h = (self.state ^ word).wrapping_mul(0x0100_0000_01b3);
        self.state = h ^ (h >> 32);
    }

    fn update(&mut self, mut bytes: &[u8]) {
        self.total += bytes.len() as u64;
        if self.held > 0 {
            let n = (8 - self.held).min(bytes.len());
            self.tail[self.held..self.held + n].copy_from_slice(&bytes[..n]);
            self.held += n;
            bytes = &bytes[n..];
            if self.held < 8 {
                return;
            }
            self.mix(u64::from_le_bytes(self.tail));
            self.held = 0;
        }
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            self.mix(u64::from_le_bytes(w.try_into().unwrap_or_default()));
        }
        let rest = words.remainder();
        self.tail[..rest.len()].copy_from_slice(rest);
        self.held = rest.len();
    }

    fn finish(mut self) -> u64 {
        if self.held > 0 {
            self.tail[self.held..].fill(0);
            self.mix(u64::from_le_bytes(self.tail));
        }
        self.mix(self.total);
        self.state
    }
}

/// Identifies the code that renders rows: the sources of the renderer and
/// of what feeds it (`status.json`'s parser is the status crate's), and the
/// crate version. A build whose rendering differs never takes another
/// build's rows.
fn renderer() -> String {
    let mut h = Sum::new();
    for source in [
        env!("CARGO_PKG_VERSION"),
        include_str!("format.rs"),
        include_str!("list.rs"),
        status::model::SOURCE,
        include_str!("list_index.rs"),
        include_str!("list_index/live.rs"),
    ] {
        h.update(source.as_bytes());
        h.update(&[0]);
    }
    format!("{:016x}", h.finish())
}

/// Nanoseconds since the epoch.
fn nanos(t: SystemTime) -> i128 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as i128,
        Err(e) => -(e.duration().as_nanos() as i128),
    }
}

/// Whether a file (or directory) stamped `stamp` may be trusted to show
/// any later change by a changed stamp. A later change is seen by comparing
/// stamps only if it cannot leave the stamp as it was: every write,
/// `chmod`, rename onto the name or (for a directory) entry added or
/// removed sets the change time of the inode to the kernel's clock at that
/// moment, and userspace cannot set it back. That clock is coarse (a timer
/// tick; whole seconds on some file systems), so a status changed in the
/// same tick as the read that recorded it — e.g. rewritten in place or
/// renamed over twice (reusing the inode number) by a live pi-subagents
/// within a few milliseconds — could keep the same stamp. Only a stamp
/// whose change time lies at least [`SETTLE_NS`] before the listing started
/// (and so before the look) is indexed: any change after the look then
/// carries a later change time than the one recorded. (A wall clock
/// stepped back by more than that could defeat it; the row would then be
/// wrong until the file changes again.)
fn settled(stamp: &Stamp, started: i128) -> bool {
    stamp.ctime_ns() + SETTLE_NS <= started
}

/// What the index is checked against.
struct Context<'a> {
    layout: &'a Layout,
    scan: &'a Scan,
    names: &'a [String],
    /// Where each name is in `names`. (Rows come in listing order, so a
    /// binary search would touch names all over memory for each row.)
    places: HashMap<&'a str, u32>,
    runs_dir: &'a str,
    home: Option<&'a str>,
    renderer: &'a str,
    session: Option<&'a str>,
}

/// The rows of an index that still hold, from one pass over it.
struct Checked {
    file: File,
    kept: Vec<Row>,
    covered: Vec<bool>,
    sessions: BTreeSet<String>,
    /// Rows in the file (all of them held when equal to `kept.len()`).
    rows: usize,
}

/// The index read in order: lines and blocks, summed, with their offsets.
struct Reader {
    inner: BufReader<File>,
    at: u64,
    sum: Sum,
}

impl Reader {
    /// The next line (with its newline) into `buf`, not summed.
    fn line(&mut self, buf: &mut Vec<u8>) -> Option<()> {
        buf.clear();
        let limit = LINE_LIMIT as u64 + 1;
        (&mut self.inner).take(limit).read_until(b'\n', buf).ok()?;
        self.at += buf.len() as u64;
        (buf.last() == Some(&b'\n')).then_some(())
    }

    /// Sums the next `n` bytes and the newline that must follow them.
    fn block(&mut self, mut n: usize) -> Option<()> {
        while n > 0 {
            let got = self.inner.fill_buf().ok()?;
            let take = got.len().min(n);
            if take == 0 {
                return None;
            }
            self.sum.update(&got[..take]);
            self.inner.consume(take);
            n -= take;
            self.at += take as u64;
        }
        let mut newline = [0u8];
        self.inner.read_exact(&mut newline).ok()?;
        self.sum.update(&newline);
        self.at += 1;
        (newline[0] == b'\n').then_some(())
    }
}

impl Checked {
    /// The index at `path`, when it is version 2, intact, in listing order
    /// and rendered for this runs directory, `$HOME` and renderer, with
    /// every row checked against its run (see the module documentation).
    fn read(path: &Path, cx: &Context<'_>) -> Option<Self> {
        let file = atomic_file::read::open_regular(path).ok()?;
        let mut reader = Reader {
            inner: BufReader::with_capacity(CHUNK, file.try_clone().ok()?),
            at: 0,
            sum: Sum::new(),
        };
        let mut line = Vec::new();
        reader.line(&mut line)?;
        (line == MAGIC.as_bytes()).then_some(())?;
        reader.sum.update(&line);
        reader.line(&mut line)?;
        reader.sum.update(&line);
        let header: Header<'_> = serde_json::from_slice(&line).ok()?;
        let ours = header.runs_dir == cx.runs_dir
            && header.home.as_deref() == cx.home
            && header.renderer == cx.renderer;
        if !ours {
            return None;
        }
        let mut checked = Self {
            file,
            kept: Vec::new(),
            covered: vec![false; cx.names.len()],
            sessions: BTreeSet::new(),
            rows: header.rows,
        };
        // The previous row's key (its name in a buffer reused row to row).
        let mut last: Option<(u8, Reverse<u64>)> = None;
        let mut last_name = String::new();
        for _ in 0..header.rows {
            let at = reader.at;
            reader.line(&mut line)?;
            reader.sum.update(&line);
            let head: RowHead<'_> = serde_json::from_slice(&line).ok()?;
            let key = (head.rank, Reverse(head.sort_time), head.name.as_ref());
            // Strictly in listing order, so no name twice.
            if last.is_some_and(|(r, t)| (r, t, last_name.as_str()) >= key) {
                return None;
            }
            (head.text <= BLOCK_LIMIT).then_some(())?;
            reader.block(head.text)?;
            checked.take(&head, at, line.len(), cx)?;
            last = Some((head.rank, Reverse(head.sort_time)));
            last_name.clear();
            last_name.push_str(&head.name);
        }
        let sum = reader.sum.finish();
        reader.line(&mut line)?;
        (line == format!("end {sum:016x}\n").as_bytes()).then_some(())?;
        reader.inner.fill_buf().ok()?.is_empty().then_some(checked)
    }

    /// Keeps a row whose run is still as the row says. `None` for a second
    /// row of one run (under another rank or time): the file is not ours.
    fn take(&mut self, head: &RowHead<'_>, at: u64, line: usize, cx: &Context<'_>) -> Option<()> {
        let Some(&i) = cx.places.get(head.name.as_ref()) else {
            return Some(());
        };
        let i = i as usize;
        if self.covered[i] {
            return None;
        }
        let name = &cx.names[i];
        if !holds(head, name, cx) {
            return Some(());
        }
        self.covered[i] = true;
        let shown = !head.hidden && session_kept(head.session.as_deref(), cx.session);
        if shown
            && let Some(session) = &head.session
            && !self.sessions.contains(session.as_ref())
        {
            self.sessions.insert(session.to_string());
        }
        self.kept.push(Row {
            rank: head.rank,
            time: head.sort_time,
            name: i as u32,
            at,
            head: line as u32,
            block: head.text as u32,
            shown,
            in_index: true,
        });
        Some(())
    }
}

/// Whether the run `name` still looks as its row says: a directory that
/// passes the live checks, the same `status.json`, the frozen fan-out
/// counts still holding.
fn holds(head: &RowHead<'_>, name: &str, cx: &Context<'_>) -> bool {
    if !matches!(cx.scan.check_dir(cx.layout, name), Ok(true)) {
        return false;
    }
    let rel = format!("{name}/{}", files::STATUS);
    let same = cx
        .scan
        .runs
        .stamp(&rel)
        .is_ok_and(|s| s == row_stamp(head.stamp));
    let claims = head.claims.map(row_stamp);
    same && head.fanout.holds_with(
        &cx.layout.run_dir(name),
        Some((cx.scan, name)),
        claims.as_ref(),
    )
}

/// `list --all` as text: rows of finished runs from the index where they
/// still hold, every other run read live (and reconciled when
/// `options.reconcile`), in the reference's order. Rewrites the index
/// when it gained, lost or replaced rows; a failed write is ignored (the
/// next listing reads those runs live again).
pub fn list_text(
    layout: &Layout,
    options: &ListOptions<'_>,
    text: &TextOptions<'_>,
) -> Result<TextListing> {
    let names = run_names(layout)?;
    let mut out = TextListing {
        spill: Spill::new(layout.root().join(INDEX_DIR)),
        ..TextListing::default()
    };
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
    let checked = keys.and_then(|(runs_dir, home)| {
        let cx = Context {
            layout,
            scan: &scan,
            names: &names,
            places: names
                .iter()
                .enumerate()
                .map(|(i, n)| (n.as_str(), i as u32))
                .collect(),
            runs_dir,
            home,
            renderer: &renderer,
            session: options.session.as_deref(),
        };
        Checked::read(&path, &cx)
    });
    let had_index = checked.is_some() || path.exists();
    let mut changed = checked.as_ref().is_none_or(|c| c.kept.len() != c.rows);
    let covered = match checked {
        Some(c) => {
            out.indexed = c.kept.len();
            out.kept = c.kept;
            out.sessions = c.sessions;
            out.index = Some((c.file, path.clone()));
            c.covered
        }
        None => vec![false; names.len()],
    };
    let live = live::Live {
        layout,
        scan: &scan,
        now: options.now,
        all: options.all,
        session: options.session.as_deref(),
        home: text.home,
        started: nanos(text.started),
        indexable: keys.is_some(),
    };
    changed |= live::read_all(&mut out, &live, options, &names, &covered);
    out.spill.flush();
    // Keys are unique (names are): no need for a stable sort's buffer.
    out.live.sort_unstable_by_key(Row::key);
    if changed && let Some((dir, home)) = keys {
        let any = !out.kept.is_empty() || out.live.iter().any(Row::indexed);
        if (had_index || any)
            && let Ok(written) = write_index(&path, dir, home, &renderer, &out)
        {
            #[cfg(test)]
            if let Some(replace) = tests::REPLACE_WRITTEN.get() {
                replace(&path);
            }
            out.reread(&path, &written);
        }
    }
    let shown =
        out.kept.iter().filter(|k| k.shown).count() + out.live.iter().filter(|l| l.shown).count();
    out.len = options.limit.map_or(shown, |limit| shown.min(limit));
    out.names = names;
    Ok(out)
}

/// The head line (with its newline) of the index record of a run read
/// live; the record goes on with the block (none when hidden: never
/// shown) and a newline. `None` when too long to index.
fn record_head(
    name: &str,
    summary: &RunSummary,
    alone: Alone,
    block: &str,
    hidden: bool,
) -> Option<String> {
    let text = if hidden { "" } else { block };
    let head = RowHead {
        name: Cow::Borrowed(name),
        stamp: stamp_row(&alone.stamp),
        fanout: alone.fanout,
        claims: alone.claims.as_ref().map(stamp_row),
        rank: state_rank(&summary.status),
        sort_time: summary.status.sort_time(),
        hidden,
        session: summary.status.session_id.as_deref().map(Cow::Borrowed),
        text: text.len(),
    };
    let mut line = serde_json::to_string(&head).ok()?;
    if line.len() >= LINE_LIMIT || text.len() > BLOCK_LIMIT {
        return None;
    }
    line.push('\n');
    Some(line)
}

/// [`crate::list::keep`]'s session filter for a row that is not hidden.
fn session_kept(session: Option<&str>, wanted: Option<&str>) -> bool {
    wanted.is_none_or(|s| s.is_empty() || session == Some(s))
}

/// Writes the index: the rows that held (copied from the old file in
/// chunks) and the new ones, merged in listing order.
fn write_index(
    path: &Path,
    runs_dir: &str,
    home: Option<&str>,
    renderer: &str,
    listing: &TextListing,
) -> atomic_file::Result<Written> {
    let new = listing.live.iter().filter(|l| l.indexed());
    let header = Header {
        runs_dir: Cow::Borrowed(runs_dir),
        home: home.map(Cow::Borrowed),
        renderer: Cow::Borrowed(renderer),
        rows: listing.kept.len() + new.clone().count(),
    };
    let header = serde_json::to_string(&header).unwrap_or_default();
    let mut chunks = listing.index.as_ref().map(|(file, _)| Chunks::new(file));
    let mut buf = Vec::new();
    let first = (MAGIC.len() + header.len() + 1) as u64;
    let mut trailer = String::new();
    atomic_file::write_private_streamed(path, |out| {
        let mut sum = Sum::new();
        let mut put = |bytes: &[u8]| {
            sum.update(bytes);
            out.write_all(bytes)
        };
        put(MAGIC.as_bytes())?;
        put(header.as_bytes())?;
        put(b"\n")?;
        for item in merged(listing.kept.iter(), new) {
            match item {
                Item::Kept(k) => match chunks.as_mut() {
                    Some(chunks) => put(chunks.get(k.record())?)?,
                    None => return Err(io::ErrorKind::NotFound.into()),
                },
                Item::Live(l) => {
                    let record = listing.spill.text(l.record(), &mut buf);
                    put(record.map_err(io::Error::other)?.as_bytes())?;
                }
            }
        }
        trailer = format!("end {:016x}\n", sum.finish());
        out.write_all(trailer.as_bytes())
    })?;
    Ok(Written { first, trailer })
}

/// What [`write_index`] wrote: where its first record starts, and its last
/// line (the checksum of all before it).
struct Written {
    first: u64,
    trailer: String,
}

impl TextListing {
    /// After [`write_index`]: takes the rows it wrote (those of the old
    /// index and the new records) from the file at `path` from now on, so
    /// the output reads them in order in chunks instead of one read of the
    /// scratch file per row. Only when `path` is still the file written
    /// (its length and last line as written: a listing that replaced it
    /// since wrote other rows or these); otherwise nothing changes.
    fn reread(&mut self, path: &Path, written: &Written) {
        let rows_end = self.relocate(written.first, false);
        let Ok(file) = atomic_file::read::open_regular(path) else {
            return;
        };
        let end = rows_end + written.trailer.len() as u64;
        let mut last = vec![0; written.trailer.len()];
        let same = file.metadata().is_ok_and(|m| m.len() == end)
            && file.read_exact_at(&mut last, rows_end).is_ok()
            && last == written.trailer.as_bytes();
        if !same {
            return;
        }
        self.relocate(written.first, true);
        self.index = Some((file, path.to_path_buf()));
    }

    /// Where each row written to a new index starts in it, its records
    /// following `first` in listing order (as [`write_index`] wrote them),
    /// set when `apply`; returns where the records end.
    fn relocate(&mut self, first: u64, apply: bool) -> u64 {
        let mut at = first;
        let (mut k, mut l) = (0, 0);
        loop {
            while self.live.get(l).is_some_and(|r| !r.indexed()) {
                l += 1;
            }
            let kept = match (self.kept.get(k), self.live.get(l)) {
                (Some(a), Some(b)) => a.key() < b.key(),
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (None, None) => return at,
            };
            let row = if kept {
                k += 1;
                &mut self.kept[k - 1]
            } else {
                l += 1;
                &mut self.live[l - 1]
            };
            let len = row.record().end - row.record().start;
            if apply {
                row.at = at;
                row.in_index = true;
            }
            at += len;
        }
    }
}

mod live;

#[cfg(test)]
mod tests;
