//! `subagents wait`: block until runs are over, woken by file events.

use std::collections::HashSet;
use std::ops::ControlFlow;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::{Duration, Instant};

use listing::format::step_number;
use listing::list::RunSummary;
use notify::{RecursiveMode, Watcher};
use status::{Layout, RunState, now_ms};

use crate::api::{WaitOutcome, WaitRequest};
use crate::error::{DurationField, Error, ErrorKind, Result};
use crate::root::parse_duration;
use crate::runs::resolve;

/// Without events we still look this often: a runner killed with SIGKILL
/// writes nothing, and only a liveness check notices it.
const RECHECK: Duration = Duration::from_secs(1);

/// Watches `dirs` (non-recursively); the receiver gets `()` on any change.
/// When no watcher can be created, the receiver never fires and callers fall
/// back to their periodic re-check.
pub fn watch_dirs(dirs: &[PathBuf]) -> (Option<notify::RecommendedWatcher>, Receiver<()>) {
    let (tx, rx) = channel();
    (watch_dirs_into(dirs, tx), rx)
}

/// Like [`watch_dirs`], sending to `tx`.
fn watch_dirs_into(dirs: &[PathBuf], tx: Sender<()>) -> Option<notify::RecommendedWatcher> {
    let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        // Our own reads of status.json are events too (open, close-nowrite);
        // waking on them would turn every wait into a busy loop.
        if !matches!(
            event,
            Ok(notify::Event {
                kind: notify::EventKind::Access(_),
                ..
            })
        ) {
            let _ = tx.send(());
        }
    });
    let Ok(mut watcher) = watcher else {
        return None;
    };
    for dir in dirs {
        let _ = watcher.watch(dir, RecursiveMode::NonRecursive);
    }
    Some(watcher)
}

/// Wakes the waiter when a run's monitor exits. A run is settled only once
/// its monitor is gone, and a process exit is no file event: without this
/// the waiter would sleep until its periodic re-check.
/// Its threads end with it: each also polls the read end of a pipe whose
/// write end it holds, so dropping it (the wait returned, or was cancelled)
/// wakes and ends them all at once, whether or not their monitor exited.
struct MonitorWatches {
    tx: Sender<()>,
    watched: HashSet<(u32, u64)>,
    /// The monitors a thread blocks on through a pidfd.
    by_pidfd: HashSet<(u32, u64)>,
    stop: Option<(Arc<OwnedFd>, OwnedFd)>,
}

impl MonitorWatches {
    fn new(tx: Sender<()>) -> Self {
        let stop = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .ok()
            .map(|(read, write)| (Arc::new(read), write));
        Self {
            tx,
            watched: HashSet::new(),
            by_pidfd: HashSet::new(),
            stop,
        }
    }

    /// Starts watching the monitors of `runs` not watched yet.
    fn add(&mut self, runs: &[RunSummary]) {
        for monitor in runs
            .iter()
            .filter_map(|r| r.status.monitor_identity.as_ref())
        {
            let Some((stop, _)) = &self.stop else {
                // No pipe: the periodic re-check notices the exit.
                return;
            };
            let key = (monitor.pid, monitor.start_time);
            if self.watched.insert(key) && watch_exit(monitor, self.tx.clone(), stop.clone()) {
                self.by_pidfd.insert(key);
            }
        }
    }

    /// Whether the exit of a live monitor of this boot, watched here, will
    /// wake the waiter for each of `runs`: a run is settled only once its
    /// monitor is gone, so no file event of such a run needs a look sooner.
    /// A run with no monitor yet, one of another boot or machine (a Slurm
    /// job's), or one whose monitor is gone needs the directory watch.
    fn cover<'r>(&self, mut runs: impl Iterator<Item = &'r RunSummary>) -> bool {
        self.stop.is_some()
            && runs.all(|run| {
                run.status.monitor_identity.as_ref().is_some_and(|m| {
                    m.is_of_this_boot()
                        && self.by_pidfd.contains(&(m.pid, m.start_time))
                        && m.liveness() == process_identity::Liveness::Alive
                })
            })
    }
}

