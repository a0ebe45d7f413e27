//! Admission, rollback, transfer and the files they leave.

use std::fs;

use serde_json::json;

use super::support::*;
use crate::{CapacityError, Kind, Relation, ReleaseState, session_key};

#[test]
fn third_acquire_with_limit_two_fails_with_the_exact_error_and_snapshot() {
    let fx = Fixture::new();
    let first = fx.acquire("run-a", 2);
    let second = fx.acquire("run-b", 2);
    assert_eq!((first.owner().slot, second.owner().slot), (0, 1));
    assert_eq!(first.limit(), 2);

    let err = fx.acquire_kind("run-c", 2, Kind::Runner).unwrap_err();
    assert_eq!(
        err.to_string(),
        "Active async run capacity exhausted: 2/2 used."
    );
    let CapacityError::Exhausted(snapshot) = err else {
        panic!("not an exhaustion error")
    };
    let value = serde_json::to_value(&snapshot).unwrap();
    assert_eq!(value["used"], 2);
    assert_eq!(value["limit"], 2);
    assert_eq!(value["slots"][0]["runId"], "run-a");
    assert_eq!(value["slots"][1]["runId"], "run-b");
    assert_eq!(value["slots"][1]["kind"], "runner");
    assert_eq!(value["slots"][1]["readable"], true);
}

#[test]
fn rollback_of_an_unstarted_slot_frees_it_once() {
    let fx = Fixture::new();
    let mut handle = fx.acquire("run-a", 1);
    assert_eq!(fx.reconcile(1).used, 1);
    assert!(handle.rollback().unwrap());
    assert_eq!(fx.reconcile(1).used, 0);
    // A new holder of slot-0 is not touched by a second rollback of the old handle.
    let _next = fx.acquire("run-b", 1);
    assert!(!handle.rollback().unwrap());
    assert_eq!(fx.used(), 1);
}

#[test]
fn started_slots_are_not_rolled_back() {
    let fx = Fixture::new();
    let mut handle = fx.acquire("run-a", 1);
    handle.mark_started("rid-a").unwrap();
    assert!(!handle.rollback().unwrap());
    assert_eq!(fx.used(), 1);
    let owner = read_json(&handle.slot_dir().join("owner.json"));
    assert_eq!(owner["runnerProcessInstanceId"], "rid-a");
    assert_eq!(owner["runnerStartedAt"], 1_700_000_000_000u64);
}

#[test]
fn a_garbage_owner_still_counts_and_blocks() {
    let fx = Fixture::new();
    let handle = fx.acquire("run-a", 1);
    fs::write(handle.slot_dir().join("owner.json"), "not json").unwrap();
    let err = fx.acquire_kind("run-b", 1, Kind::Runner).unwrap_err();
    assert_eq!(
        err.to_string(),
        "Active async run capacity exhausted: 1/1 used."
    );
    assert!(!fx.reconcile(1).slots[0].readable);
}

#[test]
fn no_limit_takes_no_slot_and_creates_nothing() {
    let fx = Fixture::new();
    assert!(fx.acquire_kind("run-a", 0, Kind::Runner).unwrap().is_none());
    assert!(!fx.root().exists());
    assert_eq!(fx.reconcile(0).used, 0);
    assert!(!fx.root().exists());
}

#[test]
fn files_are_private_and_in_the_reference_shape() {
    let fx = Fixture::new();
    let mut handle = fx.acquire("run-a", 1);
    let pool = fx.root().join(session_key(SESSION));
    let slot = pool.join("slot-0");
    assert_eq!(handle.slot_dir(), slot);
    for dir in [fx.root(), pool.clone(), slot.clone()] {
        assert_eq!(mode(&dir), 0o700, "{}", dir.display());
    }
    for file in [pool.join(".lock"), slot.join("owner.json")] {
        assert_eq!(mode(&file), 0o600, "{}", file.display());
    }
    let first = fs::read_to_string(slot.join("owner.json")).unwrap();
    assert!(first.ends_with("}\n"), "first write ends with a newline");
    let owner = read_json(&slot.join("owner.json"));
    let keys: Vec<&str> = owner
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        [
            "version",
            "reservationToken",
            "ownerSessionId",
            "ownerSessionKey",
            "slot",
            "runId",
            "generation",
            "kind",
            "asyncDir",
            "reservedAt",
            "reservedByProcess"
        ]
    );
    assert_eq!(owner["ownerSessionKey"], session_key(SESSION));
    assert_eq!(owner["reservedAt"], 1_700_000_000_000u64);
    assert_eq!(owner["reservedByProcess"]["pid"], std::process::id());

    handle.mark_started("rid-a").unwrap();
    let rewritten = fs::read_to_string(slot.join("owner.json")).unwrap();
    assert!(
        rewritten.ends_with('}'),
        "rewrites have no trailing newline"
    );
    assert_eq!(mode(&slot.join("owner.json")), 0o600);
    let mut names: Vec<String> = fs::read_dir(&slot)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    // The run, recorded a second time for a damaged owner.json.
    assert_eq!(
        names,
        ["owner.json", "run.0.run-a"],
        "no claim or temp file is left"
    );
    assert_eq!(mode(&slot.join("run.0.run-a")), 0o600);
}

