//! Stale-run reconciliation: a run whose runner is gone while its status
//! still says `queued` or `running` becomes `failed`, with a clear error.
//!
//! Unlike the reference, liveness is decided with the runner's recorded
//! [`ProcessIdentity`] (pid + start time + boot id) when the status has one, so
//! a recycled pid is never mistaken for the runner and a live runner is never
//! declared stale for being quiet. Records without an identity (the
//! reference's files) follow the reference's rules exactly, in
//! [`crate::reference`], since a listing writes its repairs into that tool's
//! own files.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use process_identity::{Liveness, pid_liveness};
use serde_json::json;

use crate::layout::files;
use crate::model::{RunState, RunStatus, read_status, update_status};
use crate::proof::ProcessTerminal;
use crate::{LIFECYCLE_ARTIFACT_VERSION, Result, events, reference};

/// Tunables of reconciliation.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// "Now" in ms.
    pub now: u64,
    /// A queued record whose writer is gone is stale after this long.
    pub queued_grace_ms: u64,
    /// A live pid without an identity is trusted for this long without updates.
    pub stale_alive_pid_ms: u64,
}

impl Options {
    /// The defaults at `now`: 30 s queued grace, 24 h live-pid rule.
    pub fn at(now: u64) -> Self {
        Self {
            now,
            queued_grace_ms: 30_000,
            stale_alive_pid_ms: 24 * 60 * 60 * 1000,
        }
    }
}

/// What reconciliation did.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// There is no status file.
    NoStatus,
    /// The status stands as it is.
    Unchanged(RunStatus),
    /// The run was repaired to `failed`.
    Repaired {
        /// The repaired status.
        status: RunStatus,
        /// Why.
        message: String,
    },
}

impl Outcome {
    /// The status after reconciliation, if any.
    pub fn status(&self) -> Option<&RunStatus> {
        match self {
            Self::NoStatus => None,
            Self::Unchanged(status) | Self::Repaired { status, .. } => Some(status),
        }
    }
}

/// Reconciles one run directory.
pub fn reconcile_run(run_dir: &Path, options: Options) -> Result<Outcome> {
    let Some(status) = read_status(run_dir)? else {
        return Ok(Outcome::NoStatus);
    };
    reconcile_read(run_dir, status, options)
}

/// [`reconcile_run`] of the status the caller just read from `run_dir`
/// (a repair still re-checks the file under its lock).
pub fn reconcile_read(run_dir: &Path, status: RunStatus, options: Options) -> Result<Outcome> {
    if let Some(outcome) = repair_with_result(run_dir, &status, options)? {
        return Ok(outcome);
    }
    let Some(message) = stale_message(&status, options) else {
        return Ok(Outcome::Unchanged(status));
    };
    let message = with_stderr_tail(run_dir, message);
    // A reference record's failed repair also writes its result file.
    let result_file = reference::is_reference_record(&status)
        .then(|| reference::result_path(run_dir, &run_id_of(run_dir, &status)))
        .flatten();
    let mut result_error = None;
    // Re-check under the lock: the runner may have written its final status meanwhile.
    let repaired = update_status(run_dir, |current| {
        let current = current?;
        stale_message(&current, options)?;
        let repaired = repair(current.clone(), &message, options.now);
        if let Some(path) = &result_file {
            let result =
                reference::failed_result(&current, &repaired, run_dir, &message, options.now);
            if let Err(e) = reference::write_failed_result(path, &result) {
                result_error = Some(e);
                return None;
            }
        }
        Some(repaired)
    })?;
    if let Some(e) = result_error {
        return Err(e);
    }
    match repaired {
        Some(status) => {
            let mut fields = json!({"pid": status.pid, "message": message});
            if let Some(path) = &result_file {
                fields["resultPath"] = json!(path.display().to_string());
            }
            let _ = events::append(
                run_dir,
                "subagent.run.repaired_stale",
                &status.run_id,
                options.now,
                fields,
            );
            Ok(Outcome::Repaired { status, message })
        }
        None => Ok(read_status(run_dir)?.map_or(Outcome::NoStatus, Outcome::Unchanged)),
    }
}

/// `runId`, else the directory name (as the reference names result files).
pub fn run_id_of(run_dir: &Path, status: &RunStatus) -> String {
    if status.run_id.is_empty() {
        run_dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    } else {
        status.run_id.clone()
    }
}

/// Result-based repair (docs/protocol/status.md §7.4) when an active run's result file
/// exists; it wins over any liveness verdict.
fn repair_with_result(
    run_dir: &Path,
    status: &RunStatus,
    options: Options,
) -> Result<Option<Outcome>> {
    let Some(path) = reference::result_path(run_dir, &run_id_of(run_dir, status)) else {
        return Ok(None);
    };
    if !status.state.is_active() || !path.exists() {
        return Ok(None);
    }
    let mut failure = None;
    let repaired = update_status(run_dir, |current| {
        match reference::repair_from_result(&current?, &path, options.now) {
            Ok(repaired) => repaired,
            Err(e) => {
                failure = Some(e);
                None
            }
        }
    })?;
    if let Some(e) = failure {
        return Err(e);
    }
    Ok(repaired.map(|status| Outcome::Repaired {
        status,
        message: reference::RESULT_REPAIR_MESSAGE.to_owned(),
    }))
}

