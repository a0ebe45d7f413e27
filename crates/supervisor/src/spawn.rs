//! Starting a run's processes: the detached monitor (new session), the
//! inherited ready pipe on descriptor 3, and the runner's `ready` line.
//!
//! Two ways to start a monitor or runner ([`SpawnMode`]): `exec` the
//! current program again with the hidden argument `__monitor` or
//! `__runner` (the host binary must dispatch them to
//! [`crate::monitor::main`] and [`crate::runner::main`]), or `fork` without
//! `exec`, where the child calls the same code with the config it already
//! holds. A fork skips loading the whole binary again (most of a process
//! start), but is only sound in a process with one thread: a lock another
//! thread held at the fork stays held in the child for ever. So a
//! front-end that knows it is single-threaded (the command line) says so
//! with [`allow_fork`]; the multi-threaded MCP server never does and keeps
//! `exec`. The monitor, single-threaded itself, forks its runner whenever
//! it can. Either way the child gets the same session or group,
//! descriptors, signal dispositions, environment and command line
//! (`crate::title`).

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nix::fcntl::OFlag;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use serde::{Deserialize, Serialize};
use status::layout::files;

use crate::config::{LaunchConfig, READY_FD_ENV};
use crate::fault::{self, Point};

/// How long the launcher waits for the runner's ready message.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// What the runner sends on the ready pipe, and `run --json` prints.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Launched {
    /// Run id.
    pub run_id: String,
    /// Run directory.
    pub async_dir: PathBuf,
    /// Runner pid.
    pub pid: u32,
    /// Runner instance id.
    pub runner_process_instance_id: String,
    /// The run waits for a capacity slot: `pid` is its monitor's, and no
    /// runner exists yet.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub queued: bool,
}

/// How a monitor or runner is started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpawnMode {
    /// `fork` + `exec` of the current program with `__monitor` / `__runner`;
    /// the config travels on the child's stdin. Safe from any process.
    Exec,
    /// `fork` alone: the child runs the monitor or runner with the config it
    /// inherited. Only from a single-threaded process.
    Fork,
}

/// Set by a front-end that launches from a single-threaded process.
static FORK_ALLOWED: AtomicBool = AtomicBool::new(false);

/// Declares that this process launches runs from its only thread (the
/// command line), so [`spawn`] may fork the monitor without `exec`.
pub fn allow_fork() {
    FORK_ALLOWED.store(true, Ordering::Relaxed);
}

impl SpawnMode {
    /// How this process starts a run's monitor: a fork only where the
    /// front-end allowed it ([`allow_fork`]) and the process still has one
    /// thread.
    pub fn for_monitor() -> Self {
        if FORK_ALLOWED.load(Ordering::Relaxed) {
            Self::for_child()
        } else {
            Self::Exec
        }
    }

    /// How a monitor starts its runner: a fork while it has one thread.
    /// Both need a kernel that lets the child show its own command line,
    /// and our program still installed: a fork of a binary that was
    /// deleted (replaced by an upgrade) would run code no longer there,
    /// where an `exec` fails and the run fails as never started.
    pub fn for_child() -> Self {
        if single_threaded() && crate::title::supported() && still_installed() {
            Self::Fork
        } else {
            Self::Exec
        }
    }
}

/// Whether the file this process runs is still at its path.
fn still_installed() -> bool {
    std::env::current_exe().is_ok_and(|exe| !exe.to_string_lossy().ends_with(" (deleted)"))
}

/// Whether this process has exactly one thread (`/proc/self/task`).
fn single_threaded() -> bool {
    std::fs::read_dir("/proc/self/task").is_ok_and(|tasks| tasks.count() == 1)
}

/// Spawns the monitor (which spawns the runner) and returns once the runner
/// reported `ready` on the inherited pipe.
pub fn spawn(config: &LaunchConfig) -> std::io::Result<Launched> {
    let (ready_read, ready_write) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    match SpawnMode::for_monitor() {
        SpawnMode::Exec => exec_monitor(config, &ready_write)?,
        SpawnMode::Fork => fork_monitor(config, &ready_write)?,
    }
    drop(ready_write);
    // The monitor is detached (own session); it outlives us and is reaped by
    // init or a subreaper, so it is deliberately not waited on.
    fault::point(Point::BeforeReady);
    let launched = read_ready(ready_read)?;
    fault::point(Point::AfterReady);
    Ok(launched)
}

/// `exec`s the monitor and writes its config to its stdin.
fn exec_monitor(config: &LaunchConfig, ready_write: &OwnedFd) -> std::io::Result<()> {
    let mut child = monitor_command(config, ready_write)?.spawn()?;
    let mut stdin = child
        .stdin
        .take()
        .ok_or_else(|| std::io::Error::other("monitor has no stdin"))?;
    stdin.write_all(&serde_json::to_vec(config).map_err(std::io::Error::other)?)?;
    Ok(())
}

