//! The monitor of a queued run (`run --queue` over the session's limit):
//! there is no daemon, so the run's own monitor waits for its turn in the
//! session's line, takes its slot under the pool lock
//! ([`capacity::Capacity::take_turn`]) and only then starts the runner.
//!
//! It wakes on file events in the pool directory and its line (a slot freed
//! is a rename there, a run leaving the line an unlink) and re-checks at
//! least every [`RECHECK`], since a slot whose run's monitor was killed is
//! freed by no event: every [`OBSERVE_EVERY`] it lets the observer finalize
//! the runs that hold the slots, as a launch into a full pool does.

use std::collections::HashSet;
use std::fs::File;
use std::io::Write;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use capacity::{Acquire, Capacity, Kind, SlotHandle, Turn};
use nix::fcntl::OFlag;
use status::Layout;
use status::model::update_status;
use status::now_ms;
use status::proof::{ProcessTerminal, ProofState};

use crate::config::{LaunchConfig, QueueConfig};
use crate::spawn::Launched;

/// The longest the monitor sleeps without looking at the pool again.
pub const RECHECK: Duration = Duration::from_millis(500);

/// How often the holders of a full pool are observed.
pub const OBSERVE_EVERY: Duration = Duration::from_secs(2);

/// Tells whoever started the monitor (launcher or observer) that the run
/// waits in line, on the ready pipe (descriptor 3), and closes it.
pub fn announce(config: &LaunchConfig) {
    // SAFETY: descriptor 3 is the ready pipe the starter handed us; we own it from here.
    let mut pipe = unsafe { File::from_raw_fd(3) };
    let launched = Launched {
        run_id: config.run_id.clone(),
        async_dir: config.run_dir.clone(),
        pid: std::process::id(),
        runner_process_instance_id: config.runner_process_instance_id.clone(),
        queued: true,
    };
    let line = serde_json::to_string(&launched).unwrap_or_default();
    let _ = writeln!(pipe, "ready {line}");
    // The starter reads to EOF: our end closes now. /dev/null takes its
    // number, so the runner's pipe made later is never given descriptor 3
    // by chance (and then closed by its own dup2 onto 3).
    let _ = std::os::fd::IntoRawFd::into_raw_fd(pipe);
    match File::open("/dev/null") {
        // SAFETY: dup2 onto descriptor 3, which this process owns; closes the pipe.
        Ok(null) => unsafe {
            libc::dup2(std::os::fd::AsRawFd::as_raw_fd(&null), 3);
        },
        // SAFETY: closing descriptor 3, which this process owns.
        Err(_) => unsafe {
            libc::close(3);
        },
    }
}

/// Waits until the run holds a slot; `None` when it left the line without
/// one (stopped, or given up here).
pub fn wait_for_turn(config: &LaunchConfig, queue: &QueueConfig) -> Option<SlotHandle> {
    let layout = Layout::new(&config.root);
    let pools = Capacity::new(layout.capacity_dir());
    let (_watcher, events) = watch(&pools, &queue.session_id);
    let live = HashSet::new();
    let request = Acquire {
        session_id: &queue.session_id,
        limit: Some(queue.limit),
        run_id: &config.run_id,
        kind: Kind::Runner,
        async_dir: &config.run_dir,
        live_workflows: &live,
    };
    let mut observed = Instant::now();
    let mut timed_out = true;
    loop {
        // On a file event only a waiter near the front takes the lock; on
        // a timeout every waiter looks, past runs whose monitor is gone.
        if !timed_out && !pools.may_be_my_turn(&request) {
            timed_out = events.recv_timeout(RECHECK).is_err();
            while events.try_recv().is_ok() {}
            continue;
        }
        match pools.take_turn(&request) {
            Ok(Turn::Admitted(handle)) => return Some(*handle),
            Ok(Turn::Gone) => {
                give_up(config, "it left the queue for a capacity slot without one");
                return None;
            }
            Ok(Turn::Waiting(_)) => {}
            // A pool we cannot read now may be readable at the next look.
            Err(e) => eprintln!("subagents: warning: failed to check the queue: {e}"),
        }
        timed_out = events.recv_timeout(RECHECK).is_err();
        while events.try_recv().is_ok() {}
        if observed.elapsed() >= OBSERVE_EVERY {
            observe_holders(&layout, &pools, &queue.session_id);
            observed = Instant::now();
        }
    }
}