/// The key of `status.json` (our extension) naming the executor of a run
/// that is not a local process tree (`"slurm"`); its `dispatch.json`
/// holds the rest.
pub const EXECUTOR_KEY: &str = "executor";

/// Why `status` is stale, or `None` when it is not.
pub fn stale_message(status: &RunStatus, options: Options) -> Option<String> {
    if reference::is_reference_record(status) {
        return reference::stale_message(status, options);
    }
    if status.display_dismissed_at.is_some() || !status.state.is_active() {
        return None;
    }
    // A run held by an executor (a Slurm job) may wait in its queue for
    // hours and runs on another host: only the executor's record decides
    // (the observer asks it).
    if status
        .extra
        .get(EXECUTOR_KEY)
        .and_then(serde_json::Value::as_str)
        .is_some_and(|e| e != "local")
    {
        return None;
    }
    // A live monitor waits on the runner and repairs the run itself, with a
    // better message than a liveness guess.
    if status
        .monitor_identity
        .as_ref()
        .is_some_and(|m| m.liveness() == Liveness::Alive)
    {
        return None;
    }
    let age = options
        .now
        .saturating_sub(status.last_update.or(status.started_at).unwrap_or(0));
    // Only the machine that ran it can tell whether a run of another machine
    // is stale.
    if status.foreign_host().is_some() {
        return None;
    }
    if let Some(identity) = &status.runner_identity {
        return match identity.liveness() {
            Liveness::Dead => Some(dead_message(identity.pid)),
            Liveness::Alive | Liveness::Unknown | Liveness::Foreign => None,
        };
    }
    // A bare pid is only looked up when the run was recorded in this boot.
    if let Some(pid) = status.pid.filter(|_| status.recorded_in_this_boot()) {
        return match pid_liveness(pid) {
            Liveness::Dead => Some(dead_message(pid)),
            _ if age > options.stale_alive_pid_ms => Some(format!(
                "Async runner process {pid} still has a live PID, but status has not updated for {age}ms. Marked run failed by stale-run reconciliation because PID ownership cannot be verified."
            )),
            _ => None,
        };
    }
    // A queued record without a runner: stale once its writer is gone and the grace passed.
    let launcher_gone = status
        .launcher_identity
        .as_ref()
        .is_none_or(|l| l.liveness() == Liveness::Dead);
    (status.state == RunState::Queued && launcher_gone && age > options.queued_grace_ms).then(|| {
        "Async run was queued but its runner never started. Marked run failed by stale-run reconciliation.".to_owned()
    })
}

fn dead_message(pid: u32) -> String {
    format!(
        "Async runner process {pid} exited or disappeared before writing a result. Marked run failed by stale-run reconciliation."
    )
}

/// Applies the failed repair (docs/protocol/status.md §7.2) to a status, downgrading a pending
/// lifecycle-3 proof to `unknown/stale-repair` (nobody is left to observe).
pub fn repair(status: RunStatus, message: &str, now: u64) -> RunStatus {
    let mut status = fail_active(status, message, now);
    let pending = status
        .process_terminal
        .as_ref()
        .is_none_or(|p| p.get("state").and_then(|s| s.as_str()) == Some("pending"));
    if status.lifecycle_artifact_version == Some(LIFECYCLE_ARTIFACT_VERSION) && pending {
        let proof =
            ProcessTerminal::unknown(&status.run_id, "observer-unavailable", "stale-repair", None);
        status.process_terminal = Some(proof.to_value());
    }
    status
}

/// Marks the run and its running/pending steps failed with `message`, and
/// leaves the proof alone: for an observer that is still going to write it.
pub fn fail_active(mut status: RunStatus, message: &str, now: u64) -> RunStatus {
    let steps = status.steps.get_or_insert_with(Vec::new);
    if steps.is_empty() {
        steps.push(crate::Step {
            agent: "subagent".into(),
            status: "running".into(),
            ..Default::default()
        });
    }
    for step in steps
        .iter_mut()
        .filter(|s| matches!(s.status.as_str(), "running" | "pending"))
    {
        step.status = "failed".into();
        step.extra.remove("activityState");
        let ended = *step.ended_at.get_or_insert(now);
        if let (Some(start), None) = (step.started_at, step.duration_ms) {
            step.duration_ms = Some(ended.saturating_sub(start));
        }
        step.exit_code.get_or_insert(1);
        step.error.get_or_insert_with(|| message.to_owned());
    }
    status.state = RunState::Failed;
    status.extra.remove("activityState");
    status.last_update = Some(now);
    status.ended_at = Some(now);
    status
}

