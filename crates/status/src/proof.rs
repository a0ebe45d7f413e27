//! Process-terminal candidates and proofs.
//!
//! The runner writes `process-terminal-candidate.json` at its very end: which
//! child writer processes it started and how each one's process group was
//! seen to be empty. The process that waited on the runner (our monitor, the
//! runner's parent) — or, when the monitor is gone, an observer that proved
//! the run's processes gone — then calls [`finalize`]: it decides the proof from the
//! runner's exit and the candidate, persists `process-terminal.json`, releases
//! the active marker only if the proof is `observed`, overlays the proof on
//! `status.json` and appends `subagent.run.process_terminal`.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::layout::files;
use crate::model::{RunStatus, update_status};
use crate::{events, index};

/// Proof states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProofState {
    /// Started, not finalized.
    Pending,
    /// Runner close seen and all writer evidence verified.
    Observed,
    /// Cannot be proven; `reason` says why.
    Unknown,
    /// No writer process was ever started.
    NotStarted,
}

impl ProofState {
    /// The name used on disk.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Observed => "observed",
            Self::Unknown => "unknown",
            Self::NotStarted => "not-started",
        }
    }
}

/// How a writer's process group was seen to be gone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    tag = "state",
    rename_all = "kebab-case",
    rename_all_fields = "camelCase"
)]
pub enum ProcessTree {
    /// The group was verified empty.
    Observed {
        /// Always `posix-process-group`.
        mechanism: String,
        /// The group id.
        process_group_id: u32,
        /// When it was verified empty (ms).
        verified_at: u64,
    },
    /// Could not be verified.
    Unknown {
        /// `unsupported-platform`, `signal-failed` or `verification-failed`.
        reason: String,
        /// Detail.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        diagnostic: Option<String>,
    },
}

/// Close record of one child writer process attempt (`kind: "pi-writer"`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WriterRecord {
    /// Unique id of this attempt.
    pub process_instance_id: String,
    /// Always `pi-writer`.
    pub kind: String,
    /// 0-based attempt number within the child.
    pub attempt: u32,
    /// When its close was observed (ms).
    pub close_observed_at: u64,
    /// Exit code, null when a signal ended it.
    pub exit_code: Option<i32>,
    /// Signal name, null when it exited.
    pub signal: Option<String>,
    /// Process-group verification.
    pub process_tree: ProcessTree,
}

/// What the waiting parent saw of the runner's end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunnerClose {
    /// The runner's instance id.
    pub process_instance_id: String,
    /// When the close was observed (ms).
    pub close_observed_at: u64,
    /// Exit code, when it exited.
    pub exit_code: Option<i32>,
    /// Signal name, when a signal ended it.
    pub signal: Option<String>,
    /// Extension: who observed the close when it was not the runner's
    /// waiting parent (e.g. `{"role": "reconciler", "reason": …}`). Kept in
    /// the runner instance record, where readers tolerate extra keys.
    pub observer: Option<Value>,
}

impl RunnerClose {
    fn record(&self) -> Value {
        let mut record = json!({
            "kind": "runner",
            "processInstanceId": self.process_instance_id,
            "closeObservedAt": self.close_observed_at,
            "exitCode": self.exit_code,
            "signal": self.signal,
        });
        if let Some(observer) = &self.observer {
            record["observer"] = observer.clone();
        }
        record
    }
}

/// `ProcessTerminalV1`: the proof, and its projections in status and steps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessTerminal {
    /// Always 1.
    pub version: u32,
    /// The state.
    pub state: ProofState,
    /// The run.
    pub run_id: String,
    /// Step index, in per-step projections only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child_index: Option<usize>,
    /// The runner instance the proof is about.
    pub runner_process_instance_id: String,
    /// When observed (ms); required when observed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_at: Option<u64>,
    /// Runner record first, then writer records; required when observed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instances: Option<Vec<Value>>,
    /// Session lease facts at observation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canonical_session: Option<Value>,
    /// Why the state is unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Detail for unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diagnostic: Option<String>,
    /// `resumable`, `non-resumable` or `unavailable`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_disposition: Option<String>,
}

impl ProcessTerminal {
    /// A bare proof of `state` for a run and runner instance.
    pub fn new(state: ProofState, run_id: &str, runner_id: &str) -> Self {
        Self {
            version: 1,
            state,
            run_id: run_id.to_owned(),
            child_index: None,
            runner_process_instance_id: runner_id.to_owned(),
            observed_at: None,
            instances: None,
            canonical_session: None,
            reason: None,
            diagnostic: None,
            resume_disposition: None,
        }
    }

    /// An `unknown` proof with a reason and optional diagnostic.
    pub fn unknown(
        run_id: &str,
        runner_id: &str,
        reason: &str,
        diagnostic: Option<String>,
    ) -> Self {
        Self {
            reason: Some(reason.to_owned()),
            diagnostic,
            ..Self::new(ProofState::Unknown, run_id, runner_id)
        }
    }

