//! `subagents prune`: deletes finished runs older than a cutoff, with what
//! only they still use (their capacity slots, session leases, fan-out
//! budgets and active-index markers).
//!
//! A run is deleted only when it is terminal, its process-terminal proof is
//! `observed` (or `not-started`: it never had a runner), and neither its
//! runner nor its monitor is alive; every other
//! old run is kept and the reason printed. Each run is judged and deleted
//! under its status lock, and `status.json` goes first, so no command ever
//! sees half a run. A budget is deleted only when its root run is pruned and
//! no remaining run refers to it, under the budget's admission lock.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use process_identity::Liveness;
use serde_json::Value;
use status::layout::files;
use status::model::RunStatus;
use status::proof::{Fallback, ProofState};
use status::{Layout, now_ms};

use crate::api::{KeptRun, PruneOutcome, PruneRequest, PrunedRun};
use crate::error::{DurationField, Error, Result};

/// The default `--older-than`.
pub const DEFAULT_AGE: &str = "7d";

/// What prune decided for one run.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Verdict {
    /// Too recent (or still being created): not mentioned.
    Young,
    /// Old but kept, and why.
    Keep(String),
    /// Old, over and proven.
    Prune,
}

/// A run that is (or would be) deleted.
#[derive(Debug, Clone)]
struct Pruned {
    id: String,
    state: String,
    ended_at: u64,
    slots: usize,
    budget: Option<String>,
}

/// `--older-than`: a duration, as every duration (`7d`, `1d12h`, `30m`).
pub fn parse_age(text: &str) -> Result<Duration, String> {
    crate::root::parse_duration(text)
}

/// Deletes (or with `dry_run` only judges) the finished runs older than
/// the request's cutoff, and what only they use.
pub fn prune(layout: &Layout, request: &PruneRequest) -> Result<PruneOutcome> {
    let dry_run = request.dry_run;
    let age = parse_age(request.older_than.as_deref().unwrap_or(DEFAULT_AGE))
        .map_err(|e| Error::bad_duration(DurationField::OlderThan, e))?;
    let now = now_ms();
    let cutoff = now.saturating_sub(age.as_millis() as u64);
    let mut pruned = Vec::new();
    let mut kept = Vec::new();
    let mut references: BTreeMap<String, String> = BTreeMap::new();
    for id in listing::list::run_names(layout)? {
        let Some(dir) = status::layout::exact_run_dir(layout, &id) else {
            continue;
        };
        match prune_run(layout, &dir, &id, now, cutoff, dry_run) {
            Ok(Some(run)) => pruned.push(run),
            Ok(None) => {
                if let Some(budget) = budget_of(&dir) {
                    references.insert(budget, id.clone());
                }
            }
            Err(reason) => {
                if let Some(budget) = budget_of(&dir) {
                    references.insert(budget, id.clone());
                }
                kept.push(KeptRun { run_id: id, reason });
            }
        }
    }
    let pruned_ids: HashSet<&str> = pruned.iter().map(|p| p.id.as_str()).collect();
    if !dry_run {
        release_markers(layout, &pruned_ids);
    }
    let slots = pruned.iter().map(|p| p.slots).sum();
    let leases = prune_leases(layout, &pruned_ids, dry_run);
    let budgets = prune_budgets(layout, &pruned, &references, dry_run);
    Ok(PruneOutcome {
        dry_run,
        older_than_ms: age.as_millis() as u64,
        pruned: pruned
            .into_iter()
            .map(|p| PrunedRun {
                run_id: p.id,
                state: p.state,
                ended_at: p.ended_at,
            })
            .collect(),
        kept,
        budgets,
        leases,
        capacity_slots: slots,
    })
}

/// Judges one run and, unless `dry_run`, deletes it. `Ok(None)`: left
/// alone silently; `Err(reason)`: old but kept. A run this prune finishes
/// ends at the prune's own `now`, the one `cutoff` was taken from, so
/// `--older-than 0s` deletes it too.
fn prune_run(
    layout: &Layout,
    dir: &Path,
    id: &str,
    now: u64,
    cutoff: u64,
    dry_run: bool,
) -> Result<Option<Pruned>, String> {
    // A directory without status.json is a run being created, unless its
    // launcher is gone: then it is finished as failed first (and pruned
    // once it is old enough, like any run).
    match status::model::read_status(dir) {
        Ok(None) if dry_run => return Ok(None),
        Ok(None) => {
            if crate::leftovers::finish_uncreated(layout, dir, id, now).is_none() {
                return Ok(None);
            }
        }
        Ok(Some(_)) => {}
        Err(e) => return prune_unreadable(layout, dir, id, cutoff, dry_run, &e),
    }
    let _lock =
        status::model::lock_status(dir).map_err(|e| format!("failed to lock its status: {e}"))?;
    let status = match status::model::read_status(dir) {
        Ok(Some(status)) => status,
        Ok(None) => return Ok(None),
        Err(e) => return Err(format!("its status is unreadable: {e}")),
    };
    match judge(dir, &status, cutoff) {
        Verdict::Young => return Ok(None),
        Verdict::Keep(reason) => return Err(reason),
        Verdict::Prune => {}
    }
    let slots = release_slots(layout, id, status.session_id.as_deref(), dry_run);
    let budget = budget_of(dir);
    if !dry_run {
        delete_run_dir(dir).map_err(|e| format!("failed to delete it: {e}"))?;
    }
    Ok(Some(Pruned {
        id: id.to_owned(),
        state: status.state.as_str().to_owned(),
        ended_at: ended_at(&status),
        slots,
        budget,
    }))
}

