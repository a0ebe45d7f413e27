#![doc = include_str!("../README.md")]
//!
//! The revival startup handshake between a launcher and the runner it spawned.
//!
//! When a run revives an existing session, the launcher must not report the
//! run as started until the runner holds the session lease and has been told
//! to go on. The exchange (docs/protocol/handshake.md §4) goes through three JSON
//! files in the run directory, removed after `proceed` and left as the trace of
//! a failed startup:
//!
//! ```text
//! runner                                   launcher
//! runner-startup.json {ready, token, pid}  ──►  verify token, pid and run binding
//!                                          ◄──  runner-startup-ack.json {ack, token}
//! runner-startup.json {acknowledged, ...}  ──►  verify the token again
//!                                          ◄──  runner-startup-proceed.json {proceed}  (commit point)
//! ```
//!
//! Both sides wake on inotify events for the run directory (polling only when
//! no watcher can be created), and the launcher also wakes the moment the
//! runner exits (pidfd). Every record carries `runId` and
//! `runnerProcessInstanceId` besides the reference fields, and each side checks
//! them, so a record from another attempt is never taken for this one.
//! The four exchange records are replaced atomically but not fsynced
//! ([`atomic_file::write_json_transient`]): they only coordinate two live
//! processes, which a crash ends; the failure record stays durable.
//!
//! * Runner side: [`RunnerHandshake`], [`report_startup_failure`].
//! * Launcher side: [`remove_stale_files`] before the spawn, then
//!   [`run_launcher_side`]; on failure it persists the pre-proceed failure
//!   record (`status.json`, `process-terminal-candidate.json`, §6.3) and
//!   terminates the runner's process group (§6.2) before returning.
#![warn(missing_docs)]

mod failure;
mod launcher;
mod records;
mod runner;
mod terminate;
mod wake;

use std::path::{Path, PathBuf};

pub use failure::{
    CANDIDATE_FILE, STATUS_FILE, persist_pre_proceed_failure, persist_pre_proceed_failure_at,
};
pub use launcher::{
    HandshakeError, LauncherTimeouts, Runner, Started, StartupFailure, remove_stale_files,
    run_launcher_side,
};
pub use records::validate_record;
pub use runner::{
    RunnerHandshake, RunnerStartupError, RunnerTimeouts, report_startup_failure,
    report_startup_failure_as,
};

/// A host's fault-injection callback (crash tests), called with the name of
/// a point inside this crate's writers. Unset, the points cost one atomic load.
static FAULT_HOOK: std::sync::OnceLock<fn(&str)> = std::sync::OnceLock::new();

/// Registers the fault-injection callback of this process (first call wins).
/// Points: `after-ack` (launcher: the ack is written,
/// the acknowledgement not yet awaited; runner: the ack was read and the
/// `acknowledged` record written, proceed not yet awaited).
// The binary's crash tests (`SUBAGENTS_FAULT`) only: not part of the
// crate's stable API.
#[doc(hidden)]
pub fn install_fault_hook(hook: fn(&str)) {
    let _ = FAULT_HOOK.set(hook);
}

pub(crate) fn fault_point(name: &str) {
    if let Some(hook) = FAULT_HOOK.get() {
        hook(name);
    }
}

/// File the runner writes its startup state to.
pub const STARTUP_FILE: &str = "runner-startup.json";
/// File the launcher writes its acknowledgement to.
pub const ACK_FILE: &str = "runner-startup-ack.json";
/// File the launcher writes its authorisation (the commit point) to.
pub const PROCEED_FILE: &str = "runner-startup-proceed.json";

/// The run a handshake belongs to; written into every record and checked on read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    /// The run id (`config.id`).
    pub run_id: String,
    /// The UUID the launcher gave this runner process (`runnerProcessInstanceId`).
    pub runner_process_instance_id: String,
}

/// The three handshake file paths of one run directory.
#[derive(Debug, Clone)]
pub struct HandshakePaths {
    /// `<asyncDir>/runner-startup.json`.
    pub startup: PathBuf,
    /// `<asyncDir>/runner-startup-ack.json`.
    pub ack: PathBuf,
    /// `<asyncDir>/runner-startup-proceed.json`.
    pub proceed: PathBuf,
}

impl HandshakePaths {
    /// The paths inside `async_dir`.
    pub fn new(async_dir: &Path) -> Self {
        Self {
            startup: async_dir.join(STARTUP_FILE),
            ack: async_dir.join(ACK_FILE),
            proceed: async_dir.join(PROCEED_FILE),
        }
    }
}
