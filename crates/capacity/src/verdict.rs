//! Release verdicts (docs/protocol/capacity.md §5): may a slot be freed?

use std::collections::HashSet;
use std::path::Path;

use process_identity::Liveness;
use serde::Serialize;
use status::proof::ProofState;
use status::{RunStatus, Step};

use crate::owner::{Kind, OwnerRecord, session_key};
use crate::pool::RecordedRun;
use crate::runfiles::{
    StatusRead, has_error, has_runner_trace, observed_proof, projected_runner, proof_state,
    read_status, status_run_id,
};

/// The three verdict states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReleaseState {
    /// The run is provably finished; reconcile frees the slot.
    Releasable,
    /// The slot stays.
    Retained,
    /// The slot does not belong to the asked-about run (inspect only).
    NotOwned,
}

/// A verdict with its human-readable reason (the reference's texts).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verdict {
    /// The decision.
    pub state: ReleaseState,
    /// Why, as `debug.run` prints it.
    pub reason: String,
}

impl Verdict {
    fn new(state: ReleaseState, reason: impl Into<String>) -> Self {
        Self {
            state,
            reason: reason.into(),
        }
    }

    pub(crate) fn not_owned(reason: impl Into<String>) -> Self {
        Self::new(ReleaseState::NotOwned, reason)
    }
}

fn retained(reason: impl Into<String>) -> Verdict {
    Verdict::new(ReleaseState::Retained, reason)
}

fn releasable(reason: impl Into<String>) -> Verdict {
    Verdict::new(ReleaseState::Releasable, reason)
}

const STATUS_MISSING: &str = "status file is missing or unreadable";

/// The verdict for one owner; `live_workflows` are the workflow run ids whose
/// controllers are live in this process.
pub fn release_verdict(owner: &OwnerRecord, live_workflows: &HashSet<String>) -> Verdict {
    match owner.kind {
        Kind::Runner => runner_verdict(owner),
        Kind::Workflow => workflow_verdict(owner, live_workflows),
    }
}

fn load_status(owner: &OwnerRecord) -> Result<Box<RunStatus>, Verdict> {
    match read_status(Path::new(&owner.async_dir)) {
        StatusRead::Present(status) => Ok(status),
        StatusRead::Missing => Err(abandoned(owner).unwrap_or_else(|| retained(STATUS_MISSING))),
        StatusRead::Unreadable(e) => Err(unreadable_status(owner, &e)),
    }
}

/// Extension of the Rust version: a damaged `status.json` cannot say the
/// run is over, but an observed proof of the slot's runner can: it is only
/// written once every process of the run was proven gone. Without one the
/// slot stays, with the read error as its reason.
fn unreadable_status(owner: &OwnerRecord, error: &str) -> Verdict {
    let dir = Path::new(&owner.async_dir);
    // Without a bound runner, the one the proof names stands in for it
    // once the reserving process is dead (nobody else can bind the slot).
    let observed = match owner.runner_process_instance_id.as_deref() {
        Some(runner) => observed_proof(dir, &owner.run_id, Some(runner)),
        None => reserver_is_dead(owner) && observed_proof(dir, &owner.run_id, None),
    };
    if observed {
        releasable(format!(
            "status file is unreadable ({error}), but a matching observed process-terminal proof is present"
        ))
    } else {
        retained(format!("{STATUS_MISSING}: {error}"))
    }
}

/// Extension of the Rust version: the process that reserved the slot died
/// before binding a runner, and the run directory shows no runner at all.
fn abandoned(owner: &OwnerRecord) -> Option<Verdict> {
    let dir = Path::new(&owner.async_dir);
    let no_runner_trace = ["process-terminal-candidate.json", "runner-startup.json"]
        .iter()
        .all(|name| !dir.join(name).exists());
    (reserver_is_dead(owner) && no_runner_trace).then(|| {
        let pid = owner.reserved_by_process.as_ref().map_or(0, |p| p.pid);
        releasable(format!(
            "reserving process {pid} died before a runner was bound"
        ))
    })
}

