//! The runner side: announce `ready`, wait for `ack`, confirm, wait for `proceed`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::records::{self, FileRead};
use crate::wake::Waiter;
use crate::{ACK_FILE, Binding, HandshakePaths, PROCEED_FILE};

/// How long the runner waits for each control file (reference: 30 s each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunnerTimeouts {
    /// Wait for `runner-startup-ack.json`.
    pub ack: Duration,
    /// Wait for `runner-startup-proceed.json`.
    pub proceed: Duration,
}

impl Default for RunnerTimeouts {
    fn default() -> Self {
        Self {
            ack: Duration::from_secs(30),
            proceed: Duration::from_secs(30),
        }
    }
}

/// Why the runner's side of the handshake failed (texts of the reference, docs/protocol/handshake.md §5).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunnerStartupError {
    /// A control file exists but is not readable JSON.
    #[error("Failed to read runner startup control '{}': {message}", path.display())]
    ReadControl {
        /// The control file.
        path: PathBuf,
        /// The read or parse error.
        message: String,
    },
    /// A control file carries another lease's token.
    #[error("Runner startup control token does not match the acquired session lease.")]
    TokenMismatch,
    /// A control file names another run or runner instance.
    #[error("runner startup control '{}' belongs to another run", path.display())]
    OtherRun {
        /// The control file.
        path: PathBuf,
    },
    /// A control file's action is neither `ack` nor `proceed`.
    #[error("Runner startup control action is invalid.")]
    InvalidAction,
    /// The control file did not arrive in time.
    #[error("Timed out after {ms}ms waiting for runner startup control '{action}'.")]
    Timeout {
        /// The timeout that expired, in milliseconds.
        ms: u128,
        /// `ack` or `proceed`.
        action: &'static str,
    },
    /// Writing `runner-startup.json` failed.
    #[error(transparent)]
    Write(#[from] atomic_file::Error),
}

/// The runner's half of one handshake, bound to its run and lease token.
pub struct RunnerHandshake {
    async_dir: PathBuf,
    paths: HandshakePaths,
    binding: Binding,
    token: String,
    pid: u32,
    timeouts: RunnerTimeouts,
    waiter: Waiter,
}

impl RunnerHandshake {
    /// Prepares the handshake in `async_dir` for the lease `token` (the session
    /// lease owner token). Starts watching the directory at once so no control
    /// file written after this call can be missed.
    pub fn new(
        async_dir: &Path,
        binding: Binding,
        token: String,
        timeouts: RunnerTimeouts,
    ) -> Self {
        Self {
            async_dir: async_dir.to_path_buf(),
            paths: HandshakePaths::new(async_dir),
            binding,
            token,
            pid: std::process::id(),
            timeouts,
            waiter: Waiter::new(async_dir, &[ACK_FILE, PROCEED_FILE], None),
        }
    }

    /// Announces `pid` in the startup records instead of this process's id:
    /// for a runner that records on behalf of another process, and for golden
    /// snapshots. The launcher checks the records against the pid it spawned.
    pub fn with_pid(mut self, pid: u32) -> Self {
        self.pid = pid;
        self
    }

    /// Runs the whole runner side: [`Self::announce_ready`] then
    /// [`Self::await_commit`]. On failure the `error` record is written (best
    /// effort) before the error is returned; `Ok` means the launcher committed.
    pub fn startup(&self, owner: &Value) -> Result<(), RunnerStartupError> {
        let result = self
            .announce_ready(owner)
            .and_then(|()| self.await_commit());
        if let Err(e) = &result {
            // The error is returned either way; a failed record only loses diagnosis.
            let _ =
                report_startup_failure_as(&self.async_dir, &self.binding, &e.to_string(), self.pid);
        }
        result
    }

    /// Writes `{state:"ready", token, pid, owner}` (plus the run binding).
    /// `owner` is the session-lease owner record at acquisition.
    pub fn announce_ready(&self, owner: &Value) -> Result<(), RunnerStartupError> {
        let record = records::ready(&self.token, self.pid, owner, &self.binding);
        atomic_file::write_json_transient(&self.paths.startup, &record)?;
        Ok(())
    }

    /// Waits for `ack`, writes `acknowledged`, waits for `proceed`, then deletes
    /// the two control files. Does not write the `error` record on failure.
    pub fn await_commit(&self) -> Result<(), RunnerStartupError> {
        self.await_control(&self.paths.ack, "ack", self.timeouts.ack)?;
        let record = records::acknowledged(&self.token, self.pid, &self.binding);
        atomic_file::write_json_transient(&self.paths.startup, &record)?;
        crate::fault_point("after-ack");
        self.await_control(&self.paths.proceed, "proceed", self.timeouts.proceed)?;
        // Committed: leftovers are harmless, the launcher deletes stale copies.
        let _ = atomic_file::remove_if_exists(&self.paths.ack);
        let _ = atomic_file::remove_if_exists(&self.paths.proceed);
        Ok(())
    }

    fn await_control(
        &self,
        path: &Path,
        action: &'static str,
        timeout: Duration,
    ) -> Result<(), RunnerStartupError> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.check_control(path, action)? {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(RunnerStartupError::Timeout {
                    ms: timeout.as_millis(),
                    action,
                });
            }
            self.waiter.wait(deadline);
        }
    }

    /// One read of a control file (docs/protocol/handshake.md §5): `Ok(true)` when it authorises `action`.
    fn check_control(&self, path: &Path, action: &str) -> Result<bool, RunnerStartupError> {
        let record = match records::read_json(path) {
            FileRead::Missing => return Ok(false),
            FileRead::Broken(message) => {
                return Err(RunnerStartupError::ReadControl {
                    path: path.to_path_buf(),
                    message,
                });
            }
            FileRead::Json(record) => record,
        };
        if record["token"].as_str() != Some(self.token.as_str()) {
            return Err(RunnerStartupError::TokenMismatch);
        }
        if !records::binding_matches(&record, &self.binding) {
            return Err(RunnerStartupError::OtherRun {
                path: path.to_path_buf(),
            });
        }
        match record["action"].as_str() {
            Some(a) if a == action => Ok(true),
            // A valid but other action (proceed while waiting for ack) keeps waiting.
            Some("ack" | "proceed") => Ok(false),
            _ => Err(RunnerStartupError::InvalidAction),
        }
    }
}

/// Writes the `error` record `{state:"error", pid, error}` (plus the run
/// binding) for a failure before the commit, e.g. a session-lease conflict.
pub fn report_startup_failure(
    async_dir: &Path,
    binding: &Binding,
    message: &str,
) -> Result<(), atomic_file::Error> {
    report_startup_failure_as(async_dir, binding, message, std::process::id())
}

/// [`report_startup_failure`] recording `pid` instead of this process's id.
pub fn report_startup_failure_as(
    async_dir: &Path,
    binding: &Binding,
    message: &str,
    pid: u32,
) -> Result<(), atomic_file::Error> {
    let record = records::error(pid, message, binding);
    atomic_file::write_json(&HandshakePaths::new(async_dir).startup, &record)
}
