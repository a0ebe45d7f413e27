//! What a launcher killed while it creates its run leaves behind, and how
//! `reconcile` finishes it.
//!
//! The launcher creates the run directory first and holds an `flock` on it
//! ([`CreationLock`]) until the queued status is written; only then come
//! the fan-out budget (named after the run) and the run's files. Killed
//! anywhere in between, it leaves a directory without `status.json`: maybe
//! temp files of its batch, maybe a budget no run refers to yet.
//! [`tidy`] finishes such a directory once its lock is free (the launcher
//! is gone) and it is older than [`CREATION_GRACE`] (a launcher that takes
//! no lock, such as the reference's, has had that long): its temp files go,
//! it gets the budget made for it, and a failed status with a `not-started`
//! proof, so it lists as a failed run and `prune` removes it, budget
//! included, like any finished run. A run with a `not-started` record but
//! no `process-terminal.json` gets the file, and a finished run's temp
//! files whose writer is gone are removed.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use status::layout::files;
use status::model::RunStatus;
use status::proof::{Fallback, ProcessTerminal, ProofState};
use status::{Layout, RunState};

use crate::error::{Error, Result};

/// How old a run directory without `status.json` must be before
/// `reconcile` finishes it, even with its creation lock free.
pub const CREATION_GRACE: Duration = Duration::from_secs(10);
/// A temp file older than this is removed from a finished run even when
/// its writer cannot be proven gone (a pid of another pid namespace).
pub const TEMP_GRACE: Duration = Duration::from_secs(600);

/// The error of a run that `reconcile` finished while its launcher waited
/// for the creation lock.
const GIVEN_UP: &str = "run was never created: its launcher exited before writing its status; marked failed by reconcile";

/// An exclusive `flock` on a run directory, held by its launcher from the
/// directory's creation until the queued status is written. It dies with
/// the launcher, so a free lock on a directory without status means nobody
/// is creating it any more.
pub struct CreationLock {
    _dir: File,
}

impl CreationLock {
    /// Takes the lock for the launcher (blocking: a reconciler holds it for
    /// a moment only), and refuses a directory `reconcile` already finished.
    pub fn take(run_dir: &Path, run_id: &str) -> Result<Self> {
        let fail = |e: std::io::Error| {
            Error::failed(format!(
                "failed to lock run directory '{}': {e}",
                atomic_file::escape_path(run_dir)
            ))
        };
        let dir = File::open(run_dir).map_err(fail)?;
        dir.lock().map_err(fail)?;
        if run_dir.join(files::STATUS).symlink_metadata().is_ok() {
            return Err(Error::failed(format!(
                "failed to launch run: run '{run_id}' was given up while it was being created"
            )));
        }
        Ok(Self { _dir: dir })
    }

    fn try_take(run_dir: &Path) -> Option<Self> {
        let dir = File::open(run_dir).ok()?;
        dir.try_lock().ok()?;
        Some(Self { _dir: dir })
    }
}

/// What [`tidy`] did to one run.
#[derive(Debug, Default)]
pub struct Tidied {
    /// The run was finished as failed (one line, for the report).
    pub finished: Option<String>,
    /// The session whose pool holds the run's slot.
    pub session: Option<String>,
}

/// `reconcile`'s pass over one run directory: finishes a directory its
/// launcher left without status, writes the missing `process-terminal.json`
/// of a `not-started` record and removes a finished run's temp files whose
/// writer is gone. Best effort: what cannot be done is left for next time.
pub fn tidy(layout: &Layout, dir: &Path, id: &str, now: u64) -> Tidied {
    match status::model::read_status(dir) {
        Ok(None) => finish_uncreated(layout, dir, id, now).unwrap_or_default(),
        Ok(Some(status)) => {
            complete_not_started(dir, &status);
            sweep_finished(dir, &status);
            Tidied::default()
        }
        Err(_) => Tidied::default(),
    }
}

/// Finishes a run directory without status whose launcher is gone.
pub fn finish_uncreated(layout: &Layout, dir: &Path, id: &str, now: u64) -> Option<Tidied> {
    if !older_than(dir, CREATION_GRACE) {
        return None;
    }
    let _lock = CreationLock::try_take(dir)?;
    if dir.join(files::STATUS).symlink_metadata().is_ok() {
        return None;
    }
    remove_temps(dir, |_| true);
    adopt_budget(layout, dir, id);
    let session = slot_session(layout, id, dir);
    let proof = ProcessTerminal::new(ProofState::NotStarted, id, "unknown");
    let mut status = RunStatus::new(id, RunState::Failed);
    status.session_id = session.clone();
    status.mode = Some("single".into());
    status.error = Some(GIVEN_UP.into());
    status.last_update = Some(now);
    status.ended_at = Some(now);
    status.process_terminal = Some(proof.to_value());
    status::model::write_status(dir, &status).ok()?;
    let _ = supervisor::observer::write_not_started(dir, &proof);
    let _ = status::index::release_marker(dir);
    Some(Tidied {
        finished: Some(GIVEN_UP.into()),
        session,
    })
}

/// Whether `path` was last changed longer than `age` ago.
fn older_than(path: &Path, age: Duration) -> bool {
    let Ok(meta) = path.symlink_metadata() else {
        return false;
    };
    // A directory's mtime moves with every entry its creator adds.
    let changed = meta.mtime().max(0) as u64;
    let now = status::now_ms() / 1000;
    now.saturating_sub(changed) >= age.as_secs()
}