/// Forks the monitor: the child gets what [`monitor_command`] gives an
/// `exec`ed one (own session, stdin `/dev/null` instead of the config pipe,
/// the run's logs as stdout and stderr, the ready pipe as descriptor 3 and
/// nothing else, the run directory as working directory, `ps` words
/// `<program> __monitor <run id>`) and runs it on the config in memory.
fn fork_monitor(config: &LaunchConfig, ready_write: &OwnedFd) -> std::io::Result<()> {
    let exe = std::env::current_exe()?;
    let stdout = open_log(config, files::RUNNER_STDOUT)?;
    let stderr = open_log(config, files::RUNNER_STDERR)?;
    let null = File::open("/dev/null")?;
    let stdio = [null.as_raw_fd(), stdout.as_raw_fd(), stderr.as_raw_fd()];
    let ready = ready_write.as_raw_fd();
    // SAFETY: this process has one thread (`SpawnMode::for_monitor`), so
    // the child starts with every lock free; it never returns into our frames.
    match unsafe { libc::fork() } {
        -1 => Err(std::io::Error::last_os_error()),
        0 => {
            // SAFETY: setsid(2) in the new child.
            let detached = unsafe { libc::setsid() } >= 0;
            let code = if detached && become_child(stdio, &[(ready, 3)]).is_ok() {
                let words = [
                    exe.as_os_str(),
                    "__monitor".as_ref(),
                    config.run_id.as_ref(),
                ];
                enter(config, &words, READY_FD_ENV, "3", crate::monitor::run)
            } else {
                127
            };
            exit_child(code)
        }
        _ => Ok(()),
    }
}

/// Opens one of the run's log files for appending, as the monitor's stdio.
fn open_log(config: &LaunchConfig, name: &str) -> std::io::Result<File> {
    OpenOptions::new()
        .append(true)
        .create(true)
        .mode(atomic_file::FILE_MODE)
        .open(config.run_dir.join(name))
}

/// In a forked child: `stdio` as descriptors 0–2, each `(fd, target)` of
/// `keep` as `target` (inheritable), every other descriptor closed, and
/// signal dispositions as a fresh `exec` of this program has them.
pub(crate) fn become_child(stdio: [i32; 3], keep: &[(i32, i32)]) -> std::io::Result<()> {
    for (target, fd) in stdio.into_iter().enumerate() {
        // SAFETY: dup2(2) of descriptors this process owns.
        if unsafe { libc::dup2(fd, target as i32) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    let mut next = 3;
    for &(fd, target) in keep {
        inherit_as(fd, target)?;
        next = next.max(target + 1);
    }
    // A gap below the highest kept descriptor (no ready pipe as 3, say)
    // must not leak whatever the parent had there.
    for fd in 3..next {
        if !keep.iter().any(|&(_, target)| target == fd) {
            // SAFETY: close(2) of a descriptor this process owns, or none.
            unsafe {
                libc::close(fd);
            }
        }
    }
    // SAFETY: close_range(2) on descriptors this process owns.
    unsafe {
        libc::syscall(libc::SYS_close_range, next as u32, u32::MAX, 0u32);
    }
    reset_dispositions();
    Ok(())
}

/// What `exec` and the Rust runtime give a new process: a caught signal
/// back to its default action, SIGPIPE ignored (so a vanished launcher
/// cannot kill a monitor or runner writing to it).
fn reset_dispositions() {
    for signal in 1..libc::SIGRTMAX() {
        if signal == libc::SIGKILL || signal == libc::SIGSTOP {
            continue;
        }
        // SAFETY: sigaction(2) reads and writes structs we own.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(signal, std::ptr::null(), &mut old) == 0
                && old.sa_sigaction != libc::SIG_DFL
                && old.sa_sigaction != libc::SIG_IGN
            {
                libc::signal(signal, libc::SIG_DFL);
            }
        }
    }
    // SAFETY: setting a disposition has no memory effects.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
}

/// In a forked child set up by [`become_child`]: the working directory,
/// the `ps` words, the descriptor variable `env` (= `value`; removed when
/// `value` is empty), then `main` on the inherited config; returns its exit
/// code (101 for a panic, which must never unwind into the parent's frames).
pub(crate) fn enter(
    config: &LaunchConfig,
    words: &[&std::ffi::OsStr],
    env: &str,
    value: &str,
    main: fn(LaunchConfig) -> i32,
) -> i32 {
    if let Err(e) = std::env::set_current_dir(&config.run_dir) {
        eprintln!("subagents: failed to enter the run directory: {e}");
        return 127;
    }
    if let Err(e) = crate::title::set(words) {
        eprintln!("subagents: failed to set the process title: {e}");
        return 127;
    }
    // SAFETY: a forked child of a single-threaded process has one thread.
    unsafe {
        if value.is_empty() {
            std::env::remove_var(env);
        } else {
            std::env::set_var(env, value);
        }
    }
    let config = config.clone();
    // The parent's freed heap came along with the fork: give it back, as
    // a fresh `exec` would never have had it.
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim(3) only returns free heap pages to the kernel.
    unsafe {
        libc::malloc_trim(0);
    }
    std::panic::catch_unwind(move || main(config)).unwrap_or(101)
}

/// Ends a forked child: flushes what it printed and exits without running
/// the parent's exit handlers.
pub(crate) fn exit_child(code: i32) -> ! {
    let _ = std::io::stdout().flush();
    // SAFETY: _exit(2) ends this process at once.
    unsafe { libc::_exit(code) }
}

fn monitor_command(config: &LaunchConfig, ready_write: &OwnedFd) -> std::io::Result<Command> {
    let exe = std::env::current_exe()?;
    let log = |name: &str| open_log(config, name);
    let mut command = Command::new(exe);
    command
        .arg("__monitor")
        // Only for `ps`: the run this process belongs to.
        .arg(&config.run_id)
        .current_dir(&config.run_dir)
        .env(READY_FD_ENV, "3")
        .stdin(Stdio::piped())
        .stdout(log(files::RUNNER_STDOUT)?)
        .stderr(log(files::RUNNER_STDERR)?);
    let fd = ready_write.as_raw_fd();
    // SAFETY: only async-signal-safe calls (setsid, dup2, fcntl) between fork and exec.
    unsafe {
        command.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            inherit_as_fd3(fd)?;
            close_inherited_fds();
            Ok(())
        });
    }
    Ok(command)
}

