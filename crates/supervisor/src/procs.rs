//! Process plumbing shared by the runner, the monitor and `stop`: signal
//! waiting without sleeps, reaping, and emptying process groups.

use std::collections::BTreeMap;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, Signal, killpg};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Exited with a code.
    Exited(i32),
    /// Killed by a signal.
    Signaled(Signal),
}

impl Ended {
    /// Exit code, when it exited.
    pub fn code(self) -> Option<i32> {
        match self {
            Self::Exited(code) => Some(code),
            Self::Signaled(_) => None,
        }
    }

    /// Signal name, when a signal ended it.
    pub fn signal(self) -> Option<String> {
        match self {
            Self::Exited(_) => None,
            Self::Signaled(sig) => Some(sig.as_str().to_owned()),
        }
    }

    /// "exit code N" or "signal SIGX".
    pub fn describe(self) -> String {
        match self {
            Self::Exited(code) => format!("exit code {code}"),
            Self::Signaled(sig) => format!("signal {}", sig.as_str()),
        }
    }
}

/// Blocked signals delivered through a signalfd, so a single `poll` waits for
/// "a child changed state", "we were asked to stop" or a deadline.
pub struct Signals {
    fd: SignalFd,
    deferred_stop: bool,
    deferred_child: bool,
}

/// What woke a wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// SIGCHLD: reap.
    Child,
    /// SIGTERM, SIGINT or SIGHUP.
    Stop,
    /// The deadline passed.
    Deadline,
}

impl Signals {
    /// Blocks SIGCHLD, SIGTERM, SIGINT and SIGHUP for this (single-threaded)
    /// process and opens a signalfd for them.
    pub fn block() -> nix::Result<Self> {
        let mut mask = SigSet::empty();
        for sig in [
            Signal::SIGCHLD,
            Signal::SIGTERM,
            Signal::SIGINT,
            Signal::SIGHUP,
        ] {
            mask.add(sig);
        }
        mask.thread_block()?;
        let fd = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)?;
        Ok(Self {
            fd,
            deferred_stop: false,
            deferred_child: false,
        })
    }

    /// Whether a stop request is already pending, without waiting. A child
    /// exit read on the way is kept for the next [`Signals::wait`]: losing a
    /// SIGCHLD would leave the caller waiting for an exit that already happened.
    pub fn stop_requested(&mut self) -> bool {
        if self.deferred_stop {
            return true;
        }
        loop {
            match self.pending() {
                Ok(Some(Wake::Stop)) => {
                    self.deferred_stop = true;
                    return true;
                }
                Ok(Some(_)) => self.deferred_child = true,
                Ok(None) | Err(_) => return false,
            }
        }
    }

    /// Forgets a pending stop request the caller has acted on.
    pub fn clear_stop(&mut self) {
        self.deferred_stop = false;
    }

    /// Keeps a stop request seen during a nested wait for the next [`Signals::wait`].
    pub fn defer_stop(&mut self) {
        self.deferred_stop = true;
    }

    /// Waits for the next signal or `deadline`.
    pub fn wait(&mut self, deadline: Option<Instant>) -> nix::Result<Wake> {
        if std::mem::take(&mut self.deferred_stop) {
            return Ok(Wake::Stop);
        }
        if std::mem::take(&mut self.deferred_child) {
            return Ok(Wake::Child);
        }
        loop {
            if let Some(wake) = self.pending()? {
                return Ok(wake);
            }
            let timeout = match deadline {
                None => PollTimeout::NONE,
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Ok(Wake::Deadline);
                    }
                    PollTimeout::try_from(left.as_millis().clamp(1, i32::MAX as u128) as i32)
                        .unwrap_or(PollTimeout::MAX)
                }
            };
            let mut fds = [PollFd::new(self.fd.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, timeout) {
                Ok(_) | Err(Errno::EINTR) => {}
                Err(e) => return Err(e),
            }
        }
    }

    fn pending(&mut self) -> nix::Result<Option<Wake>> {
        match self.fd.read_signal()? {
            None => Ok(None),
            Some(info) if info.ssi_signo == Signal::SIGCHLD as u32 => Ok(Some(Wake::Child)),
            Some(_) => Ok(Some(Wake::Stop)),
        }
    }
}

/// Restores an empty signal mask; for `pre_exec` of children.
pub fn unblock_all_in_child() -> std::io::Result<()> {
    SigSet::empty()
        .thread_set_mask()
        .map_err(std::io::Error::from)
}

