//! A damaged `owner.json` is reclaimed once the run the slot's second
//! record names is provably over, and never while it may run (issue 24,
//! item 3).

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::json;

use super::support::*;
use crate::runfiles::fixtures::write_proof;

/// What can stand in place of an owner record.
#[derive(Debug, Clone, Copy)]
enum Damage {
    Fifo,
    Directory,
    /// 20 MB: above the 16 MiB cap of every state file.
    Oversize,
    BadUtf8,
    WrongTypes,
}

const ALL: [Damage; 5] = [
    Damage::Fifo,
    Damage::Directory,
    Damage::Oversize,
    Damage::BadUtf8,
    Damage::WrongTypes,
];

fn damage(slot: &Path, how: Damage) {
    let owner = slot.join("owner.json");
    fs::remove_file(&owner).unwrap();
    match how {
        Damage::Fifo => nix::unistd::mkfifo(&owner, nix::sys::stat::Mode::S_IRWXU).unwrap(),
        Damage::Directory => {
            fs::create_dir(&owner).unwrap();
            fs::write(owner.join("inside"), "x").unwrap();
        }
        Damage::Oversize => {
            let file = fs::File::create(&owner).unwrap();
            file.set_len(20_000_000).unwrap();
        }
        Damage::BadUtf8 => fs::write(&owner, b"{\"version\": 1, \"runId\": \"\xff\xfe\"}").unwrap(),
        Damage::WrongTypes => fs::write(&owner, r#"{"version": "1", "runId": 7}"#).unwrap(),
    }
    assert!(crate::pool::read_owner(slot).unwrap().is_none(), "{how:?}");
}

/// A slot of `run-a`, bound to runner `rid-a`, with its run's status.
fn held(fx: &Fixture, state: &str) -> (PathBuf, PathBuf) {
    let mut handle = fx.acquire("run-a", 1);
    handle.mark_started("rid-a").unwrap();
    let dir = fx.write_status("run-a", state, "rid-a");
    (handle.slot_dir().to_path_buf(), dir)
}

#[test]
fn a_damaged_owner_of_a_finished_and_proven_run_is_reclaimed() {
    for how in ALL {
        let fx = Fixture::new();
        let (slot, dir) = held(&fx, "complete");
        damage(&slot, how);
        assert_eq!(fx.reconcile(1).used, 1, "{how:?}: no proof yet");
        write_proof(&dir, "observed", "run-a", "rid-a");
        assert_eq!(fx.reconcile(1).used, 0, "{how:?}: not reclaimed");
        assert!(!slot.exists(), "{how:?}");
        // The freed index admits the next run.
        fx.acquire("run-b", 1);
    }
}

#[test]
fn a_damaged_owner_of_a_live_run_is_kept() {
    for how in ALL {
        let fx = Fixture::new();
        let (slot, dir) = held(&fx, "running");
        // Even a proof does not free it while the status says it runs.
        write_proof(&dir, "observed", "run-a", "rid-a");
        damage(&slot, how);
        assert_eq!(fx.reconcile(1).used, 1, "{how:?}");
        assert!(fx.acquire_kind("run-b", 1, crate::Kind::Runner).is_err());
        assert!(slot.exists(), "{how:?}");
    }
}

#[test]
fn a_damaged_owner_of_a_pruned_run_is_reclaimed_once_its_reserver_is_dead() {
    let fx = Fixture::new();
    let (slot, dir) = held(&fx, "complete");
    write_proof(&dir, "observed", "run-a", "rid-a");
    damage(&slot, Damage::WrongTypes);
    fs::remove_dir_all(&dir).unwrap();
    // The reserver (this test process) lives: its launch may be under way.
    assert_eq!(fx.reconcile(1).used, 1);
    write_json(&slot.join("run.0.run-a"), &json!(dead_identity()));
    assert_eq!(fx.reconcile(1).used, 0);
}

#[test]
fn a_damaged_owner_of_a_transferred_slot_follows_the_revival_not_its_source() {
    let fx = Fixture::new();
    let (slot, dir) = held(&fx, "complete");
    write_proof(&dir, "observed", "run-a", "rid-a");
    let mut revival = fx.transfer("run-a", "run-b", Some(1)).unwrap().unwrap();
    revival.mark_started("rid-b").unwrap();
    let revived = fx.write_status("run-b", "running", "rid-b");
    damage(&slot, Damage::BadUtf8);
    assert_eq!(
        fx.reconcile(1).used,
        1,
        "the source being over frees nothing"
    );
    fx.write_status("run-b", "complete", "rid-b");
    write_proof(&revived, "observed", "run-b", "rid-b");
    assert_eq!(fx.reconcile(1).used, 0);
}

#[test]
fn a_slot_without_its_second_record_is_kept_as_before() {
    let fx = Fixture::new();
    let (slot, dir) = held(&fx, "complete");
    write_proof(&dir, "observed", "run-a", "rid-a");
    fs::remove_file(slot.join("run.0.run-a")).unwrap();
    damage(&slot, Damage::Fifo);
    assert_eq!(fx.reconcile(1).used, 1);
}

#[test]
fn a_slot_whose_runs_status_is_damaged_is_freed_by_its_observed_proof_only() {
    for text in [
        &br#"{"state": 5}"#[..],
        b"{\"runId\": \"run-a\", \"sta",
        b"\xff",
    ] {
        let fx = Fixture::new();
        let (_, dir) = held(&fx, "running");
        fs::write(dir.join("status.json"), text).unwrap();
        assert_eq!(fx.reconcile(1).used, 1, "{text:?}: no proof yet");
        write_proof(&dir, "unknown", "run-a", "rid-a");
        assert_eq!(fx.reconcile(1).used, 1, "{text:?}: an unknown proof");
        write_proof(&dir, "observed", "run-a", "other-runner");
        assert_eq!(fx.reconcile(1).used, 1, "{text:?}: another runner's proof");
        write_proof(&dir, "observed", "run-a", "rid-a");
        assert_eq!(fx.reconcile(1).used, 0, "{text:?}");
    }
}

/// The content of `run.<generation>.<run id>` (the reserving process, or
/// `null`), read only for a slot whose `owner.json` is damaged and whose
/// run has no status: a dead identity frees the slot; a live one, `null`
/// (written when no process could be named), an empty file, a wrong type
/// or an empty object name no dead reserver, and the slot is kept.
#[test]
fn the_reserver_record_frees_a_slot_only_when_it_names_a_dead_process() {
    let cases: [(&str, Option<serde_json::Value>, bool); 6] = [
        ("dead", Some(json!(dead_identity())), true),
        (
            "live",
            Some(json!(process_identity::ProcessIdentity::current().unwrap())),
            false,
        ),
        ("null", Some(serde_json::Value::Null), false),
        ("empty file", None, false),
        ("wrong type", Some(json!("12345")), false),
        ("empty object", Some(json!({})), false),
    ];
    for (case, content, freed) in cases {
        let fx = Fixture::new();
        let (slot, dir) = held(&fx, "complete");
        damage(&slot, Damage::WrongTypes);
        fs::remove_dir_all(&dir).unwrap();
        let record = slot.join("run.0.run-a");
        match &content {
            Some(value) => write_json(&record, value),
            None => atomic_file::write_private(&record, b"").unwrap(),
        }
        let used = fx.reconcile(1).used;
        assert_eq!(
            (used, slot.exists()),
            if freed { (0, false) } else { (1, true) },
            "{case}"
        );
    }
}
