//! The JSON records of the handshake files and how they are read.

use std::fs;
use std::io;
use std::path::Path;

use serde_json::{Value, json};

use crate::Binding;

/// One read of a handshake file.
pub(crate) enum FileRead {
    /// The file does not exist (yet).
    Missing,
    /// The file parsed as JSON.
    Json(Value),
    /// The file exists but could not be read or parsed; the cause's message.
    Broken(String),
}

/// Reads and parses a JSON file. Files are replaced by rename, so a present
/// file is always whole.
pub(crate) fn read_json(path: &Path) -> FileRead {
    match fs::read(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => FileRead::Missing,
        Err(e) => FileRead::Broken(e.to_string()),
        Ok(bytes) => match serde_json::from_slice(&bytes) {
            Ok(value) => FileRead::Json(value),
            Err(e) => FileRead::Broken(e.to_string()),
        },
    }
}

/// `{state:"ready", token, pid, owner, runId, runnerProcessInstanceId}`.
pub(crate) fn ready(token: &str, pid: u32, owner: &Value, binding: &Binding) -> Value {
    json!({
        "state": "ready",
        "token": token,
        "pid": pid,
        "owner": owner,
        "runId": binding.run_id,
        "runnerProcessInstanceId": binding.runner_process_instance_id,
    })
}

/// `{state:"acknowledged", token, pid, runId, runnerProcessInstanceId}`.
pub(crate) fn acknowledged(token: &str, pid: u32, binding: &Binding) -> Value {
    json!({
        "state": "acknowledged",
        "token": token,
        "pid": pid,
        "runId": binding.run_id,
        "runnerProcessInstanceId": binding.runner_process_instance_id,
    })
}

/// `{state:"error", pid, error, runId, runnerProcessInstanceId}` (no token).
pub(crate) fn error(pid: u32, message: &str, binding: &Binding) -> Value {
    json!({
        "state": "error",
        "pid": pid,
        "error": message,
        "runId": binding.run_id,
        "runnerProcessInstanceId": binding.runner_process_instance_id,
    })
}

/// `{action, token, runId, runnerProcessInstanceId}` for the ack and proceed files.
pub(crate) fn control(action: &str, token: &str, binding: &Binding) -> Value {
    json!({
        "action": action,
        "token": token,
        "runId": binding.run_id,
        "runnerProcessInstanceId": binding.runner_process_instance_id,
    })
}

/// True when the record names exactly this run and runner instance.
pub(crate) fn binding_matches(record: &Value, binding: &Binding) -> bool {
    record["runId"].as_str() == Some(binding.run_id.as_str())
        && record["runnerProcessInstanceId"].as_str()
            == Some(binding.runner_process_instance_id.as_str())
}

/// True when a field the record carries contradicts the run or the pid.
/// Absent fields are accepted so a reference-format error record still counts.
pub(crate) fn contradicts(record: &Value, binding: &Binding, pid: u32) -> bool {
    let differs = |key: &str, expected: &str| {
        record
            .get(key)
            .is_some_and(|v| v.as_str() != Some(expected))
    };
    differs("runId", &binding.run_id)
        || differs(
            "runnerProcessInstanceId",
            &binding.runner_process_instance_id,
        )
        || record
            .get("pid")
            .is_some_and(|v| v.as_u64() != Some(u64::from(pid)))
}