/// A budget made for a run that never wrote its persisted copy is recorded
/// in the run directory, so the run refers to it and `prune` removes it
/// with the run. Budgets are named `<run id>-<uuid>`.
fn adopt_budget(layout: &Layout, dir: &Path, id: &str) {
    if dir.join(fanout_budget::PERSISTED_FILE).exists() {
        return;
    }
    let root = layout.fanout_budgets_dir();
    let Ok(entries) = std::fs::read_dir(&root) else {
        return;
    };
    // `<safe run id>-` (the name with an empty uuid).
    let prefix = fanout_budget::budget_dir_name_with(id, &String::new);
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().starts_with(&prefix) {
            continue;
        }
        let Ok(manifest) = fanout_budget::read_manifest(&entry.path()) else {
            // Killed between making the budget's directory and writing its
            // manifest: an empty directory named after this run, which no
            // one else creates (`remove_dir` leaves anything not empty).
            let _ = std::fs::remove_dir(entry.path());
            continue;
        };
        if manifest.root_run_id != id {
            continue;
        }
        let descriptor = fanout_budget::Descriptor {
            version: 1,
            root_run_id: id.to_owned(),
            directory: entry.path(),
            limit: manifest.limit,
            parent_path: None,
        };
        let _ = fanout_budget::write_persisted(dir, &root, &descriptor);
        return;
    }
}

/// The session of the capacity slot that records this run, if any.
fn slot_session(layout: &Layout, id: &str, dir: &Path) -> Option<String> {
    let query = capacity::InspectQuery {
        run_id: id,
        session_id: None,
        async_dir: Some(dir),
    };
    let pools = crate::admission::pools(layout);
    let inspection = pools
        .inspect(&query, &std::collections::HashSet::new())
        .ok()?;
    inspection.owner.map(|o| o.owner_session_id)
}

/// Writes the `process-terminal.json` of a `not-started` record that has none.
fn complete_not_started(dir: &Path, status: &RunStatus) {
    let projected = status
        .process_terminal
        .as_ref()
        .and_then(|p| p.get("state"))
        .and_then(Value::as_str);
    if projected != Some(ProofState::NotStarted.as_str()) {
        return;
    }
    if dir.join(files::PROOF).symlink_metadata().is_ok() {
        return;
    }
    let fallback = Fallback {
        run_id: Some(status.run_id.clone()),
        runner_process_instance_id: status.runner_process_instance_id.clone(),
    };
    let label = format!("{}/{}", dir.display(), files::STATUS);
    if let Some(proof) =
        status::proof::sanitize(status.process_terminal.as_ref(), &fallback, &label)
    {
        let _ = supervisor::observer::write_not_started(dir, &proof);
    }
}

/// Removes the temp files of a run that is over (its proof final, runner
/// and monitor not alive) whose writer is gone, under the status lock, so
/// no status write is cut off.
fn sweep_finished(dir: &Path, status: &RunStatus) {
    // Cheapest first: most finished runs hold no temp file (one listing).
    if status.state.is_active() || temps(dir).is_empty() || !has_final_proof(dir, status) {
        return;
    }
    let alive = |p: &Option<process_identity::ProcessIdentity>| {
        p.as_ref()
            .is_some_and(|p| p.liveness() != process_identity::Liveness::Dead)
    };
    if alive(&status.runner_identity) || alive(&status.monitor_identity) {
        return;
    }
    let Ok(_lock) = status::model::lock_status(dir) else {
        return;
    };
    remove_temps(dir, |path| {
        writer_gone(path) || older_than(path, TEMP_GRACE)
    });
}

fn has_final_proof(dir: &Path, status: &RunStatus) -> bool {
    recorded_proof(dir, status).is_some_and(|p| p.state != ProofState::Pending)
}

/// The temp files (`.<name>.<pid>.<random>.tmp`) directly in `dir`.
fn temps(dir: &Path) -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.starts_with('.') && name.ends_with(".tmp")
        })
        .map(|e| e.path())
        .collect()
}

fn remove_temps(dir: &Path, removable: impl Fn(&Path) -> bool) {
    for path in temps(dir) {
        if removable(&path) {
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// The pid in a temp file's name names no process.
fn writer_gone(path: &Path) -> bool {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    let pid = name.as_deref().and_then(temp_writer);
    pid.is_some_and(|pid| {
        pid > 1
            && nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
                == Err(nix::errno::Errno::ESRCH)
    })
}

/// The writer's pid of `.<name>.<pid>.<random>.tmp` (pure).
fn temp_writer(name: &str) -> Option<i32> {
    let stem = name.strip_suffix(".tmp")?;
    let mut parts = stem.rsplitn(3, '.');
    let _random = parts.next()?;
    parts.next()?.parse().ok()
}

/// The run's proof: `process-terminal.json`, else the one projected into
/// its status.
pub(crate) fn recorded_proof(
    dir: &Path,
    status: &RunStatus,
) -> Option<status::proof::ProcessTerminal> {
    let fallback = Fallback {
        run_id: Some(status.run_id.clone()),
        runner_process_instance_id: status.runner_process_instance_id.clone(),
    };
    let label = format!("{}/{}", dir.display(), files::STATUS);
    status::proof::read_proof(dir, &fallback)
        .or_else(|| status::proof::sanitize(status.process_terminal.as_ref(), &fallback, &label))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_writer_is_read_from_the_temp_name() {
        assert_eq!(
            temp_writer(".status.json.4242.0011223344556677.tmp"),
            Some(4242)
        );
        assert_eq!(temp_writer(".claim.x.tmp"), None);
        assert_eq!(temp_writer("status.json"), None);
    }
}