#[test]
fn transfer_moves_the_slot_and_rollback_restores_the_source() {
    let fx = Fixture::new();
    let mut source = fx.acquire("run-a", 1);
    source.mark_started("rid-a").unwrap();
    let before = read_json(&source.slot_dir().join("owner.json"));
    fx.write_status("run-a", "paused", "rid-a");

    let mut revival = fx.transfer("run-a", "run-b", Some(1)).unwrap().unwrap();
    let moved = read_json(&revival.slot_dir().join("owner.json"));
    assert_eq!(moved["generation"], 1);
    assert_eq!(moved["runId"], "run-b");
    assert_eq!(moved["sourceRunId"], "run-a");
    assert_eq!(moved["reservationToken"], before["reservationToken"]);
    assert!(moved.get("runnerProcessInstanceId").is_none());
    assert_eq!(fx.used(), 1);

    let seen = fx
        .cap
        .inspect(
            &crate::InspectQuery {
                run_id: "run-a",
                session_id: Some(SESSION),
                async_dir: None,
            },
            &fx.none_live,
        )
        .unwrap();
    assert_eq!(seen.relation, Relation::Source);
    assert_eq!(seen.release.state, ReleaseState::NotOwned);
    assert_eq!(seen.release.reason, "slot was transferred to run-b");

    assert!(revival.rollback().unwrap());
    assert_eq!(read_json(&revival.slot_dir().join("owner.json")), before);
    assert_eq!(revival.owner().run_id, "run-a");
    assert!(
        !revival.rollback().unwrap(),
        "a second rollback does nothing"
    );
    assert_eq!(fx.used(), 1);
}

#[test]
fn a_transfer_records_its_own_reservation_time_and_process() {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NOW: AtomicU64 = AtomicU64::new(1_000);
    fn ticking() -> u64 {
        NOW.fetch_add(1_000, Ordering::SeqCst)
    }
    fn nobody() -> Option<process_identity::ProcessIdentity> {
        None
    }
    let mut fx = Fixture::new();
    fx.cap = crate::Capacity::new(fx.root())
        .with_clock(ticking)
        .with_reserving_process(nobody);
    let mut source = fx.acquire("run-a", 1);
    source.mark_started("rid-a").unwrap();
    fx.write_status("run-a", "paused", "rid-a");
    let before = read_json(&source.slot_dir().join("owner.json"));
    assert_eq!(before.get("reservedByProcess"), None);

    // The revival is reserved now, by this process.
    fx.cap = crate::Capacity::new(fx.root()).with_clock(ticking);
    let revival = fx.transfer("run-a", "run-b", Some(1)).unwrap().unwrap();
    let moved = read_json(&revival.slot_dir().join("owner.json"));
    assert!(
        moved["reservedAt"].as_u64() > before["runnerStartedAt"].as_u64(),
        "{moved}"
    );
    assert_eq!(moved["reservedByProcess"]["pid"], std::process::id());
}

#[test]
fn a_revival_holds_a_runner_slot_whatever_its_source_was() {
    let fx = Fixture::new();
    let _source = fx
        .acquire_kind("run-a", 1, Kind::Workflow)
        .unwrap()
        .unwrap();
    let dir = fx.write_status("run-a", "paused", "rid-a");
    let mut status = read_json(&dir.join("status.json"));
    status["mode"] = json!("workflow");
    write_json(&dir.join("status.json"), &status);
    let revival = fx.transfer("run-a", "run-b", Some(1)).unwrap().unwrap();
    assert!(revival.is_transfer());
    assert_eq!(revival.owner().kind, Kind::Runner);
    let moved = read_json(&revival.slot_dir().join("owner.json"));
    assert_eq!(moved["kind"], "runner");
}

