//! `subagents run`: create the run, spawn the detached monitor, and return
//! once the runner has said on the ready pipe that it is running.
//!
//! Process tree of one run:
//!
//! ```text
//! subagents run            (returns; not a parent of anything that outlives it)
//! └─ subagents __monitor   new session, child subreaper; waits on the runner,
//!    │                     writes process-terminal.json, releases the marker
//!    └─ subagents __runner own process group; writes status.json and events
//!       └─ COMMAND         own process group; stdin = task, logs to files
//! ```

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::fcntl::OFlag;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use process_identity::ProcessIdentity;
use serde::{Deserialize, Serialize};
use status::layout::files;
use status::{Layout, RunState};

use crate::admission::{self, Spawned};
use crate::cli::RunArgs;
use crate::config::{LaunchConfig, READY_FD_ENV};
use crate::error::{CliError, CliResult, Exit};
use crate::prepare::{self, Request};

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
}

/// Runs `subagents run`.
pub fn run(layout: &Layout, args: &RunArgs) -> CliResult<Launched> {
    let session = admission::session_id(args.session.as_deref());
    launch(layout, &Request::from_run_args(args, &session)?)
}

/// Prepares, spawns and (for a revival) hands over a run; settles its
/// capacity slot from what is proven about the runner.
pub fn launch(layout: &Layout, request: &Request) -> CliResult<Launched> {
    let (config, slot) = prepare::prepare(layout, request)?;
    if config.revival.is_some() {
        handshake::remove_stale_files(&config.run_dir)?;
    }
    match spawn(&config) {
        Ok(launched) if config.revival.is_some() => hand_over(layout, &config, launched, slot),
        Ok(launched) => {
            let spawned = Spawned::started(launched.pid, &launched.runner_process_instance_id);
            admission::settle(slot, &spawned)?;
            Ok(launched)
        }
        Err(e) => {
            settle_failed_start(&config, slot)?;
            let reason = failure_reason(&config.run_dir, &e);
            Err(CliError::failed(format!(
                "failed to start run '{}': {reason}",
                config.run_id
            )))
        }
    }
}

/// The revival startup handshake (handshake.md §5–6): the runner holds the
/// session lease and waits; we acknowledge and authorise it. On failure the
/// crate has persisted the failure and terminated the runner; we free a
/// lease the dead runner still holds and settle the slot by the §9 table.
fn hand_over(
    layout: &Layout,
    config: &LaunchConfig,
    launched: Launched,
    slot: Option<capacity::SlotHandle>,
) -> CliResult<Launched> {
    let identity = ProcessIdentity::of(launched.pid).unwrap_or(ProcessIdentity {
        pid: launched.pid,
        start_time: 0,
        boot_id: None,
    });
    let binding = handshake::Binding {
        run_id: config.run_id.clone(),
        runner_process_instance_id: config.runner_process_instance_id.clone(),
    };
    let wait = Duration::from_millis(config.revival.as_ref().map_or(10_000, |r| r.timeouts_ms.0));
    let timeouts = handshake::LauncherTimeouts {
        ready: wait,
        acknowledged: wait,
        ..Default::default()
    };
    let runner = handshake::Runner::Process(identity);
    match handshake::run_launcher_side(
        &config.run_dir,
        &binding,
        config.session_id.as_deref(),
        runner,
        &timeouts,
    ) {
        Ok(_) => {
            let spawned = Spawned::started(launched.pid, &launched.runner_process_instance_id);
            admission::settle(slot, &spawned)?;
            Ok(launched)
        }
        Err(failure) => {
            if failure.termination_observed {
                release_dead_runners_lease(layout, config);
            }
            let spawned = Spawned {
                failed: true,
                pid: Some(failure.pid),
                runner_process_instance_id: Some(&failure.runner_process_instance_id),
                did_not_proceed: failure.startup_did_not_proceed,
                termination_observed: failure.termination_observed,
            };
            admission::settle(slot, &spawned)?;
            Err(CliError::failed(format!(
                "failed to start async run '{}': {}",
                config.run_id, failure.error
            )))
        }
    }
}

/// A runner killed before proceed cannot release its lease; we can, once its
/// termination is observed and the lease names this run.
fn release_dead_runners_lease(layout: &Layout, config: &LaunchConfig) {
    let Some(revival) = &config.revival else {
        return;
    };
    let root = recovery::lease::lease_root(layout.root());
    let Ok(inspection) = recovery::lease::inspect_lease(&root, &revival.session_file) else {
        return;
    };
    if let recovery::lease::LeaseState::Owned(owner) = inspection.state
        && owner.run_id == config.run_id
    {
        let _ = recovery::lease::release_lease(&root, &revival.session_file, &owner.token);
    }
}

/// A runner that never reported ready did not proceed; its slot comes back
/// only if no runner exists or the recorded one is provably gone.
fn settle_failed_start(config: &LaunchConfig, slot: Option<capacity::SlotHandle>) -> CliResult {
    let status = status::model::read_status(&config.run_dir).ok().flatten();
    let runner = status.as_ref().and_then(|s| s.runner_identity.clone());
    let gone = runner
        .as_ref()
        .is_none_or(|r| r.liveness() == process_identity::Liveness::Dead);
    let spawned = Spawned {
        failed: true,
        pid: runner.as_ref().map(|r| r.pid),
        runner_process_instance_id: runner
            .as_ref()
            .map(|_| config.runner_process_instance_id.as_str()),
        did_not_proceed: true,
        termination_observed: gone,
    };
    admission::settle(slot, &spawned)
}

fn spawn(config: &LaunchConfig) -> std::io::Result<Launched> {
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
    read_ready(ready_read)
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
pub(crate) unsafe fn inherit_as_fd3(fd: i32) -> std::io::Result<()> {
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

fn read_ready(fd: OwnedFd) -> std::io::Result<Launched> {
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

/// The best explanation of a failed start: the run's own error if the
/// monitor or runner recorded one, else the launcher's.
fn failure_reason(run_dir: &Path, e: &std::io::Error) -> String {
    let recorded = status::model::read_status(run_dir)
        .ok()
        .flatten()
        .and_then(|s| s.error);
    let stderr = std::fs::read_to_string(run_dir.join(files::RUNNER_STDERR)).unwrap_or_default();
    let last = stderr
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .map(str::to_owned);
    recorded.or(last).unwrap_or_else(|| e.to_string())
}

/// Exit code of `run --wait` / `wait` for a final state.
pub fn exit_for(state: RunState) -> CliResult {
    match state {
        RunState::Complete => Ok(()),
        _ => Err(CliError::silent(Exit::Failed)),
    }
}
