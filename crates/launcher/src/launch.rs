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

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::fcntl::OFlag;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use process_identity::ProcessIdentity;
use serde::{Deserialize, Serialize};
use status::layout::files;
use status::{Layout, PROMPT_REDACTED, RunState, RunStatus, Step, index};

use crate::admission::{self, Spawned};
use crate::cli::RunArgs;
use crate::config::{LaunchConfig, READY_FD_ENV};
use crate::error::{CliError, CliResult, Exit};
use crate::root::parse_duration;

/// Default wall-clock limit of a run, as in the reference.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30 * 60);
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
    let (config, slot) = prepare(layout, args, &session)?;
    match spawn(&config) {
        Ok(launched) => {
            let spawned = Spawned {
                failed: false,
                pid: Some(launched.pid),
                runner_process_instance_id: Some(&launched.runner_process_instance_id),
                did_not_proceed: false,
                termination_observed: false,
            };
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

type Prepared = (LaunchConfig, Option<capacity::SlotHandle>);

fn prepare(layout: &Layout, args: &RunArgs, session: &str) -> CliResult<Prepared> {
    let program = args.command.first().filter(|c| !c.is_empty());
    let program =
        program.ok_or_else(|| CliError::failed("failed to launch run: COMMAND is empty"))?;
    let cwd = resolve_cwd(args.cwd.as_deref())?;
    let timeout_ms = timeout_ms(args.timeout.as_deref())?;
    let task = read_task(args)?;
    atomic_file::ensure_private_dir(&layout.runs_dir())?;
    let (run_id, slot) = admit_run(layout, args.id.as_deref(), session, args.max_active)?;
    let run_dir = layout.run_dir(&run_id);
    let task_file = match &task {
        Some(text) => {
            let path = run_dir.join(files::TASK);
            atomic_file::write_private(&path, text.as_bytes())?;
            Some(path)
        }
        None => None,
    };
    let agent = args.agent.clone().unwrap_or_else(|| file_name(program));
    let config = LaunchConfig {
        run_id,
        root: layout.root().to_path_buf(),
        run_dir,
        runner_process_instance_id: uuid::Uuid::new_v4().to_string(),
        agent,
        command: args.command.clone(),
        cwd,
        task_file,
        timeout_ms,
        session_id: Some(session.to_owned()),
        env: Default::default(),
    };
    write_queued(&config, task.is_some())?;
    // The marker exists before any process does, so an active listing can
    // never miss a run whose runner may exist.
    index::create_marker(&config.run_dir)?;
    Ok((config, slot))
}

fn resolve_cwd(cwd: Option<&Path>) -> CliResult<PathBuf> {
    let dir = match cwd {
        Some(dir) => dir.to_path_buf(),
        None => std::env::current_dir()
            .map_err(|e| CliError::failed(format!("failed to read current directory: {e}")))?,
    };
    let real = dir.canonicalize().map_err(|e| {
        CliError::failed(format!(
            "failed to launch run: cwd '{}': {e}",
            dir.display()
        ))
    })?;
    if !real.is_dir() {
        return Err(CliError::failed(format!(
            "failed to launch run: cwd is not a directory: {}",
            dir.display()
        )));
    }
    Ok(real)
}

fn timeout_ms(text: Option<&str>) -> CliResult<Option<u64>> {
    let duration = match text {
        Some(text) => parse_duration(text)
            .map_err(|e| CliError::failed(format!("failed to parse --timeout: {e}")))?,
        None => DEFAULT_TIMEOUT,
    };
    Ok((!duration.is_zero()).then_some(duration.as_millis() as u64))
}

fn read_task(args: &RunArgs) -> CliResult<Option<String>> {
    if let Some(path) = &args.task_file {
        let text = std::fs::read_to_string(path).map_err(|e| {
            CliError::failed(format!(
                "failed to read task file '{}': {e}",
                path.display()
            ))
        })?;
        return Ok(Some(text));
    }
    Ok(args.task.clone())
}

fn file_name(program: &str) -> String {
    Path::new(program)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| program.to_owned())
}

/// Picks the run id, takes a capacity slot for it (before any run artifact
/// exists, as in the reference), then creates the run directory exclusively.
/// An explicit id that exists is refused; a generated one is retried.
fn admit_run(
    layout: &Layout,
    explicit: Option<&str>,
    session: &str,
    limit: Option<u32>,
) -> CliResult<(String, Option<capacity::SlotHandle>)> {
    if let Some(id) = explicit
        && !status::layout::is_safe_run_id(id)
    {
        return Err(CliError::failed(format!(
            "failed to launch run: --id '{id}' is not a safe file name (letters, digits, '-', '_', '.'; not starting with '.')"
        )));
    }
    let exists =
        |id: &str| CliError::failed(format!("failed to launch run: run '{id}' already exists"));
    loop {
        let id = explicit
            .map(str::to_owned)
            .unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string()[..10].to_owned());
        let dir = layout.run_dir(&id);
        if dir.symlink_metadata().is_ok() {
            match explicit {
                Some(_) => return Err(exists(&id)),
                None => continue,
            }
        }
        let mut slot = admission::acquire(layout, session, limit, &id, &dir)?;
        let created = DirBuilder::new().mode(atomic_file::DIR_MODE).create(&dir);
        let Err(e) = created else {
            return Ok((id, slot));
        };
        if let Some(handle) = slot.as_mut() {
            let _ = handle.rollback();
        }
        match e.kind() {
            std::io::ErrorKind::AlreadyExists if explicit.is_none() => continue,
            std::io::ErrorKind::AlreadyExists => return Err(exists(&id)),
            _ => {
                return Err(CliError::failed(format!(
                    "failed to create run directory '{}': {e}",
                    dir.display()
                )));
            }
        }
    }
}

fn write_queued(config: &LaunchConfig, has_task: bool) -> CliResult {
    let now = status::now_ms();
    let mut queued = RunStatus::new(&config.run_id, RunState::Queued);
    queued.session_id = config.session_id.clone();
    queued.mode = Some("single".into());
    queued.last_update = Some(now);
    queued.cwd = Some(config.cwd.display().to_string());
    queued.timeout_ms = config.timeout_ms;
    queued.launcher_identity = ProcessIdentity::current().ok();
    queued.runner_process_instance_id = Some(config.runner_process_instance_id.clone());
    queued.steps = Some(vec![Step {
        agent: config.agent.clone(),
        status: "pending".into(),
        description: has_task.then(|| PROMPT_REDACTED.to_owned()),
        ..Step::default()
    }]);
    status::model::write_status(&config.run_dir, &queued)?;
    Ok(())
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
            inherit_as_fd3(fd)
        });
    }
    Ok(command)
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