    /// As a JSON value.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// The runner's candidate (`process-terminal-candidate.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Candidate {
    /// Always 1.
    pub version: u32,
    /// The run.
    pub run_id: String,
    /// The runner instance.
    pub runner_process_instance_id: String,
    /// Step index → close records of its writer attempts.
    pub writers: BTreeMap<String, Vec<WriterRecord>>,
    /// Step index → number of writer attempts started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_writers: Option<BTreeMap<String, u64>>,
    /// Revival runs: the leased session file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_file: Option<String>,
    /// Revival runs: the lease token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revival_lease_token: Option<String>,
    /// Set after the runner released the lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revival_lease_release_acknowledged: Option<bool>,
}

/// Whose proof a reader expects: mismatches are reported, not trusted.
#[derive(Debug, Clone, Default)]
pub struct Fallback {
    /// Expected run id.
    pub run_id: Option<String>,
    /// Expected runner instance id.
    pub runner_process_instance_id: Option<String>,
}

/// Validates a pi-writer or runner record as the reference does (docs/protocol/status.md §5.1, §5.3).
pub fn valid_instance(value: &Value, kind: Option<&str>) -> bool {
    let Some(obj) = value.as_object() else {
        return false;
    };
    let id_ok = obj
        .get("processInstanceId")
        .and_then(Value::as_str)
        .is_some_and(|s| !s.is_empty());
    let record_kind = obj.get("kind").and_then(Value::as_str);
    let kind_ok = match kind {
        Some(k) => record_kind == Some(k),
        None => matches!(record_kind, Some("runner" | "pi-writer")),
    };
    let basics = id_ok
        && kind_ok
        && obj.get("closeObservedAt").is_some_and(Value::is_number)
        && obj
            .get("exitCode")
            .is_some_and(|v| v.is_number() || v.is_null())
        && obj
            .get("signal")
            .is_some_and(|v| v.is_string() || v.is_null());
    if !basics {
        return false;
    }
    match record_kind {
        Some("runner") => !obj.contains_key("attempt"),
        _ => {
            obj.get("attempt").and_then(Value::as_u64).is_some()
                && valid_tree(obj.get("processTree"))
        }
    }
}

fn valid_tree(tree: Option<&Value>) -> bool {
    let Some(tree) = tree.and_then(Value::as_object) else {
        return false;
    };
    match tree.get("state").and_then(Value::as_str) {
        Some("observed") => {
            tree.get("mechanism").and_then(Value::as_str) == Some("posix-process-group")
                && tree
                    .get("processGroupId")
                    .and_then(Value::as_u64)
                    .is_some_and(|g| g > 0)
                && tree.get("verifiedAt").is_some_and(Value::is_number)
        }
        Some("unknown") => {
            matches!(
                tree.get("reason").and_then(Value::as_str),
                Some("unsupported-platform" | "signal-failed" | "verification-failed")
            ) && tree.get("diagnostic").is_none_or(Value::is_string)
        }
        _ => false,
    }
}

/// Validates a proof value (2.4 `validateProof`), returning the reference's messages.
pub fn validate_proof(
    raw: &Value,
    label: &str,
    fallback: &Fallback,
) -> Result<ProcessTerminal, String> {
    // The reference's message, then the field at fault (readers match the prefix).
    let invalid = |field: &str| format!("Invalid process-terminal proof in '{label}'. {field}");
    let obj = raw
        .as_object()
        .ok_or_else(|| invalid("The proof must be a JSON object."))?;
    let non_empty = |k: &str| obj.get(k).and_then(Value::as_str).filter(|s| !s.is_empty());
    if obj.get("version").and_then(Value::as_u64) != Some(1) {
        return Err(invalid("version must be 1."));
    }
    let state_ok = matches!(
        obj.get("state").and_then(Value::as_str),
        Some("pending" | "observed" | "unknown" | "not-started")
    );
    if !state_ok {
        return Err(invalid(
            "state must be pending, observed, unknown or not-started.",
        ));
    }
    let run_id = non_empty("runId").ok_or_else(|| invalid("runId must be a non-empty string."))?;
    let runner_id = non_empty("runnerProcessInstanceId")
        .ok_or_else(|| invalid("runnerProcessInstanceId must be a non-empty string."))?;
    if let Some(expected) = fallback.run_id.as_deref().filter(|s| !s.is_empty())
        && expected != run_id
    {
        return Err(format!(
            "Process-terminal proof in '{label}' belongs to run '{run_id}', expected '{expected}'."
        ));
    }
    if let Some(expected) = fallback.runner_process_instance_id.as_deref()
        && expected != runner_id
    {
        return Err(format!(
            "Process-terminal proof in '{label}' belongs to runner '{runner_id}', expected '{expected}'."
        ));
    }
    let instances = obj.get("instances");
    if let Some(list) = instances
        && !list
            .as_array()
            .is_some_and(|a| a.iter().all(|i| valid_instance(i, None)))
    {
        return Err(format!("Invalid process-terminal instances in '{label}'."));
    }
    if obj.get("state").and_then(Value::as_str) == Some("observed") {
        validate_observed(obj, label, runner_id)?;
    }
    if let Some(d) = obj.get("resumeDisposition")
        && !matches!(
            d.as_str(),
            Some("resumable" | "non-resumable" | "unavailable")
        )
    {
        return Err(format!(
            "Invalid process-terminal resume disposition in '{label}'."
        ));
    }
    // A field of the wrong type is named (`childIndex: invalid type ...`).
    serde_path_to_error::deserialize(raw.clone())
        .map_err(|e| invalid(&format!("{}: {}", e.path(), e.inner())))
}