/// Reaps every exited child without blocking; returns pid → how it ended.
pub fn reap_all() -> BTreeMap<u32, Ended> {
    let mut reaped = BTreeMap::new();
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) => {
                reaped.insert(pid.as_raw() as u32, Ended::Exited(code));
            }
            Ok(WaitStatus::Signaled(pid, sig, _)) => {
                reaped.insert(pid.as_raw() as u32, Ended::Signaled(sig));
            }
            Ok(WaitStatus::StillAlive) | Err(_) => return reaped,
            Ok(_) => {}
        }
    }
}

/// Sends `sig` to a process group; a group that is already gone is fine.
pub fn signal_group(pgid: u32, sig: Signal) {
    // killpg(0) is the caller's own group and group 1 is init's: neither is
    // ever a step's, whatever a bug upstream hands in.
    if pgid <= 1 {
        return;
    }
    let _ = killpg(Pid::from_raw(pgid as i32), sig);
}

/// Live processes that must be gone: members of `pgid`, or (with `None`)
/// every child of ours, which as a subreaper includes reparented orphans —
/// except the monitors and runners of nested runs, which a COMMAND started
/// with `subagents run` and which must outlive it (a run goes on after
/// the command that started it exits: docs/protocol/supervisor.md §11.1).
pub fn leftovers(pgid: Option<u32>) -> Vec<u32> {
    let mut pids = match pgid {
        Some(g) => process_identity::group_members(g).unwrap_or_default(),
        None => {
            let children = process_identity::children_of(std::process::id()).unwrap_or_default();
            children
                .into_iter()
                .filter(|pid| !is_nested_run(*pid))
                .collect()
        }
    };
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// Whether `pid` is this binary running as `__monitor` or `__runner`.
fn is_nested_run(pid: u32) -> bool {
    runs_as(pid, &["__monitor", "__runner"])
}

/// Whether `pid` is this very binary running with one of `roles` as its
/// first argument.
pub fn runs_as(pid: u32, roles: &[&str]) -> bool {
    let exe = |path: std::path::PathBuf| {
        path.to_string_lossy()
            .trim_end_matches(" (deleted)")
            .to_owned()
    };
    let ours = std::env::current_exe().map(exe).ok();
    let theirs = std::fs::read_link(format!("/proc/{pid}/exe")).map(exe).ok();
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let role = cmdline.split(|b| *b == 0).nth(1).unwrap_or_default();
    ours.is_some() && ours == theirs && roles.iter().any(|r| r.as_bytes() == role)
}

/// Terminates `pgid` (or, with `None`, all our children): SIGTERM for up to
/// `term_wait`, then SIGKILL for up to `kill_wait`. Every tick re-reads who
/// is left and signals newcomers too (orphans reparented meanwhile). Returns
/// the pids still alive (empty = verified gone) and everything reaped.
/// A stop request that arrives meanwhile is kept for the next `wait`.
pub fn empty_group(
    signals: &mut Signals,
    pgid: Option<u32>,
    term_wait: Duration,
    kill_wait: Duration,
) -> (Vec<u32>, BTreeMap<u32, Ended>) {
    if pgid.is_some_and(|g| g <= 1) {
        // As in `signal_group`: group 0 or 1 is never a step's. In a pid
        // namespace group 0 holds pid 1, whose members must never be signalled.
        return (Vec::new(), reap_all());
    }
    let mut reaped = reap_all();
    let mut stop_seen = false;
    let mut alive = leftovers(pgid);
    'phases: for (sig, wait) in [(Signal::SIGTERM, term_wait), (Signal::SIGKILL, kill_wait)] {
        let deadline = Instant::now() + wait;
        while !alive.is_empty() && Instant::now() < deadline {
            if let Some(g) = pgid {
                signal_group(g, sig);
            }
            for pid in &alive {
                let _ = nix::sys::signal::kill(Pid::from_raw(*pid as i32), sig);
            }
            // Grandchildren send no SIGCHLD to us while their parent lives, so
            // wake at least every 25 ms to look again.
            let tick = (Instant::now() + Duration::from_millis(25)).min(deadline);
            if signals.wait(Some(tick)) == Ok(Wake::Stop) {
                stop_seen = true;
            }
            reaped.extend(reap_all());
            alive = leftovers(pgid);
        }
        if alive.is_empty() {
            break 'phases;
        }
    }
    // Kept for the caller's next wait, not re-read here (that would spin).
    if stop_seen {
        signals.defer_stop();
    }
    (alive, reaped)
}

