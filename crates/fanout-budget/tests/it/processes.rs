//! Admission across real processes: this test binary re-executes itself as
//! claim workers that inherit the budget through `SUBAGENTS_RUN_FANOUT_BUDGET`.

extern crate subagents_fanout_budget as fanout_budget;
use std::collections::BTreeSet;
use std::env;
use std::fs::{self, File, TryLockError};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{Context, Result, bail};
use fanout_budget::{
    BUDGET_ENV, BUDGET_ENV_ALIAS, BUDGET_ROOT_DIR, CLAIMS_DIR, Descriptor, LOCK_FILE, OWNER_FILE,
    REFERENCE_LOCK_DIR, Snapshot, create_budget, inherited_from_env,
};
use serde_json::Value;

const ROLE: &str = "FANOUT_BUDGET_TEST_ROLE";
const ROOT: &str = "FANOUT_BUDGET_TEST_ROOT";
/// Line a holder prints once it is inside the lock.
const HOLDING: &str = "holding-the-admission-lock";
/// Exit code of a worker whose claim was rejected by the limit.
const REJECTED: i32 = 3;

/// When this process was started as a worker, act and exit; else return.
fn act_as_worker_if_asked() {
    let Ok(role) = env::var(ROLE) else { return };
    let root = PathBuf::from(env::var(ROOT).unwrap_or_default());
    let code = act(&role, &root).unwrap_or_else(|e| {
        eprintln!("worker failed: {e:#}");
        1
    });
    std::process::exit(code);
}

fn act(role: &str, root: &Path) -> Result<i32> {
    let budget = inherited_from_env(root)?.context("no inherited budget")?;
    match role.split_once(':') {
        Some(("claim", path)) => {
            // Start line: the parent closes stdin once every worker exists.
            std::io::stdin().read_to_end(&mut Vec::new())?;
            match budget.claim(&[path]) {
                Ok(_) => Ok(0),
                Err(e) if e.rejection().is_some() => Ok(REJECTED),
                Err(e) => Err(e.into()),
            }
        }
        Some(("group", prefix)) => {
            std::io::stdin().read_to_end(&mut Vec::new())?;
            match budget.claim(&[format!("{prefix}/0"), format!("{prefix}/1")]) {
                Ok(_) => Ok(0),
                Err(e) if e.rejection().is_some() => Ok(REJECTED),
                Err(e) => Err(e.into()),
            }
        }
        Some(("lock", _)) => {
            // Holds only the lock, as a claimer stuck inside it would.
            let file = File::options()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(budget.descriptor().directory.join(LOCK_FILE))?;
            file.lock()?;
            println!("{HOLDING}");
            std::io::stdout().flush()?;
            loop {
                std::thread::park();
            }
        }
        Some(("hold", path)) => {
            budget.claim_with_commit(&[path], |_| -> Result<(), _> {
                println!("{HOLDING}");
                std::io::stdout().flush()?;
                loop {
                    std::thread::park();
                }
            })?;
            bail!("the holder returned")
        }
        _ => bail!("unknown role {role}"),
    }
}

fn worker(test: &str, role: &str, root: &Path, descriptor: &Descriptor) -> Result<Command> {
    let mut cmd = Command::new(env::current_exe()?);
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .env(ROOT, root)
        .env(BUDGET_ENV, descriptor.to_env_value())
        .env_remove(BUDGET_ENV_ALIAS);
    Ok(cmd)
}

#[test]
fn a_child_inheriting_through_the_reference_env_name_claims_from_the_same_budget() -> Result<()> {
    act_as_worker_if_asked();
    let tmp = tempfile::tempdir()?;
    let root = tmp.path().join(BUDGET_ROOT_DIR);
    let budget = create_budget(&root, "alias", 2)?;
    let child = budget.descriptor().child("tasks[0]");
    let test =
        "processes::a_child_inheriting_through_the_reference_env_name_claims_from_the_same_budget";
    let out = worker(test, "claim:single", &root, &child)?
        .env_remove(BUDGET_ENV)
        .env(BUDGET_ENV_ALIAS, child.to_env_value())
        .stdin(Stdio::null())
        .output()?;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let paths = claim_paths(&budget.descriptor().directory)?;
    assert_eq!(paths, BTreeSet::from(["tasks[0]/single".to_string()]));
    Ok(())
}