fn validate_observed(
    obj: &serde_json::Map<String, Value>,
    label: &str,
    runner_id: &str,
) -> Result<(), String> {
    if !obj.get("observedAt").is_some_and(Value::is_number) {
        return Err(format!(
            "Observed process-terminal proof in '{label}' is missing observedAt."
        ));
    }
    let Some(list) = obj.get("instances").and_then(Value::as_array) else {
        return Err(format!(
            "Observed process-terminal proof in '{label}' is missing instances."
        ));
    };
    let runner = list
        .iter()
        .find(|i| i.get("kind").and_then(Value::as_str) == Some("runner"));
    let matches = runner.is_some_and(|r| {
        valid_instance(r, Some("runner"))
            && r.get("processInstanceId").and_then(Value::as_str) == Some(runner_id)
    });
    if !matches {
        return Err(format!(
            "Observed process-terminal proof in '{label}' has no matching runner instance."
        ));
    }
    Ok(())
}

/// A synthetic (never persisted) `unknown/proof-write-failed` proof for an unreadable one.
pub(crate) fn unreadable_proof(
    run_id: &str,
    runner_id: &str,
    diagnostic: String,
) -> ProcessTerminal {
    ProcessTerminal::unknown(run_id, runner_id, "proof-write-failed", Some(diagnostic))
}

/// Reads `process-terminal.json`: `None` when absent; an unreadable or
/// mismatched file yields the synthetic unknown proof (2.4 `readProcessTerminal`).
pub fn read_proof(run_dir: &Path, fallback: &Fallback) -> Option<ProcessTerminal> {
    let path = run_dir.join(files::PROOF);
    let text = match atomic_file::read::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.is_not_found() => return None,
        Err(e) => return Some(synthetic(run_dir, fallback, e.to_string())),
    };
    let label = run_dir.display().to_string();
    let parsed = parse_proof(&text, &label, fallback);
    Some(parsed.unwrap_or_else(|message| synthetic(run_dir, fallback, message)))
}

/// Parses and validates proof text; `label` names the run directory in
/// messages. Touches no file (fuzzing entry point).
pub fn parse_proof(
    text: &str,
    label: &str,
    fallback: &Fallback,
) -> Result<ProcessTerminal, String> {
    serde_json::from_str::<Value>(text)
        .map_err(|e| format!("Invalid process-terminal proof in '{label}'. {e}"))
        .and_then(|v| validate_proof(&v, label, fallback))
}

fn synthetic(run_dir: &Path, fallback: &Fallback, diagnostic: String) -> ProcessTerminal {
    let dir_name = run_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let run_id = fallback.run_id.clone().unwrap_or(dir_name);
    let runner = fallback
        .runner_process_instance_id
        .clone()
        .unwrap_or_else(|| "unknown".into());
    unreadable_proof(&run_id, &runner, diagnostic)
}

/// Sanitises a projection found in `status.json` (2.4 `sanitizeProcessTerminal`).
pub fn sanitize(
    value: Option<&Value>,
    fallback: &Fallback,
    label: &str,
) -> Option<ProcessTerminal> {
    let value = value?;
    Some(
        validate_proof(value, label, &Fallback::default()).unwrap_or_else(|message| {
            let run_id = fallback.run_id.clone().unwrap_or_else(|| label.to_owned());
            let runner = fallback
                .runner_process_instance_id
                .clone()
                .unwrap_or_else(|| "unknown".into());
            unreadable_proof(&run_id, &runner, message)
        }),
    )
}

/// Reads and validates the candidate (docs/protocol/status.md §5.1): `Ok(None)` when absent.
pub fn read_candidate(run_dir: &Path) -> Result<Option<Candidate>, String> {
    let path = run_dir.join(files::CANDIDATE);
    let text = match atomic_file::read::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let invalid = format!(
        "Invalid process-terminal candidate in '{}'.",
        run_dir.display()
    );
    parse_candidate(&text, &invalid).map(Some)
}

/// Parses and validates candidate text; `invalid` is the message prefix of
/// every refusal. Touches no file (fuzzing entry point).
pub fn parse_candidate(text: &str, invalid: &str) -> Result<Candidate, String> {
    let value: Value = serde_json::from_str(text).map_err(|e| format!("{invalid} {e}"))?;
    validate_candidate(&value, invalid)?;
    let mut candidate: Candidate =
        serde_json::from_value(value).map_err(|e| format!("{invalid} {e}"))?;
    candidate.session_file = candidate.session_file.filter(|s| !s.is_empty());
    candidate.revival_lease_token = candidate.revival_lease_token.filter(|s| !s.is_empty());
    Ok(candidate)
}