/// Wakes on every change in the pool directory and in its line.
fn watch(pools: &Capacity, session: &str) -> (Option<notify::RecommendedWatcher>, Receiver<()>) {
    use notify::Watcher;
    let (tx, rx) = channel();
    let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        // Our own reads are events too; waking on them would spin.
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
        return (None, rx);
    };
    for dir in [pools.pool_dir(session), pools.queue_dir(session)] {
        let _ = watcher.watch(&dir, notify::RecursiveMode::NonRecursive);
    }
    (Some(watcher), rx)
}

/// Lets the observer finalize the runs holding the session's slots whose
/// monitors are gone, so that the next look can free their slots.
fn observe_holders(layout: &Layout, pools: &Capacity, session: &str) {
    let Ok(snapshot) = pools.count(session, None) else {
        return;
    };
    let options = crate::observer::Options::new(layout.root());
    for run_id in snapshot.slots.iter().filter_map(|s| s.run_id.as_deref()) {
        if let Some(dir) = status::layout::exact_run_dir(layout, run_id) {
            crate::observer::observe(&dir, &options);
        }
    }
}

/// The run's wait is over: `queuedForSlot` becomes `slotWait`. Only the
/// content is fsynced: lost in a crash, the run is queued again without
/// its entry, and the monitor started for it gives it up.
pub fn admitted(config: &LaunchConfig) {
    let now = now_ms();
    let written = status::model::update_status_unsynced_dir(&config.run_dir, |s| {
        let mut s = s?;
        status::slot_wait::end_wait(&mut s, now);
        Some(s)
    });
    if let Err(e) = written {
        eprintln!("subagents: warning: failed to record the end of the wait: {e}");
    }
}

/// A new ready pipe as descriptor 3 for the runner: the one the starter
/// gave us was answered by [`announce`]. Returns its read end.
pub fn ready_pipe() -> std::io::Result<OwnedFd> {
    let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    // SAFETY: plain descriptor syscalls on descriptors this process owns.
    unsafe { crate::spawn::inherit_as_fd3(std::os::fd::AsRawFd::as_raw_fd(&write))? };
    Ok(read)
}

/// Binds the slot to the runner once it reported ready (as the launcher
/// does for a run it started itself); a runner that died first leaves the
/// slot bound to its instance, and the run's proof frees it.
pub fn bind(handle: &mut SlotHandle, config: &LaunchConfig, ready: Option<OwnedFd>) {
    if let Some(read) = ready {
        let _ = crate::spawn::read_ready(read);
    }
    let bound = handle
        .mark_started(&config.runner_process_instance_id)
        .and_then(|()| handle.release_if_over().map(drop));
    if let Err(e) = bound {
        eprintln!("subagents: warning: failed to bind the capacity slot: {e}");
    }
}

/// A run that left the line without a slot and is still queued (its entry
/// went without a stop): failed, with a `not-started` proof, and its
/// marker released. A run a stop already ended is left as it is.
pub fn give_up(config: &LaunchConfig, why: &str) {
    let message = format!("Async run never started a runner: {why}.");
    let proof = ProcessTerminal::new(
        ProofState::NotStarted,
        &config.run_id,
        &config.runner_process_instance_id,
    );
    let now = now_ms();
    let mut failed = false;
    let written = update_status(&config.run_dir, |s| {
        let mut s = s?;
        status::slot_wait::queued_for_slot(&s)?;
        failed = true;
        s.state = status::RunState::Failed;
        s.error = Some(message.clone());
        s.last_update = Some(now);
        s.ended_at = Some(now);
        s.process_terminal = Some(proof.to_value());
        Some(s)
    });
    if written.is_ok() && failed {
        let _ = crate::observer::write_not_started(&config.run_dir, &proof);
        let _ = status::index::release_marker(&config.run_dir);
    }
}

/// Starts the monitor of a queued run again (its wait was cut short by a
/// kill or a reboot), from the launch config kept in the run directory;
/// returns its pid once it has taken its place in the line.
pub fn restart(run_dir: &Path) -> Result<u32, String> {
    let config = crate::config::read_queued_launch_file(run_dir)?;
    let launched =
        crate::spawn::spawn(&config).map_err(|e| format!("failed to start its monitor: {e}"))?;
    Ok(launched.pid)
}