fn claim_paths(dir: &Path) -> Result<BTreeSet<String>> {
    let mut paths = BTreeSet::new();
    for entry in fs::read_dir(dir.join(CLAIMS_DIR))? {
        let record: Value = serde_json::from_str(&fs::read_to_string(entry?.path())?)?;
        paths.insert(record["path"].as_str().context("path")?.to_string());
    }
    Ok(paths)
}

#[test]
fn thirty_two_processes_race_for_twenty_slots() -> Result<()> {
    act_as_worker_if_asked();
    let tmp = tempfile::tempdir()?;
    let root = tmp.path().join(BUDGET_ROOT_DIR);
    let budget = create_budget(&root, "race", 20)?;
    let test = "processes::thirty_two_processes_race_for_twenty_slots";
    let mut children = Vec::new();
    for i in 0..32 {
        let mut cmd = worker(
            test,
            &format!("claim:tasks[{i}]"),
            &root,
            budget.descriptor(),
        )?;
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        children.push(cmd.spawn()?);
    }
    let (admitted, rejected) = release_and_count(children)?;
    assert_eq!((admitted, rejected), (20, 12));
    assert_eq!(budget.snapshot()?, Snapshot::new(20, 20));
    let names: Vec<_> = fs::read_dir(budget.descriptor().directory.join(CLAIMS_DIR))?.collect();
    assert_eq!(names.len(), 20, "exactly 20 slot files, nothing else");
    assert_eq!(
        claim_paths(&budget.descriptor().directory)?.len(),
        20,
        "distinct paths"
    );
    Ok(())
}

#[test]
fn a_lock_holder_killed_by_sigkill_does_not_block_the_next_claimer() -> Result<()> {
    act_as_worker_if_asked();
    let tmp = tempfile::tempdir()?;
    let root = tmp.path().join(BUDGET_ROOT_DIR);
    let budget = create_budget(&root, "kill", 3)?;
    let test = "processes::a_lock_holder_killed_by_sigkill_does_not_block_the_next_claimer";
    let mut holder = worker(test, "hold:held", &root, budget.descriptor())?
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut lines = BufReader::new(holder.stdout.take().context("stdout")?).lines();
    loop {
        match lines.next().transpose()? {
            // libtest prints "test <name> ... " before the marker on the same line.
            Some(line) if line.ends_with(HOLDING) => break,
            Some(_) => continue,
            None => bail!("holder exited before taking the lock: {:?}", holder.wait()?),
        }
    }
    let lock_path = budget.descriptor().directory.join(LOCK_FILE);
    let probe = File::open(&lock_path)?;
    assert!(
        matches!(probe.try_lock(), Err(TryLockError::WouldBlock)),
        "holder has the lock"
    );

    holder.kill()?;
    holder.wait()?;
    // The holder's slot survives (its rollback never ran); the lock does not.
    assert_eq!(budget.claim(&["next"])?, Snapshot::new(2, 3));
    let paths = claim_paths(&budget.descriptor().directory)?;
    assert_eq!(
        paths,
        BTreeSet::from(["held".to_string(), "next".to_string()])
    );
    Ok(())
}

/// Starts a worker in `role` and waits until it prints that it holds the lock.
fn holding_worker(test: &str, role: &str, root: &Path, descriptor: &Descriptor) -> Result<Child> {
    let mut holder = worker(test, role, root, descriptor)?
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut lines = BufReader::new(holder.stdout.take().context("stdout")?).lines();
    loop {
        match lines.next().transpose()? {
            Some(line) if line.ends_with(HOLDING) => return Ok(holder),
            Some(_) => continue,
            None => bail!("holder exited before taking the lock: {:?}", holder.wait()?),
        }
    }
}

