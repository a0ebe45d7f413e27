//! `subagents top`: a live terminal view of the fleet.
//!
//! The screen is a pure function of [`App`] ([`render`]), so it is tested
//! with ratatui's `TestBackend`. The loop redraws on file events (inotify on
//! the state root, the active-run index and each active run's directory), on
//! keys, and on a one-second tick that only advances the elapsed times.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::Duration;

use crossterm::event::{Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use launcher::format::{fanout_line, shorten, spell_duration};
use launcher::{Layout, RunSummary, now_ms};
use notify::{RecursiveMode, Watcher};
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout as Split};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Text};
use ratatui::widgets::{Block, List, ListItem, ListState, Paragraph};

use launcher::api::{ListQuery, StopRequest};
use launcher::error::{Error, Exit, Result};
use launcher::service::Launcher;

/// How much of each log file the output pane reads (its end).
const TAIL_BYTES: u64 = 64 * 1024;

/// How many lines of output the panes keep (the logs view scrolls in them).
const TAIL_LINES: usize = 2000;

/// The first characters of a step's header line in the output panes.
const HEADER: &str = "── step ";

/// The runs of one session and its capacity pool.
#[derive(Debug, Clone)]
pub struct SessionGroup {
    /// The session id (`(no session)` when the run recorded none).
    pub session: String,
    /// Slots held by the session's active runs and the limit (0 =
    /// unlimited) of its pool.
    pub capacity: Option<(usize, u32)>,
    /// Slots of the pool whose holder is no active run (a finished run's
    /// slot not freed yet, an unreadable owner): occupied, but no run.
    pub idle_slots: usize,
    /// Its active runs, newest start first, then the queued ones (see
    /// [`fleet_order`]).
    pub runs: Vec<RunSummary>,
}

/// What the keys do at the moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// The fleet and the selected run's output.
    Fleet,
    /// Waiting for `y` to stop this run.
    ConfirmStop(String),
    /// The selected run's logs, full screen.
    Logs,
}

/// Everything the screen shows.
#[derive(Debug, Clone)]
pub struct App {
    /// The state root, as shown in the title.
    pub root: String,
    /// Sessions with active runs.
    pub sessions: Vec<SessionGroup>,
    /// The selected run's id.
    pub selected: Option<String>,
    /// The end of the selected run's output, one entry per line.
    pub tail: Vec<String>,
    /// Key mode.
    pub mode: Mode,
    /// The last thing that happened (a stop started or ended).
    pub message: Option<String>,
    /// The clock of this frame (ms).
    pub now: u64,
    /// The logs view's distance from the end of the output, in lines
    /// (0 follows the end).
    pub scroll: usize,
    /// The logs view's height in lines (a page).
    pub page: usize,
    /// The ids of the last fleet that had any run, in screen order: where a
    /// run that left stood, even across an empty refresh.
    pub shown: Vec<String>,
}

impl App {
    fn runs(&self) -> impl Iterator<Item = &RunSummary> {
        self.sessions.iter().flat_map(|s| s.runs.iter())
    }

    fn selected_run(&self) -> Option<&RunSummary> {
        let id = self.selected.as_deref()?;
        self.runs().find(|r| r.id == id)
    }

    fn ids(&self) -> Vec<String> {
        self.runs().map(|r| r.id.clone()).collect()
    }

    /// Shows a new fleet; the selection stays on its run, or goes to the
    /// neighbour of a run that left.
    fn show(&mut self, sessions: Vec<SessionGroup>) {
        self.sessions = sessions;
        let shown = std::mem::take(&mut self.shown);
        self.fix_selection(&shown);
        let now = self.ids();
        self.shown = if now.is_empty() { shown } else { now };
    }

    /// Keeps the selection on a run that still exists; a run that left
    /// (`before` is the order it was listed in) hands it to the next run
    /// after it that is still listed, else the one before it.
    fn fix_selection(&mut self, before: &[String]) {
        if self.selected_run().is_some() {
            return;
        }
        let now = self.ids();
        // A listing that came back empty (a refresh that failed under load)
        // says nothing about the selected run: keep it for the next one.
        if now.is_empty() {
            return;
        }
        let at = before
            .iter()
            .position(|id| Some(id.as_str()) == self.selected.as_deref());
        let neighbour = at.and_then(|i| {
            let after = before[i + 1..].iter();
            let earlier = before[..i].iter().rev();
            after.chain(earlier).find(|id| now.contains(id)).cloned()
        });
        self.selected = neighbour.or_else(|| now.first().cloned());
    }

    /// Moves the logs view `lines` up (towards the start) or down.
    fn scroll_by(&mut self, lines: usize, up: bool) {
        let most = self.tail.len().saturating_sub(self.page);
        self.scroll = if up {
            self.scroll.saturating_add(lines).min(most)
        } else {
            self.scroll.saturating_sub(lines)
        };
    }

