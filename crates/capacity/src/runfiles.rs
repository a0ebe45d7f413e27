//! A thin adapter over the `status` crate's readers of a run's
//! `status.json` and `process-terminal.json` (docs/protocol/status.md §2.1, §5.3):
//! the verdicts read run facts through them, so what a status or a proof
//! says (which states are over, what makes a proof valid) is decided once.

use std::path::Path;

use status::RunStatus;
use status::proof::{Fallback, ProofState, read_proof};

/// Outcome of reading `status.json`.
#[derive(Debug)]
pub(crate) enum StatusRead {
    /// No file.
    Missing,
    /// The file exists but the status reader refuses it (unreadable,
    /// unparsable, a field of the wrong type or an unknown state). The
    /// reference throws here; this version keeps the slot with the error,
    /// which names the file, as reason instead.
    Unreadable(String),
    /// A status the reader accepts.
    Present(Box<RunStatus>),
}

pub(crate) fn read_status(dir: &Path) -> StatusRead {
    match status::model::read_status(dir) {
        Ok(Some(status)) => StatusRead::Present(Box::new(status)),
        Ok(None) => StatusRead::Missing,
        Err(e) => StatusRead::Unreadable(e.to_string()),
    }
}

/// The status's `runId`, `None` when absent or empty.
pub(crate) fn status_run_id(status: &RunStatus) -> Option<&str> {
    Some(status.run_id.as_str()).filter(|id| !id.is_empty())
}

/// A non-empty run-level `error`.
pub(crate) fn has_error(status: &RunStatus) -> bool {
    status.error.as_deref().is_some_and(|e| !e.is_empty())
}

/// Whether the status records a runner process (pid or identity).
pub(crate) fn has_runner_trace(status: &RunStatus) -> bool {
    status.pid.is_some() || status.runner_identity.is_some()
}

/// The runner instance the status's `processTerminal` projection names,
/// when it names one.
pub(crate) fn projected_runner(status: &RunStatus) -> Option<&str> {
    status
        .projected_proof_str("runnerProcessInstanceId")
        .filter(|id| !id.is_empty())
}

/// State of the proof file checked against an expected run and runner:
/// `None` when missing; `unknown` when invalid or not matching (the
/// reader's stand-in for such a file).
pub(crate) fn proof_state(dir: &Path, run_id: &str, runner_id: &str) -> Option<ProofState> {
    let expected = Fallback {
        run_id: Some(run_id.to_owned()),
        runner_process_instance_id: Some(runner_id.to_owned()),
    };
    read_proof(dir, &expected).map(|proof| proof.state)
}

/// Whether `process-terminal.json` is a valid observed proof of `run_id`
/// and of `runner`, or of whichever runner it names when `runner` is `None`.
pub(crate) fn observed_proof(dir: &Path, run_id: &str, runner: Option<&str>) -> bool {
    let expected = Fallback {
        run_id: Some(run_id.to_owned()),
        runner_process_instance_id: runner.map(str::to_owned),
    };
    read_proof(dir, &expected).is_some_and(|proof| proof.state == ProofState::Observed)
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
    use super::fixtures::write_proof;
    use super::*;

    #[test]
    fn malformed_status_is_unreadable_not_missing() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("status.json");
        assert!(matches!(read_status(tmp.path()), StatusRead::Missing));
        for text in ["{oops", "[]", r#"{"state": 5}"#, r#"{"state": "detached"}"#] {
            atomic_file::write_private(&path, text.as_bytes()).unwrap();
            match read_status(tmp.path()) {
                StatusRead::Unreadable(e) => {
                    assert!(e.contains(&path.display().to_string()), "{text}: {e}")
                }
                other => panic!("{text}: {other:?}"),
            }
        }
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        assert!(matches!(read_status(tmp.path()), StatusRead::Unreadable(_)));
        std::fs::remove_dir(&path).unwrap();
        atomic_file::write_private(&path, br#"{"runId": "r", "state": "paused"}"#).unwrap();
        match read_status(tmp.path()) {
            StatusRead::Present(s) => assert_eq!(s.state, status::RunState::Paused),
            other => panic!("{other:?}"),
        }
    }

    fn parse(value: serde_json::Value) -> RunStatus {
        status::model::parse_status(Path::new("/r/status.json"), &value.to_string()).unwrap()
    }

    #[test]
    fn the_status_fields_the_verdicts_read() {
        let bare = parse(
            serde_json::json!({"runId": "", "state": "failed", "error": "",
                                            "pid": null, "runnerIdentity": null}),
        );
        assert_eq!(status_run_id(&bare), None);
        assert!(!has_error(&bare));
        assert!(!has_runner_trace(&bare));
        assert_eq!(projected_runner(&bare), None);
        let full = parse(serde_json::json!({
            "runId": "r", "state": "failed", "error": "boom",
            "runnerIdentity": {"pid": 12, "startTime": 7, "bootId": "b"},
            "processTerminal": {"state": "pending", "runnerProcessInstanceId": "rid"},
        }));
        assert_eq!(status_run_id(&full), Some("r"));
        assert!(has_error(&full));
        assert!(has_runner_trace(&full));
        assert_eq!(projected_runner(&full), Some("rid"));
        assert!(has_runner_trace(&parse(
            serde_json::json!({"state": "failed", "pid": 42})
        )));
        let empty_runner = parse(serde_json::json!({"state": "failed",
            "processTerminal": {"runnerProcessInstanceId": ""}}));
        assert_eq!(projected_runner(&empty_runner), None);
    }

    #[test]
    fn proof_is_checked_against_run_and_runner() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        assert_eq!(proof_state(dir, "r", "p"), None);
        assert!(!observed_proof(dir, "r", None));
        write_proof(dir, "observed", "r", "p");
        assert_eq!(proof_state(dir, "r", "p"), Some(ProofState::Observed));
        assert_eq!(proof_state(dir, "r", "other"), Some(ProofState::Unknown));
        assert_eq!(proof_state(dir, "x", "p"), Some(ProofState::Unknown));
        assert!(observed_proof(dir, "r", Some("p")));
        assert!(observed_proof(dir, "r", None), "any runner the proof names");
        assert!(!observed_proof(dir, "r", Some("other")));
        assert!(!observed_proof(dir, "x", None));
        write_proof(dir, "pending", "r", "p");
        assert_eq!(proof_state(dir, "r", "p"), Some(ProofState::Pending));
        assert!(!observed_proof(dir, "r", None));
        let proof = dir.join("process-terminal.json");
        atomic_file::write_private(&proof, b"{").unwrap();
        assert_eq!(proof_state(dir, "r", "p"), Some(ProofState::Unknown));
        std::fs::remove_file(&proof).unwrap();
        std::fs::create_dir(&proof).unwrap();
        assert_eq!(proof_state(dir, "r", "p"), Some(ProofState::Unknown));
        assert!(!observed_proof(dir, "r", None));
    }
}
