//! `subagents list`: one pass over the runs that keeps a small row per run
//! (a rendered text block, or for JSON just the name of a run whose facts
//! are frozen), then prints in listing order. Memory grows with the rows,
//! never with whole statuses. `list --all` as text takes finished runs'
//! blocks from the listing index (`listing::list_index`) where they hold.

use std::collections::{BTreeSet, HashSet};
use std::io::{BufWriter, Write};

use listing::list::{Hooks, ListOptions, RunSummary, UnreadableRun, has_frozen_facts};
use status::Layout;
use status::now_ms;
use supervisor::observer;

use crate::admission;
use crate::api::{ListOutcome, ListQuery, ListSort};
use crate::error::{Error, Result};
use crate::root::home;
use crate::runs::{note_skipped, observer_options};

/// How [`stream`] writes a listing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListFormat {
    /// The pretty JSON array of `list --json` on a terminal.
    Json,
    /// The same array on one line (`list --json` on a pipe).
    CompactJson,
    /// The detailed text of `list --long`.
    Text,
}

/// The listing of `query`: active runs (or all), observed and reconciled.
pub fn collect(layout: &Layout, query: &ListQuery) -> Result<ListOutcome> {
    if query.dismissed {
        return Ok(ListOutcome {
            runs: list_dismissed(layout, query)?,
            unreadable: Vec::new(),
            warnings: Vec::new(),
        });
    }
    // The active index's runs are observed as they are listed (one read of
    // each status for both); `--all` observes them first.
    let observer = observer_options(layout);
    if query.all {
        observer::observe_active(layout, &observer);
    }
    let observe = |dir: &std::path::Path, status| {
        let observed = observer::observe_status(dir, status, &observer);
        observed.map(|s| {
            s.map(|s| crate::queue::with_position(layout, crate::executor::with_dispatch(dir, s)))
        })
    };
    let by_start = query.sort == Some(ListSort::Started);
    let budgets = fanout_budget::BudgetsRoot::resolve(&layout.fanout_budgets_dir());
    let options = ListOptions {
        all: query.all,
        session: query.session.clone(),
        // Sorted by start below, then cut.
        limit: query.limit.filter(|_| !by_start),
        reconcile: true,
        now: now_ms(),
        hooks: Hooks {
            fanout: Some(&|dir| crate::fanout::live_snapshot(&budgets, dir)),
            on_repaired: Some(&supervisor::procs::kill_step_groups),
            observe: (!query.all).then_some(&observe),
        },
    };
    let listing = listing::list::list(layout, &options)?;
    let mut warnings = Vec::new();
    note_skipped(&mut warnings, listing.skipped_repairs);
    let mut runs = listing.runs;
    if query.all {
        crate::queue::show_positions(layout, runs.iter_mut());
    }
    if by_start {
        runs.sort_by_key(|r| std::cmp::Reverse(r.status.started_at.unwrap_or(0)));
        runs.truncate(query.limit.unwrap_or(usize::MAX));
    }
    let active = runs
        .iter()
        .filter(|r| r.status.state.is_active())
        .map(|r| r.id.clone())
        .collect();
    admission::release_over(
        layout,
        runs.iter().filter_map(|r| r.status.session_id.as_deref()),
        &active,
    );
    runs.iter_mut().for_each(crate::answers::attach_preview);
    Ok(ListOutcome {
        runs,
        unreadable: listing.unreadable,
        warnings,
    })
}

/// `list --all --dismissed`: the runs `dismiss` hid, newest first.
fn list_dismissed(layout: &Layout, query: &ListQuery) -> Result<Vec<RunSummary>> {
    let hooks = Hooks {
        fanout: None,
        on_repaired: None,
        observe: None,
    };
    let now = now_ms();
    let mut runs: Vec<RunSummary> = listing::list::run_names(layout)?
        .iter()
        .filter_map(|id| {
            listing::list::load(layout, id, false, now, &hooks)
                .ok()
                .flatten()
        })
        .filter(|r| r.status.display_dismissed_at.is_some())
        .filter(|r| {
            query
                .session
                .as_deref()
                .is_none_or(|s| r.status.session_id.as_deref() == Some(s))
        })
        .collect();
    runs.sort_by_key(|r| std::cmp::Reverse(r.status.sort_time()));
    runs.truncate(query.limit.unwrap_or(usize::MAX));
    Ok(runs)
}

