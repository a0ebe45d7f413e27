//! The queue entry `queue/<enqueuedAt>.<run id>.json`: what `admit`
//! writes, and its one optional field, `enqueuedByProcess`, read back only
//! while the waiting run has no status yet (docs/protocol/capacity.md §8.3):
//! a live launcher keeps the run in line, a dead one makes the entry stale
//! (removed); absent, `null`, of the wrong type or empty (and an entry that
//! does not parse at all) name no launcher, and the entry then stands while
//! the run's directory exists and is stale once it is gone.

use std::path::PathBuf;

use serde_json::{Value, json};

use super::support::{Fixture, SESSION};
use crate::{Acquire, Admission, CapacityError, Kind, QueueEntry};

/// The waiting run joined well before the fixture's clock
/// (1_700_000_000_000), and its entry's content says a third time, so a
/// rule that read the wrong one would show.
const WAITING_SINCE: u64 = 1_699_999_000_111;
const CONTENT_ENQUEUED_AT: u64 = 1_699_999_000_222;

fn queue_dir(fx: &Fixture) -> PathBuf {
    fx.cap.queue_dir(SESSION)
}

fn entry_path(fx: &Fixture) -> PathBuf {
    queue_dir(fx).join(format!("{WAITING_SINCE:016}.waiting.json"))
}

/// An entry with every field set, its launcher this process.
fn full(fx: &Fixture) -> Value {
    json!({
        "version": 1,
        "runId": "waiting",
        "ownerSessionId": SESSION,
        "asyncDir": fx.tmp.path().join("async-subagent-runs/waiting"),
        "enqueuedAt": CONTENT_ENQUEUED_AT,
        "limit": 1,
        "enqueuedByProcess": process_identity::ProcessIdentity::current().unwrap(),
    })
}

fn put(fx: &Fixture, entry: &Value) {
    atomic_file::ensure_private_dir(&fx.root()).unwrap();
    let pool = queue_dir(fx);
    atomic_file::ensure_private_dir(pool.parent().unwrap()).unwrap();
    atomic_file::ensure_private_dir(&pool).unwrap();
    atomic_file::write_json(&entry_path(fx), entry).unwrap();
}

/// Whether a launch without `--queue` (limit 1, no slot taken) finds the
/// waiting run in its way; the entry is gone when it did not.
fn stands_in_line(fx: &Fixture) -> bool {
    let dir = fx.tmp.path().join("async-subagent-runs/newcomer");
    let request = Acquire {
        session_id: SESSION,
        limit: Some(1),
        run_id: "newcomer",
        kind: Kind::Runner,
        async_dir: &dir,
        live_workflows: &fx.none_live,
    };
    match fx.cap.admit(&request, false) {
        Err(CapacityError::Exhausted(_)) => {
            assert!(entry_path(fx).exists(), "an entry in line stays");
            true
        }
        Ok(Some(Admission::Slot(_))) => {
            assert!(!entry_path(fx).exists(), "a stale entry is removed");
            false
        }
        other => panic!("unexpected admission: {other:?}"),
    }
}

/// An edit of the full entry.
type Change = dyn Fn(&mut Value);

fn judged(change: impl Fn(&mut Value), run_dir_exists: bool) -> bool {
    let fx = Fixture::new();
    if run_dir_exists {
        fx.run_dir("waiting");
    }
    let mut entry = full(&fx);
    change(&mut entry);
    put(&fx, &entry);
    stands_in_line(&fx)
}

#[test]
fn enqueued_by_process_absent_null_wrong_or_empty_names_no_launcher() {
    let set = |v: Value| move |e: &mut Value| e["enqueuedByProcess"] = v.clone();
    // Full: the launcher (this process) lives, the run stands in line even
    // without a directory yet.
    assert!(judged(|_| {}, false), "a live launcher");
    // A dead launcher (a recycled pid: same pid, another start) is stale.
    let mut dead = process_identity::ProcessIdentity::current().unwrap();
    dead.start_time += 1;
    assert!(!judged(set(json!(dead)), true), "a dead launcher");
    let cases: [(&str, Box<Change>); 5] = [
        (
            "absent",
            Box::new(|e: &mut Value| {
                e.as_object_mut().unwrap().remove("enqueuedByProcess");
            }),
        ),
        ("null", Box::new(set(Value::Null))),
        ("wrong type", Box::new(set(json!("launcher")))),
        ("empty", Box::new(set(json!({})))),
        (
            "entry unparsable",
            Box::new(|e: &mut Value| e["limit"] = json!("1")),
        ),
    ];
    for (case, change) in cases {
        assert!(
            judged(&change, true),
            "{case}: stands while its directory exists"
        );
        assert!(
            !judged(&change, false),
            "{case}: stale once its directory is gone"
        );
    }
}

#[test]
fn admit_writes_every_field_of_the_entry_under_its_name() {
    let fx = Fixture::new();
    let _held = fx.acquire("holder", 1);
    let dir = fx.run_dir("queued");
    let request = Acquire {
        session_id: SESSION,
        limit: Some(1),
        run_id: "queued",
        kind: Kind::Runner,
        async_dir: &dir,
        live_workflows: &fx.none_live,
    };
    let Some(Admission::Queued(q)) = fx.cap.admit(&request, true).unwrap() else {
        panic!("a full pool queues the run");
    };
    assert_eq!((q.since, q.position), (1_700_000_000_000, 1));
    let path = queue_dir(&fx).join("0001700000000000.queued.json");
    let entry: QueueEntry =
        serde_json::from_slice(&atomic_file::read::read_file(&path).unwrap()).unwrap();
    assert_eq!(
        entry,
        QueueEntry {
            version: 1,
            run_id: "queued".into(),
            owner_session_id: SESSION.into(),
            async_dir: dir.to_string_lossy().into_owned(),
            enqueued_at: 1_700_000_000_000,
            limit: 1,
            enqueued_by_process: process_identity::ProcessIdentity::current().ok(),
        }
    );
    let names: Vec<_> = std::fs::read_dir(queue_dir(&fx))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(
        names,
        ["0001700000000000.queued.json"],
        "16 digits, then the id"
    );
}
