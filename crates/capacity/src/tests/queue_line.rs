//! The line of waiting runs (docs/protocol/capacity.md, "The queue"), told
//! by what `admit`, `take_turn`, `may_be_my_turn`, `is_queued` and
//! `queue_positions` answer on real files: first in first out by enqueue
//! time (then run id), 1-based places, nobody passes the line, a run is
//! admitted only on its turn and within the limit, and an entry whose run
//! is over, gone or never came to be leaves the line while one whose
//! monitor died keeps its place but holds up nobody.

use process_identity::ProcessIdentity;
use serde_json::{Value, json};
use std::cell::Cell;
use std::fs;

use super::support::*;
use crate::runfiles::fixtures::write_proof;
use crate::{Acquire, Admission, Capacity, CapacityError, Kind, SlotHandle, Turn};

thread_local! {
    static NOW: Cell<u64> = const { Cell::new(1_700_000_000_000) };
}

/// A clock that moves on by 1 ms at every reading, so runs that join one
/// after the other get distinct, growing times.
fn ticking() -> u64 {
    NOW.with(|now| {
        now.set(now.get() + 1);
        now.get()
    })
}

struct Line {
    fx: Fixture,
    cap: Capacity,
}

impl Line {
    fn new() -> Self {
        let fx = Fixture::new();
        let cap = Capacity::new(fx.root()).with_clock(ticking);
        Self { fx, cap }
    }