/// A JSON row: the whole summary of a run whose facts are live (few: the
/// active ones), or only the name of one frozen at its end, read again when
/// printed.
enum JsonRow {
    Whole(Box<RunSummary>),
    Frozen(String),
}

/// `subagents list [--all] [--session S] [--limit N] [--json]` written to
/// `out` as it is read: the pretty JSON array (`json`) or the detailed
/// text. Returns the repairs that could not be written, one line each.
pub fn stream(
    layout: &Layout,
    args: &ListQuery,
    format: ListFormat,
    out: &mut dyn Write,
) -> Result<Vec<String>> {
    let json = format != ListFormat::Text;
    if args.all {
        supervisor::observer::observe_active(layout, &crate::runs::observer_options(layout));
    }
    let mut warnings = Vec::new();
    let budgets = fanout_budget::BudgetsRoot::resolve(&layout.fanout_budgets_dir());
    let fanout = |dir: &std::path::Path| crate::fanout::live_snapshot(&budgets, dir);
    // The active index's runs are observed as they are listed (one read of
    // each status for both); `--all` observes them above.
    let observer = crate::runs::observer_options(layout);
    let observe = |dir: &std::path::Path, status| {
        let observed = supervisor::observer::observe_status(dir, status, &observer);
        observed.map(|s| {
            s.map(|s| crate::queue::with_position(layout, crate::executor::with_dispatch(dir, s)))
        })
    };
    let started = std::time::SystemTime::now();
    let now = status::now_ms();
    let options = ListOptions {
        all: args.all,
        session: args.session.clone(),
        limit: args.limit,
        reconcile: true,
        now,
        hooks: Hooks {
            fanout: Some(&fanout),
            on_repaired: Some(&supervisor::procs::kill_step_groups),
            observe: (!args.all).then_some(&observe),
        },
    };
    let mut sessions = BTreeSet::new();
    let mut active = HashSet::new();
    let mut note_session = |summary: &RunSummary| {
        if let Some(session) = &summary.status.session_id
            && !sessions.contains(session)
        {
            sessions.insert(session.clone());
        }
        if summary.status.state.is_active() {
            active.insert(summary.id.clone());
        }
    };
    let mut out = BufWriter::new(out);
    if json {
        let rows = listing::list::list_rows(layout, &options, |summary| {
            note_session(&summary);
            match summary.async_dir.file_name().and_then(|n| n.to_str()) {
                Some(name) if has_frozen_facts(&summary.status) => JsonRow::Frozen(name.to_owned()),
                _ => JsonRow::Whole(Box::new(summary)),
            }
        })?;
        note_skipped(&mut warnings, rows.skipped_repairs);
        admission::release_over(layout, sessions.iter().map(String::as_str), &active);
        let reload = Hooks {
            fanout: Some(&fanout),
            on_repaired: None,
            observe: None,
        };
        let mut unreadable = rows.unreadable;
        let mut array = JsonArray {
            started: false,
            pretty: format == ListFormat::Json,
        };
        for row in rows.rows {
            let mut summary = match row {
                JsonRow::Whole(summary) => *summary,
                JsonRow::Frozen(name) => {
                    match listing::list::load(layout, &name, false, now, &reload) {
                        Ok(Some(summary)) => summary,
                        // Gone since the first look: nothing to show.
                        Ok(None) => continue,
                        Err(e) => {
                            let dir = layout.run_dir(&name);
                            unreadable.push(UnreadableRun::new(&name, &dir, &e));
                            continue;
                        }
                    }
                }
            };
            crate::answers::attach_preview(&mut summary);
            array.push(
                &mut out,
                &serde_json::to_value(&summary).unwrap_or_default(),
            )?;
        }
        // Unreadable runs follow the readable ones as `{id, asyncDir, state: "unreadable", error}`.
        for run in &unreadable {
            array.push(&mut out, &serde_json::to_value(run).unwrap_or_default())?;
        }
        array.finish(&mut out)?;
    } else if args.all {
        // Finished runs' rows from the listing index where they still hold.
        let home = home();
        let text = listing::list_index::TextOptions {
            home: home.as_deref(),
            started,
        };
        let listing = listing::list_index::list_text(layout, &options, &text)?;
        note_skipped(&mut warnings, listing.skipped_repairs.clone());
        admission::release_finished(layout, listing.sessions.iter().map(String::as_str));
        // Streamed: the index's rows are copied out in chunks, never held.
        let mut text = TextOut::start(&mut out, "Async runs", listing.len())?;
        listing.for_each_block(|block| text.block(block))?;
        write_unreadable(&mut out, &listing.unreadable)?;
    } else {
        let home = home();
        // Every row's text goes into one buffer (one allocation that grows,
        // not one per run); rows are ranges into it.
        let mut text = String::new();
        let rows = listing::list::list_rows(layout, &options, |summary| {
            note_session(&summary);
            let start = text.len();
            for (i, line) in listing::format::run_lines(&summary, now, home.as_deref())
                .iter()
                .enumerate()
            {
                if i > 0 {
                    text.push('\n');
                }
                text.push_str(line);
            }
            start..text.len()
        })?;
        let blocks: Vec<&str> = rows.rows.iter().map(|r| &text[r.clone()]).collect();
        note_skipped(&mut warnings, rows.skipped_repairs);
        admission::release_over(layout, sessions.iter().map(String::as_str), &active);
        let heading = if args.all {
            "Async runs"
        } else {
            "Active async runs"
        };
        write_text(&mut out, heading, &blocks)?;
        write_unreadable(&mut out, &rows.unreadable)?;
    }
    out.flush().map_err(write_error)?;
    Ok(warnings)
}

