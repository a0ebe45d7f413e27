//! Several real processes on one pool, and holders killed with SIGKILL.

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use super::hooks;
use super::support::*;
use crate::{Acquire, Capacity, CapacityError, Kind, session_key};

const WORKER_TEST: &str = "tests::processes::worker";

/// What a worker process does, chosen by `CAPACITY_WORKER`.
fn act_as_worker(mode: &str) {
    let env = |key: &str| std::env::var(key).unwrap();
    let root = PathBuf::from(env("CAPACITY_ROOT"));
    let out = PathBuf::from(env("CAPACITY_OUT"));
    let run_id = env("CAPACITY_RUN");
    let limit: u32 = env("CAPACITY_LIMIT").parse().unwrap();
    match mode {
        "acquire" => {
            let go = PathBuf::from(env("CAPACITY_GO"));
            wait_until("the start signal", || go.exists());
        }
        "hang-staged" => {
            hooks::SLOT_STAGED.set(hang).unwrap();
        }
        "hang-claimed" => {
            hooks::CLAIM_TAKEN.set(hang).unwrap();
        }
        other => panic!("unknown worker mode {other}"),
    }
    let result = acquire_in(&root, &run_id, limit);
    let text = match &result {
        Ok(slot) => format!("slot {slot}"),
        Err(CapacityError::Exhausted(_)) => "exhausted".to_owned(),
        Err(e) => format!("error {e}"),
    };
    atomic_file::write_private(&out, text.as_bytes()).unwrap();
    if mode == "acquire" {
        // Stay alive, holding the reservation, until the parent has counted.
        let release = PathBuf::from(env("CAPACITY_GO")).with_extension("release");
        wait_until("the release signal", || release.exists());
    }
}

/// Acquires, then for the `hang-claimed` worker binds a runner (which stops
/// in the claim hook).
fn acquire_in(root: &Path, run_id: &str, limit: u32) -> Result<u64, CapacityError> {
    let live = HashSet::new();
    let dir = root.join("runs").join(run_id);
    let request = Acquire {
        session_id: SESSION,
        limit: Some(limit),
        run_id,
        kind: Kind::Runner,
        async_dir: &dir,
        live_workflows: &live,
    };
    let mut handle = Capacity::new(root).acquire(&request)?.unwrap();
    if hooks::CLAIM_TAKEN.get().is_some() {
        handle.mark_started("rid")?;
    }
    Ok(handle.owner().slot)
}

/// Announces that the worker reached its pause point, then never returns.
fn hang() {
    let marker = PathBuf::from(std::env::var("CAPACITY_OUT").unwrap()).with_extension("paused");
    atomic_file::write_private(&marker, b"paused").unwrap();
    loop {
        std::thread::park();
    }
}

#[test]
#[ignore = "entry point of the worker processes the other tests start"]
fn worker() {
    let mode = std::env::var("CAPACITY_WORKER").expect("run only as a worker");
    act_as_worker(&mode);
}

fn spawn_worker(mode: &str, root: &Path, run_id: &str, limit: u32, out: &Path, go: &Path) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            WORKER_TEST,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("CAPACITY_WORKER", mode)
        .env("CAPACITY_ROOT", root)
        .env("CAPACITY_RUN", run_id)
        .env("CAPACITY_LIMIT", limit.to_string())
        .env("CAPACITY_OUT", out)
        .env("CAPACITY_GO", go)
        // The worker's own harness lines ("running 1 test", "test result")
        // must not reach the parent's output, where they read as our tests.
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

#[test]
fn eight_processes_acquiring_with_limit_three_hold_exactly_three_slots() {
    let fx = Fixture::new();
    let root = fx.root();
    let go = fx.tmp.path().join("go");
    let outs: Vec<PathBuf> = (0..8)
        .map(|i| fx.tmp.path().join(format!("out-{i}")))
        .collect();
    let mut workers: Vec<Child> = outs
        .iter()
        .enumerate()
        .map(|(i, out)| spawn_worker("acquire", &root, &format!("run-{i}"), 3, out, &go))
        .collect();
    atomic_file::write_private(&go, b"go").unwrap();
    wait_until("every worker's answer", || outs.iter().all(|o| o.exists()));
    let mut results: Vec<String> = outs
        .iter()
        .map(|o| fs::read_to_string(o).unwrap())
        .collect();
    results.sort();
    assert_eq!(
        results,
        [
            "exhausted",
            "exhausted",
            "exhausted",
            "exhausted",
            "exhausted",
            "slot 0",
            "slot 1",
            "slot 2"
        ]
    );
    let snapshot = fx.cap.count(SESSION, Some(3)).unwrap();
    assert_eq!(snapshot.used, 3);
    let mut runs: Vec<String> = snapshot
        .slots
        .into_iter()
        .filter_map(|s| s.run_id)
        .collect();
    runs.sort();
    runs.dedup();
    assert_eq!(runs.len(), 3, "three different runs hold the three slots");
    assert_eq!(fx.reconcile(3).used, 3, "live reservers keep their slots");

    atomic_file::write_private(&go.with_extension("release"), b"release").unwrap();
    for worker in &mut workers {
        assert!(worker.wait().unwrap().success());
    }
    // The workers exited without binding a runner or leaving a run
    // directory: their reservations are provably abandoned.
    assert_eq!(fx.reconcile(3).used, 0);
}

fn start_hanging(fx: &Fixture, mode: &str) -> Child {
    let out = fx.tmp.path().join("out");
    let go = fx.tmp.path().join("go");
    let mut child = spawn_worker(mode, &fx.root(), "run-dead", 1, &out, &go);
    let marker = out.with_extension("paused");
    wait_until("the worker to pause", || {
        assert!(child.try_wait().unwrap().is_none(), "worker exited early");
        marker.exists()
    });
    child
}

fn kill(mut child: Child) {
    child.kill().unwrap();
    let status = child.wait().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9)
    );
}

#[test]
fn a_holder_killed_mid_acquire_does_not_wedge_the_pool() {
    let fx = Fixture::new();
    let child = start_hanging(&fx, "hang-staged");
    let pool = fx.root().join(session_key(SESSION));
    let staged = || {
        fs::read_dir(&pool)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .contains(".creating-")
            })
            .count()
    };
    assert_eq!(
        staged(),
        1,
        "the worker stopped between staging and renaming"
    );
    kill(child);

    let handle = fx.acquire("run-live", 1);
    assert_eq!(handle.owner().slot, 0);
    assert_eq!(fx.used(), 1);
    assert_eq!(staged(), 0, "the half-made slot was swept");
}

#[test]
fn a_holder_killed_inside_a_slot_claim_does_not_wedge_the_slot() {
    let fx = Fixture::new();
    let child = start_hanging(&fx, "hang-claimed");
    let slot = fx.root().join(session_key(SESSION)).join("slot-0");
    assert!(crate::pool::claim_path(&slot).exists());
    kill(child);

    // The killer's slot is unbound and its reserver is dead, so reconcile
    // frees it even though the dead process still "holds" the claim.
    let handle = fx.acquire("run-live", 1);
    assert_eq!(handle.owner().run_id, "run-live");
    assert!(!crate::pool::claim_path(&slot).exists());
}
