//! The pi-subagents 0.49 directory lock `admission.lock/` as our claimers
//! take it: dead and stale owners are reclaimed, a live owner is waited for,
//! and a claim leaves no lock behind that would block a 0.49 claimer.

extern crate subagents_fanout_budget as fanout_budget;
use std::fs;
use std::path::Path;
use std::process::{Child, Command};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Result;
use fanout_budget::{
    BUDGET_ROOT_DIR, Error, LOCK_FILE, OWNER_FILE, REFERENCE_LOCK_DIR, ReferenceLock, Snapshot,
    create_budget,
};
use serde_json::Value;
use test_support::{dead_pid, epoch_ms};

/// Writes a 0.49-style lock directory owned by `pid`.
fn plant_lock(budget_dir: &Path, pid: u32, token: &str) -> Result<()> {
    let lock = budget_dir.join(REFERENCE_LOCK_DIR);
    fs::create_dir(&lock)?;
    fs::write(
        lock.join(OWNER_FILE),
        format!(r#"{{"pid":{pid},"token":"{token}"}}"#),
    )?;
    Ok(())
}

fn owner_token(budget_dir: &Path) -> Result<String> {
    let text = fs::read_to_string(budget_dir.join(REFERENCE_LOCK_DIR).join(OWNER_FILE))?;
    let value: Value = serde_json::from_str(&text)?;
    Ok(value["token"].as_str().unwrap_or_default().to_string())
}

fn age(path: &Path, by: Duration) -> Result<()> {
    let file = fs::File::open(path)?;
    file.set_modified(SystemTime::now() - by)?;
    Ok(())
}

fn live_child() -> Result<Child> {
    Ok(Command::new("sleep").arg("60").spawn()?)
}

fn no_stale_leftovers(budget_dir: &Path) -> Result<bool> {
    Ok(fs::read_dir(budget_dir)?.filter_map(|e| e.ok()).all(|e| {
        !e.file_name()
            .to_string_lossy()
            .starts_with("admission.stale-")
    }))
}

#[test]
fn a_lock_whose_owner_is_dead_is_reclaimed_at_once() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path();
    plant_lock(dir, dead_pid(), "theirs")?;
    let before = epoch_ms();
    // A deadline already past: only an immediate reclaim can succeed.
    let lock = ReferenceLock::acquire(dir, Instant::now())?;
    let after = epoch_ms();
    assert_eq!(owner_token(dir)?, lock.token());
    let owner: Value = serde_json::from_str(&fs::read_to_string(
        dir.join(REFERENCE_LOCK_DIR).join(OWNER_FILE),
    )?)?;
    assert_eq!(owner["pid"], std::process::id());
    let created = owner["createdAt"].as_u64().expect("createdAt in ms");
    assert!((before..=after).contains(&created), "{created}");
    drop(lock);
    assert!(!dir.join(REFERENCE_LOCK_DIR).exists(), "released");
    assert!(no_stale_leftovers(dir)?);
    Ok(())
}

#[test]
fn a_lock_whose_owner_is_alive_is_waited_for() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().to_path_buf();
    let mut holder = live_child()?;
    plant_lock(&dir, holder.id(), "theirs")?;

    let err = ReferenceLock::acquire(&dir, Instant::now()).unwrap_err();
    assert!(matches!(err, Error::LockTimeout { .. }), "{err}");
    assert_eq!(
        owner_token(&dir)?,
        "theirs",
        "a live owner's lock is untouched"
    );

    let (tx, rx) = mpsc::channel();
    let waiter_dir = dir.clone();
    let waiter = std::thread::spawn(move || {
        let lock = ReferenceLock::acquire(&waiter_dir, Instant::now() + Duration::from_secs(30));
        let token = lock.as_ref().map(|l| l.token().to_string()).ok();
        tx.send(token).unwrap();
        lock.map(drop)
    });
    assert!(
        rx.try_recv().is_err(),
        "still waiting while the owner holds it"
    );
    // The owner releases the way 0.49 does: remove the directory.
    fs::remove_dir_all(dir.join(REFERENCE_LOCK_DIR))?;
    let token = rx.recv_timeout(Duration::from_secs(30))?;
    assert!(token.is_some_and(|t| t != "theirs"));
    waiter.join().unwrap()?;
    holder.kill()?;
    holder.wait()?;
    Ok(())
}