/// Checks a candidate value; `invalid` is the message for a wrong top level.
pub fn validate_candidate(value: &Value, invalid: &str) -> Result<(), String> {
    let obj = value.as_object().ok_or_else(|| invalid.to_owned())?;
    let top_ok = obj.get("version").and_then(Value::as_u64) == Some(1)
        && obj.get("runId").is_some_and(Value::is_string)
        && obj
            .get("runnerProcessInstanceId")
            .is_some_and(Value::is_string)
        && obj.get("writers").is_some_and(Value::is_object);
    if !top_ok {
        let field = [
            (
                "version",
                obj.get("version").and_then(Value::as_u64) == Some(1),
                "version must be 1.",
            ),
            (
                "runId",
                obj.get("runId").is_some_and(Value::is_string),
                "runId must be a string.",
            ),
            (
                "runnerProcessInstanceId",
                obj.get("runnerProcessInstanceId")
                    .is_some_and(Value::is_string),
                "runnerProcessInstanceId must be a string.",
            ),
            (
                "writers",
                obj.get("writers").is_some_and(Value::is_object),
                "writers must be an object.",
            ),
        ]
        .into_iter()
        .find(|(_, ok, _)| !ok)
        .map_or("", |(_, _, message)| message);
        return Err(format!("{invalid} {field}").trim_end().to_owned());
    }
    for (index, records) in obj["writers"].as_object().into_iter().flatten() {
        if !records
            .as_array()
            .is_some_and(|a| a.iter().all(|r| valid_instance(r, Some("pi-writer"))))
        {
            return Err(format!(
                "Invalid writer process records for child '{index}'."
            ));
        }
    }
    if let Some(expected) = obj.get("expectedWriters") {
        let map = expected
            .as_object()
            .ok_or("Invalid expected writer process records.")?;
        if let Some((index, _)) = map.iter().find(|(_, v)| v.as_u64().is_none()) {
            return Err(format!(
                "Invalid expected writer count for child '{index}'."
            ));
        }
    }
    let checks = [
        (
            "sessionFile",
            Value::is_string as fn(&Value) -> bool,
            "Invalid process-terminal candidate sessionFile.",
        ),
        (
            "revivalLeaseToken",
            Value::is_string,
            "Invalid process-terminal candidate lease token.",
        ),
        (
            "revivalLeaseReleaseAcknowledged",
            Value::is_boolean,
            "Invalid process-terminal lease release acknowledgement.",
        ),
    ];
    for (key, ok, message) in checks {
        if obj.get(key).is_some_and(|v| !ok(v)) {
            return Err(message.to_owned());
        }
    }
    Ok(())
}

/// Writes the candidate (private atomic write).
pub fn write_candidate(run_dir: &Path, candidate: &Candidate) -> crate::Result<()> {
    atomic_file::write_json(&run_dir.join(files::CANDIDATE), candidate)?;
    Ok(())
}

/// State of a session's revival lease as the finalizer needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseState {
    /// No lease; carries the canonical session id.
    Free(String),
    /// Held by a valid owner.
    Owned,
    /// The lease directory exists but its owner record is invalid.
    Unreadable,
}

/// Inspects the lease of a session file; errors become `proof-write-failed`.
pub type LeaseInspector<'a> = &'a dyn Fn(&str) -> Result<LeaseState, String>;

/// Whether a run in `state` with `session_file` can be resumed
/// (docs/protocol/status.md §5.7).
pub fn resume_disposition(state: Option<&str>, session_file: Option<&str>) -> &'static str {
    match state {
        Some("stopped") => "non-resumable",
        Some("complete" | "completed" | "failed" | "paused")
            if session_file.is_some_and(|f| Path::new(f).exists()) =>
        {
            "resumable"
        }
        _ => "unavailable",
    }
}

