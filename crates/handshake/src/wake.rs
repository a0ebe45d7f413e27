//! Waking a handshake wait on file events and on the runner's exit.
//!
//! Each wait re-reads its files after every wake-up, so a wake-up only has to
//! be prompt, never precise. inotify on the run directory gives the file
//! wake-ups; a pidfd watched by a helper thread gives the exit wake-up. When
//! either cannot be set up, the wait falls back to a short polling slice.

use std::io::{PipeWriter, pipe};
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use notify::{Event, EventKind, RecommendedWatcher, RecursiveMode, Watcher};

/// Slice when every wake-up source works: only a guard against lost events.
const GUARD_SLICE: Duration = Duration::from_secs(1);
/// Slice when a source is missing and the wait has to poll.
const POLL_SLICE: Duration = Duration::from_millis(20);

/// Blocks a handshake wait until something may have changed.
pub(crate) struct Waiter {
    rx: Receiver<()>,
    // Kept so the channel never disconnects (a disconnected receiver would spin).
    _tx: Sender<()>,
    _watcher: Option<RecommendedWatcher>,
    _exit: Option<ExitWatch>,
    slice: Duration,
}

impl Waiter {
    /// Watches `dir` for changes to the files named `names` and, when
    /// `exit_of` is given, the exit of that process.
    pub(crate) fn new(dir: &Path, names: &[&'static str], exit_of: Option<u32>) -> Self {
        let (tx, rx) = channel();
        let watcher = watch_dir(dir, names, tx.clone());
        let exit = exit_of.map(|pid| ExitWatch::start(pid, tx.clone()));
        let exit_ok = exit.as_ref().is_none_or(|e| e.is_some());
        let slice = if watcher.is_some() && exit_ok {
            GUARD_SLICE
        } else {
            POLL_SLICE
        };
        Self {
            rx,
            _tx: tx,
            _watcher: watcher,
            _exit: exit.flatten(),
            slice,
        }
    }

    /// Returns after a wake-up, the wait's slice, or `deadline`, whichever is first.
    pub(crate) fn wait(&self, deadline: Instant) {
        self.wait_at_most(deadline, self.slice);
    }

    /// Like [`Waiter::wait`] with a caller-chosen upper bound for the slice.
    pub(crate) fn wait_at_most(&self, deadline: Instant, slice: Duration) {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return;
        }
        if self.rx.recv_timeout(remaining.min(slice)).is_ok() {
            // Collapse a burst of events into one wake-up.
            while self.rx.try_recv().is_ok() {}
        }
    }
}

/// An inotify watch on `dir` that signals events touching one of `names`.
fn watch_dir(dir: &Path, names: &[&'static str], tx: Sender<()>) -> Option<RecommendedWatcher> {
    let names = names.to_vec();
    let handler = move |event: notify::Result<Event>| {
        let relevant = match &event {
            // Opening and reading a file are access events (IN_OPEN, IN_ACCESS,
            // IN_CLOSE_*): the wait's own reads would wake it again at once, a
            // loop that takes a whole CPU. Writers that matter rename the file
            // into place (or modify it), which are not access events.
            Ok(ev) if matches!(ev.kind, EventKind::Access(_)) => ev.need_rescan(),
            Ok(ev) => {
                ev.need_rescan()
                    || ev.paths.iter().any(|p| {
                        p.file_name()
                            .is_some_and(|n| names.iter().any(|name| n == *name))
                    })
            }
            Err(_) => true,
        };
        if relevant {
            let _ = tx.send(());
        }
    };
    let mut watcher = notify::recommended_watcher(handler).ok()?;
    watcher.watch(dir, RecursiveMode::NonRecursive).ok()?;
    Some(watcher)
}

/// A helper thread that signals once when a process exits (pidfd readable).
struct ExitWatch {
    cancel: Option<PipeWriter>,
    thread: Option<JoinHandle<()>>,
}

impl ExitWatch {
    /// `None` when pidfds are unavailable (old kernel) or the pid is gone.
    fn start(pid: u32, tx: Sender<()>) -> Option<Self> {
        let pidfd = pidfd_open(pid)?;
        let (cancel_rx, cancel_tx) = pipe().ok()?;
        let thread = std::thread::spawn(move || {
            let mut fds = [
                PollFd::new(pidfd.as_fd(), PollFlags::POLLIN),
                PollFd::new(cancel_rx.as_fd(), PollFlags::POLLIN),
            ];
            loop {
                match poll(&mut fds, PollTimeout::NONE) {
                    Err(Errno::EINTR) => continue,
                    Err(_) => return,
                    Ok(_) => break,
                }
            }
            let exited = fds[0].revents().is_some_and(|r| !r.is_empty());
            if exited {
                let _ = tx.send(());
            }
        });
        Some(Self {
            cancel: Some(cancel_tx),
            thread: Some(thread),
        })
    }
}

impl Drop for ExitWatch {
    fn drop(&mut self) {
        // Closing the write end hangs up the pipe, which ends the thread's poll.
        self.cancel.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    let pid = libc::pid_t::try_from(pid).ok()?;
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1;
    // it touches no memory of ours.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let fd = i32::try_from(fd).ok().filter(|fd| *fd >= 0)?;
    // SAFETY: the syscall just returned this descriptor and nothing else owns it.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};
    use std::sync::mpsc::TryRecvError;

    /// Bound of each wait for a wake-up that must come (never reached when
    /// it does).
    const WAKE_BOUND: Duration = Duration::from_secs(20);

    #[test]
    fn a_watched_name_renamed_into_the_directory_wakes_the_watch() {
        // One watched name only: a comparison that matched any other name
        // would let this event through only by accident.
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let (tx, rx) = channel();
        let _watcher = watch_dir(dir.path(), &["ack.json"], tx).expect("inotify");
        let staged = outside.path().join("ack.json");
        std::fs::write(&staged, b"{}").unwrap();
        std::fs::rename(&staged, dir.path().join("ack.json")).unwrap();
        rx.recv_timeout(WAKE_BOUND)
            .expect("the rename of a watched name is a wake-up");
    }

    fn waiting_child() -> std::process::Child {
        Command::new("cat")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap()
    }

    #[test]
    fn an_exit_watch_wakes_when_its_process_exits() {
        let mut child = waiting_child();
        let (tx, rx) = channel();
        let _watch = ExitWatch::start(child.id(), tx).expect("pidfd");
        drop(child.stdin.take());
        rx.recv_timeout(WAKE_BOUND)
            .expect("the exit of the watched process is a wake-up");
        child.wait().unwrap();
    }

    #[test]
    fn dropping_an_exit_watch_ends_its_thread_before_it_returns() {
        let mut child = waiting_child();
        let (tx, rx) = channel();
        let watch = ExitWatch::start(child.id(), tx).expect("pidfd");
        drop(watch);
        // The thread held the only sender: once it has been joined the
        // channel is disconnected, with no wake-up sent.
        assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));
        drop(child.stdin.take());
        child.wait().unwrap();
    }
}