    fn with<T>(&self, run_id: &str, limit: u32, f: impl FnOnce(&Acquire<'_>) -> T) -> T {
        let dir = self.fx.run_dir(run_id);
        f(&Acquire {
            session_id: SESSION,
            limit: Some(limit),
            run_id,
            kind: Kind::Runner,
            async_dir: &dir,
            live_workflows: &self.fx.none_live,
        })
    }

    fn admit(&self, run_id: &str, limit: u32, queue: bool) -> Result<Admission, CapacityError> {
        self.with(run_id, limit, |r| self.cap.admit(r, queue))
            .map(|a| a.expect("a limit was given"))
    }

    fn slot(&self, run_id: &str, limit: u32) -> SlotHandle {
        match self.admit(run_id, limit, false) {
            Ok(Admission::Slot(handle)) => *handle,
            other => panic!("{run_id} gets no slot: {other:?}"),
        }
    }

    /// Queues `run_id`, returning its place.
    fn queue(&self, run_id: &str, limit: u32) -> usize {
        match self.admit(run_id, limit, true) {
            Ok(Admission::Queued(q)) => q.position,
            other => panic!("{run_id} is not queued: {other:?}"),
        }
    }

    fn turn(&self, run_id: &str, limit: u32) -> Turn {
        self.with(run_id, limit, |r| self.cap.take_turn(r)).unwrap()
    }

    fn may(&self, run_id: &str, limit: u32) -> bool {
        self.with(run_id, limit, |r| self.cap.may_be_my_turn(r))
    }

    fn positions(&self) -> Vec<(String, usize)> {
        self.cap.queue_positions(SESSION)
    }
}

fn waiting(turn: Turn) -> usize {
    match turn {
        Turn::Waiting(place) => place,
        other => panic!("not waiting: {other:?}"),
    }
}

fn line(ids: &[(&str, usize)]) -> Vec<(String, usize)> {
    ids.iter().map(|(id, n)| ((*id).to_owned(), *n)).collect()
}

#[test]
fn first_in_first_out_by_time_with_1_based_places() {
    let l = Line::new();
    let mut x = l.slot("x", 2);
    let mut y = l.slot("y", 2);
    // They join in the reverse of their ids' order: time comes first.
    assert_eq!(
        [l.queue("c", 2), l.queue("b", 2), l.queue("a", 2)],
        [1, 2, 3]
    );
    assert_eq!(l.positions(), line(&[("c", 1), ("b", 2), ("a", 3)]));
    assert!(l.cap.is_queued(SESSION, "b"));
    assert!(
        !l.cap.is_queued(SESSION, "x"),
        "a slot holder is not in line"
    );
    assert!(!l.cap.is_queued(SESSION, "nobody"));
    assert!(!l.cap.is_queued("another session", "b"));
    assert_eq!(l.used(), 2, "the line holds no slot");

    // Full: nobody's turn.
    assert!(!l.may("c", 2));
    assert_eq!(waiting(l.turn("a", 2)), 3);
    assert_eq!(waiting(l.turn("c", 2)), 1);

    // One free slot: the head's turn only.
    assert!(x.rollback().unwrap());
    assert!(l.may("c", 2));
    assert!(!l.may("b", 2));
    assert!(!l.may("a", 2));
    assert_eq!(waiting(l.turn("b", 2)), 2, "b does not pass c");
    assert_eq!(waiting(l.turn("a", 2)), 3);
    assert!(matches!(
        l.admit("late", 2, false),
        Err(CapacityError::Exhausted(_))
    ));
    assert!(matches!(l.turn("c", 2), Turn::Admitted(_)));
    assert!(matches!(l.turn("c", 2), Turn::Gone));
    assert!(!l.cap.is_queued(SESSION, "c"));
    assert_eq!(l.positions(), line(&[("b", 1), ("a", 2)]));
    assert_eq!(l.used(), 2, "within the limit");
    assert_eq!(waiting(l.turn("b", 2)), 1, "full again");

    assert!(y.rollback().unwrap());
    assert!(matches!(l.turn("b", 2), Turn::Admitted(_)));
    assert_eq!(l.positions(), line(&[("a", 1)]));
    assert_eq!(waiting(l.turn("a", 2)), 1);
}

impl Line {
    fn used(&self) -> usize {
        self.fx.used()
    }
}

#[test]
fn a_launch_without_queue_takes_a_slot_only_past_everyone_waiting() {
    let l = Line::new();
    let mut held: Vec<SlotHandle> = ["x", "y", "z"].iter().map(|id| l.slot(id, 3)).collect();
    // Full with nobody waiting: refused, and not put in line.
    assert!(matches!(
        l.admit("refused", 3, false),
        Err(CapacityError::Exhausted(_))
    ));
    assert!(l.positions().is_empty());
    assert_eq!(l.queue("q", 3), 1);
    for handle in &mut held[..2] {
        assert!(handle.rollback().unwrap());
    }
    // 1 used + 1 waiting < 3: one slot is left over for a launch.
    assert!(matches!(l.admit("n", 3, false), Ok(Admission::Slot(_))));
    // 2 used + 1 waiting = 3: the last free slot is q's.
    assert!(matches!(
        l.admit("m", 3, false),
        Err(CapacityError::Exhausted(_))
    ));
    assert_eq!(l.used(), 2);
    assert!(matches!(l.turn("q", 3), Turn::Admitted(_)));
}

#[test]
fn a_slot_of_a_finished_run_goes_to_the_head_of_the_line() {
    let l = Line::new();
    let mut a = l.slot("run-a", 1);
    a.mark_started("rid-a").unwrap();
    assert_eq!(l.queue("b", 1), 1);
    assert_eq!(waiting(l.turn("b", 1)), 1, "run-a still runs");
    // run-a is over and proven so: its slot is stale until a reconcile.
    let dir = l.fx.write_status("run-a", "complete", "rid-a");
    write_proof(&dir, "observed", "run-a", "rid-a");
    assert!(matches!(l.turn("b", 1), Turn::Admitted(_)));
    assert_eq!(l.used(), 1);
    assert!(l.positions().is_empty());
}

#[test]
fn a_queue_that_is_not_a_directory_is_an_error_not_an_empty_line() {
    let l = Line::new();
    let pool = l.cap.pool_dir(SESSION);
    atomic_file::ensure_private_dir(&l.fx.root()).unwrap();
    atomic_file::ensure_private_dir(&pool).unwrap();
    atomic_file::write_private(&pool.join("queue"), b"not a line").unwrap();
    let err = l.admit("n", 1, false).unwrap_err();
    assert!(err.to_string().contains("queue"), "{err}");
    assert_eq!(l.used(), 0);
}

/// How a waiting run stands when a launch reads the line.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum Stands {
    /// It holds up the launch, and stays.
    InLine,
    /// It keeps its place but holds up nobody.
    Asleep,
    /// Its entry is removed.
    Stale,
}

/// The waiting run's status, or what is in its place.
enum Status {
    Queued(Value),
    Unreadable,
    Missing { run_dir: bool },
}

fn live() -> Value {
    json!(ProcessIdentity::current().unwrap())
}

fn dead() -> Value {
    json!(dead_identity())
}

/// A queued status of run `w` with these fields changed.
fn queued(changes: &[(&str, Value)]) -> Status {
    let mut status = json!({
        "runId": "w",
        "sessionId": SESSION,
        "mode": "single",
        "state": "queued",
        "queuedForSlot": {"since": 1_699_999_000_111_u64},
    });
    for (key, value) in changes {
        if value.is_null() {
            status.as_object_mut().unwrap().remove(*key);
        } else {
            status[*key] = value.clone();
        }
    }
    Status::Queued(status)
}