/// Appends the runner's stderr tail (last 30 lines of the last 64 KiB, at
/// most 4000 characters) to a repair message, as the reference does.
pub fn with_stderr_tail(run_dir: &Path, message: String) -> String {
    let tail = stderr_tail(&run_dir.join(files::RUNNER_STDERR));
    if tail.is_empty() {
        message
    } else {
        format!("{message}\n\nRunner stderr tail:\n{tail}")
    }
}

fn stderr_tail(path: &Path) -> String {
    // Never blocks on a FIFO; reads at most the 64 KiB tail.
    let Ok(mut file) = atomic_file::read::open_regular(path) else {
        return String::new();
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
    let mut bytes = Vec::new();
    let _ = file.take(64 * 1024).read_to_end(&mut bytes);
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.trim().lines().collect();
    let tail = lines[lines.len().saturating_sub(30)..].join("\n");
    let chars: Vec<char> = tail.chars().collect();
    if chars.len() > 4000 {
        format!(
            "{}\n[stderr tail truncated]",
            chars[chars.len() - 4000..].iter().collect::<String>()
        )
    } else {
        tail
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::write_status;
    use process_identity::ProcessIdentity;

    fn running(dir: &Path, identity: Option<ProcessIdentity>, pid: Option<u32>) {
        let mut status = RunStatus::new("r1", RunState::Running);
        status.lifecycle_artifact_version = Some(3);
        status.pid = pid;
        status.runner_identity = identity;
        status.started_at = Some(1);
        status.process_terminal =
            Some(ProcessTerminal::new(crate::proof::ProofState::Pending, "r1", "i1").to_value());
        status.steps = Some(vec![crate::Step {
            agent: "a".into(),
            status: "running".into(),
            started_at: Some(1),
            ..Default::default()
        }]);
        write_status(dir, &status).unwrap();
    }

    #[test]
    fn dead_runner_is_repaired_with_stderr_tail() {
        let dir = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let identity = ProcessIdentity::of(child.id()).unwrap();
        child.wait().unwrap();
        running(dir.path(), Some(identity.clone()), Some(identity.pid));
        std::fs::write(dir.path().join(files::RUNNER_STDERR), "boom\n").unwrap();
        let Outcome::Repaired { status, message } =
            reconcile_run(dir.path(), Options::at(100)).unwrap()
        else {
            panic!("not repaired")
        };
        assert!(message.contains("exited or disappeared"), "{message}");
        assert!(message.ends_with("Runner stderr tail:\nboom"), "{message}");
        assert_eq!(status.state, RunState::Failed);
        assert_eq!(status.steps()[0].status, "failed");
        assert_eq!(status.steps()[0].duration_ms, Some(99));
        assert_eq!(status.process_terminal.unwrap()["reason"], "stale-repair");
        assert_eq!(
            events::read_all(dir.path()).last().unwrap()["type"],
            "subagent.run.repaired_stale"
        );
    }

    #[test]
    fn recycled_pid_is_dead_and_live_identity_is_not_stale() {
        let dir = tempfile::tempdir().unwrap();
        let me = ProcessIdentity::current().unwrap();
        // Our own pid with another start time: a recycled pid.
        let recycled = ProcessIdentity {
            start_time: me.start_time + 5,
            ..me.clone()
        };
        running(dir.path(), Some(recycled), Some(me.pid));
        assert!(matches!(
            reconcile_run(dir.path(), Options::at(100)).unwrap(),
            Outcome::Repaired { .. }
        ));
        running(dir.path(), Some(me.clone()), Some(me.pid));
        let far_future = Options::at(10 * 24 * 60 * 60 * 1000);
        assert!(matches!(
            reconcile_run(dir.path(), far_future).unwrap(),
            Outcome::Unchanged(_)
        ));
    }

    #[test]
    fn bare_live_pid_goes_stale_after_a_day() {
        let dir = tempfile::tempdir().unwrap();
        running(dir.path(), None, Some(std::process::id()));
        assert!(matches!(
            reconcile_run(dir.path(), Options::at(100)).unwrap(),
            Outcome::Unchanged(_)
        ));
        let Outcome::Repaired { message, .. } =
            reconcile_run(dir.path(), Options::at(2 * 24 * 60 * 60 * 1000)).unwrap()
        else {
            panic!("not repaired")
        };
        assert!(message.contains("still has a live PID"));
    }

    #[test]
    fn queued_without_runner_is_stale_after_grace() {
        let dir = tempfile::tempdir().unwrap();
        let mut status = RunStatus::new("q", RunState::Queued);
        status.last_update = Some(1000);
        // Ours: the launcher that wrote the record is gone.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        status.launcher_identity = Some(ProcessIdentity::of(child.id()).unwrap());
        child.wait().unwrap();
        write_status(dir.path(), &status).unwrap();
        assert!(matches!(
            reconcile_run(dir.path(), Options::at(2000)).unwrap(),
            Outcome::Unchanged(_)
        ));
        assert!(matches!(
            reconcile_run(dir.path(), Options::at(60_000)).unwrap(),
            Outcome::Repaired { .. }
        ));
    }
}