fn write_error(e: std::io::Error) -> Error {
    Error::failed(format!("failed to write the listing: {e}"))
}

/// The text of `format_run_list`, written one run at a time.
fn write_text(out: &mut impl Write, heading: &str, blocks: &[&str]) -> Result {
    let mut text = TextOut::start(out, heading, blocks.len())?;
    for block in blocks {
        text.block(block)?;
    }
    Ok(())
}

/// The text of `format_run_list` for a known number of blocks, written as
/// they come.
struct TextOut<'a, W: Write> {
    out: &'a mut W,
    left: usize,
}

impl<'a, W: Write> TextOut<'a, W> {
    /// Writes the heading (or the line that says there is nothing).
    fn start(out: &'a mut W, heading: &str, blocks: usize) -> Result<Self> {
        if blocks == 0 {
            writeln!(out, "No {}.", heading.to_lowercase()).map_err(write_error)?;
        } else {
            writeln!(out, "{heading}: {blocks}").map_err(write_error)?;
        }
        Ok(Self { out, left: blocks })
    }

    fn block(&mut self, block: &str) -> Result {
        self.left = self.left.saturating_sub(1);
        // The whole listing is trimmed at its end, as the reference's is.
        let block = if self.left == 0 {
            block.trim_end()
        } else {
            block
        };
        write!(self.out, "\n{block}\n").map_err(write_error)
    }
}

fn write_unreadable(out: &mut impl Write, unreadable: &[UnreadableRun]) -> Result {
    if unreadable.is_empty() {
        return Ok(());
    }
    writeln!(out, "\nUnreadable runs: {}\n", unreadable.len()).map_err(write_error)?;
    for run in unreadable {
        writeln!(
            out,
            "- {} | unreadable | {}",
            atomic_file::escape(&run.id),
            run.error
        )
        .map_err(write_error)?;
    }
    Ok(())
}

