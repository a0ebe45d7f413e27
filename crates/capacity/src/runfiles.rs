//! The few fields of a run's `status.json` and `process-terminal.json` that
//! the release verdicts look at (docs/protocol/status.md §2.1, §5.3), read tolerantly
//! as `serde_json::Value` so unknown keys never matter.

use std::path::Path;

use serde_json::Value;

/// Run states after which a run is finished (anything but these three).
const NON_TERMINAL: [&str; 3] = ["queued", "running", "paused"];

/// Outcome of reading `status.json`.
#[derive(Debug)]
pub(crate) enum StatusRead {
    /// No file.
    Missing,
    /// The file exists but cannot be read or parsed (the reference throws
    /// here; this version keeps the slot with the error as reason instead).
    Unreadable(String),
    /// A parsed JSON object.
    Present(RunStatus),
}

/// A parsed `status.json`.
#[derive(Debug)]
pub(crate) struct RunStatus(Value);

pub(crate) fn read_status(dir: &Path) -> StatusRead {
    let path = dir.join("status.json");
    let bytes = match atomic_file::read::read_file(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.is_not_found() => return StatusRead::Missing,
        Err(e) => return StatusRead::Unreadable(e.to_string()),
    };
    match serde_json::from_slice::<Value>(&bytes) {
        // A state that is not a string is no status at all (the status
        // reader refuses it too); taken as present, it would read as over.
        Ok(value) if value.get("state").is_some_and(|s| !s.is_string()) => {
            StatusRead::Unreadable(format!("'{}': state is not a string", path.display()))
        }
        Ok(value) if value.is_object() => StatusRead::Present(RunStatus(value)),
        Ok(_) => StatusRead::Unreadable(format!("'{}' is not a JSON object", path.display())),
        Err(e) => StatusRead::Unreadable(format!("failed to parse '{}': {e}", path.display())),
    }
}

impl RunStatus {
    fn str_field(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(Value::as_str)
    }

    pub(crate) fn session_id(&self) -> Option<&str> {
        self.str_field("sessionId")
    }

    pub(crate) fn run_id(&self) -> Option<&str> {
        self.str_field("runId")
    }

    pub(crate) fn state(&self) -> Option<&str> {
        self.str_field("state")
    }

    pub(crate) fn mode(&self) -> Option<&str> {
        self.str_field("mode")
    }

    pub(crate) fn is_terminal(&self) -> bool {
        !NON_TERMINAL.contains(&self.state().unwrap_or(""))
    }

    /// A non-empty run-level `error`.
    pub(crate) fn has_error(&self) -> bool {
        self.str_field("error").is_some_and(|e| !e.is_empty())
    }

    /// Whether the status records a runner process (pid or identity).
    pub(crate) fn has_runner_trace(&self) -> bool {
        self.0.get("pid").is_some_and(|v| !v.is_null())
            || self.0.get("runnerIdentity").is_some_and(|v| !v.is_null())
    }

    /// `processTerminal` as `(state, runId, runnerProcessInstanceId)`.
    pub(crate) fn process_terminal(&self) -> Option<(&str, &str, &str)> {
        let proof = self.0.get("processTerminal")?;
        let field = |key| proof.get(key).and_then(Value::as_str).unwrap_or("");
        Some((
            field("state"),
            field("runId"),
            field("runnerProcessInstanceId"),
        ))
    }

    pub(crate) fn steps(&self) -> &[Value] {
        self.0
            .get("steps")
            .and_then(Value::as_array)
            .map_or(&[], Vec::as_slice)
    }
}

/// State of the proof file checked against an expected run and runner:
/// `None` when missing, `"unknown"` when invalid or not matching.
pub(crate) fn proof_state(dir: &Path, run_id: &str, runner_id: &str) -> Option<String> {
    let bytes = match atomic_file::read::read_file(&dir.join("process-terminal.json")) {
        Err(e) if e.is_not_found() => return None,
        other => other.ok(),
    };
    let proof = bytes.and_then(|b| serde_json::from_slice::<Value>(&b).ok());
    let state = proof
        .as_ref()
        .and_then(|p| valid_proof_state(p, run_id, runner_id))
        .unwrap_or("unknown");
    Some(state.to_owned())
}

/// The runner instance `process-terminal.json` names, whatever its state.
pub(crate) fn proof_runner(dir: &Path) -> Option<String> {
    let bytes = atomic_file::read::read_file(&dir.join("process-terminal.json")).ok()?;
    let proof = serde_json::from_slice::<Value>(&bytes).ok()?;
    let id = proof.get("runnerProcessInstanceId")?.as_str()?;
    (!id.is_empty()).then(|| id.to_owned())
}