/// Blocks a thread on a pidfd of `process` and sends once it exits; the
/// thread also ends when `stop` hangs up (the wait is over). When the
/// recorded process is already gone, or pidfds are unavailable, it sends
/// at once (one extra look; the periodic re-check covers the rest).
/// Returns whether a thread now blocks on the process's exit.
fn watch_exit(
    process: &process_identity::ProcessIdentity,
    tx: Sender<()>,
    stop: Arc<OwnedFd>,
) -> bool {
    // A pid of another boot or machine names nothing of ours here.
    if !process.is_of_this_boot() {
        let _ = tx.send(());
        return false;
    }
    let Some(pidfd) = open_pidfd(process.pid) else {
        let _ = tx.send(());
        return false;
    };
    // Checked after opening: if the pid was recycled before pidfd_open, the
    // recorded identity no longer matches and the descriptor is not ours.
    if process.liveness() != process_identity::Liveness::Alive {
        let _ = tx.send(());
        return false;
    }
    let spawned = std::thread::Builder::new()
        .name("wait-monitor".into())
        .stack_size(64 * 1024)
        .spawn(move || {
            let mut fds = [
                nix::poll::PollFd::new(
                    std::os::fd::AsFd::as_fd(&pidfd),
                    nix::poll::PollFlags::POLLIN,
                ),
                nix::poll::PollFd::new(
                    std::os::fd::AsFd::as_fd(&*stop),
                    nix::poll::PollFlags::POLLIN,
                ),
            ];
            while let Err(nix::errno::Errno::EINTR) =
                nix::poll::poll(&mut fds, nix::poll::PollTimeout::NONE)
            {}
            let _ = tx.send(());
        });
    spawned.is_ok()
}