/// A run whose status cannot be read is pruned once it is proven over: an
/// observed proof older than the cutoff, and neither the monitor nor the
/// runner of its `run-processes.json` alive. Its slot is freed by the
/// proof (the capacity verdict for an unreadable status).
fn prune_unreadable(
    layout: &Layout,
    dir: &Path,
    id: &str,
    cutoff: u64,
    dry_run: bool,
    error: &status::Error,
) -> Result<Option<Pruned>, String> {
    let kept = |why: &str| Err(format!("its status is unreadable ({error}) and {why}"));
    let _lock =
        status::model::lock_status(dir).map_err(|e| format!("failed to lock its status: {e}"))?;
    let record = status::processes::read(dir).ok().flatten();
    let fallback = Fallback {
        run_id: Some(id.to_owned()),
        runner_process_instance_id: record
            .as_ref()
            .map(|r| r.runner_process_instance_id.clone()),
    };
    let Some(proof) = status::proof::read_proof(dir, &fallback) else {
        return kept("it has no process-terminal proof");
    };
    if proof.state != ProofState::Observed {
        return kept(&format!(
            "its process-terminal proof is {}",
            proof.state.as_str()
        ));
    }
    let ended = proof.observed_at.unwrap_or(0);
    if ended > cutoff {
        return Ok(None);
    }
    let alive = |p: &process_identity::ProcessIdentity| p.liveness() == Liveness::Alive;
    if record
        .as_ref()
        .is_some_and(|r| alive(&r.runner) || alive(&r.monitor))
    {
        return kept("its runner or monitor is still alive");
    }
    let session = record.as_ref().and_then(|r| r.session_id.as_deref());
    let slots = release_slots(layout, id, session, dry_run);
    let budget = budget_of(dir);
    if !dry_run {
        delete_run_dir(dir).map_err(|e| format!("failed to delete it: {e}"))?;
    }
    Ok(Some(Pruned {
        id: id.to_owned(),
        state: "unreadable".to_owned(),
        ended_at: ended,
        slots,
        budget,
    }))
}

fn ended_at(status: &RunStatus) -> u64 {
    status
        .ended_at
        .or(status.last_update)
        .or(status.started_at)
        .unwrap_or(0)
}

fn judge(dir: &Path, status: &RunStatus, cutoff: u64) -> Verdict {
    if ended_at(status) > cutoff {
        return Verdict::Young;
    }
    // `paused` too: over for listings, but a resume takes its slot over, so
    // pruning it would leave that slot held for good.
    if status.state.holds_capacity() {
        return Verdict::Keep(format!("it is still {}", status.state));
    }
    let alive = |p: &Option<process_identity::ProcessIdentity>| {
        p.as_ref().is_some_and(|p| p.liveness() == Liveness::Alive)
    };
    if alive(&status.runner_identity) || alive(&status.monitor_identity) {
        return Verdict::Keep("its runner or monitor is still alive".into());
    }
    match crate::leftovers::recorded_proof(dir, status).map(|p| p.state) {
        // A run that never had a runner: nothing of it can be running.
        Some(ProofState::Observed | ProofState::NotStarted) => Verdict::Prune,
        Some(state) => Verdict::Keep(format!(
            "its process-terminal proof is {}, not observed",
            state.as_str()
        )),
        None => Verdict::Keep("it has no process-terminal proof".into()),
    }
}