    fn move_selection(&mut self, down: bool) {
        let ids: Vec<&str> = self.runs().map(|r| r.id.as_str()).collect();
        let at = ids
            .iter()
            .position(|id| Some(*id) == self.selected.as_deref());
        let next = match (at, down) {
            (None, _) => 0,
            (Some(i), true) => (i + 1).min(ids.len().saturating_sub(1)),
            (Some(i), false) => i.saturating_sub(1),
        };
        self.selected = ids.get(next).map(|id| (*id).to_owned());
    }
}

/// Draws one frame.
pub fn render(frame: &mut Frame<'_>, app: &App) {
    let [title, body, footer] = Split::vertical([
        Constraint::Length(1),
        Constraint::Min(3),
        Constraint::Length(1),
    ])
    .areas(frame.area());
    let count = app.runs().count();
    let plural = if count == 1 { "" } else { "s" };
    frame.render_widget(
        Line::from(format!(
            "subagents top · {count} active run{plural} · {}",
            app.root
        ))
        .style(Style::new().add_modifier(Modifier::BOLD)),
        title,
    );
    if app.mode == Mode::Logs {
        render_output(frame, app, body, "Logs");
    } else {
        let [runs, output] =
            Split::vertical([Constraint::Percentage(60), Constraint::Percentage(40)]).areas(body);
        render_runs(frame, app, runs);
        render_output(frame, app, output, "Output");
    }
    frame.render_widget(Line::from(footer_text(app)), footer);
}

fn footer_text(app: &App) -> String {
    let keys = match &app.mode {
        Mode::ConfirmStop(id) => {
            return format!("Stop run {id}? y to stop, any other key to keep it");
        }
        Mode::Logs => "k/j PgUp/PgDn g/G scroll  esc back  q quit",
        Mode::Fleet => "↑/↓ select  s stop  l logs  q quit",
    };
    match &app.message {
        Some(message) => format!("{keys}  · {message}"),
        None => keys.to_owned(),
    }
}

fn render_runs(frame: &mut Frame<'_>, app: &App, area: ratatui::layout::Rect) {
    let mut items = Vec::new();
    let mut selected_item = None;
    for group in &app.sessions {
        items.push(
            ListItem::new(Line::from(session_line(group)))
                .style(Style::new().add_modifier(Modifier::DIM)),
        );
        for run in &group.runs {
            if app.selected.as_deref() == Some(run.id.as_str()) {
                selected_item = Some(items.len());
            }
            items.push(ListItem::new(Text::from(run_lines(run, app.now))));
        }
    }
    if items.is_empty() {
        items.push(ListItem::new("No active runs."));
    }
    let list = List::new(items)
        .block(Block::bordered().title("Runs"))
        .highlight_style(Style::new().add_modifier(Modifier::REVERSED))
        .highlight_symbol("> ");
    let mut state = ListState::default().with_selected(selected_item);
    frame.render_stateful_widget(list, area, &mut state);
}

fn session_line(group: &SessionGroup) -> String {
    let capacity = match group.capacity {
        Some((used, 0)) => format!("capacity {used} used, no limit"),
        Some((used, limit)) => format!("capacity {used}/{limit} used"),
        None => "capacity unavailable".to_owned(),
    };
    let idle = match group.idle_slots {
        0 => String::new(),
        1 => " · 1 slot held by no active run".to_owned(),
        n => format!(" · {n} slots held by no active run"),
    };
    format!(
        "Session {} · {capacity}{idle}",
        launcher::escape(&group.session)
    )
}

/// The run line, one line per step, and the fan-out line.
fn run_lines(run: &RunSummary, now: u64) -> Vec<Line<'static>> {
    let s = &run.status;
    let steps = s.steps();
    let done = steps
        .iter()
        .filter(|st| matches!(st.status.as_str(), "complete" | "completed"))
        .count();
    let elapsed = s
        .started_at
        .map(|start| spell_duration(now.saturating_sub(start)))
        .unwrap_or_else(|| "-".to_owned());
    let cwd = s.cwd.as_deref().unwrap_or("");
    // A single step has no line of its own: its quiet time is the run's.
    let quiet = match steps {
        [only] => quiet_for(run, 0, only, now),
        _ => String::new(),
    };
    // Recorded strings are escaped: one run is its own rows, nothing more.
    let mut lines = vec![Line::from(launcher::escape(&format!(
        "{}  {}  {}  {done}/{} done  {elapsed}  {}{quiet}",
        run.id,
        launcher::format::state_with_queue(s),
        launcher::format::run_label(s),
        steps.len(),
        shorten(Path::new(cwd), launcher::root::home().as_deref()),
    )))];
    if steps.len() > 1 {
        for (i, step) in steps.iter().enumerate() {
            lines.push(Line::from(launcher::escape(&format!(
                "    {}. {}  {}  {}{}",
                i + 1,
                launcher::format::step_label(step),
                launcher::format::step_state(step, s.state),
                step_time(step, now),
                quiet_for(run, i, step, now),
            ))));
        }
    }
    if let Some(place) = launcher::format::dispatch_line(s) {
        lines.push(Line::from(launcher::escape(&format!(
            "    Executor: {place}"
        ))));
    }
    for line in agent_lines(s) {
        lines.push(Line::from(launcher::escape(&line)));
    }
    if let Some(fanout) = fanout_line(s.run_fanout_budget.as_ref()) {
        lines.push(Line::from(format!("    {fanout}")));
    }
    lines
}