/// Claims are never released, so a batch that does not fit in what the
/// claims directory shows is refused at once: the refusal neither takes
/// nor waits for the admission lock, here held by another process (with a
/// live 0.49-style directory lock too). Waiting would end in a lock timeout,
/// not in a rejection.
#[test]
fn a_batch_that_cannot_fit_is_refused_without_waiting_for_a_held_lock() -> Result<()> {
    act_as_worker_if_asked();
    let tmp = tempfile::tempdir()?;
    let root = tmp.path().join(BUDGET_ROOT_DIR);
    let test = "processes::a_batch_that_cannot_fit_is_refused_without_waiting_for_a_held_lock";
    // One slot left for a group of two; no slot left for one path.
    let cases = [
        (3, vec!["c", "d"], ("d", 2, 1)),
        (2, vec!["c"], ("c", 2, 0)),
    ];
    for (limit, batch, (path, used, remaining)) in cases {
        let budget = create_budget(&root, "held", limit)?;
        budget.claim(&["a", "b"])?;
        let mut holder = holding_worker(test, "lock:-", &root, budget.descriptor())?;
        let dir = budget.descriptor().directory.clone();
        fs::create_dir(dir.join(REFERENCE_LOCK_DIR))?;
        let owner = format!(r#"{{"pid":{},"token":"held"}}"#, holder.id());
        fs::write(dir.join(REFERENCE_LOCK_DIR).join(OWNER_FILE), owner)?;
        let probe = File::open(dir.join(LOCK_FILE))?;
        let held = matches!(probe.try_lock(), Err(TryLockError::WouldBlock));
        let refused = budget.claim(&batch);
        holder.kill()?;
        holder.wait()?;
        assert!(held, "the other process held the lock");
        let err = refused.unwrap_err();
        let rejection = &err.rejection().with_context(|| format!("{err}"))?.rejection;
        assert_eq!(
            (rejection.path.as_str(), rejection.used, rejection.remaining),
            (path, used, remaining),
            "{err}"
        );
        assert_eq!(budget.snapshot()?, Snapshot::new(2, limit));
    }
    Ok(())
}

/// Groups of two race for an odd number of slots: every group is admitted
/// whole or not at all, whether it was refused before the lock or under it,
/// and the slot no group fits in is still there for a single path.
#[test]
fn groups_racing_for_an_odd_budget_are_all_or_nothing() -> Result<()> {
    act_as_worker_if_asked();
    let tmp = tempfile::tempdir()?;
    let root = tmp.path().join(BUDGET_ROOT_DIR);
    let budget = create_budget(&root, "groups", 7)?;
    let test = "processes::groups_racing_for_an_odd_budget_are_all_or_nothing";
    let mut children = Vec::new();
    for i in 0..12 {
        let mut cmd = worker(test, &format!("group:g{i}"), &root, budget.descriptor())?;
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        children.push(cmd.spawn()?);
    }
    let (admitted, rejected) = release_and_count(children)?;
    assert_eq!((admitted, rejected), (3, 9));
    let paths = claim_paths(&budget.descriptor().directory)?;
    for i in 0..12 {
        let halves = [format!("g{i}/0"), format!("g{i}/1")].map(|p| paths.contains(&p));
        assert!(halves[0] == halves[1], "group g{i} was split: {paths:?}");
    }
    assert_eq!(budget.claim(&["single"])?, Snapshot::new(7, 7));
    let names: Vec<_> = fs::read_dir(budget.descriptor().directory.join(CLAIMS_DIR))?.collect();
    assert_eq!(names.len(), 7, "slot files only, no prepared record left");
    Ok(())
}

/// Releases the waiting workers together (closing their stdin) and counts
/// how many were admitted and how many rejected; any other end is an error.
fn release_and_count(mut children: Vec<Child>) -> Result<(usize, usize)> {
    for child in &mut children {
        drop(child.stdin.take());
    }
    let (mut admitted, mut rejected) = (0, 0);
    for child in children {
        let out = child.wait_with_output()?;
        match out.status.code() {
            Some(0) => admitted += 1,
            Some(REJECTED) => rejected += 1,
            _ => bail!(
                "worker {:?}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ),
        }
    }
    Ok((admitted, rejected))
}