/// Puts run `w` in line (its entry launched by `launcher`), then asks for
/// a slot with limit 1 and none taken.
fn standing(status: Status, launcher: Value) -> Stands {
    let l = Line::new();
    let entry_path = l.cap.queue_dir(SESSION).join("0001699999000111.w.json");
    atomic_file::ensure_private_dir(&l.fx.root()).unwrap();
    atomic_file::ensure_private_dir(&l.cap.pool_dir(SESSION)).unwrap();
    atomic_file::ensure_private_dir(&l.cap.queue_dir(SESSION)).unwrap();
    let entry = json!({
        "version": 1,
        "runId": "w",
        "ownerSessionId": SESSION,
        "asyncDir": l.fx.tmp.path().join("async-subagent-runs/w"),
        "enqueuedAt": 1_699_999_000_111_u64,
        "limit": 1,
        "enqueuedByProcess": launcher,
    });
    write_json(&entry_path, &entry);
    match status {
        Status::Queued(value) => write_json(&l.fx.run_dir("w").join("status.json"), &value),
        Status::Unreadable => {
            atomic_file::write_private(&l.fx.run_dir("w").join("status.json"), b"{\"runId\":")
                .unwrap();
        }
        Status::Missing { run_dir: true } => {
            l.fx.run_dir("w");
        }
        Status::Missing { run_dir: false } => {}
    }
    let stands = match l.admit("newcomer", 1, false) {
        Err(CapacityError::Exhausted(_)) => Stands::InLine,
        Ok(Admission::Slot(_)) if entry_path.exists() => Stands::Asleep,
        Ok(Admission::Slot(_)) => Stands::Stale,
        other => panic!("unexpected admission: {other:?}"),
    };
    assert_eq!(
        l.cap.is_queued(SESSION, "w"),
        stands != Stands::Stale,
        "is_queued agrees"
    );
    stands
}

#[test]
fn where_a_waiting_run_stands_by_its_status_and_its_starters() {
    use Stands::*;
    let other_session = json!("/home/u/.pi/sessions/other.jsonl");
    let cases: Vec<(&str, Status, Value, Stands)> = vec![
        (
            "queued, monitor alive",
            queued(&[("monitorIdentity", live())]),
            dead(),
            InLine,
        ),
        (
            "queued, no session id, monitor alive",
            queued(&[("monitorIdentity", live()), ("sessionId", Value::Null)]),
            dead(),
            InLine,
        ),
        (
            "queued, monitor dead, launcher alive: the monitor tells",
            queued(&[("monitorIdentity", dead()), ("launcherIdentity", live())]),
            live(),
            Asleep,
        ),
        (
            "queued, no monitor yet, launcher alive",
            queued(&[("launcherIdentity", live())]),
            dead(),
            InLine,
        ),
        (
            "queued, no monitor yet, launcher dead",
            queued(&[("launcherIdentity", dead())]),
            live(),
            Asleep,
        ),
        (
            "running, not waiting any more",
            queued(&[("monitorIdentity", live()), ("state", json!("running"))]),
            live(),
            Stale,
        ),
        (
            "queued without queuedForSlot",
            queued(&[("monitorIdentity", live()), ("queuedForSlot", Value::Null)]),
            live(),
            Stale,
        ),
        (
            "queued in another session",
            queued(&[("monitorIdentity", live()), ("sessionId", other_session)]),
            live(),
            Stale,
        ),
        (
            "the status of another run",
            queued(&[("monitorIdentity", live()), ("runId", json!("v"))]),
            live(),
            Stale,
        ),
        ("status unreadable", Status::Unreadable, live(), Asleep),
        (
            "no status yet, launcher alive, no directory yet",
            Status::Missing { run_dir: false },
            live(),
            InLine,
        ),
        (
            "no status, launcher dead",
            Status::Missing { run_dir: true },
            dead(),
            Stale,
        ),
        (
            "no status, no launcher recorded, directory there",
            Status::Missing { run_dir: true },
            Value::Null,
            InLine,
        ),
        (
            "no status, no launcher recorded, directory gone",
            Status::Missing { run_dir: false },
            Value::Null,
            Stale,
        ),
    ];
    for (case, status, launcher, expected) in cases {
        assert_eq!(standing(status, launcher), expected, "{case}");
    }
}

const WORKER_TEST: &str = "tests::queue_line::worker";