#[test]
fn a_started_revival_keeps_the_slot_and_a_running_source_is_not_transferable() {
    let fx = Fixture::new();
    let mut source = fx.acquire("run-a", 1);
    source.mark_started("rid-a").unwrap();
    fx.write_status("run-a", "running", "rid-a");
    let err = fx.transfer("run-a", "run-b", Some(1)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "Active async capacity source 'run-a' is not transferable."
    );

    fx.write_status("run-a", "complete", "rid-a");
    // The limit may be disabled by now: the transfer still works.
    let mut revival = fx.transfer("run-a", "run-b", None).unwrap().unwrap();
    assert_eq!(revival.owner().generation, 1);
    assert_eq!(revival.limit(), 0);
    assert_eq!(revival.count().unwrap().used, 1);
    revival.mark_started("rid-b").unwrap();
    assert!(!revival.rollback().unwrap());
    assert_eq!(revival.owner().run_id, "run-b");
}

#[test]
fn transfer_without_a_source_slot_acquires() {
    let fx = Fixture::new();
    assert!(fx.transfer("gone", "run-b", None).unwrap().is_none());
    assert!(
        !fx.root().exists(),
        "no limit and no pool: nothing is created"
    );
    let handle = fx.transfer("gone", "run-b", Some(1)).unwrap().unwrap();
    assert_eq!(handle.owner().generation, 0);
    assert_eq!(handle.owner().kind, Kind::Runner);
    assert!(!handle.is_transfer());
}

#[test]
fn transfer_never_takes_another_runs_slot() {
    let fx = Fixture::new();
    let mut other = fx.acquire("run-x", 2);
    other.mark_started("rid-x").unwrap();
    let dir = fx.write_status("run-x", "complete", "rid-x");
    crate::runfiles::fixtures::write_proof(&dir, "observed", "run-x", "rid-x");
    // "gone" holds no slot: the revival gets a new one; run-x's slot, although
    // transferable, is not its.
    let handle = fx.transfer("gone", "run-b", Some(2)).unwrap().unwrap();
    assert!(!handle.is_transfer());
    assert_eq!(handle.owner().slot, 1);
    let owner = read_json(&other.slot_dir().join("owner.json"));
    assert_eq!(owner["runId"], "run-x");
}

#[test]
fn mark_started_fails_when_the_slot_changed_hands() {
    let fx = Fixture::new();
    let mut handle = fx.acquire("run-a", 1);
    let mut owner = read_json(&handle.slot_dir().join("owner.json"));
    owner["generation"] = json!(5);
    write_json(&handle.slot_dir().join("owner.json"), &owner);
    let err = handle.mark_started("rid-a").unwrap_err();
    assert_eq!(
        err.to_string(),
        "Active async capacity ownership changed for run 'run-a'."
    );
    assert!(!handle.is_started());
    let err = handle.mark_workflow_started().unwrap_err();
    assert_eq!(
        err.to_string(),
        "Active async capacity ownership changed for workflow 'run-a'."
    );
}

#[test]
fn a_reference_claim_blocks_and_a_dead_holders_claim_is_taken_over() {
    let fx = Fixture::new();
    let mut handle = fx.acquire("run-a", 1);
    let claim = crate::pool::claim_path(handle.slot_dir());
    fs::write(&claim, "3f1c9d52-0000-4000-8000-000000000000").unwrap();
    let err = handle.mark_started("rid-a").unwrap_err();
    assert!(
        matches!(err, CapacityError::RunOwnershipChanged(_)),
        "a reference claim is never reclaimed: {err}"
    );
    assert!(
        !handle.rollback().unwrap(),
        "a claimed slot is not rolled back"
    );
    assert!(handle.slot_dir().exists());

    let stale = json!({"claimToken": "old", "holder": dead_identity()});
    write_json(&claim, &stale);
    handle.mark_started("rid-a").unwrap();
    assert!(!claim.exists());
    assert!(handle.is_started());
}