/// Extension of the Rust version: the reserving process died before it
/// bound a runner, the run is over, and nothing shows a runner ever ran
/// (no runner pid or identity in the status, no candidate, no handshake).
/// Nobody else could bind the slot, so it is free.
fn never_bound(owner: &OwnerRecord, status: &RunStatus) -> Option<Verdict> {
    if status.state.holds_capacity() || has_runner_trace(status) {
        return None;
    }
    let dir = Path::new(&owner.async_dir);
    let no_runner_files = ["process-terminal-candidate.json", "runner-startup.json"]
        .iter()
        .all(|name| !dir.join(name).exists());
    (reserver_is_dead(owner) && no_runner_files).then(|| {
        let pid = owner.reserved_by_process.as_ref().map_or(0, |p| p.pid);
        releasable(format!(
            "reserving process {pid} died before a runner was bound, and the run is {} without one",
            state_text(status)
        ))
    })
}

fn reserver_is_dead(owner: &OwnerRecord) -> bool {
    !owner.is_started()
        && owner
            .reserved_by_process
            .as_ref()
            .is_some_and(|p| p.liveness() == Liveness::Dead)
}

/// The runner the slot is bound to. When the reserving process died before
/// `mark_started`, the runner named by the status stands in for it.
fn runner_id<'a>(owner: &'a OwnerRecord, status: &'a RunStatus) -> Option<&'a str> {
    if let Some(id) = owner.runner_process_instance_id.as_deref() {
        return Some(id);
    }
    projected_runner(status).filter(|_| reserver_is_dead(owner))
}

fn identity_mismatch(owner: &OwnerRecord, status: &RunStatus) -> Option<Verdict> {
    let session = status.session_id.as_deref();
    if session != Some(owner.owner_session_id.as_str()) {
        return Some(retained(format!(
            "status session {} does not match owner session {}",
            session.unwrap_or("unknown"),
            owner.owner_session_id
        )));
    }
    if status_run_id(status) != Some(owner.run_id.as_str()) {
        return Some(retained(format!(
            "status run {} does not match owner run {}",
            status_run_id(status).unwrap_or("unknown"),
            owner.run_id
        )));
    }
    None
}

fn state_text(status: &RunStatus) -> &'static str {
    status.state.as_str()
}

/// The state of the proof file as the verdicts print it.
fn proof_text(state: Option<ProofState>) -> &'static str {
    state.map_or("missing", ProofState::as_str)
}

fn runner_verdict(owner: &OwnerRecord) -> Verdict {
    let status = match load_status(owner) {
        Ok(status) => status,
        Err(verdict) => return verdict,
    };
    let Some(runner) = runner_id(owner, &status) else {
        return never_bound(owner, &status)
            .unwrap_or_else(|| retained("runner process identity has not been recorded"));
    };
    if let Some(verdict) = identity_mismatch(owner, &status) {
        return verdict;
    }
    if status.state.holds_capacity() {
        return retained(format!("run is still {}", state_text(&status)));
    }
    let projected = |key| status.projected_proof_str(key);
    if projected("state") == Some("not-started")
        && projected("runId") == Some(owner.run_id.as_str())
        && projected("runnerProcessInstanceId") == Some(runner)
        && has_error(&status)
    {
        return releasable("run failed before child startup completed");
    }
    match proof_state(Path::new(&owner.async_dir), &owner.run_id, runner) {
        Some(ProofState::Observed) => {
            releasable("matching observed process-terminal proof is present")
        }
        state => retained(format!("process-terminal proof is {}", proof_text(state))),
    }
}

fn workflow_verdict(owner: &OwnerRecord, live_workflows: &HashSet<String>) -> Verdict {
    let status = match load_status(owner) {
        Ok(status) => status,
        Err(verdict) => return verdict,
    };
    if let Some(verdict) = identity_mismatch(owner, &status) {
        return verdict;
    }
    if status.mode.as_deref() != Some("workflow") {
        let mode = status.mode.as_deref().unwrap_or("unknown");
        return retained(format!("status mode is {mode}, not workflow"));
    }
    if status.state.holds_capacity() {
        return retained(format!("workflow is still {}", state_text(&status)));
    }
    if live_workflows.contains(&owner.run_id) {
        return retained("workflow controller is still live");
    }
    let runs_root = Path::new(&owner.async_dir)
        .parent()
        .unwrap_or(Path::new("/"));
    for step in status.steps() {
        if let Some(verdict) = unsettled_child(step, runs_root) {
            return verdict;
        }
    }
    releasable("workflow is terminal, controller is gone, and async children have observed proof")
}

