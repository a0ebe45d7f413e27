//! The launcher side: wait for `ready`, acknowledge, wait for `acknowledged`,
//! authorise (`proceed`), and on any failure before that commit persist the
//! failure and terminate the runner.

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use process_identity::{Liveness, ProcessIdentity};

use crate::records::{self, FileRead};
use crate::terminate::terminate;
use crate::wake::Waiter;
use crate::{Binding, HandshakePaths, STARTUP_FILE, persist_pre_proceed_failure};

/// The launcher's waits (reference: 10 s each, 1 s per termination signal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LauncherTimeouts {
    /// Wait for the `ready` state.
    pub ready: Duration,
    /// Wait for the `acknowledged` state (a separate budget).
    pub acknowledged: Duration,
    /// How long to wait for the runner to go after SIGTERM.
    pub terminate_grace: Duration,
    /// How long to wait for the runner to go after SIGKILL.
    pub kill_grace: Duration,
}

impl Default for LauncherTimeouts {
    fn default() -> Self {
        Self {
            ready: Duration::from_secs(10),
            acknowledged: Duration::from_secs(10),
            terminate_grace: Duration::from_secs(1),
            kill_grace: Duration::from_secs(1),
        }
    }
}

/// The spawned runner, as the launcher knows it.
pub enum Runner<'a> {
    /// Our own child: exit is observed with `waitpid` (`try_wait`), which also
    /// reaps it; the exit status stays available from the `Child`.
    Child(&'a mut Child),
    /// Another process (e.g. spawned through an intermediate): exit is observed
    /// through its pid-reuse-safe identity.
    Process(ProcessIdentity),
}

impl Runner<'_> {
    /// The runner's pid (also its process group id: it is a session leader).
    pub fn pid(&self) -> u32 {
        match self {
            Runner::Child(child) => child.id(),
            Runner::Process(identity) => identity.pid,
        }
    }

    /// Whether the runner has exited; a zombie counts as exited.
    pub fn has_exited(&mut self) -> bool {
        match self {
            // An error means the child was already reaped elsewhere.
            Runner::Child(child) => !matches!(child.try_wait(), Ok(None)),
            Runner::Process(identity) => identity.liveness() == Liveness::Dead,
        }
    }
}

/// Why the handshake failed before the commit (texts of the reference, docs/protocol/handshake.md §6.1).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HandshakeError {
    /// The runner wrote `{state:"error", error}`; its message verbatim.
    #[error("{0}")]
    Runner(String),
    /// The expected state arrived with a wrong token, pid or run binding.
    #[error("Async runner wrote an invalid {state} startup handshake: {}", path.display())]
    Invalid {
        /// `ready` or `acknowledged`.
        state: &'static str,
        /// `runner-startup.json`.
        path: PathBuf,
    },
    /// `runner-startup.json` exists but is not readable JSON.
    #[error("Failed to read async runner startup handshake '{}': {message}", path.display())]
    Read {
        /// `runner-startup.json`.
        path: PathBuf,
        /// The read or parse error.
        message: String,
    },
    /// The expected state did not arrive in time.
    #[error("Timed out after {ms}ms waiting for the async runner startup state '{state}'.")]
    Timeout {
        /// The timeout that expired, in milliseconds.
        ms: u128,
        /// `ready` or `acknowledged`.
        state: &'static str,
    },
    /// The runner exited without writing the expected state (the reference
    /// only notices this when its wait times out).
    #[error("async runner exited before writing the startup state '{state}'")]
    RunnerExited {
        /// `ready` or `acknowledged`.
        state: &'static str,
    },
    /// Writing `runner-startup-ack.json` failed.
    #[error("Failed to acknowledge async runner startup: {0}")]
    Acknowledge(#[source] atomic_file::Error),
    /// Writing `runner-startup-proceed.json` failed.
    #[error("Failed to authorize async runner startup: {0}")]
    Authorize(#[source] atomic_file::Error),
}

/// The runner was authorised to proceed: the launch counts as started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Started {
    /// The runner's pid.
    pub pid: u32,
    /// The runner's instance id.
    pub runner_process_instance_id: String,
}

/// A failed handshake, after the failure was persisted and the runner terminated.
#[derive(Debug)]
pub struct StartupFailure {
    /// The runner's pid.
    pub pid: u32,
    /// The runner's instance id.
    pub runner_process_instance_id: String,
    /// What went wrong.
    pub error: HandshakeError,
    /// Whether the runner and its process group were seen gone afterwards.
    pub termination_observed: bool,
    /// Always true: a failure is only reported before the commit point.
    pub startup_did_not_proceed: bool,
    /// Set when the failure record (candidate or status) could not be written;
    /// the caller should then prefer rolling capacity back once
    /// `termination_observed` holds (docs/protocol/handshake.md §10).
    pub persist_error: Option<atomic_file::Error>,
}

/// Deletes the handshake files of an earlier attempt (step S5); call before
/// spawning the runner. A missing file is fine.
pub fn remove_stale_files(async_dir: &Path) -> Result<(), atomic_file::Error> {
    let paths = HandshakePaths::new(async_dir);
    atomic_file::remove_if_exists(&paths.startup)?;
    atomic_file::remove_if_exists(&paths.ack)?;
    atomic_file::remove_if_exists(&paths.proceed)
}