/// A run's agent lines: why it did not complete; while it runs, its CLI
/// session and the latest activity.
fn agent_lines(s: &launcher::RunStatus) -> Vec<String> {
    let text = |fields: &serde_json::Map<String, serde_json::Value>, key: &str| {
        fields.get(key).and_then(|v| v.as_str()).map(str::to_owned)
    };
    let mut lines = Vec::new();
    if !s.state.is_active() && s.state != launcher::RunState::Complete {
        if let Some(reason) = text(&s.extra, "reason") {
            lines.push(format!("    reason: {reason}"));
        }
        return lines;
    }
    if let Some(id) = text(&s.extra, "agentSessionId") {
        lines.push(format!("    session {id}"));
    }
    let activity = s
        .steps()
        .iter()
        .filter(|st| st.status == "running")
        .find_map(|st| text(&st.extra, "lastActivity"));
    if let Some(activity) = activity {
        lines.push(format!("    doing: {activity}"));
    }
    lines
}

fn step_time(step: &launcher::Step, now: u64) -> String {
    match (step.duration_ms, step.started_at) {
        (Some(ms), _) => spell_duration(ms),
        (None, Some(start)) if step.status == "running" => {
            spell_duration(now.saturating_sub(start))
        }
        _ => String::new(),
    }
}

/// `  · last output 12.0s ago` for a running step that printed something:
/// from its logs' modification time, else the step's `lastActivityAt`.
fn quiet_for(run: &RunSummary, i: usize, step: &launcher::Step, now: u64) -> String {
    if step.status != "running" {
        return String::new();
    }
    let logged = ["stdout", "stderr"]
        .iter()
        .filter_map(|stream| {
            let path = run.async_dir.join(format!("external-{i}.{stream}.log"));
            let meta = std::fs::symlink_metadata(path).ok()?;
            let at = meta.modified().ok()?.duration_since(std::time::UNIX_EPOCH);
            (meta.len() > 0).then_some(at.ok()?.as_millis() as u64)
        })
        .max();
    let recorded = ["lastOutputAt", "lastActivityAt"]
        .iter()
        .find_map(|key| step.extra.get(*key).and_then(|v| v.as_u64()));
    match logged.or(recorded) {
        Some(at) => format!(
            "  · last output {} ago",
            spell_duration(now.saturating_sub(at))
        ),
        None => String::new(),
    }
}

/// The lines the output pane shows: the end of the output, or in the logs
/// view `app.scroll` lines before it; when the first line shown is inside a
/// step's output, that step's header is shown above it.
fn visible_lines(app: &App, height: usize, scrolled: bool) -> Vec<&str> {
    let tail = &app.tail;
    let scroll = if scrolled { app.scroll } else { 0 };
    let end = tail
        .len()
        .saturating_sub(scroll)
        .max(height.min(tail.len()));
    let mut start = end.saturating_sub(height);
    let is_header = |i: usize| tail[i].starts_with(HEADER);
    let mut lines = Vec::new();
    // The header takes the first row: the line under it must be output too.
    let inside = start > 0 && start + 1 < end && !is_header(start) && !is_header(start + 1);
    if let Some(at) = (0..start).rev().find(|i| inside && is_header(*i)) {
        lines.push(tail[at].as_str());
        start += 1;
    }
    lines.extend(tail[start..end].iter().map(String::as_str));
    lines
}

fn render_output(frame: &mut Frame<'_>, app: &App, area: ratatui::layout::Rect, what: &str) {
    let title = match &app.selected {
        Some(id) => format!("{what} of {id}"),
        None => what.to_owned(),
    };
    let height = area.height.saturating_sub(2) as usize;
    let text: Vec<Line<'_>> = visible_lines(app, height, what == "Logs")
        .into_iter()
        .map(Line::from)
        .collect();
    frame.render_widget(
        Paragraph::new(text).block(Block::bordered().title(title)),
        area,
    );
}

/// The end of every step's stdout and stderr under a header per step
/// (numbered as `status` numbers them), at most `max` lines.
pub fn tail_lines(run: &RunSummary, max: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let steps = run.status.steps();
    for (i, step) in steps.iter().enumerate() {
        for stream in ["stdout", "stderr"] {
            let path = run.async_dir.join(format!("external-{i}.{stream}.log"));
            let text = read_end(&path);
            if text.trim().is_empty() {
                continue;
            }
            let label = if stream == "stderr" { " (stderr)" } else { "" };
            lines.push(format!(
                "{HEADER}{} {}{label} ──",
                i + 1,
                launcher::escape(&launcher::format::step_label(step))
            ));
            lines.extend(text.lines().map(launcher::escape));
        }
    }
    if lines.is_empty() {
        lines.push(match &run.status.error {
            Some(error) => format!("(no output) {}", launcher::escape(error)),
            None => "(no output yet)".to_owned(),
        });
    }
    let start = lines.len().saturating_sub(max);
    lines.split_off(start)
}