#[test]
fn spawn_decisions_bind_or_free_the_slot() {
    let fx = Fixture::new();
    let mut failed = fx.acquire("run-a", 2);
    let no_runner = crate::SpawnOutcome {
        failed: true,
        ..Default::default()
    };
    failed
        .apply(&crate::decide_after_spawn(&no_runner))
        .unwrap();
    assert!(!failed.slot_dir().exists());

    let mut spawned = fx.acquire("run-b", 2);
    let success = crate::SpawnOutcome {
        pid: Some(7),
        runner_process_instance_id: Some("rid-b"),
        ..Default::default()
    };
    spawned.apply(&crate::decide_after_spawn(&success)).unwrap();
    assert_eq!(
        spawned.owner().runner_process_instance_id.as_deref(),
        Some("rid-b")
    );
    spawned.apply(&crate::CapacityAction::Rollback).unwrap();
    assert_eq!(fx.used(), 1, "a bound slot survives a later rollback");
}

#[test]
fn inspect_matches_the_run_directory_after_path_resolution() {
    let fx = Fixture::new();
    let handle = fx.acquire("run-a", 1);
    let dir = fx.run_dir("run-a");
    let roundabout = dir.join("..").join(".").join("run-a");
    let query = crate::InspectQuery {
        run_id: "some-other-id",
        session_id: Some(SESSION),
        async_dir: Some(&roundabout),
    };
    let seen = fx.cap.inspect(&query, &fx.none_live).unwrap();
    assert_eq!(seen.relation, Relation::Current);
    assert_eq!(seen.slot_dir.as_deref(), Some(handle.slot_dir()));
    let json = serde_json::to_value(&seen).unwrap();
    assert_eq!(json["relation"], "current");
    assert_eq!(json["release"]["state"], "retained");
    assert_eq!(json["owner"]["runId"], "run-a");

    // Another directory matches nothing.
    let elsewhere = fx.run_dir("run-z");
    let query = crate::InspectQuery {
        async_dir: Some(&elsewhere),
        ..query
    };
    let seen = fx.cap.inspect(&query, &fx.none_live).unwrap();
    assert_eq!(seen.relation, Relation::None);
}

#[test]
fn injected_token_and_reserving_process_are_recorded() {
    fn token() -> String {
        "token-1".into()
    }
    fn holder() -> Option<process_identity::ProcessIdentity> {
        Some(process_identity::ProcessIdentity {
            pid: 4242,
            start_time: 7,
            boot_id: None,
            machine_id: None,
            host: None,
        })
    }
    let mut fx = Fixture::new();
    fx.cap = fx
        .cap
        .clone()
        .with_reservation_tokens(token)
        .with_reserving_process(holder);
    let slot = fx.acquire("run-a", 2);
    let owner = read_json(&slot.slot_dir().join("owner.json"));
    assert_eq!(owner["reservationToken"], "token-1");
    assert_eq!(
        owner["reservedByProcess"],
        json!({"pid": 4242, "startTime": 7})
    );
    assert_eq!(owner["reservedAt"], 1_700_000_000_000_u64);
}

#[test]
fn the_limit_setting_is_a_positive_integer_or_unlimited() {
    use crate::resolve_limit;
    assert_eq!(resolve_limit(Some(&json!(3))), Some(3));
    assert_eq!(resolve_limit(Some(&json!(1))), Some(1));
    for unlimited in [
        json!(0),
        json!(-2),
        json!(1.5),
        json!("3"),
        json!(null),
        json!(u64::from(u32::MAX) + 1),
    ] {
        assert_eq!(resolve_limit(Some(&unlimited)), None, "{unlimited}");
    }
    assert_eq!(resolve_limit(None), None);
}

#[test]
fn the_default_clock_is_epoch_milliseconds() {
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
    };
    let mut fx = Fixture::new();
    fx.cap = crate::Capacity::new(fx.root());
    let before = now();
    let mut handle = fx.acquire("run-a", 1);
    handle.mark_started("rid-a").unwrap();
    let after = now();
    let owner = read_json(&handle.slot_dir().join("owner.json"));
    for field in ["reservedAt", "runnerStartedAt"] {
        let ms = owner[field].as_u64().unwrap();
        assert!((before..=after).contains(&ms), "{field} {ms}");
    }
}