/// status.json first: from then on every command treats the directory as absent.
fn delete_run_dir(dir: &Path) -> std::io::Result<()> {
    let status = dir.join(files::STATUS);
    // A damaged status may be a directory.
    let removed = match std::fs::symlink_metadata(&status) {
        Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(&status),
        _ => std::fs::remove_file(&status),
    };
    match removed {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    std::fs::remove_dir_all(dir)
}

fn release_markers(layout: &Layout, pruned: &HashSet<&str>) {
    for id in pruned {
        // The marker lives outside the run directory, keyed by its name.
        let _ = status::index::release_marker(&layout.run_dir(id));
    }
}

/// The budget directory name a run refers to.
fn budget_of(dir: &Path) -> Option<String> {
    let text = atomic_file::read::read_to_string(&dir.join(fanout_budget::PERSISTED_FILE)).ok()?;
    let value: Value = serde_json::from_str(&text).ok()?;
    budget_of_value(Some(&value))
}

fn budget_of_value(value: Option<&Value>) -> Option<String> {
    let directory = value?.get("directory")?.as_str()?;
    Path::new(directory)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
}

/// Frees the capacity slots the run still holds, while its directory still
/// shows the verdict: the session's pool is reconciled under its own lock
/// and only releasable slots go. Returns how many of the run's slots went
/// (or would go).
fn release_slots(layout: &Layout, id: &str, session: Option<&str>, dry_run: bool) -> usize {
    let Some(session) = session else { return 0 };
    let pools = crate::admission::pools(layout);
    let held = |snapshot: &capacity::Snapshot| {
        snapshot
            .slots
            .iter()
            .filter(|s| s.run_id.as_deref() == Some(id))
            .count()
    };
    let Ok(before) = pools.count(session, None) else {
        return 0;
    };
    if dry_run {
        return held(&before);
    }
    match pools.reconcile(session, None, &HashSet::new()) {
        Ok(after) => held(&before).saturating_sub(held(&after)),
        Err(_) => 0,
    }
}

/// Deletes the session leases held for a pruned run (a revival's lease).
fn prune_leases(layout: &Layout, pruned: &HashSet<&str>, dry_run: bool) -> Vec<String> {
    let root = layout.session_leases_dir();
    let Ok(entries) = std::fs::read_dir(&root) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let dir = entry.path();
        let owner = dir.join(recovery::lease::OWNER_FILE);
        let run = atomic_file::read::read_to_string(&owner)
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .and_then(|v| v.get("runId").and_then(Value::as_str).map(str::to_owned));
        let Some(run) = run.filter(|r| pruned.contains(r.as_str())) else {
            continue;
        };
        if dry_run || std::fs::remove_dir_all(&dir).is_ok() {
            removed.push(format!(
                "{} (run {run})",
                entry.file_name().to_string_lossy()
            ));
        }
    }
    removed
}

/// Deletes each budget whose root run was pruned and that no remaining run
/// refers to, holding its admission lock so no claim is half-written.
fn prune_budgets(
    layout: &Layout,
    pruned: &[Pruned],
    references: &BTreeMap<String, String>,
    dry_run: bool,
) -> Vec<String> {
    let root = layout.fanout_budgets_dir();
    let ids: HashSet<&str> = pruned.iter().map(|p| p.id.as_str()).collect();
    let candidates: BTreeSet<&str> = pruned.iter().filter_map(|p| p.budget.as_deref()).collect();
    let mut removed = Vec::new();
    for name in candidates {
        if references.contains_key(name) || name.starts_with('.') || name.contains('/') {
            continue;
        }
        let dir: PathBuf = root.join(name);
        let Ok(manifest) = fanout_budget::read_manifest(&dir) else {
            continue;
        };
        if !ids.contains(manifest.root_run_id.as_str()) {
            continue;
        }
        if dry_run || remove_budget(&dir).is_ok() {
            removed.push(name.to_owned());
        }
    }
    removed
}

fn remove_budget(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    // A budget nobody claimed from yet (its launcher was killed first) has
    // no lock file: made here, so a claimer arriving now still waits for us.
    let lock = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(atomic_file::FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(dir.join(fanout_budget::LOCK_FILE))?;
    nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| std::io::Error::from(e))
        .and_then(|_held| std::fs::remove_dir_all(dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run directory a killed launcher left before its status.json, past
    /// the creation grace.
    fn left_uncreated(layout: &Layout, id: &str) {
        let dir = layout.run_dir(id);
        std::fs::create_dir_all(&dir).unwrap();
        let old = std::time::SystemTime::now() - Duration::from_secs(120);
        std::fs::File::open(&dir)
            .unwrap()
            .set_modified(old)
            .unwrap();
    }

    #[test]
    fn a_zero_age_prune_deletes_every_run_it_finishes_itself() {
        let root = tempfile::tempdir().unwrap();
        let layout = Layout::new(root.path());
        // Enough runs that finishing them takes several milliseconds: each
        // ends at the prune's own clock, never after its cutoff.
        let ids: Vec<String> = (0..200).map(|i| format!("left-{i:03}")).collect();
        for id in &ids {
            left_uncreated(&layout, id);
        }
        let request = PruneRequest {
            older_than: Some("0s".into()),
            dry_run: false,
        };
        let outcome = prune(&layout, &request).unwrap();
        let pruned: Vec<&str> = outcome.pruned.iter().map(|p| p.run_id.as_str()).collect();
        assert_eq!(pruned, ids, "kept: {:?}", outcome.kept);
        assert!(outcome.pruned.iter().all(|p| p.state == "failed"));
        let left = listing::list::run_names(&layout).unwrap();
        assert_eq!(left, Vec::<String>::new());
    }
}