/// Rule 7 for one workflow step: `None` when the step is settled.
fn unsettled_child(step: &Step, runs_root: &Path) -> Option<Verdict> {
    let label = step.extra_str("workflowKey").unwrap_or(&step.agent);
    if step.holds_capacity() {
        let state = &step.status;
        return Some(retained(format!("workflow child {label} is still {state}")));
    }
    match step.is_async() {
        None => {
            return Some(retained(format!(
                "workflow child {label} is missing async classification"
            )));
        }
        Some(false) => return None,
        Some(true) => {}
    }
    let child = |what: &str| Some(retained(format!("async workflow child {label} {what}")));
    let Some(run_id) = step.extra_str("runId").filter(|id| !id.is_empty()) else {
        return child("is missing run id");
    };
    let dir = runs_root.join(run_id);
    if !dir.is_dir() {
        return child("directory is missing");
    }
    let StatusRead::Present(status) = read_status(&dir) else {
        return child("status is missing or unreadable");
    };
    if status.state.holds_capacity() {
        return child(&format!("is still {}", state_text(&status)));
    }
    let Some(runner) = projected_runner(&status) else {
        return child("has no runner process identity");
    };
    match proof_state(&dir, run_id, runner) {
        Some(ProofState::Observed) => None,
        state => child(&format!("process-terminal proof is {}", proof_text(state))),
    }
}

/// Extension of the Rust version: the verdict for a slot whose `owner.json`
/// is damaged, from the run its second record names and that run's own
/// files (in `runs_dir`), the pool's session key standing in for the
/// owner's session. Releasable only when the run is provably over: a
/// terminal status of this session with an observed proof (or a
/// `not-started` failure); a damaged status with an observed proof; or no
/// status at all (never written, or pruned) while the process that made
/// the reservation is dead.
pub(crate) fn damaged_owner_verdict(
    recorded: &RecordedRun,
    pool_key: &str,
    runs_dir: &Path,
) -> Verdict {
    let run_id = recorded.run_id.as_str();
    let dir = runs_dir.join(run_id);
    let status = match read_status(&dir) {
        StatusRead::Present(status) => status,
        StatusRead::Missing => {
            let dead = recorded
                .reserver
                .as_ref()
                .is_some_and(|p| p.liveness() == Liveness::Dead);
            return if dead {
                releasable(format!(
                    "owner record is damaged; run {run_id} has no status and its reserving process died"
                ))
            } else {
                retained(format!(
                    "owner record is damaged and run {run_id} has no status"
                ))
            };
        }
        StatusRead::Unreadable(e) => {
            return if observed_proof(&dir, run_id, None) {
                releasable(format!(
                    "owner record is damaged; run {run_id}'s status is unreadable ({e}), but its observed process-terminal proof is present"
                ))
            } else {
                retained(format!("owner record is damaged; {STATUS_MISSING}: {e}"))
            };
        }
    };
    let ours = status_run_id(&status) == Some(run_id)
        && status.session_id.as_deref().map(session_key).as_deref() == Some(pool_key);
    if !ours {
        return retained(format!(
            "owner record is damaged and the status of {run_id} is not this slot's run"
        ));
    }
    if status.state.holds_capacity() {
        return retained(format!(
            "owner record is damaged; run {run_id} is still {}",
            state_text(&status)
        ));
    }
    let Some(runner) = projected_runner(&status) else {
        return retained("owner record is damaged; runner process identity has not been recorded");
    };
    if status.projected_proof_str("state") == Some("not-started") && has_error(&status) {
        return releasable("owner record is damaged; run failed before child startup completed");
    }
    match proof_state(&dir, run_id, runner) {
        Some(ProofState::Observed) => releasable(
            "owner record is damaged; its run's matching observed process-terminal proof is present",
        ),
        state => retained(format!(
            "owner record is damaged; process-terminal proof is {}",
            proof_text(state)
        )),
    }
}
