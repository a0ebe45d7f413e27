//! Starting a run's processes: the detached monitor (new session), the
//! inherited ready pipe on descriptor 3, and the runner's `ready` line.
//!
//! The host binary must dispatch the hidden arguments `__monitor` and
//! `__runner` to [`crate::monitor::main`] and [`crate::runner::main`]:
//! [`spawn`] re-executes the current program with them.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
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

/// Spawns the monitor (which spawns the runner) and returns once the runner
/// reported `ready` on the inherited pipe.
pub fn spawn(config: &LaunchConfig) -> std::io::Result<Launched> {
    let (ready_read, ready_write) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    let mut child = monitor_command(config, &ready_write)?.spawn()?;
    drop(ready_write);
    let mut stdin = child
        .stdin
        .take()
        .ok_or_else(|| std::io::Error::other("monitor has no stdin"))?;
    stdin.write_all(&serde_json::to_vec(config).map_err(std::io::Error::other)?)?;
    drop(stdin);
    // The monitor is detached (own session); it outlives us and is reaped by
    // init or a subreaper, so `child` is deliberately not waited on.
    fault::point(Point::BeforeReady);
    let launched = read_ready(ready_read)?;
    fault::point(Point::AfterReady);
    Ok(launched)
}

fn monitor_command(config: &LaunchConfig, ready_write: &OwnedFd) -> std::io::Result<Command> {
    let exe = std::env::current_exe()?;
    let log = |name: &str| {
        OpenOptions::new()
            .append(true)
            .create(true)
            .mode(atomic_file::FILE_MODE)
            .open(config.run_dir.join(name))
    };
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
    // SAFETY: plain descriptor syscalls on descriptors this process owns.
    let rc = unsafe {
        if fd == 3 {
            let flags = libc::fcntl(3, libc::F_GETFD);
            libc::fcntl(3, libc::F_SETFD, flags & !libc::FD_CLOEXEC)
        } else {
            libc::dup2(fd, 3)
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