fn valid_proof_state<'a>(proof: &'a Value, run_id: &str, runner_id: &str) -> Option<&'a str> {
    let field = |key| proof.get(key).and_then(Value::as_str);
    if proof.get("version").and_then(Value::as_u64) != Some(1)
        || field("runId") != Some(run_id)
        || field("runnerProcessInstanceId") != Some(runner_id)
        || run_id.is_empty()
        || runner_id.is_empty()
    {
        return None;
    }
    let state = field("state")?;
    match state {
        "observed" => observed_is_complete(proof, runner_id).then_some(state),
        "pending" | "unknown" | "not-started" => Some(state),
        _ => None,
    }
}

/// An `observed` proof needs `observedAt` and a runner instance with the
/// expected id (docs/protocol/status.md §5.3).
fn observed_is_complete(proof: &Value, runner_id: &str) -> bool {
    let has_time = proof.get("observedAt").is_some_and(Value::is_number);
    let runner = proof
        .get("instances")
        .and_then(Value::as_array)
        .and_then(|list| {
            list.iter()
                .find(|i| i.get("kind").and_then(Value::as_str) == Some("runner"))
        });
    has_time
        && runner.is_some_and(|r| {
            r.get("processInstanceId").and_then(Value::as_str) == Some(runner_id)
                && r.get("closeObservedAt").is_some_and(Value::is_number)
        })
}

#[cfg(test)]
pub(crate) mod fixtures {
    //! Run directories as the runner and the launcher leave them.

    use std::path::Path;

    use serde_json::json;

    pub(crate) fn write_proof(dir: &Path, state: &str, run_id: &str, runner_id: &str) {
        let mut proof = json!({
            "version": 1,
            "state": state,
            "runId": run_id,
            "runnerProcessInstanceId": runner_id,
        });
        if state == "observed" {
            proof["observedAt"] = json!(1000);
            proof["instances"] = json!([{
                "kind": "runner",
                "processInstanceId": runner_id,
                "closeObservedAt": 999,
                "exitCode": 0,
                "signal": null,
            }]);
        } else if state == "unknown" {
            proof["reason"] = json!("writer-close-unverified");
        }
        atomic_file::write_json(&dir.join("process-terminal.json"), &proof).unwrap();
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::*;
    use super::*;

    #[test]
    fn proof_is_checked_against_run_and_runner() {
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(proof_state(tmp.path(), "r", "p"), None);
        write_proof(tmp.path(), "observed", "r", "p");
        assert_eq!(
            proof_state(tmp.path(), "r", "p").as_deref(),
            Some("observed")
        );
        assert_eq!(
            proof_state(tmp.path(), "r", "other").as_deref(),
            Some("unknown")
        );
        assert_eq!(
            proof_state(tmp.path(), "x", "p").as_deref(),
            Some("unknown")
        );
        write_proof(tmp.path(), "pending", "r", "p");
        assert_eq!(
            proof_state(tmp.path(), "r", "p").as_deref(),
            Some("pending")
        );
        std::fs::write(tmp.path().join("process-terminal.json"), "{").unwrap();
        assert_eq!(
            proof_state(tmp.path(), "r", "p").as_deref(),
            Some("unknown")
        );
    }

    #[test]
    fn malformed_status_is_unreadable_not_missing() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(matches!(read_status(tmp.path()), StatusRead::Missing));
        std::fs::write(tmp.path().join("status.json"), "{oops").unwrap();
        assert!(matches!(read_status(tmp.path()), StatusRead::Unreadable(_)));
        std::fs::write(tmp.path().join("status.json"), "[]").unwrap();
        match read_status(tmp.path()) {
            StatusRead::Unreadable(e) => assert!(e.ends_with("is not a JSON object"), "{e}"),
            other => panic!("{other:?}"),
        }
        std::fs::remove_file(tmp.path().join("status.json")).unwrap();
        std::fs::create_dir(tmp.path().join("status.json")).unwrap();
        assert!(matches!(read_status(tmp.path()), StatusRead::Unreadable(_)));
    }