#[test]
fn a_stale_handle_cannot_bind_a_new_reservation_of_the_same_run() {
    let mut fx = Fixture::new();
    // The default token source: a fresh reservation token every time.
    fx.cap = crate::Capacity::new(fx.root());
    let mut stale = fx.acquire("run-a", 1);
    // The slot is freed behind the handle's back (as a reconcile frees it),
    // and the same run id reserves it again.
    fs::remove_dir_all(stale.slot_dir()).unwrap();
    let fresh = fx.acquire("run-a", 1);
    assert_eq!(fresh.slot_dir(), stale.slot_dir());
    let err = stale.mark_started("rid-stale").unwrap_err();
    assert!(
        matches!(err, CapacityError::RunOwnershipChanged(_)),
        "{err}"
    );
    let owner = read_json(&fresh.slot_dir().join("owner.json"));
    assert_eq!(owner.get("runnerProcessInstanceId"), None);
    // Nor roll it back.
    assert!(!stale.rollback().unwrap());
    assert!(fresh.slot_dir().join("owner.json").exists());
}

#[test]
fn a_rolled_back_transfer_of_an_unstarted_source_is_not_rolled_back_twice() {
    let fx = Fixture::new();
    let _source = fx.acquire("run-a", 1);
    fx.write_status("run-a", "paused", "rid-a");
    let mut revival = fx.transfer("run-a", "run-b", Some(1)).unwrap().unwrap();
    assert!(revival.rollback().unwrap());
    assert_eq!(revival.owner().run_id, "run-a");
    assert!(
        !revival.rollback().unwrap(),
        "a second rollback does nothing"
    );
}

#[test]
fn a_free_index_below_the_limit_is_taken_without_reconciling() {
    let fx = Fixture::new();
    let mut finished = fx.acquire("run-a", 2);
    finished.mark_started("rid-a").unwrap();
    let dir = fx.write_status("run-a", "complete", "rid-a");
    crate::runfiles::fixtures::write_proof(&dir, "observed", "run-a", "rid-a");
    // Slot 1 is free: admission takes it and leaves the releasable slot 0
    // to the next reconcile.
    let next = fx.acquire("run-b", 2);
    assert_eq!(next.owner().slot, 1);
    assert!(finished.slot_dir().exists());
    // Now every index is occupied: admission reconciles and reuses slot 0.
    let third = fx.acquire("run-c", 2);
    assert_eq!(third.owner().slot, 0);
}

#[test]
fn slots_above_a_lowered_limit_still_count() {
    let fx = Fixture::new();
    let _a = fx.acquire("run-a", 3);
    let mut b = fx.acquire("run-b", 3);
    let _c = fx.acquire("run-c", 3);
    assert!(b.rollback().unwrap());
    // Slots 0 and 2 are held; with a limit of 2 that is full, although
    // index 1 is free.
    let err = fx.acquire_kind("run-d", 2, Kind::Runner).unwrap_err();
    assert_eq!(
        err.to_string(),
        "Active async run capacity exhausted: 2/2 used."
    );
    assert_eq!(fx.used(), 2);
}

#[test]
fn a_session_pool_is_named_by_the_hash_of_its_id() {
    let fx = Fixture::new();
    let pool = fx.root().join(session_key(super::support::SESSION));
    assert_eq!(fx.cap.pool_dir(super::support::SESSION), pool);
    let handle = fx.acquire("run-a", 1);
    assert_eq!(handle.slot_dir(), pool.join("slot-0"));
    assert!(pool.join("slot-0").join("owner.json").is_file());
}

#[test]
fn only_slot_and_digits_name_a_slot() {
    let fx = Fixture::new();
    let handle = fx.acquire("run-a", 3);
    let pool = fx.cap.pool_dir(SESSION);
    for name in ["slot-+1", "slot-", "slot-1a", "slot-1"] {
        fs::create_dir(pool.join(name)).unwrap();
    }
    let snapshot = fx.cap.count(SESSION, Some(3)).unwrap();
    let slots: Vec<u64> = snapshot.slots.iter().map(|s| s.slot).collect();
    assert_eq!(slots, [0, 1]);
    // The count without owners agrees, and even an owner-less slot counts.
    assert_eq!(fx.cap.used(SESSION).unwrap(), 2);
    drop(handle);
}