/// A waiting run in its own process: joins the line when `<out>.go`
/// appears and writes its place to `<out>`, waits for its turn and writes
/// `admitted` there, then holds the slot until `<out>.release` appears.
#[test]
#[ignore = "entry point of the worker processes of the line's process test"]
fn worker() {
    let env = |key: &str| std::env::var(key).expect("run only as a worker");
    let root = std::path::PathBuf::from(env("LINE_ROOT"));
    let out = std::path::PathBuf::from(env("LINE_OUT"));
    let run_id = env("LINE_RUN");
    let (live, dir) = (std::collections::HashSet::new(), root.join("no-run-dir"));
    let request = Acquire {
        session_id: SESSION,
        limit: Some(1),
        run_id: &run_id,
        kind: Kind::Runner,
        async_dir: &dir,
        live_workflows: &live,
    };
    let cap = Capacity::new(&root);
    wait_until("the start signal", || out.with_extension("go").exists());
    let place = match cap.admit(&request, true).unwrap() {
        Some(Admission::Queued(q)) => q.position,
        other => panic!("{run_id} was not queued: {other:?}"),
    };
    atomic_file::write_private(&out, format!("queued {place}").as_bytes()).unwrap();
    if std::env::var_os("LINE_HANG").is_some() {
        // Killed here by the parent: a launcher that died after joining.
        loop {
            std::thread::park();
        }
    }
    let mut handle = None;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while handle.is_none() {
        assert!(std::time::Instant::now() < deadline, "{run_id}: no turn");
        match cap.take_turn(&request).unwrap() {
            Turn::Admitted(h) => handle = Some(h),
            Turn::Waiting(_) => std::thread::sleep(std::time::Duration::from_millis(5)),
            Turn::Gone => panic!("{run_id} left the line"),
        }
    }
    atomic_file::write_private(&out, b"admitted").unwrap();
    wait_until("the release signal", || {
        out.with_extension("release").exists()
    });
    assert!(handle.unwrap().rollback().unwrap());
}

fn spawn_worker(l: &Line, out: &std::path::Path, run_id: &str) -> std::process::Command {
    let mut command = std::process::Command::new(std::env::current_exe().unwrap());
    command
        .args([WORKER_TEST, "--exact", "--ignored", "--test-threads=1"])
        .env("LINE_ROOT", l.fx.root())
        .env("LINE_OUT", out)
        .env("LINE_RUN", run_id)
        .stdout(std::process::Stdio::null());
    command
}

#[test]
fn a_launcher_killed_after_joining_the_line_holds_up_nobody() {
    let l = Line::new();
    let mut holder = l.slot("holder", 1);
    let out = l.fx.tmp.path().join("out-killed");
    let mut child = spawn_worker(&l, &out, "killed")
        .env("LINE_HANG", "1")
        .spawn()
        .unwrap();
    atomic_file::write_private(&out.with_extension("go"), b"go").unwrap();
    wait_until("the worker in line", || {
        assert!(child.try_wait().unwrap().is_none(), "worker exited early");
        fs::read_to_string(&out).unwrap_or_default() == "queued 1"
    });
    assert!(holder.rollback().unwrap());
    assert!(
        matches!(
            l.admit("blocked", 1, false),
            Err(CapacityError::Exhausted(_))
        ),
        "a live launcher's run keeps its place"
    );
    child.kill().unwrap();
    let status = child.wait().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9)
    );
    // Its run never got a status: the entry is stale and goes.
    assert!(matches!(l.admit("next", 1, false), Ok(Admission::Slot(_))));
    assert!(l.positions().is_empty());
}

#[test]
fn six_processes_wait_in_one_line_and_take_the_slot_in_its_order() {
    let l = Line::new();
    let mut holder = l.slot("holder", 1);
    let outs: Vec<_> = (0..6)
        .map(|i| l.fx.tmp.path().join(format!("out-{i}")))
        .collect();
    let mut workers: Vec<std::process::Child> = outs
        .iter()
        .enumerate()
        .map(|(i, out)| spawn_worker(&l, out, &format!("q-{i}")).spawn().unwrap())
        .collect();
    for out in &outs {
        atomic_file::write_private(&out.with_extension("go"), b"go").unwrap();
    }
    let read = |i: usize| fs::read_to_string(&outs[i]).unwrap_or_default();
    wait_until("every worker in line", || {
        (0..6).all(|i| read(i).starts_with("queued"))
    });
    let mut places: Vec<String> = (0..6).map(read).collect();
    places.sort();
    let expected: Vec<String> = (1..=6).map(|p| format!("queued {p}")).collect();
    assert_eq!(places, expected, "six distinct places, 1-based");
    let order: Vec<usize> = l
        .positions()
        .iter()
        .map(|(id, _)| id.strip_prefix("q-").unwrap().parse().unwrap())
        .collect();
    assert_eq!(order.len(), 6);

    assert!(holder.rollback().unwrap());
    for (turn, &next) in order.iter().enumerate() {
        wait_until("the next admission", || read(next) == "admitted");
        let admitted: Vec<usize> = (0..6).filter(|&i| read(i) == "admitted").collect();
        assert_eq!(admitted, [next], "turn {turn}: only the head of the line");
        assert_eq!(l.used(), 1, "turn {turn}: within the limit");
        assert_eq!(l.positions().len(), 5 - turn);
        atomic_file::write_private(&outs[next].with_extension("release"), b"go").unwrap();
        assert!(workers[next].wait().unwrap().success(), "worker {next}");
        fs::remove_file(&outs[next]).unwrap();
    }
    for worker in &mut workers {
        assert!(worker.try_wait().unwrap().is_some());
    }
    assert_eq!(l.used(), 0);
}
