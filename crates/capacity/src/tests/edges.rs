//! Edges of the release rules and of the slot's second record that the
//! rest of the suite passes by: an unsafe run id in a file name, a
//! damaged owner whose run's status belongs elsewhere or failed before
//! startup, an unreadable status of an unbound slot, and a launcher's
//! early release without a proof.

use std::fs;

use serde_json::{Value, json};

use super::support::*;
use crate::runfiles::fixtures::write_proof;
use crate::{Acquire, Kind};

/// The names in a slot directory that hold its second record.
fn run_names(slot: &std::path::Path) -> Vec<String> {
    fs::read_dir(slot)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("run."))
        .collect()
}

#[test]
fn a_run_id_unfit_for_a_file_name_gets_no_second_record() {
    let long = "r".repeat(200);
    let too_long = "r".repeat(201);
    let cases: [(&str, bool); 8] = [
        ("run-a", true),
        (&long, true),
        ("", false),
        (".", false),
        ("..", false),
        ("a/b", false),
        ("a\0b", false),
        (&too_long, false),
    ];
    for (run_id, recorded) in cases {
        let fx = Fixture::new();
        let dir = fx.run_dir("any");
        let handle = fx
            .cap
            .acquire(&Acquire {
                session_id: SESSION,
                limit: Some(1),
                run_id,
                kind: Kind::Runner,
                async_dir: &dir,
                live_workflows: &fx.none_live,
            })
            .unwrap_or_else(|e| panic!("{run_id:?}: {e}"))
            .unwrap();
        let expected: Vec<String> = if recorded {
            vec![format!("run.0.{run_id}")]
        } else {
            vec![]
        };
        assert_eq!(run_names(handle.slot_dir()), expected, "{run_id:?}");
    }
}

/// A started slot of `run-a` whose `owner.json` is then damaged, with the
/// run's status as given.
fn damaged_slot(fx: &Fixture, status: &Value) -> std::path::PathBuf {
    let mut handle = fx.acquire("run-a", 1);
    handle.mark_started("rid-a").unwrap();
    let dir = fx.run_dir("run-a");
    write_json(&dir.join("status.json"), status);
    let slot = handle.slot_dir().to_path_buf();
    fs::write(slot.join("owner.json"), r#"{"version": "1", "runId": 7}"#).unwrap();
    assert!(crate::pool::read_owner(&slot).unwrap().is_none());
    slot
}

fn failed_status(session: &str, run_id: &str, proof_state: &str, error: Option<&str>) -> Value {
    let mut status = json!({
        "runId": run_id,
        "sessionId": session,
        "mode": "single",
        "state": "failed",
        "processTerminal": {
            "version": 1,
            "state": proof_state,
            "runId": run_id,
            "runnerProcessInstanceId": "rid-a",
        },
    });
    if let Some(error) = error {
        status["error"] = json!(error);
    }
    status
}

#[test]
fn a_damaged_owner_is_freed_only_by_its_own_runs_status() {
    let other = "/home/u/.pi/sessions/other.jsonl";
    // (case, status, proof written, freed)
    let cases: [(&str, Value, bool, bool); 7] = [
        (
            "over and proven",
            failed_status(SESSION, "run-a", "pending", None),
            true,
            true,
        ),
        (
            "over and proven, but of another session",
            failed_status(other, "run-a", "pending", None),
            true,
            false,
        ),
        (
            "over and proven, but the status of another run",
            failed_status(SESSION, "run-b", "pending", None),
            true,
            false,
        ),
        (
            "failed before startup, with an error",
            failed_status(SESSION, "run-a", "not-started", Some("Timed out")),
            false,
            true,
        ),
        (
            "not started, no error",
            failed_status(SESSION, "run-a", "not-started", None),
            false,
            false,
        ),
        (
            "an error, but the runner was started",
            failed_status(SESSION, "run-a", "pending", Some("Timed out")),
            false,
            false,
        ),
        (
            "failed before startup, of another session",
            failed_status(other, "run-a", "not-started", Some("Timed out")),
            false,
            false,
        ),
    ];
    for (case, status, proof, freed) in cases {
        let fx = Fixture::new();
        let slot = damaged_slot(&fx, &status);
        if proof {
            write_proof(&fx.run_dir("run-a"), "observed", "run-a", "rid-a");
        }
        assert_eq!(fx.reconcile(1).used, usize::from(!freed), "{case}");
        assert_eq!(slot.exists(), !freed, "{case}");
    }
}

#[test]
fn an_unreadable_status_of_an_unbound_slot_needs_a_dead_reserver_and_a_proof() {
    // (reserver dead, observed proof, freed)
    for (dead, proof, freed) in [
        (false, false, false),
        (false, true, false),
        (true, false, false),
        (true, true, true),
    ] {
        let fx = Fixture::new();
        let handle = fx.acquire("run-a", 1);
        if dead {
            let owner_path = handle.slot_dir().join("owner.json");
            let mut owner = read_json(&owner_path);
            owner["reservedByProcess"] = json!(dead_identity());
            write_json(&owner_path, &owner);
        }
        let dir = fx.run_dir("run-a");
        fs::write(dir.join("status.json"), b"{\"runId\": \"run-a\", \"sta").unwrap();
        if proof {
            write_proof(&dir, "observed", "run-a", "rid-x");
        }
        let used = fx.reconcile(1).used;
        assert_eq!(used, usize::from(!freed), "dead {dead}, proof {proof}");
    }
}

#[test]
fn a_launcher_frees_its_slot_early_only_on_a_proof() {
    let fx = Fixture::new();
    let mut handle = fx.acquire("run-a", 1);
    handle.mark_started("rid-a").unwrap();
    // Over without a proof file (a failure before startup): a reconcile
    // frees it, the launcher's early release does not look.
    let status = failed_status(SESSION, "run-a", "not-started", Some("Timed out"));
    write_json(&fx.run_dir("run-a").join("status.json"), &status);
    assert!(!handle.release_if_over().unwrap());
    assert_eq!(fx.used(), 1);
    assert_eq!(fx.reconcile(1).used, 0);
}