fn read_end(path: &Path) -> String {
    let Some(mut file) = launcher::process::open_regular(path) else {
        return String::new();
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let from = len.saturating_sub(TAIL_BYTES);
    if file.seek(SeekFrom::Start(from)).is_err() {
        return String::new();
    }
    let mut bytes = Vec::new();
    let _ = file.take(TAIL_BYTES).read_to_end(&mut bytes);
    let text = String::from_utf8_lossy(&bytes).into_owned();
    if from > 0 {
        // Drop the partial first line.
        return text
            .split_once('\n')
            .map(|(_, r)| r.to_owned())
            .unwrap_or_default();
    }
    text
}

/// Reads the active runs grouped by session, with each session's capacity.
pub fn load_fleet(layout: &Layout) -> Result<Vec<SessionGroup>> {
    let launcher = Launcher::new(layout.clone(), Default::default());
    let listing = launcher.list(&ListQuery::default())?;
    let limit = std::env::var("SUBAGENTS_MAX_ACTIVE")
        .ok()
        .and_then(|v| v.parse().ok());
    let pools = launcher::admission::pools(layout);
    let mut groups: BTreeMap<String, Vec<RunSummary>> = BTreeMap::new();
    for run in listing.runs {
        let session = run
            .status
            .session_id
            .clone()
            .unwrap_or_else(|| "(no session)".to_owned());
        groups.entry(session).or_default().push(run);
    }
    groups.values_mut().for_each(|runs| fleet_order(runs));
    let active: Vec<String> = groups.values().flatten().map(|r| r.id.clone()).collect();
    Ok(groups
        .into_iter()
        .map(|(session, runs)| {
            let snapshot = pools.count(&session, limit).ok();
            // Only the slots of active runs count: a slot a finished run
            // still holds is no run of the fleet.
            let held = snapshot.as_ref().map_or(0, |snap| {
                let holders = snap.slots.iter().filter_map(|s| s.run_id.as_ref());
                holders.filter(|id| active.contains(id)).count()
            });
            SessionGroup {
                session,
                capacity: snapshot.as_ref().map(|snap| (held, snap.limit)),
                idle_slots: snapshot.map_or(0, |snap| snap.used.saturating_sub(held)),
                runs,
            }
        })
        .collect())
}

/// Puts a session's runs in the order `top` shows them: started runs newest
/// start first, then the queued ones, ties by id. The listing's own order
/// (by last update) would move a row each time its run writes its status, a
/// stopped run included while it finishes, and with it what "the next row"
/// is; a start time is written once.
pub fn fleet_order(runs: &mut [RunSummary]) {
    runs.sort_by(|a, b| {
        let key = |r: &RunSummary| {
            (
                r.status.started_at.is_none(),
                std::cmp::Reverse(r.status.started_at),
            )
        };
        key(a).cmp(&key(b)).then_with(|| a.id.cmp(&b.id))
    });
}

enum Msg {
    Input(Event),
    Changed,
    Tick,
    Stopped(String),
}

/// Restores the terminal however `top` ends.
struct TerminalGuard;

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        let _ = crossterm::terminal::disable_raw_mode();
        let _ = crossterm::execute!(
            std::io::stdout(),
            crossterm::terminal::LeaveAlternateScreen,
            crossterm::cursor::Show
        );
    }
}