/// A JSON array written element by element, byte for byte what
/// `serde_json::to_string_pretty` (or `to_string`) makes of the whole array.
struct JsonArray {
    started: bool,
    pretty: bool,
}

impl JsonArray {
    fn push(&mut self, out: &mut impl Write, value: &serde_json::Value) -> Result {
        if !self.pretty {
            let open: &[u8] = if self.started { b"," } else { b"[" };
            self.started = true;
            out.write_all(open).map_err(write_error)?;
            return serde_json::to_writer(&mut *out, value).map_err(|e| write_error(e.into()));
        }
        let text = serde_json::to_string_pretty(value).unwrap_or_default();
        let open: &[u8] = if self.started { b",\n" } else { b"[\n" };
        self.started = true;
        out.write_all(open).map_err(write_error)?;
        // Pretty JSON escapes newlines inside strings: every line break is
        // structure and takes the array's indentation.
        for (i, line) in text.lines().enumerate() {
            let sep = if i == 0 { "" } else { "\n" };
            write!(out, "{sep}  {line}").map_err(write_error)?;
        }
        Ok(())
    }

    fn finish(self, out: &mut impl Write) -> Result {
        let close = match (self.started, self.pretty) {
            (true, true) => "\n]",
            (true, false) => "]",
            (false, _) => "[]",
        };
        writeln!(out, "{close}").map_err(write_error)
    }
}

/// A run offered to a shell's completion of a run id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunChoice {
    /// The run id.
    pub id: String,
    /// Its active marker exists.
    pub active: bool,
    /// `<state> · <label>`, when its status could be read.
    pub help: Option<String>,
}

/// The runs a shell offers for a run id: the active ones first, then the
/// newest finished ones (at most `finished`), each group newest start first.
/// It only reads: no observation, no repair, nothing written, so a Tab
/// press changes nothing on disk.
pub fn choices(layout: &Layout, finished: usize) -> Vec<RunChoice> {
    let Ok(names) = listing::list::run_names(layout) else {
        return Vec::new();
    };
    let active_dir = layout.active_index_dir();
    let (active, done): (Vec<String>, Vec<String>) = names
        .into_iter()
        .partition(|name| active_dir.join(name).symlink_metadata().is_ok());
    let mut done: Vec<(std::time::SystemTime, String)> = done
        .into_iter()
        .map(|name| {
            let modified = std::fs::symlink_metadata(layout.run_dir(&name))
                .and_then(|m| m.modified())
                .unwrap_or(std::time::UNIX_EPOCH);
            (modified, name)
        })
        .collect();
    // Reading every status of a long history for one Tab press is too slow:
    // the directories touched last stand for the newest runs.
    done.sort_by(|a, b| b.cmp(a));
    done.truncate(finished);
    let mut choices = read_choices(layout, active, true);
    choices.extend(read_choices(
        layout,
        done.into_iter().map(|(_, name)| name).collect(),
        false,
    ));
    choices
}

fn read_choices(layout: &Layout, names: Vec<String>, active: bool) -> Vec<RunChoice> {
    let now = now_ms();
    let mut runs: Vec<(u64, RunChoice)> = names
        .into_iter()
        .map(|id| {
            let run = listing::list::load(layout, &id, false, now, &Hooks::default())
                .ok()
                .flatten();
            let started = run.as_ref().and_then(|r| r.status.started_at).unwrap_or(0);
            let help = run.map(|r| {
                format!(
                    "{} · {}",
                    listing::format::state_label(&r.status),
                    listing::format::run_label(&r.status)
                )
            });
            (started, RunChoice { id, active, help })
        })
        .collect();
    runs.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.id.cmp(&b.1.id)));
    runs.into_iter().map(|(_, choice)| choice).collect()
}
