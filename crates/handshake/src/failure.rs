//! The pre-proceed failure record (docs/protocol/handshake.md §6.3): what a failed startup leaves for
//! the process-terminal finaliser and for capacity accounting.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value, json};

use crate::Binding;
use crate::records::{self, FileRead};

/// The run's status file.
pub const STATUS_FILE: &str = "status.json";
/// The process-terminal candidate file.
pub const CANDIDATE_FILE: &str = "process-terminal-candidate.json";

/// Records that the runner of `binding` never proceeded.
///
/// Writes `process-terminal-candidate.json` =
/// `{version:1, runId, runnerProcessInstanceId, writers:{}, expectedWriters:{"0":0}}`
/// first (it is what lets the finaliser prove the run terminal), then merges
/// into `status.json` (unreadable → `{}`): `runId`, `sessionId` (if given),
/// `state:"failed"`, `lastUpdate` (ms), `error`, and
/// `processTerminal:{version:1, state:"not-started", runId, runnerProcessInstanceId}`.
/// Both writes are attempted; the first error is returned.
pub fn persist_pre_proceed_failure(
    async_dir: &Path,
    binding: &Binding,
    session_id: Option<&str>,
    message: &str,
) -> Result<(), atomic_file::Error> {
    persist_pre_proceed_failure_at(async_dir, binding, session_id, message, now_ms())
}

/// [`persist_pre_proceed_failure`] with `lastUpdate` = `now_ms` instead of
/// the system clock (golden snapshots pin it).
pub fn persist_pre_proceed_failure_at(
    async_dir: &Path,
    binding: &Binding,
    session_id: Option<&str>,
    message: &str,
    now_ms: u64,
) -> Result<(), atomic_file::Error> {
    let candidate = json!({
        "version": 1,
        "runId": binding.run_id,
        "runnerProcessInstanceId": binding.runner_process_instance_id,
        "writers": {},
        "expectedWriters": { "0": 0 },
    });
    let candidate_written = atomic_file::write_json(&async_dir.join(CANDIDATE_FILE), &candidate);
    let status_path = async_dir.join(STATUS_FILE);
    let status = failed_status(
        read_object(&status_path),
        binding,
        session_id,
        message,
        now_ms,
    );
    let status_written = atomic_file::write_json(&status_path, &status);
    candidate_written.and(status_written)
}

fn failed_status(
    mut status: Map<String, Value>,
    binding: &Binding,
    session_id: Option<&str>,
    message: &str,
    now_ms: u64,
) -> Map<String, Value> {
    status.insert("runId".into(), json!(binding.run_id));
    if let Some(session_id) = session_id {
        status.insert("sessionId".into(), json!(session_id));
    }
    status.insert("state".into(), json!("failed"));
    status.insert("lastUpdate".into(), json!(now_ms));
    status.insert("error".into(), json!(message));
    status.insert(
        "processTerminal".into(),
        json!({
            "version": 1,
            "state": "not-started",
            "runId": binding.run_id,
            "runnerProcessInstanceId": binding.runner_process_instance_id,
        }),
    );
    status
}

/// The JSON object in `path`, or an empty one when it is missing, unreadable
/// or not an object (the reference tolerates anything here).
fn read_object(path: &Path) -> Map<String, Value> {
    match records::read_json(path) {
        FileRead::Json(Value::Object(map)) => map,
        _ => Map::new(),
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}