/// `subagents top`.
pub fn command(layout: &Layout) -> Result {
    if !std::io::stdout().is_terminal() || !std::io::stdin().is_terminal() {
        return Err(Error::new(
            Exit::Usage,
            "top needs a terminal (use `subagents list` in scripts)",
        ));
    }
    let failed = |e: std::io::Error| Error::failed(format!("failed to set up the terminal: {e}"));
    crossterm::terminal::enable_raw_mode().map_err(failed)?;
    let _guard = TerminalGuard;
    crossterm::execute!(
        std::io::stdout(),
        crossterm::terminal::EnterAlternateScreen,
        crossterm::cursor::Hide
    )
    .map_err(failed)?;
    let backend = ratatui::backend::CrosstermBackend::new(std::io::stdout());
    let mut terminal = ratatui::Terminal::new(backend).map_err(failed)?;
    let (tx, rx) = channel();
    spawn_input(tx.clone());
    spawn_tick(tx.clone());
    let watched = tx.clone();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        // Our own reads are events too; they must not wake us.
        if !matches!(&event, Ok(e) if matches!(e.kind, notify::EventKind::Access(_))) {
            let _ = watched.send(Msg::Changed);
        }
    })
    .ok();
    let mut app = App {
        root: layout.root().display().to_string(),
        sessions: Vec::new(),
        selected: None,
        tail: Vec::new(),
        mode: Mode::Fleet,
        message: None,
        now: now_ms(),
        scroll: 0,
        page: 10,
        shown: Vec::new(),
    };
    let mut watching: Vec<PathBuf> = Vec::new();
    let mut dirty = true;
    loop {
        if dirty {
            app.show(load_fleet(layout)?);
            rewatch(&mut watcher, layout, &app, &mut watching);
            dirty = false;
        }
        app.now = now_ms();
        let rows = terminal.size().map(|s| s.height as usize).unwrap_or(40);
        // The logs view's pane: the screen less title, footer and borders.
        app.page = rows.saturating_sub(4).max(1);
        app.tail = app
            .selected_run()
            .map(|run| tail_lines(run, TAIL_LINES))
            .unwrap_or_default();
        app.scroll = app.scroll.min(app.tail.len().saturating_sub(app.page));
        terminal
            .draw(|frame| render(frame, &app))
            .map_err(|e| Error::failed(format!("failed to draw: {e}")))?;
        let Ok(msg) = rx.recv() else {
            return Ok(());
        };
        for msg in std::iter::once(msg).chain(drain(&rx)) {
            match msg {
                Msg::Changed => dirty = true,
                Msg::Tick => {}
                Msg::Stopped(line) => {
                    app.message = Some(line);
                    dirty = true;
                }
                Msg::Input(Event::Key(key)) if key.kind != KeyEventKind::Release => {
                    if handle_key(&mut app, key, layout, &tx) {
                        return Ok(());
                    }
                }
                Msg::Input(_) => {}
            }
        }
    }
}

fn drain(rx: &Receiver<Msg>) -> Vec<Msg> {
    std::iter::from_fn(|| rx.try_recv().ok()).collect()
}

/// Applies one key; true to quit.
fn handle_key(app: &mut App, key: KeyEvent, layout: &Layout, tx: &Sender<Msg>) -> bool {
    let ctrl_c = key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c');
    if let Mode::ConfirmStop(id) = &app.mode {
        if key.code == KeyCode::Char('y') {
            app.message = Some(format!("stopping {id}…"));
            spawn_stop(layout, id, tx.clone());
        } else {
            app.message = Some(format!("kept {id}"));
        }
        app.mode = Mode::Fleet;
        return ctrl_c;
    }
    match key.code {
        KeyCode::Char('q') => return true,
        _ if ctrl_c => return true,
        KeyCode::Esc if app.mode == Mode::Logs => app.mode = Mode::Fleet,
        KeyCode::Char('l') | KeyCode::Enter if app.mode == Mode::Logs => app.mode = Mode::Fleet,
        KeyCode::Char('l') | KeyCode::Enter if app.selected.is_some() => {
            app.mode = Mode::Logs;
            app.scroll = 0;
        }
        KeyCode::Up | KeyCode::Char('k') if app.mode == Mode::Logs => app.scroll_by(1, true),
        KeyCode::Down | KeyCode::Char('j') if app.mode == Mode::Logs => app.scroll_by(1, false),
        KeyCode::PageUp if app.mode == Mode::Logs => app.scroll_by(app.page, true),
        KeyCode::PageDown if app.mode == Mode::Logs => app.scroll_by(app.page, false),
        KeyCode::Char('g') | KeyCode::Home if app.mode == Mode::Logs => {
            app.scroll_by(usize::MAX, true)
        }
        KeyCode::Char('G') | KeyCode::End if app.mode == Mode::Logs => app.scroll = 0,
        KeyCode::Up | KeyCode::Char('k') => app.move_selection(false),
        KeyCode::Down | KeyCode::Char('j') => app.move_selection(true),
        KeyCode::Char('s') => {
            if let Some(id) = app.selected.clone() {
                app.mode = Mode::ConfirmStop(id);
            }
        }
        _ => {}
    }
    false
}

/// `Launcher::stop` on a thread of its own, so the screen stays live
/// meanwhile; the line `subagents stop` prints, or its error.
fn spawn_stop(layout: &Layout, id: &str, tx: Sender<Msg>) {
    let launcher = Launcher::new(layout.clone(), Default::default());
    let request = StopRequest {
        run: id.to_owned(),
        reason: None,
    };
    std::thread::spawn(move || {
        let line = match launcher.stop(&request) {
            Ok(outcome) if outcome.was_over => format!(
                "{} was already over ({}); nothing to stop",
                outcome.run.id, outcome.run.status.state
            ),
            Ok(outcome) => format!("{} {}", outcome.run.id, outcome.run.status.state),
            Err(e) => format!("failed to stop {}: subagents: {}", request.run, e.message),
        };
        let _ = tx.send(Msg::Stopped(line));
    });
}