    fn status(value: serde_json::Value) -> RunStatus {
        let tmp = tempfile::tempdir().unwrap();
        atomic_file::write_json(&tmp.path().join("status.json"), &value).unwrap();
        match read_status(tmp.path()) {
            StatusRead::Present(status) => status,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_status_fields_the_verdicts_read() {
        let s = status(serde_json::json!({
            "sessionId": "s", "runId": "r", "state": "running", "mode": "chain",
            "error": "", "pid": null, "runnerIdentity": null, "steps": [{}, {}],
        }));
        assert_eq!(
            (s.session_id(), s.run_id(), s.state(), s.mode()),
            (Some("s"), Some("r"), Some("running"), Some("chain"))
        );
        assert!(!s.has_error());
        assert!(!s.has_runner_trace());
        assert_eq!(s.process_terminal(), None);
        assert_eq!(s.steps().len(), 2);
        let empty = status(serde_json::json!({}));
        assert_eq!(empty.steps().len(), 0);
        assert!(!empty.has_error());
        assert!(!empty.has_runner_trace());
        assert!(status(serde_json::json!({"error": "boom"})).has_error());
        assert!(status(serde_json::json!({"pid": 42})).has_runner_trace());
        assert!(status(serde_json::json!({"runnerIdentity": {}})).has_runner_trace());
        let proof =
            status(serde_json::json!({"processTerminal": {"state": "observed", "runId": "r"}}));
        assert_eq!(proof.process_terminal(), Some(("observed", "r", "")));
    }

    #[test]
    fn only_queued_running_and_paused_are_not_terminal() {
        for state in ["queued", "running", "paused"] {
            assert!(
                !status(serde_json::json!({"state": state})).is_terminal(),
                "{state}"
            );
        }
        for state in ["complete", "failed", "stopped", "detached"] {
            assert!(
                status(serde_json::json!({"state": state})).is_terminal(),
                "{state}"
            );
        }
        assert!(status(serde_json::json!({})).is_terminal());
    }

    #[test]
    fn every_rule_of_a_proof_is_checked_on_its_own() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let state_of = |proof: serde_json::Value, run_id: &str, runner_id: &str| {
            atomic_file::write_json(&dir.join("process-terminal.json"), &proof).unwrap();
            proof_state(dir, run_id, runner_id)
        };
        let proof = |run_id: &str, runner_id: &str, state: &str| {
            serde_json::json!({"version": 1, "state": state, "runId": run_id,
                               "runnerProcessInstanceId": runner_id})
        };
        let unknown = Some("unknown".to_owned());
        for state in ["pending", "unknown", "not-started"] {
            assert_eq!(
                state_of(proof("r", "p", state), "r", "p").as_deref(),
                Some(state)
            );
        }
        assert_eq!(state_of(proof("r", "p", "bogus"), "r", "p"), unknown);
        assert_eq!(
            state_of(
                serde_json::json!({"version": 1, "runId": "r",
            "runnerProcessInstanceId": "p"}),
                "r",
                "p"
            ),
            unknown
        );
        // Each rule alone refuses the proof.
        let mut v2 = proof("r", "p", "pending");
        v2["version"] = serde_json::json!(2);
        assert_eq!(state_of(v2, "r", "p"), unknown);
        assert_eq!(state_of(proof("x", "p", "pending"), "r", "p"), unknown);
        assert_eq!(state_of(proof("r", "x", "pending"), "r", "p"), unknown);
        assert_eq!(state_of(proof("", "p", "pending"), "", "p"), unknown);
        assert_eq!(state_of(proof("r", "", "pending"), "r", ""), unknown);

        // An observed proof needs its time and its runner's close.
        let observed = || {
            let mut p = proof("r", "p", "observed");
            p["observedAt"] = serde_json::json!(1000);
            p["instances"] = serde_json::json!([
                {"kind": "writer", "processInstanceId": "w", "closeObservedAt": 1},
                {"kind": "runner", "processInstanceId": "p", "closeObservedAt": 999},
            ]);
            p
        };
        assert_eq!(state_of(observed(), "r", "p").as_deref(), Some("observed"));
        let mut no_time = observed();
        no_time["observedAt"] = serde_json::json!("1000");
        assert_eq!(state_of(no_time, "r", "p"), unknown);
        let mut other_runner = observed();
        other_runner["instances"][1]["processInstanceId"] = serde_json::json!("w");
        assert_eq!(state_of(other_runner, "r", "p"), unknown);
        let mut not_closed = observed();
        not_closed["instances"][1]
            .as_object_mut()
            .unwrap()
            .remove("closeObservedAt");
        assert_eq!(state_of(not_closed, "r", "p"), unknown);

        // A proof that exists but cannot be read is unknown, not missing.
        std::fs::remove_file(dir.join("process-terminal.json")).unwrap();
        std::fs::create_dir(dir.join("process-terminal.json")).unwrap();
        assert_eq!(proof_state(dir, "r", "p"), unknown);
    }
}