#[test]
fn a_pool_that_is_not_a_directory_is_an_error_not_empty() {
    let fx = Fixture::new();
    let pool = fx.cap.pool_dir(SESSION);
    fs::create_dir_all(fx.root()).unwrap();
    fs::write(&pool, "not a directory").unwrap();
    let err = fx.cap.count(SESSION, Some(1)).unwrap_err();
    assert!(err.to_string().starts_with("failed to list "), "{err}");
    let err = fx.cap.used(SESSION).unwrap_err();
    assert!(err.to_string().starts_with("failed to list "), "{err}");
}

#[test]
fn a_slot_created_meanwhile_moves_creation_on() {
    let fx = Fixture::new();
    let handle = fx.acquire("run-a", 2);
    let pool = fx.cap.pool_dir(SESSION);
    // As if the reference created slot-0 between our listing and our rename.
    let created = crate::pool::create_slot(&pool, handle.owner()).unwrap();
    assert!(!created);
    let left: Vec<String> = fs::read_dir(&pool)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".slot-"))
        .collect();
    assert!(left.is_empty(), "staging left behind: {left:?}");
}

#[test]
fn only_our_hidden_leftovers_are_swept() {
    let fx = Fixture::new();
    let first = fx.acquire("run-a", 3);
    let pool = fx.cap.pool_dir(SESSION);
    let ours = [".slot-1.creating-x", ".slot-2.released-y"];
    let foreign = ["keep.creating-x", ".slot-1.tmp"];
    for name in ours.iter().chain(&foreign) {
        fs::create_dir(pool.join(name)).unwrap();
    }
    // Admission sweeps leftovers under the pool lock.
    let _second = fx.acquire("run-b", 3);
    for name in ours {
        assert!(!pool.join(name).exists(), "{name} was not swept");
    }
    for name in foreign {
        assert!(pool.join(name).exists(), "{name} was swept");
    }
    drop(first);
}

#[test]
fn a_claim_on_a_vanished_slot_is_not_taken() {
    let fx = Fixture::new();
    let gone = fx.root().join("no-such-slot");
    let ran = crate::pool::with_claim(&gone, || Ok(())).unwrap();
    assert_eq!(ran, None);
}

#[test]
fn a_claim_that_cannot_be_written_is_an_error() {
    let fx = Fixture::new();
    fs::create_dir_all(fx.root()).unwrap();
    let not_a_dir = fx.root().join("slot-0");
    fs::write(&not_a_dir, "").unwrap();
    let err = crate::pool::with_claim(&not_a_dir, || Ok(())).unwrap_err();
    assert!(matches!(err, CapacityError::File(_)), "{err}");
}

#[test]
fn an_unreadable_claim_at_release_is_an_error() {
    let fx = Fixture::new();
    let handle = fx.acquire("run-a", 1);
    let claim = crate::pool::claim_path(handle.slot_dir());
    // Something replaced the claim while it was held: releasing it cannot
    // tell whose it is, and says so instead of leaving it silently.
    let result = crate::pool::with_claim(handle.slot_dir(), || {
        fs::remove_file(&claim).unwrap();
        fs::create_dir(&claim).unwrap();
        Ok(())
    });
    let err = result.unwrap_err();
    assert!(err.to_string().starts_with("failed to read "), "{err}");
}

#[test]
fn a_started_workflow_slot_is_not_rolled_back() {
    let fx = Fixture::new();
    let mut handle = fx.acquire_kind("wf-a", 1, Kind::Workflow).unwrap().unwrap();
    assert!(!handle.is_started());
    handle.mark_workflow_started().unwrap();
    // Only runnerStartedAt marks a workflow started.
    assert!(handle.is_started());
    assert!(!handle.rollback().unwrap());
    assert!(handle.slot_dir().exists());
}