fn spawn_input(tx: Sender<Msg>) {
    std::thread::spawn(move || {
        while let Ok(event) = crossterm::event::read() {
            if tx.send(Msg::Input(event)).is_err() {
                return;
            }
        }
    });
}

fn spawn_tick(tx: Sender<Msg>) {
    std::thread::spawn(move || {
        while tx.send(Msg::Tick).is_ok() {
            std::thread::sleep(Duration::from_secs(1));
        }
    });
}

/// Watches the root, the runs directory, the active index and every active
/// run's directory; directories of runs that ended are dropped.
fn rewatch(
    watcher: &mut Option<notify::RecommendedWatcher>,
    layout: &Layout,
    app: &App,
    watching: &mut Vec<PathBuf>,
) {
    let Some(watcher) = watcher else { return };
    let mut wanted = vec![
        layout.root().to_path_buf(),
        layout.runs_dir(),
        layout.active_index_dir(),
    ];
    wanted.extend(app.runs().map(|r| r.async_dir.clone()));
    for dir in watching.iter().filter(|d| !wanted.contains(d)) {
        let _ = watcher.unwatch(dir);
    }
    watching.retain(|d| wanted.contains(d));
    for dir in wanted {
        // A directory that does not exist yet is retried on the next reload.
        if !watching.contains(&dir) && watcher.watch(&dir, RecursiveMode::NonRecursive).is_ok() {
            watching.push(dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use launcher::{RunState, RunStatus, Step};
    use ratatui::Terminal;
    use ratatui::backend::TestBackend;
    use serde_json::json;

    const NOW: u64 = 1_800_000_000_000;

    fn step(agent: &str, state: &str, started: Option<u64>, duration: Option<u64>) -> Step {
        Step {
            agent: agent.into(),
            status: state.into(),
            started_at: started,
            duration_ms: duration,
            ..Step::default()
        }
    }

    fn fleet() -> App {
        let mut chain = RunStatus::new("20261130-chain", RunState::Running);
        chain.mode = Some("chain".into());
        chain.session_id = Some("review".into());
        chain.started_at = Some(NOW - 75_000);
        chain.cwd = Some("/srv/project".into());
        let mut writer = step("writer", "running", Some(NOW - 63_000), None);
        writer
            .extra
            .insert("lastActivityAt".into(), json!(NOW - 9_000));
        let mut checker = step("checker", "pending", None, None);
        checker.extra.insert("name".into(), json!("final check"));
        chain.steps = Some(vec![
            step("scout", "complete", Some(NOW - 75_000), Some(12_000)),
            writer,
            checker,
        ]);
        chain.run_fanout_budget = Some(json!({"used": 3, "limit": 64, "remaining": 61}));
        let mut single = RunStatus::new("20261130-single", RunState::Running);
        single.mode = Some("single".into());
        single.session_id = Some("review".into());
        single.started_at = Some(NOW - 4_000);
        single.cwd = Some("/srv/other".into());
        single.steps = Some(vec![step("claude", "running", Some(NOW - 4_000), None)]);
        single
            .extra
            .insert("name".into(), json!("lint-bot nightly"));
        let mut queued = RunStatus::new("20261130-queued", RunState::Queued);
        queued.cwd = Some("/tmp".into());
        let summary = |status: RunStatus| RunSummary {
            id: status.run_id.clone(),
            async_dir: PathBuf::from("/nonexistent").join(&status.run_id),
            status,
        };
        App {
            root: "/state".into(),
            sessions: vec![
                SessionGroup {
                    session: "(no session)".into(),
                    capacity: None,
                    idle_slots: 0,
                    runs: vec![summary(queued)],
                },
                SessionGroup {
                    session: "review".into(),
                    capacity: Some((2, 4)),
                    idle_slots: 1,
                    runs: vec![summary(chain), summary(single)],
                },
            ],
            selected: Some("20261130-chain".into()),
            tail: vec![
                "── step 1 scout ──".into(),
                "found three files".into(),
                "── step 2 writer ──".into(),
                "drafting section 2".into(),
            ],
            mode: Mode::Fleet,
            message: None,
            now: NOW,
            scroll: 0,
            page: 6,
            shown: Vec::new(),
        }
    }

    fn draw(app: &App) -> Terminal<TestBackend> {
        let mut terminal = Terminal::new(TestBackend::new(80, 24)).unwrap();
        terminal.draw(|f| render(f, app)).unwrap();
        terminal
    }

    #[test]
    fn a_run_in_slurms_queue_says_where_and_why() {
        let mut queued = RunStatus::new("20261130-slurm", RunState::Queued);
        queued.extra.insert(
            "dispatch".into(),
            json!({"executor": "slurm", "jobId": "4713", "cluster": "lab", "node": null,
                   "slurmState": "PENDING", "slurmReason": "Resources"}),
        );
        let run = RunSummary {
            id: queued.run_id.clone(),
            async_dir: PathBuf::from("/nonexistent/20261130-slurm"),
            status: queued,
        };
        let text: Vec<String> = run_lines(&run, NOW).iter().map(|l| l.to_string()).collect();
        assert!(
            text.contains(&"    Executor: slurm job 4713 of lab (PENDING: Resources)".to_owned()),
            "{text:?}"
        );
    }

    #[test]
    fn renders_the_fleet() {
        insta::assert_snapshot!(draw(&fleet()).backend());
    }

    #[test]
    fn asks_before_stopping() {
        let mut app = fleet();
        app.mode = Mode::ConfirmStop("20261130-chain".into());
        insta::assert_snapshot!(draw(&app).backend());
    }

    #[test]
    fn shows_logs_full_screen() {
        let mut app = fleet();
        app.mode = Mode::Logs;
        insta::assert_snapshot!(draw(&app).backend());
    }

    /// A long output: step 1's header and 20 lines, step 2's header and 20.
    fn long_logs() -> App {
        let mut app = fleet();
        app.mode = Mode::Logs;
        app.tail = (1..=2)
            .flat_map(|step| {
                let header = format!("{HEADER}{step} worker-{step} ──");
                let lines = (1..=20).map(move |n| format!("step {step} line {n}"));
                std::iter::once(header).chain(lines)
            })
            .collect();
        app.page = 20;
        app
    }

    #[test]
    fn the_logs_view_scrolls_and_keeps_the_step_header() {
        let layout = Layout::new("/nonexistent");
        let (tx, _rx) = channel();
        let mut app = long_logs();
        let press = |app: &mut App, code: KeyCode| {
            handle_key(app, KeyEvent::from(code), &layout, &tx);
        };
        press(&mut app, KeyCode::Char('k'));
        press(&mut app, KeyCode::PageUp);
        assert_eq!(app.scroll, 21);
        insta::assert_snapshot!(draw(&app).backend());
        let shown = visible_lines(&app, 20, true);
        assert_eq!(shown[0], "── step 1 worker-1 ──");
        assert_eq!(shown[1], "step 1 line 2");
        press(&mut app, KeyCode::Char('j'));
        assert_eq!(app.scroll, 20);
        press(&mut app, KeyCode::Char('g'));
        assert_eq!(app.scroll, 22);
        assert_eq!(visible_lines(&app, 20, true)[1], "step 1 line 1");
        press(&mut app, KeyCode::PageDown);
        assert_eq!(app.scroll, 2);
        let shown = visible_lines(&app, 20, true);
        assert_eq!(shown[..2], ["step 1 line 20", "── step 2 worker-2 ──"]);
        assert_eq!(shown[19], "step 2 line 18");
        press(&mut app, KeyCode::Char('G'));
        assert_eq!(app.scroll, 0);
        let shown = visible_lines(&app, 20, true);
        assert_eq!(shown[..2], ["── step 2 worker-2 ──", "step 2 line 2"]);
        assert_eq!(shown[19], "step 2 line 20");
        // The fleet view's pane always shows the end.
        app.scroll = 5;
        assert_eq!(visible_lines(&app, 20, false)[19], "step 2 line 20");
    }

    #[test]
    fn a_run_that_left_hands_the_selection_to_its_neighbour() {
        let mut app = fleet();
        let before = app.ids();
        assert_eq!(
            before,
            ["20261130-queued", "20261130-chain", "20261130-single"]
        );
        app.sessions[1].runs.remove(0);
        app.fix_selection(&before);
        assert_eq!(app.selected.as_deref(), Some("20261130-single"));
        // The last run's neighbour is the one before it.
        let before = app.ids();
        app.sessions[1].runs.clear();
        app.fix_selection(&before);
        assert_eq!(app.selected.as_deref(), Some("20261130-queued"));
    }

    #[test]
    fn a_run_that_left_after_an_empty_refresh_still_hands_the_selection_to_its_neighbour() {
        let mut app = fleet();
        let sessions = app.sessions.clone();
        app.show(sessions.clone());
        assert_eq!(app.selected.as_deref(), Some("20261130-chain"));
        // A refresh that listed nothing, then the chain gone.
        app.show(Vec::new());
        assert_eq!(app.selected.as_deref(), Some("20261130-chain"));
        let mut without_chain = sessions;
        without_chain[1].runs.remove(0);
        app.show(without_chain);
        assert_eq!(app.selected.as_deref(), Some("20261130-single"));
    }

    #[test]
    fn the_fleet_keeps_its_order_while_its_runs_write_their_status() {
        // Start times and last updates in different orders: a stopped run
        // still finishing wrote last.
        let run = |id: &str, state, started: Option<u64>, updated: u64| {
            let mut status = RunStatus::new(id, state);
            status.started_at = started;
            status.last_update = Some(updated);
            RunSummary {
                id: id.into(),
                async_dir: PathBuf::from("/nonexistent").join(id),
                status,
            }
        };
        let mut runs = vec![
            run("queued", RunState::Queued, None, NOW - 1_000),
            run("oldest", RunState::Running, Some(NOW - 90_000), NOW - 2_000),
            run("stopping", RunState::Stopped, Some(NOW - 60_000), NOW - 500),
            run("newest", RunState::Running, Some(NOW - 30_000), NOW - 9_000),
            run("twin-b", RunState::Running, Some(NOW - 70_000), NOW - 3_000),
            run("twin-a", RunState::Running, Some(NOW - 70_000), NOW - 4_000),
        ];
        fleet_order(&mut runs);
        let ids: Vec<&str> = runs.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(
            ids,
            ["newest", "stopping", "twin-a", "twin-b", "oldest", "queued"]
        );
    }

    #[test]
    fn rows_show_the_runs_label_as_list_does() {
        let app = fleet();
        let single = &app.sessions[1].runs[1];
        let line = run_lines(single, NOW)[0].to_string();
        assert_eq!(
            line,
            "20261130-single  running  lint-bot nightly  0/1 done  4s  /srv/other"
        );
        let chain = &app.sessions[1].runs[0];
        let lines: Vec<String> = run_lines(chain, NOW)
            .iter()
            .map(|l| l.to_string())
            .collect();
        assert!(lines[0].contains("  chain ×3  "), "{lines:?}");
        assert_eq!(
            lines[2],
            "    2. writer  running  1m3s  · last output 9s ago"
        );
        assert_eq!(lines[3], "    3. final check  pending  ");
    }

    #[test]
    fn selection_moves_across_sessions_and_stays_in_range() {
        let mut app = fleet();
        app.move_selection(true);
        assert_eq!(app.selected.as_deref(), Some("20261130-single"));
        app.move_selection(true);
        assert_eq!(app.selected.as_deref(), Some("20261130-single"));
        app.move_selection(false);
        app.move_selection(false);
        app.move_selection(false);
        assert_eq!(app.selected.as_deref(), Some("20261130-queued"));
    }

    #[test]
    fn recorded_strings_are_escaped_in_rows_and_headers() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("external-0.stdout.log"), "one\n").unwrap();
        let forged = "a\n20261130-forged  complete\u{1b}[2J";
        let mut status = RunStatus::new("r", RunState::Running);
        status.cwd = Some("/srv/x\ny".into());
        status.steps = Some(vec![
            step(forged, "complete", None, None),
            step("b", "running", None, None),
        ]);
        let run = RunSummary {
            id: "r".into(),
            async_dir: dir.path().to_path_buf(),
            status,
        };
        let group = SessionGroup {
            session: "s\nforged".into(),
            capacity: None,
            idle_slots: 0,
            runs: Vec::new(),
        };
        let mut texts: Vec<String> = run_lines(&run, NOW)
            .iter()
            .map(|line| line.to_string())
            .collect();
        texts.extend(tail_lines(&run, 10));
        texts.push(session_line(&group));
        for text in &texts {
            assert!(!text.chars().any(char::is_control), "{text:?}");
        }
        assert!(
            texts.iter().any(|t| t.contains(r"a\n20261130-forged")),
            "{texts:?}"
        );
        assert_eq!(
            texts[1],
            r"    1. a\n20261130-forged  complete\u{1b}[2J  complete  "
        );
    }

    #[test]
    fn a_step_that_never_ran_is_skipped_and_durations_are_spelled_one_way() {
        let mut status = RunStatus::new("r", RunState::Stopped);
        status.started_at = Some(NOW - 5_400_000);
        status.steps = Some(vec![
            step("long", "stopped", Some(NOW - 5_400_000), Some(5_400_000)),
            step("never", "stopped", None, None),
        ]);
        let run = RunSummary {
            id: "r".into(),
            async_dir: "/nonexistent".into(),
            status,
        };
        let texts: Vec<String> = run_lines(&run, NOW)
            .iter()
            .map(|line| line.to_string())
            .collect();
        assert!(texts[0].contains("  1h30m  "), "{texts:?}");
        assert_eq!(texts[1], "    1. long  stopped  1h30m");
        assert_eq!(texts[2].trim_end(), "    2. never  skipped");
    }

    #[test]
    fn the_tail_has_a_header_per_step_and_stderr_apart() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("external-0.stdout.log"), "one\n").unwrap();
        std::fs::write(dir.path().join("external-1.stderr.log"), "oops\n").unwrap();
        let mut status = RunStatus::new("r", RunState::Running);
        status.steps = Some(vec![
            step("a", "complete", None, None),
            step("b", "running", None, None),
        ]);
        let run = RunSummary {
            id: "r".into(),
            async_dir: dir.path().to_path_buf(),
            status,
        };
        assert_eq!(
            tail_lines(&run, 10),
            ["── step 1 a ──", "one", "── step 2 b (stderr) ──", "oops"]
        );
        assert_eq!(tail_lines(&run, 1), ["oops"]);
    }
}