/// Decides the proof for a runner close (docs/protocol/status.md §5.4), without writing anything.
pub fn decide(
    run_dir: &Path,
    run_id: &str,
    close: &RunnerClose,
    leases: LeaseInspector<'_>,
) -> ProcessTerminal {
    let runner = close.process_instance_id.as_str();
    let unknown = |reason: &str, diagnostic: Option<String>| {
        ProcessTerminal::unknown(run_id, runner, reason, diagnostic)
    };
    let candidate = match read_candidate(run_dir) {
        Ok(Some(candidate)) => candidate,
        Ok(None) => return unknown("runner-candidate-missing", None),
        Err(message) => return unknown("proof-write-failed", Some(message)),
    };
    if candidate.run_id != run_id || candidate.runner_process_instance_id != runner {
        return unknown("runner-instance-mismatch", None);
    }
    let mut canonical = None;
    if let Some(session) = &candidate.session_file {
        match leases(session) {
            Ok(LeaseState::Owned) => return unknown("canonical-session-lease-active", None),
            Ok(LeaseState::Unreadable) => return unknown("canonical-session-unavailable", None),
            Ok(LeaseState::Free(id)) => canonical = Some(id),
            Err(message) => return unknown("proof-write-failed", Some(message)),
        }
    }
    let token = candidate.revival_lease_token.is_some();
    if token && candidate.revival_lease_release_acknowledged != Some(true) {
        return unknown("canonical-session-release-unverified", None);
    }
    if !writers_consistent(&candidate) {
        return unknown("writer-close-unverified", None);
    }
    let writers = ordered_writers(&candidate);
    if writers
        .iter()
        .any(|w| !matches!(w.process_tree, ProcessTree::Observed { .. }))
    {
        return unknown("process-tree-unverified", None);
    }
    let status = crate::model::read_status(run_dir).ok().flatten();
    let session_file = candidate
        .session_file
        .clone()
        .or_else(|| status.as_ref().and_then(|s| s.session_file.clone()));
    let state = status.as_ref().map(|s| s.state.as_str());
    let mut instances = vec![close.record()];
    instances.extend(
        writers
            .iter()
            .map(|w| serde_json::to_value(w).unwrap_or(Value::Null)),
    );
    ProcessTerminal {
        observed_at: Some(close.close_observed_at),
        instances: Some(instances),
        resume_disposition: Some(resume_disposition(state, session_file.as_deref()).to_owned()),
        canonical_session: canonical.map(|id| canonical_session(&id, token)),
        ..ProcessTerminal::new(crate::proof::ProofState::Observed, run_id, runner)
    }
}

fn canonical_session(id: &str, token: bool) -> Value {
    let mut value = json!({
        "canonicalSessionId": id,
        "leaseDisposition": if token { "released" } else { "not-held" },
        "freeAtObservation": true,
    });
    if token {
        value["canonicalSessionLeaseReleased"] = json!(true);
    }
    value
}

fn expected_counts(candidate: &Candidate) -> BTreeMap<String, u64> {
    candidate.expected_writers.clone().unwrap_or_else(|| {
        candidate
            .writers
            .iter()
            .map(|(k, v)| (k.clone(), v.len() as u64))
            .collect()
    })
}

fn writers_consistent(candidate: &Candidate) -> bool {
    let expected = expected_counts(candidate);
    if candidate.writers.is_empty() && candidate.expected_writers.is_none() {
        return false;
    }
    let counts_match = candidate
        .writers
        .iter()
        .all(|(index, records)| expected.get(index) == Some(&(records.len() as u64)));
    let none_missing = expected
        .iter()
        .all(|(index, n)| *n == 0 || candidate.writers.contains_key(index));
    counts_match && none_missing
}

/// Writer records in ascending numeric child-index order.
fn ordered_writers(candidate: &Candidate) -> Vec<&WriterRecord> {
    let mut keyed: Vec<(u64, &Vec<WriterRecord>)> = candidate
        .writers
        .iter()
        .map(|(k, v)| (k.parse().unwrap_or(u64::MAX), v))
        .collect();
    keyed.sort_by_key(|(k, _)| *k);
    keyed.into_iter().flat_map(|(_, v)| v.iter()).collect()
}

/// Finalizes the proof of a run whose runner close was observed (docs/protocol/status.md §5.4, §5.5):
/// idempotent; writes `process-terminal.json`, overlays status, appends the
/// event, and only then releases the marker (when observed). Returns the
/// durable proof.
pub fn finalize(
    run_dir: &Path,
    run_id: &str,
    close: &RunnerClose,
    leases: LeaseInspector<'_>,
    now: u64,
) -> ProcessTerminal {
    finalize_with(run_dir, run_id, close, leases, now, &|_| {})
}

/// [`finalize`] that also applies `on_observed` to the status in the same
/// write as the overlay, when the proof is observed (the monitor freezes
/// the run's listing facts this way, without a write of its own).
pub fn finalize_with(
    run_dir: &Path,
    run_id: &str,
    close: &RunnerClose,
    leases: LeaseInspector<'_>,
    now: u64,
    on_observed: &dyn Fn(&mut RunStatus),
) -> ProcessTerminal {
    finalize_then(run_dir, run_id, close, leases, now, on_observed, &|_| {})
}