fn open_pidfd(pid: u32) -> Option<OwnedFd> {
    let pid = libc::pid_t::try_from(pid).ok()?;
    // SAFETY: pidfd_open(2) takes a pid and flags and returns a new descriptor.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let fd = i32::try_from(fd).ok().filter(|fd| *fd >= 0)?;
    // SAFETY: `fd` was just returned by pidfd_open and is owned by nobody else.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// What a wait reports while it blocks.
pub enum WaitEvent<'a> {
    /// A run is over (once per run, as soon as it is).
    Settled(&'a RunSummary),
    /// Some runs are still going: every run's current summary, and the time
    /// waited so far.
    Pending(&'a [RunSummary], Duration),
}

/// A `--timeout` / `timeout` value of `run`, `resume` or `wait`; a
/// malformed one is a usage mistake (exit 2). The one parser of the field.
/// `0` is no deadline, for every command alike (`None`).
pub fn parse_timeout(text: Option<&str>) -> Result<Option<Duration>> {
    let parsed = text
        .map(|t| parse_duration(t).map_err(|e| Error::bad_duration(DurationField::Timeout, e)))
        .transpose()?;
    Ok(parsed.filter(|d| !d.is_zero()))
}

/// What a wait's reporter says: keep waiting, or give up (the waiter's
/// client is gone).
pub type Keep = ControlFlow<()>;

pub use crate::api::Cancel;

/// `subagents wait` (or the MCP `wait` tool): blocks until every run is
/// over, calling `report` as runs settle and while they do not; exit 124
/// past the timeout, exit 1 when `report` breaks. The outcome holds every
/// run, complete or not.
pub fn wait(
    layout: &Layout,
    request: &WaitRequest,
    report: &mut dyn FnMut(WaitEvent<'_>) -> Keep,
) -> Result<WaitOutcome> {
    let timeout = parse_timeout(request.timeout.as_deref())?;
    if request.runs.is_empty() {
        return Err(Error::of(
            ErrorKind::NoRunNamed,
            "failed to wait: name at least one run",
        ));
    }
    let runs = wait_until(layout, &request.runs, timeout, &request.cancel, report)?;
    Ok(WaitOutcome { runs })
}

/// `<id> <state>[: <reason>][ (step N exit C)]`: what happened, and for a
/// failure why, and the failing step's exit code (or signal).
pub fn outcome_line(run: &RunSummary) -> String {
    let s = &run.status;
    let mut line = format!("{} {}", run.id, s.state);
    let failing = s
        .steps()
        .iter()
        .enumerate()
        .find(|(_, st)| st.error.is_some() || st.exit_code.is_some_and(|c| c != 0));
    // The reason the runner recorded (the agent's own words) comes first.
    let reason = s
        .extra
        .get("reason")
        .and_then(serde_json::Value::as_str)
        .or(s.error.as_deref())
        .or_else(|| failing.and_then(|(_, st)| st.error.as_deref()));
    if let Some(reason) = reason.filter(|_| s.state != RunState::Complete) {
        line.push_str(&format!(": {}", atomic_file::escape(reason)));
    }
    if let Some((i, step)) = failing.filter(|_| s.state != RunState::Complete) {
        let signal = step
            .external_process
            .as_ref()
            .and_then(|p| p.process_signal.clone());
        let end = match (signal, step.exit_code) {
            (Some(signal), _) => Some(format!("signal {signal}")),
            (None, Some(code)) => Some(format!("exit {code}")),
            _ => None,
        };
        // A reason that is the exit itself ("… exit code 3") needs no repeat.
        let repeated = |end: &str| {
            let end = end.replace("exit ", "exit code ");
            reason.is_some_and(|r| r.ends_with(&end))
        };
        if let Some(end) = end.filter(|e| !repeated(e)) {
            if s.steps().len() > 1 {
                line.push_str(&format!(" (step {} {end})", i + 1));
            } else {
                line.push_str(&format!(" ({end})"));
            }
        }
    }
    line
}

/// Longest activity a progress line shows, in characters.
const PROGRESS_ACTIVITY_CHARS: usize = 120;

/// What a running run is doing, for progress: `, 1m5s in, last output 3s
/// ago, doing: <the agent's latest activity>` (each part when known).
fn progress_detail(run: &RunSummary, now: u64) -> String {
    let s = &run.status;
    if !s.state.is_active() {
        return String::new();
    }
    let mut detail = String::new();
    if let Some(start) = s.started_at {
        let elapsed = crate::format::format_duration(now.saturating_sub(start));
        detail.push_str(&format!(", {elapsed} in"));
    }
    let step = s.current_step.and_then(|i| s.steps().get(i));
    let field = |key: &str| step.and_then(|st| st.extra.get(key));
    if let Some(at) = field("lastOutputAt").and_then(serde_json::Value::as_u64) {
        let quiet = crate::format::format_duration(now.saturating_sub(at));
        detail.push_str(&format!(", last output {quiet} ago"));
    }
    if let Some(activity) = field("lastActivity").and_then(serde_json::Value::as_str) {
        let activity = crate::format::bounded(activity, PROGRESS_ACTIVITY_CHARS);
        detail.push_str(&format!(", doing: {activity}"));
    }
    detail
}

/// Blocks until every run is terminal; exit 124 past `timeout`.
pub fn wait_for_runs(
    layout: &Layout,
    ids: &[String],
    timeout: Option<Duration>,
) -> Result<Vec<RunSummary>> {
    wait_reporting(layout, ids, timeout, &mut |_| Keep::Continue(()))
}

/// [`wait_for_runs`], calling `report` once for each run as it settles, and
/// with every run's summary on each look while some are still going.
pub fn wait_reporting(
    layout: &Layout,
    ids: &[String],
    timeout: Option<Duration>,
    report: &mut dyn FnMut(WaitEvent<'_>) -> Keep,
) -> Result<Vec<RunSummary>> {
    wait_until(layout, ids, timeout, &Cancel::default(), report)
}

/// [`wait_reporting`] that `cancel` can end from another thread.
fn wait_until(
    layout: &Layout,
    ids: &[String],
    timeout: Option<Duration>,
    cancel: &Cancel,
    report: &mut dyn FnMut(WaitEvent<'_>) -> Keep,
) -> Result<Vec<RunSummary>> {
    let ids: Vec<String> = ids
        .iter()
        .map(|id| resolve(layout, id))
        .collect::<Result<_>>()?;
    let dirs: Vec<PathBuf> = ids.iter().map(|id| layout.run_dir(id)).collect();
    let (tx, events) = channel();
    // Made only when a pidfd cannot tell us a run is over: closing an
    // inotify instance waits for a kernel grace period (about 10 ms here),
    // which a short `run --wait` would otherwise spend at its exit.
    let mut watcher = None;
    cancel.wake(tx.clone());
    let mut monitors = MonitorWatches::new(tx.clone());
    let started = Instant::now();
    let deadline = timeout.map(|t| started + t);
    let mut reported = vec![false; ids.len()];
    loop {
        if cancel.is_cancelled() {
            return Err(cancelled());
        }
        let runs = load_all(layout, &ids)?;
        monitors.add(&runs);
        for (run, done) in runs.iter().zip(reported.iter_mut()) {
            if !*done && is_settled(run) {
                *done = true;
                if report(WaitEvent::Settled(run)).is_break() {
                    return Err(cancelled());
                }
            }
        }
        // Done when every run has been reported, not when every run is
        // settled now: a monitor that exits between the two looks would
        // settle its run unreported.
        if reported.iter().all(|done| *done) {
            let mut runs = runs;
            runs.iter_mut().for_each(crate::answers::attach);
            return Ok(runs);
        }
        let unsettled = runs.iter().zip(&reported).filter(|(_, done)| !**done);
        if watcher.is_none() && !monitors.cover(unsettled.map(|(run, _)| run)) {
            watcher = watch_dirs_into(&dirs, tx.clone());
        }
        if report(WaitEvent::Pending(&runs, started.elapsed())).is_break() {
            return Err(cancelled());
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            // Every run not reported yet: a run over by its status whose
            // monitor is frozen or slow is still waited for.
            let waiting: Vec<&str> = runs
                .iter()
                .zip(&reported)
                .filter(|(_, done)| !**done)
                .map(|(r, _)| r.id.as_str())
                .collect();
            return Err(Error::of(
                ErrorKind::WaitTimedOut,
                format!("timed out waiting for {}", waiting.join(", ")),
            ));
        }
        let tick = deadline.map_or(RECHECK, |d| d.saturating_duration_since(now).min(RECHECK));
        let _ = events.recv_timeout(tick);
        while events.try_recv().is_ok() {}
        if cancel.is_cancelled() {
            return Err(cancelled());
        }
    }
}

fn cancelled() -> Error {
    Error::of(
        ErrorKind::WaitCancelled,
        "failed to wait: the wait was cancelled",
    )
}

/// Over, and its monitor and runner (when recorded) have exited, so the
/// proof, the status overlay and the events are all written when `wait`
/// returns (by the monitor, or by the observer when the monitor is gone).
pub fn is_settled(run: &RunSummary) -> bool {
    let alive = |identity: Option<&process_identity::ProcessIdentity>| {
        identity.is_some_and(|i| i.liveness() == process_identity::Liveness::Alive)
    };
    !run.status.state.is_active()
        && !alive(run.status.monitor_identity.as_ref())
        && !alive(run.status.runner_identity.as_ref())
}

fn load_all(layout: &Layout, ids: &[String]) -> Result<Vec<RunSummary>> {
    let hooks = listing::list::Hooks {
        fanout: None,
        on_repaired: Some(&supervisor::procs::kill_step_groups),
        observe: None,
    };
    ids.iter()
        .map(|id| {
            crate::runs::observe(layout, id);
            listing::list::load(layout, id, true, now_ms(), &hooks)?
                .ok_or_else(|| crate::runs::no_status(id))
        })
        .collect()
}

/// `waiting 12s: <id> running step 1/2, ...` (the terminal's progress line).
pub fn progress_line(runs: &[RunSummary], elapsed: Duration) -> String {
    let parts: Vec<String> = runs
        .iter()
        .map(|r| {
            let step = r
                .status
                .current_step
                .map(|c| format!(" step {}", step_number(c, r.status.steps().len())));
            let state = if r.status.state.is_active() || is_settled(r) {
                r.status.state.to_string()
            } else {
                // Over by its status; its monitor has not finished with it.
                format!("finishing ({})", r.status.state)
            };
            let mut part = format!("{} {state}{}", r.id, step.unwrap_or_default());
            part.push_str(&progress_detail(r, now_ms()));
            atomic_file::escape(&part)
        })
        .collect();
    format!("waiting {}s: {}", elapsed.as_secs(), parts.join(", "))
}