/// SIGKILLs the process group of every step whose COMMAND is provably still
/// the one the runner started (recorded identity alive), or whose leader is
/// gone while members remain (a pgid cannot be reused while its group lives).
///
/// Nothing is signalled for a run recorded in another boot or on another
/// machine: its group numbers may be a stranger's here.
pub fn kill_step_groups(status: &status::RunStatus) {
    if !status.recorded_in_this_boot() {
        return;
    }
    for process in status
        .steps()
        .iter()
        .filter_map(|s| s.external_process.as_ref())
    {
        let Some(pgid) = process.pid else { continue };
        let ours = process
            .identity
            .as_ref()
            .is_some_and(|i| i.liveness() == process_identity::Liveness::Alive);
        let leader_gone = process_identity::read_stat(pgid).is_err();
        let members = process_identity::group_members(pgid).unwrap_or_default();
        if ours || (leader_gone && !members.is_empty()) {
            signal_group(pgid, Signal::SIGKILL);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::os::unix::process::CommandExt;
    use std::process::Command;
    use std::sync::{Mutex, MutexGuard};

    use super::*;

    /// Tests that spawn children or reap with `waitpid(-1)` run one at a
    /// time: a reap in one test would steal another test's child exit.
    static SERIAL: Mutex<()> = Mutex::new(());

    pub(crate) fn serial() -> MutexGuard<'static, ()> {
        SERIAL.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A shell in a process group of its own, with the signal mask a
    /// runner gives its COMMAND; returns its pid (= pgid).
    fn group_leader(script: &str) -> u32 {
        let mut command = Command::new("sh");
        command.args(["-c", script]).process_group(0);
        // SAFETY: only resets the signal mask (async-signal-safe) between fork and exec.
        unsafe {
            command.pre_exec(unblock_all_in_child);
        }
        command.spawn().unwrap().id()
    }

    /// SIGKILLs the group on drop, so a failed assertion leaves nothing behind.
    struct Reaper(u32);

    impl Drop for Reaper {
        fn drop(&mut self) {
            signal_group(self.0, Signal::SIGKILL);
        }
    }

    /// Waits (polling /proc, bounded) until `pgid` has `n` live members.
    fn until_members(pgid: u32, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while leftovers(Some(pgid)).len() < n {
            assert!(
                Instant::now() < deadline,
                "group {pgid} never had {n} members"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// A child blocked on its stdin until the returned handle is dropped.
    fn blocked_child(
        program: &std::path::Path,
        args: &[&str],
        cwd: &std::path::Path,
    ) -> std::process::Child {
        Command::new(program)
            .args(args)
            .current_dir(cwd)
            .env("SUBAGENTS_PROCESS_TEST", "60")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    }

    #[test]
    fn a_nested_runs_monitor_is_told_apart_and_kept_out_of_the_leftovers() {
        let _serial = serial();
        let dir = tempfile::tempdir().unwrap();
        let exe = std::env::current_exe().unwrap();
        // A copy of this binary as a monitor waits for its config on stdin.
        let mut monitor = blocked_child(&exe, &["__monitor", "r1"], dir.path());
        // Another program with the same first argument (`tee` writes a file
        // of that name, in the temporary directory).
        let mut other = blocked_child(std::path::Path::new("tee"), &["__monitor"], dir.path());
        let (m, o) = (monitor.id(), other.id());
        crate::process_tests::until("both children past their exec", || {
            std::fs::read(format!("/proc/{m}/cmdline"))
                .is_ok_and(|c| c.starts_with(exe.as_os_str().as_encoded_bytes()))
        });
        assert!(runs_as(m, &["__runner", "__monitor"]));
        assert!(is_nested_run(m));
        assert!(!runs_as(m, &["__runner"]), "another role");
        assert!(!runs_as(o, &["__monitor"]), "another program");
        assert!(
            !runs_as(std::process::id(), &["__monitor"]),
            "no role at all"
        );
        let left = leftovers(None);
        assert!(left.contains(&o), "{left:?}");
        assert!(
            !left.contains(&m),
            "a nested run outlives its COMMAND: {left:?}"
        );
        for child in [&mut monitor, &mut other] {
            drop(child.stdin.take());
            child.wait().unwrap();
        }
    }

    #[test]
    fn ended_describes_codes_and_signals() {
        assert_eq!(Ended::Exited(3).code(), Some(3));
        assert_eq!(Ended::Exited(3).signal(), None);
        assert_eq!(Ended::Exited(3).describe(), "exit code 3");
        let killed = Ended::Signaled(Signal::SIGKILL);
        assert_eq!(killed.code(), None);
        assert_eq!(killed.signal().as_deref(), Some("SIGKILL"));
        assert_eq!(killed.describe(), "signal SIGKILL");
    }

    #[test]
    fn groups_zero_and_one_are_never_signalled() {
        use std::sync::atomic::{AtomicBool, Ordering};
        static GOT: AtomicBool = AtomicBool::new(false);
        extern "C" fn on_urg(_: libc::c_int) {
            GOT.store(true, Ordering::SeqCst);
        }
        let handler: extern "C" fn(libc::c_int) = on_urg;
        // SAFETY: the handler only stores to an atomic. SIGURG is ignored by
        // default, so a stray one elsewhere in the test binary is harmless.
        unsafe { libc::signal(libc::SIGURG, handler as libc::sighandler_t) };
        // Group 0 means the caller's own group: it would reach this process.
        signal_group(0, Signal::SIGURG);
        signal_group(1, Signal::SIGURG);
        assert!(!GOT.load(Ordering::SeqCst), "a group <= 1 was signalled");
        // The handler works: a signal to ourselves is seen.
        nix::sys::signal::raise(Signal::SIGURG).unwrap();
        assert!(GOT.load(Ordering::SeqCst));
    }

    #[test]
    fn a_group_that_obeys_sigterm_is_emptied_by_it() {
        let _serial = serial();
        let mut signals = Signals::block().unwrap();
        let pgid = group_leader("sleep 300 & sleep 300 & wait");
        let _reaper = Reaper(pgid);
        until_members(pgid, 3);
        let (alive, reaped) = empty_group(
            &mut signals,
            Some(pgid),
            Duration::from_secs(5),
            Duration::from_secs(1),
        );
        assert!(alive.is_empty(), "{alive:?}");
        assert!(leftovers(Some(pgid)).is_empty());
        assert_eq!(reaped.get(&pgid), Some(&Ended::Signaled(Signal::SIGTERM)));
    }

    #[test]
    fn a_group_deaf_to_sigterm_gets_sigkill_after_the_term_wait() {
        let _serial = serial();
        let mut signals = Signals::block().unwrap();
        let pgid = group_leader(r#"trap "" TERM; sleep 300 & wait; while :; do sleep 1; done"#);
        let _reaper = Reaper(pgid);
        until_members(pgid, 2);
        let (alive, reaped) = empty_group(
            &mut signals,
            Some(pgid),
            Duration::from_millis(200),
            Duration::from_secs(5),
        );
        assert!(alive.is_empty(), "{alive:?}");
        assert!(leftovers(Some(pgid)).is_empty(), "members left");
        assert_eq!(reaped.get(&pgid), Some(&Ended::Signaled(Signal::SIGKILL)));
    }

    #[test]
    fn a_child_exit_read_while_checking_for_stop_is_not_lost() {
        let _serial = serial();
        let mut signals = Signals::block().unwrap();
        // SAFETY: raise(3) sends a signal to this thread, which blocks it.
        unsafe { libc::raise(libc::SIGCHLD) };
        assert!(!signals.stop_requested());
        // The SIGCHLD consumed above is handed out by the next wait.
        let past = Instant::now();
        assert_eq!(signals.wait(Some(past)), Ok(Wake::Child));
        assert_eq!(signals.wait(Some(past)), Ok(Wake::Deadline));
    }

    #[test]
    fn a_stop_request_is_kept_until_cleared() {
        let _serial = serial();
        let mut signals = Signals::block().unwrap();
        // SAFETY: raise(3) sends a signal to this thread, which blocks it.
        unsafe { libc::raise(libc::SIGTERM) };
        assert!(signals.stop_requested());
        assert!(signals.stop_requested(), "asking twice does not lose it");
        signals.clear_stop();
        assert!(!signals.stop_requested());
        signals.defer_stop();
        assert_eq!(signals.wait(Some(Instant::now())), Ok(Wake::Stop));
        assert_eq!(signals.wait(Some(Instant::now())), Ok(Wake::Deadline));
    }

    #[test]
    fn orphans_of_ours_are_leftovers_of_none() {
        let _serial = serial();
        let pid = group_leader("exec sleep 300");
        let _reaper = Reaper(pid);
        assert!(leftovers(None).contains(&pid));
        signal_group(pid, Signal::SIGKILL);
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut reaped = BTreeMap::new();
        while !reaped.contains_key(&pid) {
            assert!(Instant::now() < deadline, "never reaped");
            reaped.extend(reap_all());
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(reaped[&pid], Ended::Signaled(Signal::SIGKILL));
        assert!(!leftovers(None).contains(&pid));
    }

    #[test]
    fn emptying_a_group_keeps_a_stop_that_arrived_and_invents_none() {
        let _serial = serial();
        let mut signals = Signals::block().unwrap();
        let pgid = group_leader("exec sleep 300");
        let _reaper = Reaper(pgid);
        until_members(pgid, 1);
        let (alive, _) = empty_group(
            &mut signals,
            Some(pgid),
            Duration::from_secs(5),
            Duration::from_secs(1),
        );
        assert!(alive.is_empty());
        assert!(!signals.stop_requested(), "no stop was asked for");
        let pgid = group_leader("exec sleep 300");
        let _reaper = Reaper(pgid);
        until_members(pgid, 1);
        // SAFETY: raise(3) sends a signal to this thread, which blocks it.
        unsafe { libc::raise(libc::SIGTERM) };
        let (alive, _) = empty_group(
            &mut signals,
            Some(pgid),
            Duration::from_secs(5),
            Duration::from_secs(1),
        );
        assert!(alive.is_empty());
        assert!(signals.stop_requested(), "the stop is kept for the caller");
    }

    /// A status whose one step recorded `pid` (its group) and `identity`.
    fn status_with_step(
        pid: u32,
        identity: Option<process_identity::ProcessIdentity>,
    ) -> status::RunStatus {
        let mut status = status::RunStatus::new("r", status::RunState::Running);
        status.steps = Some(vec![status::Step {
            external_process: Some(status::model::ExternalProcess {
                pid: Some(pid),
                identity,
                ..Default::default()
            }),
            ..Default::default()
        }]);
        status
    }

    /// How our child `pid` ended; `None` if it has not within 10 s.
    fn reaped_within(pid: u32) -> Option<Ended> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(ended) = reap_all().remove(&pid) {
                return Some(ended);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn step_groups_are_killed_only_when_provably_the_runners() {
        let _serial = serial();
        // The recorded COMMAND still runs (identity matches): killed.
        let pid = group_leader("exec sleep 300");
        let _reaper = Reaper(pid);
        let identity = process_identity::ProcessIdentity::of(pid).unwrap();
        kill_step_groups(&status_with_step(pid, Some(identity.clone())));
        assert_eq!(reaped_within(pid), Some(Ended::Signaled(Signal::SIGKILL)));
        // A live process under the recorded pid but with another start
        // time is someone else (a recycled pid): left alone.
        let stranger = group_leader("exec sleep 300");
        let _reaper = Reaper(stranger);
        let mut recycled = process_identity::ProcessIdentity::of(stranger).unwrap();
        recycled.start_time += 1;
        kill_step_groups(&status_with_step(stranger, Some(recycled)));
        // Had it been sent a SIGKILL, that would be how it ended; our
        // SIGTERM, sent after, decides only if nothing came before.
        signal_group(stranger, Signal::SIGTERM);
        assert_eq!(
            reaped_within(stranger),
            Some(Ended::Signaled(Signal::SIGTERM)),
            "a stranger was killed"
        );
        // The leader is gone but its group lives on: the group is killed.
        let leader = group_leader("sleep 300 & echo $! > /dev/null; exit 0");
        let _reaper = Reaper(leader);
        assert_eq!(reaped_within(leader), Some(Ended::Exited(0)));
        until_members(leader, 1);
        let orphan = leftovers(Some(leader))[0];
        kill_step_groups(&status_with_step(leader, Some(identity)));
        let deadline = Instant::now() + Duration::from_secs(5);
        while !leftovers(Some(leader)).is_empty() {
            assert!(
                Instant::now() < deadline,
                "orphan {orphan} of a gone leader survived"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