/// [`finalize_with`] that calls `before_release` once the proof is durable,
/// overlaid and recorded, just before the marker release (the finalizer
/// frees the run's capacity slot there, in the same step as the proof).
pub fn finalize_then(
    run_dir: &Path,
    run_id: &str,
    close: &RunnerClose,
    leases: LeaseInspector<'_>,
    now: u64,
    on_observed: &dyn Fn(&mut RunStatus),
    before_release: &dyn Fn(&ProcessTerminal),
) -> ProcessTerminal {
    let fallback = Fallback {
        run_id: Some(run_id.to_owned()),
        runner_process_instance_id: Some(close.process_instance_id.clone()),
    };
    if let Some(existing) = read_proof(run_dir, &fallback)
        && matches!(existing.state, ProofState::Observed | ProofState::Unknown)
    {
        if persistence_unfinished(run_dir, &existing) {
            persist_after_proof(run_dir, run_id, &existing, now, on_observed, before_release);
        }
        return existing;
    }
    let proof = decide(run_dir, run_id, close, leases);
    if atomic_file::write_json(&run_dir.join(files::PROOF), &proof).is_err() {
        let message = "Failed to persist process-terminal proof.".to_owned();
        return unreadable_proof(run_id, &close.process_instance_id, message);
    }
    crate::fault_point("after-proof");
    persist_after_proof(run_dir, run_id, &proof, now, on_observed, before_release);
    proof
}

/// The overlay, event and marker release of docs/protocol/status.md §5.5 for a proof already on disk: overlay, event, and
/// only then (observed) the marker release. `on_observed` edits the status
/// in the overlay's own write when the proof is observed.
fn persist_after_proof(
    run_dir: &Path,
    run_id: &str,
    proof: &ProcessTerminal,
    now: u64,
    on_observed: &dyn Fn(&mut RunStatus),
    before_release: &dyn Fn(&ProcessTerminal),
) {
    let candidate = read_candidate(run_dir).ok().flatten();
    let _ = update_status(run_dir, |status| {
        status.map(|s| {
            let mut s = overlay(s, proof, candidate.as_ref(), now);
            if proof.state == ProofState::Observed {
                on_observed(&mut s);
            }
            s
        })
    });
    let fields = json!({"lifecycleArtifactVersion": crate::LIFECYCLE_ARTIFACT_VERSION, "processTerminal": proof});
    let _ = events::append(
        run_dir,
        "subagent.run.process_terminal",
        run_id,
        now,
        fields,
    );
    before_release(proof);
    // Only now, with the proof overlaid and recorded, may the run leave the index.
    if proof.state == ProofState::Observed {
        let _ = index::release_marker(run_dir);
    }
}

/// Whether a final proof's persistence is unfinished: its finalizer died
/// after writing `process-terminal.json` but before the overlay, the event or
/// the marker release (the status still projects another proof state, or the
/// marker of an observed run is still there).
pub fn persistence_unfinished(run_dir: &Path, proof: &ProcessTerminal) -> bool {
    let marker_left = proof.state == ProofState::Observed && index::has_marker(run_dir);
    // A damaged status cannot take the overlay: only the marker is left to do.
    let Ok(status) = crate::model::read_status(run_dir) else {
        return marker_left;
    };
    let projected = status
        .and_then(|s| s.process_terminal)
        .and_then(|p| p.get("state").and_then(Value::as_str).map(str::to_owned));
    let overlaid = projected.as_deref() == Some(proof.state.as_str());
    !overlaid || marker_left
}

/// Finishes persisting a final proof (see [`persistence_unfinished`]);
/// returns whether it did anything.
pub fn complete_persisted(run_dir: &Path, run_id: &str, proof: &ProcessTerminal, now: u64) -> bool {
    complete_persisted_then(run_dir, run_id, proof, now, &|_| {})
}

/// [`complete_persisted`] calling `before_release` as [`finalize_then`] does.
pub fn complete_persisted_then(
    run_dir: &Path,
    run_id: &str,
    proof: &ProcessTerminal,
    now: u64,
    before_release: &dyn Fn(&ProcessTerminal),
) -> bool {
    if !persistence_unfinished(run_dir, proof) {
        return false;
    }
    persist_after_proof(run_dir, run_id, proof, now, &|_| {}, before_release);
    true
}

/// Sets the run proof on a status and projects a proof on every step (docs/protocol/status.md §5.6).
pub fn overlay(
    mut status: RunStatus,
    proof: &ProcessTerminal,
    candidate: Option<&Candidate>,
    now: u64,
) -> RunStatus {
    status.process_terminal = Some(proof.to_value());
    let session = candidate.and_then(|c| c.session_file.clone());
    for (i, step) in status.steps.iter_mut().flatten().enumerate() {
        let key = i.to_string();
        let records = candidate
            .and_then(|c| c.writers.get(&key))
            .cloned()
            .unwrap_or_default();
        let expected = candidate
            .and_then(|c| c.expected_writers.as_ref())
            .and_then(|e| e.get(&key).copied())
            .unwrap_or(records.len() as u64);
        let state = if expected == 0 {
            ProofState::NotStarted
        } else if proof.state == ProofState::Observed && records.len() as u64 == expected {
            ProofState::Observed
        } else if proof.state == ProofState::Pending {
            ProofState::Pending
        } else {
            ProofState::Unknown
        };
        let step_session = step
            .extra
            .get("sessionFile")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .or(session.clone());
        let mut projection = ProcessTerminal {
            child_index: Some(i),
            resume_disposition: Some(
                resume_disposition(Some(&step.status), step_session.as_deref()).to_owned(),
            ),
            ..ProcessTerminal::new(state, &proof.run_id, &proof.runner_process_instance_id)
        };
        match state {
            ProofState::Observed => {
                projection.observed_at = Some(proof.observed_at.unwrap_or(now));
                projection.instances = Some(
                    records
                        .iter()
                        .map(|r| serde_json::to_value(r).unwrap_or(Value::Null))
                        .collect(),
                );
            }
            ProofState::Unknown => {
                let reason = if proof.state == ProofState::Unknown {
                    proof.reason.clone()
                } else {
                    None
                };
                projection.reason =
                    Some(reason.unwrap_or_else(|| "writer-close-unverified".into()));
            }
            _ => {}
        }
        step.process_terminal = Some(projection.to_value());
    }
    status
}