/// What another user could have planted or changed in a pool is refused,
/// with the path and the reason, when a slot is read (the state root's
/// trust check no longer stats every slot at every command): a slot
/// directory or `owner.json` that is a symlink out of the root, owned by
/// another user, or writable by group or others; and so is such a pool.
#[test]
fn untrusted_slots_and_owner_records_are_refused_when_read() {
    use std::os::unix::fs::{PermissionsExt, symlink};
    let chmod = |path: &std::path::Path, mode: u32| {
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    };
    let refused = |fx: &Fixture, path: &std::path::Path, why: &str| {
        let err = fx.cap.count(SESSION, Some(2)).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, CapacityError::Untrusted { .. }), "{text}");
        assert!(
            text.starts_with("refusing ") && text.contains(&format!("'{}'", path.display())),
            "{text}"
        );
        assert!(text.contains(why), "{text}");
        assert!(!text.contains('\n'), "{text}");
        // Admission reads the slots only when none is free: the full pool
        // is refused the same way rather than counted as exhausted.
        let err = fx.acquire_kind("run-next", 1, Kind::Runner).unwrap_err();
        assert!(matches!(err, CapacityError::Untrusted { .. }), "{err}");
    };
    let outside = tempfile::tempdir().unwrap();
    let planted = outside.path().join("slot");
    fs::create_dir(&planted).unwrap();
    fs::write(planted.join("owner.json"), "{}").unwrap();
    let chown_works = {
        let probe = outside.path().join("probe");
        fs::write(&probe, "").unwrap();
        std::os::unix::fs::chown(&probe, Some(4242), Some(4242)).is_ok()
    };

    // The slot directory.
    let fx = Fixture::new();
    let handle = fx.acquire("run-a", 2);
    let slot = handle.slot_dir().to_path_buf();
    chmod(&slot, 0o770);
    refused(&fx, &slot, "writable by group or others (mode 0770)");
    chmod(&slot, 0o700);
    if chown_works {
        std::os::unix::fs::chown(&slot, Some(4242), Some(4242)).unwrap();
        refused(&fx, &slot, "owned by uid 4242");
        std::os::unix::fs::chown(&slot, Some(0), Some(0)).unwrap();
    }
    let moved = slot.with_file_name("slot-1");
    symlink(&planted, &moved).unwrap();
    refused(&fx, &moved, "symbolic link");
    fs::remove_file(&moved).unwrap();

    // Its owner record.
    let owner = slot.join("owner.json");
    chmod(&owner, 0o620);
    refused(&fx, &owner, "writable by group or others (mode 0620)");
    chmod(&owner, 0o600);
    if chown_works {
        std::os::unix::fs::chown(&owner, Some(4242), Some(4242)).unwrap();
        refused(&fx, &owner, "owned by uid 4242");
        std::os::unix::fs::chown(&owner, Some(0), Some(0)).unwrap();
    }
    let kept = slot.join("owner.kept");
    fs::rename(&owner, &kept).unwrap();
    symlink(planted.join("owner.json"), &owner).unwrap();
    refused(&fx, &owner, "symbolic link");
    fs::remove_file(&owner).unwrap();
    fs::rename(&kept, &owner).unwrap();

    // The pool itself.
    let pool = fx.cap.pool_dir(SESSION);
    chmod(&pool, 0o777);
    refused(&fx, &pool, "writable by group or others (mode 0777)");
    chmod(&pool, 0o700);

    // Fixed, the slot reads again.
    assert_eq!(
        fx.cap.count(SESSION, Some(2)).unwrap().slots[0]
            .run_id
            .as_deref(),
        Some("run-a")
    );
    drop(handle);
}

/// A slot directory its handle holds, swapped for a symlink to a copy
/// elsewhere (same `owner.json`), is refused when the handle reads it: the
/// rollback neither follows the link nor frees anything.
#[test]
fn a_held_slot_swapped_for_a_symlink_is_refused_not_followed() {
    let fx = Fixture::new();
    let mut handle = fx.acquire("run-a", 2);
    let slot = handle.slot_dir().to_path_buf();
    let outside = tempfile::tempdir().unwrap();
    let planted = outside.path().join("slot");
    fs::create_dir(&planted).unwrap();
    fs::copy(slot.join("owner.json"), planted.join("owner.json")).unwrap();
    let kept = slot.with_file_name("kept");
    fs::rename(&slot, &kept).unwrap();
    std::os::unix::fs::symlink(&planted, &slot).unwrap();
    let err = handle.rollback().unwrap_err();
    assert!(matches!(err, CapacityError::Untrusted { .. }), "{err}");
    assert!(
        err.to_string().contains(&format!("'{}'", slot.display())),
        "{err}"
    );
    assert!(slot.is_symlink() && planted.join("owner.json").exists());
}