/// Closes every descriptor above 3 that the caller let us inherit, so a
/// detached run never holds a pipe of whoever started it (which would make
/// `subagents run ... | cat` wait for the run).
fn close_inherited_fds() {
    // SAFETY: close_range(2) on descriptors this process owns; async-signal-safe.
    unsafe {
        libc::syscall(libc::SYS_close_range, 4u32, u32::MAX, 0u32);
    }
}

/// Makes `fd` available as descriptor 3 across exec (dup2 clears CLOEXEC).
///
/// # Safety
/// Must only be called between fork and exec.
pub unsafe fn inherit_as_fd3(fd: i32) -> std::io::Result<()> {
    inherit_as(fd, 3)
}

/// Makes `fd` available as `target` across exec, or in a forked child
/// (dup2 clears CLOEXEC; an `fd` already there only loses its flag).
fn inherit_as(fd: i32, target: i32) -> std::io::Result<()> {
    // SAFETY: plain descriptor syscalls on descriptors this process owns.
    let rc = unsafe {
        if fd == target {
            let flags = libc::fcntl(target, libc::F_GETFD);
            libc::fcntl(target, libc::F_SETFD, flags & !libc::FD_CLOEXEC)
        } else {
            libc::dup2(fd, target)
        }
    };
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

pub(crate) fn read_ready(fd: OwnedFd) -> std::io::Result<Launched> {
    let mut fds = [PollFd::new(
        std::os::fd::AsFd::as_fd(&fd),
        PollFlags::POLLIN,
    )];
    let timeout =
        PollTimeout::try_from(READY_TIMEOUT.as_millis() as i32).unwrap_or(PollTimeout::MAX);
    if poll(&mut fds, timeout)? == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "the runner did not report ready within 30s",
        ));
    }
    let mut text = String::new();
    File::from(fd).read_to_string(&mut text)?;
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("ready "))
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the runner exited before it reported ready",
            )
        })?;
    serde_json::from_str(line).map_err(std::io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::*;

    extern "C" fn caught(_: libc::c_int) {}

    /// What `become_child` left in a forked child, as bits of its exit
    /// code: 1 the kept descriptor is not at its target, 2 the gap below
    /// it or 4 a descriptor above it is still open, 8 SIGPIPE is not
    /// ignored, 16 a caught signal is still caught, 32 an ignored one is
    /// no longer ignored, 64 `become_child` failed, 128 a descriptor kept
    /// where it already was is still close-on-exec. `in_place` keeps
    /// descriptor 5 where it is instead of moving `/dev/null` there.
    fn child_after_become_child(in_place: bool) -> i32 {
        let _serial = crate::procs::tests::serial();
        let null = File::open("/dev/null").unwrap();
        let n = null.as_raw_fd();
        // SAFETY: the child makes only async-signal-safe calls (dup2,
        // signal, sigaction, fcntl, close) and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork");
        if pid == 0 {
            // SAFETY: as above.
            unsafe {
                libc::dup2(n, 4);
                libc::dup2(n, 7);
                libc::signal(libc::SIGPIPE, libc::SIG_DFL);
                let handler: extern "C" fn(libc::c_int) = caught;
                libc::signal(libc::SIGUSR1, handler as libc::sighandler_t);
                libc::signal(libc::SIGHUP, libc::SIG_IGN);
                let open = |fd| libc::fcntl(fd, libc::F_GETFD) >= 0;
                let disposition = |signal| {
                    let mut old: libc::sigaction = std::mem::zeroed();
                    libc::sigaction(signal, std::ptr::null(), &mut old);
                    old.sa_sigaction
                };
                let mut code = 0;
                let keep = if in_place {
                    libc::dup2(n, 5);
                    libc::fcntl(5, libc::F_SETFD, libc::FD_CLOEXEC);
                    (5, 5)
                } else {
                    (n, 5)
                };
                if become_child([n, n, n], &[keep]).is_err() {
                    code |= 64;
                }
                if !open(5) {
                    code |= 1;
                }
                if open(4) {
                    code |= 2;
                }
                if open(7) {
                    code |= 4;
                }
                if disposition(libc::SIGPIPE) != libc::SIG_IGN {
                    code |= 8;
                }
                if disposition(libc::SIGUSR1) != libc::SIG_DFL {
                    code |= 16;
                }
                if disposition(libc::SIGHUP) != libc::SIG_IGN {
                    code |= 32;
                }
                if libc::fcntl(5, libc::F_GETFD) & libc::FD_CLOEXEC != 0 {
                    code |= 128;
                }
                libc::_exit(code);
            }
        }
        let mut status = 0;
        // SAFETY: waits for the child just forked, by its pid.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status), "the child died: {status}");
        libc::WEXITSTATUS(status)
    }

    #[test]
    fn a_forked_child_keeps_only_its_descriptors_and_gets_exec_dispositions() {
        assert_eq!(child_after_become_child(false), 0);
        assert_eq!(child_after_become_child(true), 0, "kept in place");
    }

    /// Runs `sh -c script` with the write end of a ready pipe as descriptor
    /// 3, as the monitor hands it to the runner; returns what the launcher
    /// side makes of the pipe.
    fn launcher_side_of(script: &str) -> std::io::Result<Launched> {
        let _serial = crate::procs::tests::serial();
        let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
        let fd = write.as_raw_fd();
        let mut command = Command::new("sh");
        command.args(["-c", script]);
        // SAFETY: only async-signal-safe calls (dup2, fcntl) between fork and exec.
        unsafe {
            command.pre_exec(move || inherit_as_fd3(fd));
        }
        let mut child = command.spawn()?;
        drop(write);
        let result = read_ready(read);
        child.wait()?;
        result
    }

    /// The test harness runs each test on a thread of its own: a process
    /// with threads never forks a monitor or runner, even when allowed.
    #[test]
    fn a_process_with_threads_always_execs() {
        assert!(!single_threaded());
        allow_fork();
        assert_eq!(SpawnMode::for_monitor(), SpawnMode::Exec);
        assert_eq!(SpawnMode::for_child(), SpawnMode::Exec);
    }

    /// A process with one thread (a forked child of this test) forks.
    #[test]
    fn a_single_threaded_process_forks() {
        let _serial = crate::procs::tests::serial();
        // SAFETY: the child only reads /proc and `_exit`s (glibc's fork
        // leaves malloc usable in the child).
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let forks = single_threaded() && SpawnMode::for_child() == SpawnMode::Fork;
            // SAFETY: ends the child without running the harness's exit.
            unsafe { libc::_exit(if forks { 0 } else { 1 }) };
        }
        let status = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None).unwrap();
        assert_eq!(
            status,
            nix::sys::wait::WaitStatus::Exited(nix::unistd::Pid::from_raw(pid), 0)
        );
    }

    #[test]
    fn a_runner_that_exits_before_ready_is_reported_at_once() {
        let err = launcher_side_of("echo starting >&3; exit 1").unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof);
        assert_eq!(
            err.to_string(),
            "the runner exited before it reported ready"
        );
    }

    #[test]
    fn the_ready_line_carries_the_runner() {
        let line =
            r#"ready {"runId":"r1","asyncDir":"/x/r1","pid":77,"runnerProcessInstanceId":"rid"}"#;
        let launched = launcher_side_of(&format!("echo '{line}' >&3; exit 0")).unwrap();
        assert_eq!(launched.run_id, "r1");
        assert_eq!(launched.async_dir, PathBuf::from("/x/r1"));
        assert_eq!(launched.pid, 77);
        assert_eq!(launched.runner_process_instance_id, "rid");
    }

    #[test]
    fn a_garbled_ready_line_is_an_error() {
        let err = launcher_side_of("echo 'ready {not json' >&3").unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::Other, "{err}");
    }
}