#[test]
fn a_lock_without_owner_older_than_a_minute_is_reclaimed() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path();
    fs::create_dir(dir.join(REFERENCE_LOCK_DIR))?;
    // Fresh and ownerless: a holder between mkdir and writing its owner.
    let err = ReferenceLock::acquire(dir, Instant::now()).unwrap_err();
    assert!(matches!(err, Error::LockTimeout { .. }), "{err}");

    age(&dir.join(REFERENCE_LOCK_DIR), Duration::from_secs(61))?;
    let lock = ReferenceLock::acquire(dir, Instant::now())?;
    assert_eq!(owner_token(dir)?, lock.token());
    Ok(())
}

#[test]
fn a_lock_older_than_a_minute_is_reclaimed_even_with_a_live_pid() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path();
    let mut holder = live_child()?;
    plant_lock(dir, holder.id(), "recycled")?;
    age(&dir.join(REFERENCE_LOCK_DIR), Duration::from_secs(61))?;
    let lock = ReferenceLock::acquire(dir, Instant::now())?;
    assert_eq!(owner_token(dir)?, lock.token());
    holder.kill()?;
    holder.wait()?;
    Ok(())
}

#[test]
fn release_leaves_a_lock_retaken_by_someone_else() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path();
    let lock = ReferenceLock::acquire(dir, Instant::now())?;
    // Someone judged ours stale and took the lock with their own token.
    fs::write(
        dir.join(REFERENCE_LOCK_DIR).join(OWNER_FILE),
        r#"{"pid":1,"token":"someone-else"}"#,
    )?;
    drop(lock);
    assert_eq!(owner_token(dir)?, "someone-else");
    Ok(())
}

#[test]
fn a_claim_reclaims_a_dead_reference_lock_and_leaves_no_lock_behind() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let root = tmp.path().join(BUDGET_ROOT_DIR);
    let budget = create_budget(&root, "mixed", 2)?;
    let dir = budget.descriptor().directory.clone();
    plant_lock(&dir, dead_pid(), "crashed-reference")?;

    assert_eq!(budget.claim(&["a"])?, Snapshot::new(1, 2));
    assert!(
        !dir.join(REFERENCE_LOCK_DIR).exists(),
        "no directory lock left"
    );
    assert!(
        dir.join(LOCK_FILE).is_file(),
        "our flock file has its own name"
    );
    assert_ne!(LOCK_FILE, REFERENCE_LOCK_DIR);
    assert!(no_stale_leftovers(&dir)?);
    Ok(())
}

#[test]
fn a_regular_file_in_the_reference_lock_place_is_cleared() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let root = tmp.path().join(BUDGET_ROOT_DIR);
    let budget = create_budget(&root, "old-flock", 2)?;
    let dir = budget.descriptor().directory.clone();
    // What earlier versions of subagents left: a flock file named admission.lock.
    fs::write(dir.join(REFERENCE_LOCK_DIR), "")?;
    assert_eq!(budget.claim(&["a"])?, Snapshot::new(1, 2));
    assert!(!dir.join(REFERENCE_LOCK_DIR).exists());
    Ok(())
}

#[test]
fn a_missing_budget_directory_is_an_error_not_a_held_lock() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let gone = tmp.path().join("gone");
    let err = ReferenceLock::acquire(&gone, Instant::now()).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("failed to create admission lock directory '"),
        "{err}"
    );
    Ok(())
}

#[test]
fn only_a_positive_pid_with_a_token_makes_an_owner() -> Result<()> {
    let plant = |dir: &Path, pid: i64, token: &str| -> Result<()> {
        let lock = dir.join(REFERENCE_LOCK_DIR);
        fs::create_dir(&lock)?;
        let owner = serde_json::json!({"pid": pid, "token": token});
        fs::write(lock.join(OWNER_FILE), owner.to_string())?;
        Ok(())
    };
    let dead = i64::from(dead_pid());
    // A fresh lock whose record breaks a rule has no owner, so it is held
    // (its holder may be between mkdir and writing the record), although
    // the pid in it names no process (a negative pid would probe a group).
    for (pid, token) in [(-dead, "t"), (dead, "")] {
        let tmp = tempfile::tempdir()?;
        plant(tmp.path(), pid, token)?;
        let err = ReferenceLock::acquire(tmp.path(), Instant::now()).unwrap_err();
        assert!(
            matches!(err, Error::LockTimeout { .. }),
            "pid {pid} token {token:?}: {err}"
        );
    }
    // The largest pid is a valid owner, and no process has it: reclaimed.
    let tmp = tempfile::tempdir()?;
    plant(tmp.path(), i64::from(i32::MAX), "t")?;
    let lock = ReferenceLock::acquire(tmp.path(), Instant::now())?;
    assert_eq!(owner_token(tmp.path())?, lock.token());
    Ok(())
}