/// A slot path that holds a plain file (a slot replaced after the pool
/// was listed) is refused as what it is, not as a symlink.
#[test]
fn a_slot_replaced_by_a_file_is_refused_as_not_a_directory() {
    let fx = Fixture::new();
    let handle = fx.acquire("run-a", 2);
    let slot = handle.slot_dir().to_path_buf();
    fs::rename(&slot, slot.with_file_name("kept")).unwrap();
    fs::write(&slot, "not a slot").unwrap();
    let err = crate::pool::read_owner(&slot).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, CapacityError::Untrusted { .. }), "{text}");
    assert!(text.contains("it is not a directory"), "{text}");
    fs::remove_file(&slot).unwrap();
    std::os::unix::fs::symlink(slot.with_file_name("kept"), &slot).unwrap();
    let err = crate::pool::read_owner(&slot).unwrap_err();
    assert!(err.to_string().contains("symbolic link"), "{err}");
}

/// A FIFO in place of `owner.json` is an unreadable record (the slot still
/// counts), found without waiting for a writer.
#[test]
fn an_owner_record_replaced_by_a_fifo_is_unreadable_without_blocking() {
    let fx = Fixture::new();
    let handle = fx.acquire("run-a", 2);
    let owner = handle.slot_dir().join("owner.json");
    fs::remove_file(&owner).unwrap();
    nix::unistd::mkfifo(&owner, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let snapshot = fx.cap.count(SESSION, Some(2)).unwrap();
    assert_eq!(snapshot.used, 1);
    assert!(!snapshot.slots[0].readable);
    assert_eq!(snapshot.slots[0].run_id, None);
}

/// A pool directory that is a symlink (to a private directory elsewhere) is
/// refused as a symlink, whatever the mode of what it points to.
#[test]
fn a_symlinked_pool_is_refused_as_a_symlink() {
    let fx = Fixture::new();
    drop(fx.acquire("run-a", 2));
    let pool = fx.cap.pool_dir(SESSION);
    let outside = tempfile::tempdir().unwrap();
    let moved = outside.path().join("pool");
    fs::rename(&pool, &moved).unwrap();
    std::os::unix::fs::symlink(&moved, &pool).unwrap();
    let err = fx.cap.count(SESSION, Some(2)).unwrap_err();
    assert!(matches!(err, CapacityError::Untrusted { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains(&format!("'{}'", pool.display())) && text.contains("symbolic link"),
        "{text}"
    );
}

/// Each field of our `capacity.claim` (`claimToken`, `holder`) absent,
/// `null`, of the wrong type and empty: only a record whose holder is a
/// process that provably died is taken over (its token is not read for
/// that); any other claim blocks the slot as a reference claim does.
#[test]
fn a_claim_is_taken_over_only_when_its_holder_is_known_dead() {
    let dead = json!({"claimToken": "old", "holder": dead_identity()});
    let with = |key: &str, value: Option<serde_json::Value>| {
        let mut claim = dead.clone();
        match value {
            Some(v) => claim[key] = v,
            None => {
                claim.as_object_mut().unwrap().remove(key);
            }
        }
        claim
    };
    let live = json!(process_identity::ProcessIdentity::current().unwrap());
    let cases = [
        ("dead holder", dead.clone(), true),
        ("empty token", with("claimToken", Some(json!(""))), true),
        ("token absent", with("claimToken", None), false),
        (
            "token null",
            with("claimToken", Some(serde_json::Value::Null)),
            false,
        ),
        (
            "token wrong type",
            with("claimToken", Some(json!(7))),
            false,
        ),
        ("live holder", with("holder", Some(live)), false),
        ("holder absent", with("holder", None), false),
        (
            "holder null",
            with("holder", Some(serde_json::Value::Null)),
            false,
        ),
        (
            "holder wrong type",
            with("holder", Some(json!("123"))),
            false,
        ),
        ("holder empty", with("holder", Some(json!({}))), false),
    ];
    for (case, claim, taken_over) in cases {
        let fx = Fixture::new();
        let mut handle = fx.acquire("run-a", 1);
        let path = crate::pool::claim_path(handle.slot_dir());
        write_json(&path, &claim);
        let started = handle.mark_started("rid-a");
        assert_eq!(started.is_ok(), taken_over, "{case}: {started:?}");
        assert_eq!(path.exists(), !taken_over, "{case}");
    }
}