/// Runs the launcher side of the handshake with the spawned `runner`.
///
/// Blocks for at most the two waits plus the two termination graces. On
/// success the proceed file is written and `runner-startup.json` removed. On
/// failure the pre-proceed failure record is persisted (with `session_id` if
/// given), then the runner is terminated; the handshake files stay as a trace.
pub fn run_launcher_side(
    async_dir: &Path,
    binding: &Binding,
    session_id: Option<&str>,
    mut runner: Runner<'_>,
    timeouts: &LauncherTimeouts,
) -> Result<Started, Box<StartupFailure>> {
    let waiter = Waiter::new(async_dir, &[STARTUP_FILE], Some(runner.pid()));
    let mut side = LauncherSide {
        paths: HandshakePaths::new(async_dir),
        binding,
        runner: &mut runner,
        waiter: &waiter,
    };
    let error = match side.exchange(timeouts) {
        Ok(()) => {
            return Ok(Started {
                pid: runner.pid(),
                runner_process_instance_id: binding.runner_process_instance_id.clone(),
            });
        }
        Err(error) => error,
    };
    let persisted = persist_pre_proceed_failure(async_dir, binding, session_id, &error.to_string());
    let termination_observed = terminate(
        &mut runner,
        &waiter,
        timeouts.terminate_grace,
        timeouts.kill_grace,
    );
    Err(Box::new(StartupFailure {
        pid: runner.pid(),
        runner_process_instance_id: binding.runner_process_instance_id.clone(),
        error,
        termination_observed,
        startup_did_not_proceed: true,
        persist_error: persisted.err(),
    }))
}

struct LauncherSide<'s, 'r> {
    paths: HandshakePaths,
    binding: &'s Binding,
    runner: &'s mut Runner<'r>,
    waiter: &'s Waiter,
}

impl LauncherSide<'_, '_> {
    /// ready → ack → acknowledged → proceed; `Ok` once proceed is written.
    fn exchange(&mut self, timeouts: &LauncherTimeouts) -> Result<(), HandshakeError> {
        let token = self.await_state("ready", None, timeouts.ready)?;
        let ack = records::control("ack", &token, self.binding);
        atomic_file::write_json_transient(&self.paths.ack, &ack)
            .map_err(HandshakeError::Acknowledge)?;
        crate::fault_point("after-ack");
        self.await_state("acknowledged", Some(&token), timeouts.acknowledged)?;
        let proceed = records::control("proceed", &token, self.binding);
        atomic_file::write_json_transient(&self.paths.proceed, &proceed)
            .map_err(HandshakeError::Authorize)?;
        // Committed: a leftover file is replaced or removed by the next attempt.
        let _ = atomic_file::remove_if_exists(&self.paths.startup);
        Ok(())
    }

    /// Waits for `state` (docs/protocol/handshake.md §4.4), waking on file events and on the runner's exit.
    fn await_state(
        &mut self,
        state: &'static str,
        token: Option<&str>,
        timeout: Duration,
    ) -> Result<String, HandshakeError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(token) = self.read_state(state, token)? {
                return Ok(token);
            }
            if self.runner.has_exited() {
                // It may have written its record just before exiting.
                return self
                    .read_state(state, token)?
                    .ok_or(HandshakeError::RunnerExited { state });
            }
            if Instant::now() >= deadline {
                break;
            }
            self.waiter.wait(deadline);
        }
        self.read_state(state, token)?
            .ok_or(HandshakeError::Timeout {
                ms: timeout.as_millis(),
                state,
            })
    }

    /// One read of `runner-startup.json` (docs/protocol/handshake.md §4.3, plus the pid and run binding
    /// checks): `Ok(Some(token))` when `state` is there and valid.
    fn read_state(
        &self,
        state: &'static str,
        token: Option<&str>,
    ) -> Result<Option<String>, HandshakeError> {
        let path = &self.paths.startup;
        let invalid = || HandshakeError::Invalid {
            state,
            path: path.clone(),
        };
        let record = match records::read_json(path) {
            FileRead::Missing => return Ok(None),
            FileRead::Broken(message) => {
                return Err(HandshakeError::Read {
                    path: path.clone(),
                    message,
                });
            }
            FileRead::Json(record) => record,
        };
        let pid = self.runner.pid();
        if record["state"] == "error"
            && let Some(message) = record["error"].as_str()
        {
            if records::contradicts(&record, self.binding, pid) {
                return Err(invalid());
            }
            return Err(HandshakeError::Runner(message.to_owned()));
        }
        if record["state"] != state {
            // A lingering `ready` while waiting for `acknowledged` is normal.
            return Ok(None);
        }
        let Some(found) = record["token"].as_str() else {
            return Err(invalid());
        };
        let valid = token.is_none_or(|t| t == found)
            && record["pid"].as_u64() == Some(u64::from(pid))
            && records::binding_matches(&record, self.binding);
        if valid {
            Ok(Some(found.to_owned()))
        } else {
            Err(invalid())
        }
    }
}