/// No session leases are involved (runs without a session file).
pub fn no_leases(_: &str) -> Result<LeaseState, String> {
    Err("no session lease inspector is configured".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{RunState, Step, write_status};

    #[test]
    fn numbers_in_foreign_instance_records_survive_a_rewrite_exactly() {
        // Found by the `proof` fuzz target: without correctly rounded float
        // parsing, writing a proof back changed the last digit of a float
        // kept from another writer's instance record.
        let text = r#"{"version":1,"state":"observed","runId":"run","runnerProcessInstanceId":"r",
            "observedAt":5,"instances":[
            {"kind":"runner","processInstanceId":"r","closeObservedAt":5,"exitCode":0,"signal":null},
            {"processInstanceId":"w","kind":"pi-writer","attempt":1,"exitCode":0,"signal":null,
             "closeObservedAt":176666666666666666666666666666666666667225604000,
             "processTree":{"state":"observed","mechanism":"posix-process-group","processGroupId":2171,"verifiedAt":4}}]}"#;
        let fallback = Fallback::default();
        let proof = parse_proof(text, "run", &fallback).unwrap();
        let written = String::from_utf8(atomic_file::to_pretty_json(&proof)).unwrap();
        assert_eq!(parse_proof(&written, "run", &fallback).unwrap(), proof);
    }

    fn writer(tree_observed: bool) -> WriterRecord {
        WriterRecord {
            process_instance_id: "w1".into(),
            kind: "pi-writer".into(),
            attempt: 0,
            close_observed_at: 10,
            exit_code: Some(0),
            signal: None,
            process_tree: if tree_observed {
                ProcessTree::Observed {
                    mechanism: "posix-process-group".into(),
                    process_group_id: 77,
                    verified_at: 11,
                }
            } else {
                ProcessTree::Unknown {
                    reason: "verification-failed".into(),
                    diagnostic: None,
                }
            },
        }
    }

    fn candidate(run: &str, runner: &str, writers: Vec<WriterRecord>) -> Candidate {
        Candidate {
            version: 1,
            run_id: run.into(),
            runner_process_instance_id: runner.into(),
            writers: BTreeMap::from([("0".into(), writers)]),
            expected_writers: Some(BTreeMap::from([("0".into(), 1)])),
            session_file: None,
            revival_lease_token: None,
            revival_lease_release_acknowledged: None,
        }
    }

    fn close(runner: &str) -> RunnerClose {
        RunnerClose {
            process_instance_id: runner.into(),
            close_observed_at: 20,
            exit_code: Some(0),
            signal: None,
            observer: None,
        }
    }

    fn run_dir() -> (tempfile::TempDir, std::path::PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run-1");
        std::fs::create_dir(&dir).unwrap();
        let mut status = RunStatus::new("run-1", RunState::Complete);
        status.steps = Some(vec![Step {
            agent: "a".into(),
            status: "complete".into(),
            ..Step::default()
        }]);
        write_status(&dir, &status).unwrap();
        index::create_marker(&dir).unwrap();
        (tmp, dir)
    }

    #[test]
    fn mismatched_runner_then_matching_runner() {
        let (_tmp, dir) = run_dir();
        write_candidate(&dir, &candidate("run-1", "runner-1", vec![writer(true)])).unwrap();
        let proof = finalize(&dir, "run-1", &close("runner-2"), &no_leases, 30);
        assert_eq!(
            (proof.state, proof.reason.as_deref()),
            (ProofState::Unknown, Some("runner-instance-mismatch"))
        );
        assert!(index::has_marker(&dir));
        std::fs::remove_file(dir.join(files::PROOF)).unwrap();
        let proof = finalize(&dir, "run-1", &close("runner-1"), &no_leases, 30);
        assert_eq!(proof.state, ProofState::Observed);
        assert_eq!(proof.instances.as_ref().unwrap().len(), 2);
        assert!(!index::has_marker(&dir));
        let status = crate::model::read_status(&dir).unwrap().unwrap();
        assert_eq!(
            status.process_terminal.as_ref().unwrap()["state"],
            "observed"
        );
        assert_eq!(
            status.steps()[0].process_terminal.as_ref().unwrap()["state"],
            "observed"
        );
        let events = events::read_all(&dir);
        assert_eq!(
            events.last().unwrap()["type"],
            "subagent.run.process_terminal"
        );
    }

    #[test]
    fn unverified_tree_keeps_the_marker() {
        let (_tmp, dir) = run_dir();
        write_candidate(&dir, &candidate("run-1", "runner-1", vec![writer(false)])).unwrap();
        let proof = finalize(&dir, "run-1", &close("runner-1"), &no_leases, 30);
        assert_eq!(proof.reason.as_deref(), Some("process-tree-unverified"));
        assert!(index::has_marker(&dir));
    }

    #[test]
    fn missing_candidate_is_exactly_the_reference_shape() {
        let (_tmp, dir) = run_dir();
        let proof = decide(&dir, "run-2", &close("runner-2"), &no_leases);
        assert_eq!(
            proof.to_value(),
            json!({"version":1,"state":"unknown","runId":"run-2","runnerProcessInstanceId":"runner-2","reason":"runner-candidate-missing"})
        );
    }

    #[test]
    fn writer_consistency_rules() {
        let (_tmp, dir) = run_dir();
        let mut c = candidate("run-1", "runner-1", vec![]);
        write_candidate(&dir, &c).unwrap();
        assert_eq!(
            decide(&dir, "run-1", &close("runner-1"), &no_leases)
                .reason
                .as_deref(),
            Some("writer-close-unverified")
        );
        c.expected_writers = Some(BTreeMap::from([("0".into(), 0)]));
        c.writers.clear();
        write_candidate(&dir, &c).unwrap();
        assert_eq!(
            decide(&dir, "run-1", &close("runner-1"), &no_leases).state,
            ProofState::Observed
        );
        c.writers.insert("0".into(), vec![writer(true)]);
        write_candidate(&dir, &c).unwrap();
        assert_eq!(
            decide(&dir, "run-1", &close("runner-1"), &no_leases)
                .reason
                .as_deref(),
            Some("writer-close-unverified")
        );
    }

    #[test]
    fn lease_release_must_be_acknowledged() {
        let (_tmp, dir) = run_dir();
        let mut c = candidate("run-1", "runner-1", vec![writer(true)]);
        c.revival_lease_token = Some("t".into());
        c.revival_lease_release_acknowledged = Some(false);
        write_candidate(&dir, &c).unwrap();
        let proof = decide(&dir, "run-1", &close("runner-1"), &no_leases);
        assert_eq!(
            proof.reason.as_deref(),
            Some("canonical-session-release-unverified")
        );
    }

    #[test]
    fn malformed_and_foreign_proofs_are_unknown() {
        let (_tmp, dir) = run_dir();
        std::fs::write(
            dir.join(files::PROOF),
            r#"{"version":1,"state":"bogus","runId":"r","runnerProcessInstanceId":"x"}"#,
        )
        .unwrap();
        let proof = read_proof(&dir, &Fallback::default()).unwrap();
        assert_eq!(proof.reason.as_deref(), Some("proof-write-failed"));
        assert!(
            proof
                .diagnostic
                .unwrap()
                .contains("Invalid process-terminal proof")
        );
        let observed = json!({"version":1,"state":"observed","runId":"wrong-run","runnerProcessInstanceId":"r1","observedAt":1,
            "instances":[{"kind":"runner","processInstanceId":"r1","closeObservedAt":1,"exitCode":0,"signal":null}]});
        std::fs::write(dir.join(files::PROOF), observed.to_string()).unwrap();
        let proof = finalize(&dir, "actual-run", &close("r1"), &no_leases, 5);
        assert_eq!(proof.state, ProofState::Unknown);
        assert!(
            proof
                .diagnostic
                .unwrap()
                .contains("belongs to run 'wrong-run', expected 'actual-run'")
        );
    }

    #[test]
    fn candidate_validation_messages() {
        let bad = json!({"version":1,"runId":"r","runnerProcessInstanceId":"x","writers":{"0":[{"kind":"pi-writer"}]}});
        assert_eq!(
            validate_candidate(&bad, "top").unwrap_err(),
            "Invalid writer process records for child '0'."
        );
        let bad = json!({"version":1,"runId":"r","runnerProcessInstanceId":"x","writers":{},"expectedWriters":{"0":-1}});
        assert_eq!(
            validate_candidate(&bad, "top").unwrap_err(),
            "Invalid expected writer count for child '0'."
        );
        let bad = json!({"version":2,"runId":"r","runnerProcessInstanceId":"x","writers":{}});
        assert_eq!(
            validate_candidate(&bad, "top").unwrap_err(),
            "top version must be 1."
        );
    }

    #[test]
    fn resume_dispositions() {
        assert_eq!(resume_disposition(Some("stopped"), None), "non-resumable");
        assert_eq!(resume_disposition(Some("failed"), None), "unavailable");
        assert_eq!(
            resume_disposition(Some("running"), Some("/")),
            "unavailable"
        );
        assert_eq!(resume_disposition(Some("complete"), Some("/")), "resumable");
    }
}
