//! Nothing left behind by a launcher that died while creating its run, no
//! run that its session's capacity does not count, and a finished run's
//! slot freed by the run's own finalizer (issue 24, items 4, 5 and 11).

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use serde_json::Value;

const SESSION: &str = "leftovers";

fn runs_dir(env: &Env) -> PathBuf {
    env.root().join("async-subagent-runs")
}

fn budgets_dir(env: &Env) -> PathBuf {
    env.root().join("run-fanout-budgets")
}

fn pool_dir(env: &Env) -> PathBuf {
    env.root()
        .join("session-active-async-capacity")
        .join(capacity::session_key(SESSION))
}

/// The `slot-N` directories of the session's pool, read from the disk
/// (no command that could free a slot on its way).
fn slot_dirs(env: &Env) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(pool_dir(env)) else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("slot-"))
        .collect()
}

fn names_in(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn run_ids(env: &Env) -> Vec<String> {
    names_in(&runs_dir(env))
        .into_iter()
        .filter(|n| !n.starts_with('.'))
        .collect()
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("failed to read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// `subagents run` with a fault that SIGKILLs the launcher at `point`;
/// returns the id of the run directory it left.
fn killed_launch(env: &Env, point: &str) -> String {
    let out = env
        .command(&["run", "--session", SESSION, "--", "true"])
        .env("SUBAGENTS_FAULT", format!("launcher:{point}"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("fault injected: launcher:{point}")),
        "the fault did not fire: {out:?}"
    );
    assert_eq!(
        out.status.code(),
        None,
        "the launcher was not killed: {out:?}"
    );
    let ids = run_ids(env);
    assert_eq!(ids.len(), 1, "{ids:?}");
    ids[0].clone()
}

/// Makes a directory look `secs` seconds old (its mtime is what the
/// creation grace reads), as if the grace had passed.
fn age(dir: &Path, secs: u64) {
    let status = Command::new("touch")
        .arg("-m")
        .arg("-d")
        .arg(format!("{secs} seconds ago"))
        .arg(dir)
        .status()
        .unwrap();
    assert!(status.success());
}

fn temps(dir: &Path) -> Vec<String> {
    names_in(dir)
        .into_iter()
        .filter(|n| n.ends_with(".tmp"))
        .collect()
}

#[test]
fn a_launcher_killed_inside_its_status_write_is_finished_by_reconcile_and_pruned() {
    let env = Env::new();
    let id = killed_launch(&env, "mid-status-write");
    let dir = env.run_dir(&id);
    assert!(!dir.join("status.json").exists());
    assert!(!temps(&dir).is_empty(), "{:?}", names_in(&dir));
    let budgets = names_in(&budgets_dir(&env));
    assert_eq!(budgets.len(), 1, "{budgets:?}");

    // Within the creation grace nothing is touched.
    env.ok(&["reconcile"]);
    assert!(!dir.join("status.json").exists());
    assert!(!temps(&dir).is_empty());

    age(&dir, 60);
    env.ok(&["reconcile"]);
    assert_eq!(temps(&dir), Vec::<String>::new(), "{:?}", names_in(&dir));
    let status = read_json(&dir.join("status.json"));
    assert_eq!(status["state"], "failed", "{status}");
    assert_eq!(
        status["processTerminal"]["state"], "not-started",
        "{status}"
    );
    let proof = read_json(&dir.join("process-terminal.json"));
    assert_eq!(proof["state"], "not-started", "{proof}");
    assert_eq!(proof["runId"], id.as_str(), "{proof}");
    let persisted = read_json(&dir.join("run-fanout-budget.json"));
    let budget = budgets_dir(&env).join(&budgets[0]);
    assert_eq!(
        persisted["directory"],
        budget.to_str().unwrap(),
        "{persisted}"
    );
    assert_eq!(slot_dirs(&env), Vec::<String>::new());

    env.ok(&["prune", "--older-than", "0s"]);
    assert!(!dir.exists(), "{:?}", names_in(&dir));
    assert!(!budget.exists(), "{:?}", names_in(&budgets_dir(&env)));
    assert_eq!(run_ids(&env), Vec::<String>::new());
}

#[test]
fn prune_finishes_and_deletes_a_run_its_launcher_left_without_a_status_but_a_dry_run_does_not() {
    let env = Env::new();
    let id = killed_launch(&env, "mid-status-write");
    let dir = env.run_dir(&id);
    age(&dir, 60);
    let listed = env.ok(&["prune", "--dry-run", "--older-than", "0s"]);
    // A dry run changes nothing, not even to finish the run it looks at.
    assert!(!dir.join("status.json").exists(), "{listed}");
    assert!(!temps(&dir).is_empty(), "{:?}", names_in(&dir));
    env.ok(&["prune", "--older-than", "0s"]);
    assert!(!dir.exists(), "{:?}", names_in(&dir));
    assert_eq!(run_ids(&env), Vec::<String>::new());
}

#[test]
fn prune_releases_the_active_marker_of_a_run_whose_monitor_died_after_its_proof() {
    let env = Env::new();
    let out = env
        .command(&["run", "--", "true"])
        .env("SUBAGENTS_FAULT", "monitor:after-proof")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let id = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let dir = env.run_dir(&id);
    poll(Duration::from_secs(20), || {
        common::processes_in(&[&dir]).is_empty()
    });
    assert!(
        env.marker(&id).exists(),
        "the monitor died before releasing it"
    );
    // Another run of the session holds a slot too: only this run's count.
    let other = env.ok(&["run", "--", "sleep", "300"]).trim().to_owned();
    let prune = |args: &[&str]| -> Value {
        let all = [&["prune", "--older-than", "0s", "--json"][..], args].concat();
        serde_json::from_str(&env.ok(&all)).unwrap()
    };
    let listed = prune(&["--dry-run"]);
    assert_eq!(listed["pruned"][0]["runId"], id.as_str(), "{listed}");
    assert_eq!(listed["capacitySlots"], 1, "{listed}");
    assert!(
        env.marker(&id).exists() && dir.exists(),
        "a dry run changed things"
    );
    let pruned = prune(&[]);
    assert_eq!(pruned["pruned"][0]["runId"], id.as_str(), "{pruned}");
    assert_eq!(pruned["capacitySlots"], 1, "{pruned}");
    assert!(!dir.exists());
    assert!(!env.marker(&id).exists(), "the marker outlived its run");
    env.ok(&["stop", &other]);
    env.settled(&other);
    // Nothing of it was held any more.
    let again = prune(&[]);
    assert_eq!(again["pruned"][0]["runId"], other.as_str(), "{again}");
    assert_eq!(again["capacitySlots"], 0, "{again}");
}

#[test]
fn a_run_directory_whose_creator_holds_its_lock_is_never_touched() {
    let env = Env::new();
    let dir = runs_dir(&env).join("being-made");
    std::fs::create_dir_all(&dir).unwrap();
    let temp = dir.join(".task.md.999999.00112233aabbccdd.tmp");
    std::fs::write(&temp, "half").unwrap();
    // A live process holding the directory's lock, as a launcher does
    // while it creates the run.
    // One process that holds the lock itself (flock(1) would leave it
    // with its child too).
    let hold = r#"use Fcntl qw(:flock); open(my $d, "<", $ARGV[0]) or die; flock($d, LOCK_EX) or die; sleep 60"#;
    let mut holder = Command::new("perl")
        .args(["-e", hold])
        .arg(&dir)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    poll(Duration::from_secs(10), || {
        let probe = std::fs::File::open(&dir).unwrap();
        probe.try_lock().is_err()
    });
    age(&dir, 60);
    env.ok(&["reconcile"]);
    assert!(temp.exists());
    assert!(!dir.join("status.json").exists());

    holder.kill().unwrap();
    holder.wait().unwrap();
    age(&dir, 60);
    env.ok(&["reconcile"]);
    assert!(!temp.exists());
    let status = read_json(&dir.join("status.json"));
    assert_eq!(status["state"], "failed", "{status}");
}

#[test]
fn an_abandoned_run_gets_its_not_started_proof_file_and_is_pruned_with_its_budget() {
    let env = Env::new();
    let id = killed_launch(&env, "after-run-dir");
    let dir = env.run_dir(&id);
    let budgets = names_in(&budgets_dir(&env));
    assert_eq!(budgets.len(), 1, "{budgets:?}");
    env.ok(&["reconcile"]);
    let proof = read_json(&dir.join("process-terminal.json"));
    assert_eq!(proof["state"], "not-started", "{proof}");
    assert_eq!(slot_dirs(&env), Vec::<String>::new());

    // A record whose file was lost gets it back.
    std::fs::remove_file(dir.join("process-terminal.json")).unwrap();
    env.ok(&["reconcile"]);
    let proof = read_json(&dir.join("process-terminal.json"));
    assert_eq!(proof["state"], "not-started", "{proof}");

    let kept = env.ok(&["prune"]);
    assert!(dir.exists(), "pruned before its age: {kept}");
    env.ok(&["prune", "--older-than", "0s"]);
    assert!(!dir.exists());
    assert_eq!(names_in(&budgets_dir(&env)), Vec::<String>::new());
}

/// A launcher killed between making its budget's directory and writing the
/// manifest leaves, beside a run directory without status, an empty
/// directory named after the run: finishing the run removes it (seen once
/// in 15 fault trials of `launcher-kill-during-creation`).
#[test]
fn an_empty_budget_directory_of_an_abandoned_run_is_removed() {
    let env = Env::new();
    let id = killed_launch(&env, "after-run-dir");
    let dir = env.run_dir(&id);
    let budgets = names_in(&budgets_dir(&env));
    assert_eq!(budgets.len(), 1, "{budgets:?}");
    // What the kill left at that instant: no file in either directory.
    for parent in [dir.clone(), budgets_dir(&env).join(&budgets[0])] {
        for entry in std::fs::read_dir(&parent).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                std::fs::remove_dir_all(&path).unwrap();
            } else {
                std::fs::remove_file(&path).unwrap();
            }
        }
    }
    age(&dir, 60);
    env.ok(&["reconcile"]);
    let proof = read_json(&dir.join("process-terminal.json"));
    assert_eq!(proof["state"], "not-started", "{proof}");
    assert_eq!(names_in(&budgets_dir(&env)), Vec::<String>::new());
}

#[test]
fn a_slot_that_cannot_be_written_refuses_the_launch() {
    let env = Env::new();
    // A file where the session's pool directory must be: fails for root too.
    let capacity = env.root().join("session-active-async-capacity");
    std::fs::create_dir_all(&capacity).unwrap();
    std::fs::write(pool_dir(&env), "").unwrap();
    let out = env.run(&["run", "--session", SESSION, "--", "true"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    let pool = pool_dir(&env);
    assert!(stderr.contains(pool.to_str().unwrap()), "{stderr}");
    assert_eq!(run_ids(&env), Vec::<String>::new(), "a run was started");
}

#[test]
fn a_finished_run_frees_its_slot_before_any_reader_comes() {
    let env = Env::new();
    let mut ids = Vec::new();
    for _ in 0..3 {
        let out = env.ok(&["run", "--session", SESSION, "--", "true"]);
        ids.push(out.trim().to_owned());
    }
    // The marker goes last, after the proof and the slot.
    poll(Duration::from_secs(30), || {
        ids.iter().all(|id| !env.marker(id).exists())
    });
    for id in &ids {
        let proof = read_json(&env.run_dir(id).join("process-terminal.json"));
        assert_eq!(proof["state"], "observed", "{proof}");
    }
    assert_eq!(slot_dirs(&env), Vec::<String>::new());
}

#[test]
fn prune_removes_a_budget_nobody_claimed_from() {
    let env = Env::new();
    let id = env.ok(&["run", "--wait", "--session", SESSION, "--", "true"]);
    env.settled(id.trim());
    let budgets = names_in(&budgets_dir(&env));
    assert_eq!(budgets.len(), 1, "{budgets:?}");
    // As a launcher killed before its claim leaves it: no admission lock yet.
    let budget = budgets_dir(&env).join(&budgets[0]);
    std::fs::remove_file(budget.join("admission.flock")).unwrap();
    env.ok(&["prune", "--older-than", "0s"]);
    assert!(!env.run_dir(id.trim()).exists());
    assert!(!budget.exists(), "{:?}", names_in(&budget));
}

#[test]
fn reconcile_removes_a_finished_runs_temp_files_whose_writer_is_gone() {
    let env = Env::new();
    let id = env.ok(&["run", "--wait", "--session", SESSION, "--", "true"]);
    let id = id.trim();
    env.settled(id);
    let dir = env.run_dir(id);
    // A writer that provably exited (reaped here), and one that lives: us.
    let mut gone = Command::new("true").spawn().unwrap();
    let dead = gone.id();
    gone.wait().unwrap();
    let orphan = dir.join(format!(".status.json.{dead}.00112233aabbccdd.tmp"));
    let live = dir.join(format!(
        ".status.json.{}.8899aabbccddeeff.tmp",
        std::process::id()
    ));
    // A file of the run's own that only ends in `.tmp`, long past the
    // grace: not a temp file of ours (those start with `.`), so it stays.
    let own = dir.join("notes.1.2.tmp");
    std::fs::write(&orphan, "{").unwrap();
    std::fs::write(&live, "{").unwrap();
    std::fs::write(&own, "keep").unwrap();
    age(&own, 86_400);
    env.ok(&["reconcile"]);
    assert!(!orphan.exists(), "{:?}", names_in(&dir));
    assert!(live.exists(), "a live writer's temp file was removed");
    assert!(own.exists(), "{:?}", names_in(&dir));
}
