//! `subagents prune` on real runs: what goes, what stays and why, and a
//! prune racing real concurrent launches.

use crate::common;

use std::path::PathBuf;
use std::time::Duration;

use common::*;
use serde_json::Value;

const DAY_MS: u64 = 86_400_000;

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// A finished run (exit 0), settled.
fn finished(env: &Env) -> String {
    let id = env
        .ok(&["run", "--wait", "--", "sh", "-c", "echo done"])
        .lines()
        .next()
        .unwrap()
        .to_owned();
    env.settled(&id);
    id
}

fn run_dir(env: &Env, id: &str) -> PathBuf {
    env.root().join("async-subagent-runs").join(id)
}

/// Moves a finished run's end `days` into the past (the test's fixture).
fn age(env: &Env, id: &str, days: u64) {
    let path = run_dir(env, id).join("status.json");
    let mut status: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let then = now_ms() - days * DAY_MS;
    for key in ["startedAt", "endedAt", "lastUpdate", "lastActivityAt"] {
        if status.get(key).is_some() {
            status[key] = then.into();
        }
    }
    std::fs::write(&path, status.to_string()).unwrap();
}

fn budget_dir(env: &Env, id: &str) -> PathBuf {
    let text = std::fs::read_to_string(run_dir(env, id).join("run-fanout-budget.json")).unwrap();
    let descriptor: Value = serde_json::from_str(&text).unwrap();
    let name = PathBuf::from(descriptor["directory"].as_str().unwrap());
    env.root()
        .join("run-fanout-budgets")
        .join(name.file_name().unwrap())
}

fn prune_json(env: &Env, args: &[&str]) -> Value {
    let mut all = vec!["prune", "--json"];
    all.extend_from_slice(args);
    serde_json::from_str(&env.ok(&all)).unwrap()
}

fn ids(list: &Value) -> Vec<String> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|e| e["runId"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn prune_deletes_old_finished_runs_with_their_budget_and_keeps_recent_ones() {
    let env = Env::new();
    let old = finished(&env);
    let recent = finished(&env);
    age(&env, &old, 8);
    let old_budget = budget_dir(&env, &old);
    let recent_budget = budget_dir(&env, &recent);
    assert!(old_budget.is_dir());

    let dry = prune_json(&env, &["--dry-run"]);
    assert_eq!(ids(&dry["pruned"]), vec![old.clone()]);
    assert_eq!(dry["dryRun"], true);
    assert!(run_dir(&env, &old).is_dir(), "--dry-run deleted the run");
    assert!(old_budget.is_dir(), "--dry-run deleted the budget");

    let done = prune_json(&env, &[]);
    assert_eq!(ids(&done["pruned"]), vec![old.clone()]);
    assert_eq!(done["olderThanMs"], 7 * DAY_MS);
    assert!(!run_dir(&env, &old).exists());
    assert!(!old_budget.exists(), "the pruned run's own budget stayed");
    assert!(run_dir(&env, &recent).is_dir());
    assert!(recent_budget.is_dir());
    assert_eq!(env.run(&["status", &old]).status.code(), Some(4));
    assert_eq!(env.status_json(&recent)["state"], "complete");

    // Nothing left to do: a second prune deletes nothing.
    assert_eq!(ids(&prune_json(&env, &[])["pruned"]), Vec::<String>::new());
}

#[test]
fn prune_keeps_unproven_and_live_runs_and_says_why() {
    let env = Env::new();
    let unproven = finished(&env);
    age(&env, &unproven, 30);
    // Without its proof the run's exit was never observed.
    std::fs::remove_file(run_dir(&env, &unproven).join("process-terminal.json")).unwrap();
    let path = run_dir(&env, &unproven).join("status.json");
    let mut status: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    status.as_object_mut().unwrap().remove("processTerminal");
    std::fs::write(&path, status.to_string()).unwrap();

    let live = env.ok(&["run", "--", "sleep", "300"]).trim().to_owned();
    env.wait_for_child_pid(&live);

    let out = prune_json(&env, &["--older-than", "0s"]);
    assert_eq!(ids(&out["pruned"]), Vec::<String>::new(), "{out}");
    let kept = out["kept"].as_array().unwrap();
    let reason = |id: &str| {
        kept.iter()
            .find(|k| k["runId"] == id)
            .map(|k| k["reason"].as_str().unwrap().to_owned())
            .unwrap_or_default()
    };
    assert_eq!(reason(&unproven), "it has no process-terminal proof");
    assert_eq!(reason(&live), "it is still running");
    assert!(run_dir(&env, &unproven).is_dir());
    assert_eq!(env.status_json(&live)["state"], "running");

    let text = env.ok(&["prune", "--older-than", "0s"]);
    assert!(
        text.contains(&format!("kept {live}: it is still running")),
        "{text}"
    );
    env.ok(&["stop", &live]);
}

/// A paused run (the reference's checkpoint: its runner may come back, and a
/// resume takes over its capacity slot) is over for listings but still holds
/// its slot: pruning it would leave the slot held for good.
#[test]
fn prune_keeps_a_paused_run_that_still_holds_its_slot() {
    let env = Env::new();
    let paused = finished(&env);
    let done = finished(&env);
    age(&env, &paused, 30);
    age(&env, &done, 29);
    let path = run_dir(&env, &paused).join("status.json");
    let mut status: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    status["state"] = "paused".into();
    std::fs::write(&path, status.to_string()).unwrap();

    let out = prune_json(&env, &["--older-than", "7d"]);
    assert_eq!(ids(&out["pruned"]), vec![done.clone()], "{out}");
    let kept = out["kept"].as_array().unwrap();
    let reason = kept
        .iter()
        .find(|k| k["runId"] == paused.as_str())
        .and_then(|k| k["reason"].as_str());
    assert_eq!(reason, Some("it is still paused"), "{out}");
    assert!(run_dir(&env, &paused).is_dir());
    assert!(!run_dir(&env, &done).exists());
}

#[test]
fn prune_rejects_a_bad_duration_as_usage() {
    let env = Env::new();
    let out = env.run(&["prune", "--older-than", "soon"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--older-than"), "{stderr}");
}

#[test]
fn prune_racing_concurrent_launches_never_touches_their_runs() {
    let env = Env::new();
    let old: Vec<String> = (0..3).map(|_| finished(&env)).collect();
    for id in &old {
        age(&env, id, 10);
    }
    // Four launcher processes at a time, three runs each, while prune runs.
    let launched = std::thread::scope(|scope| {
        let launchers: Vec<_> = (0..4)
            .map(|_| {
                scope.spawn(|| {
                    (0..3)
                        .map(|_| {
                            let out = env.run(&["run", "--wait", "--", "sh", "-c", "echo fresh"]);
                            assert!(out.status.success(), "{out:?}");
                            String::from_utf8(out.stdout).unwrap().trim().to_owned()
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for _ in 0..5 {
            let out = env.run(&["prune", "--older-than", "1h", "--json"]);
            assert!(out.status.success(), "{out:?}");
        }
        launchers
            .into_iter()
            .flat_map(|l| l.join().unwrap())
            .collect::<Vec<_>>()
    });
    assert_eq!(launched.len(), 12);
    for id in &launched {
        assert_eq!(env.settled(id)["state"], "complete", "run {id}");
        assert!(
            budget_dir(&env, id).is_dir(),
            "the budget of {id} was deleted"
        );
        assert_eq!(env.ok(&["logs", id]), "fresh\n");
    }
    for id in &old {
        assert!(!run_dir(&env, id).exists(), "old run {id} survived");
    }
    poll(Duration::from_secs(5), || {
        !env.root().join("async-subagent-runs/.active-runs").is_dir()
            || std::fs::read_dir(env.root().join("async-subagent-runs/.active-runs"))
                .unwrap()
                .count()
                == 0
    });
}

/// A process that stands for a run's monitor or runner still alive; killed
/// on drop, also when the test fails.
struct Alive(std::process::Child);

impl Drop for Alive {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `record[key]` made the identity of `alive`: its pid and start time, the
/// rest (boot, machine, host) as recorded.
fn point_at(record: &mut Value, key: &str, alive: &Alive) {
    let pid = alive.0.id();
    record[key]["pid"] = pid.into();
    record[key]["startTime"] = proc_start_time(pid).into();
}

#[test]
fn prune_keeps_a_proven_run_while_either_its_runner_or_its_monitor_is_alive() {
    let env = Env::new();
    let id = finished(&env);
    age(&env, &id, 30);
    let path = run_dir(&env, &id).join("status.json");
    let original = std::fs::read_to_string(&path).unwrap();
    let alive = Alive(
        std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap(),
    );
    for key in ["runnerIdentity", "monitorIdentity"] {
        let mut status: Value = serde_json::from_str(&original).unwrap();
        point_at(&mut status, key, &alive);
        std::fs::write(&path, status.to_string()).unwrap();
        let out = prune_json(&env, &["--older-than", "0s"]);
        assert_eq!(ids(&out["pruned"]), Vec::<String>::new(), "{key}: {out}");
        assert_eq!(
            out["kept"][0]["reason"], "its runner or monitor is still alive",
            "{key}: {out}"
        );
    }
    std::fs::write(&path, &original).unwrap();
    let out = prune_json(&env, &["--older-than", "0s"]);
    assert_eq!(ids(&out["pruned"]), vec![id], "{out}");
}

/// `chattr +i` on a file (no one may delete it, root neither); undone on
/// drop, also when the test fails. `None` where the file system has no
/// such flag.
struct Immutable(PathBuf);

impl Immutable {
    fn set(path: PathBuf) -> Option<Self> {
        let done = std::process::Command::new("chattr")
            .arg("+i")
            .arg(&path)
            .status();
        done.is_ok_and(|s| s.success()).then_some(Self(path))
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        let _ = std::process::Command::new("chattr")
            .arg("-i")
            .arg(&self.0)
            .status();
    }
}

#[test]
fn a_run_whose_status_cannot_be_deleted_is_kept_whole() {
    let env = Env::new();
    let id = finished(&env);
    let dir = run_dir(&env, &id);
    let Some(pinned) = Immutable::set(dir.join("status.json")) else {
        eprintln!("skipped: chattr +i is not supported here");
        return;
    };
    let out = prune_json(&env, &["--older-than", "0s"]);
    assert_eq!(ids(&out["pruned"]), Vec::<String>::new(), "{out}");
    let reason = out["kept"][0]["reason"].as_str().unwrap_or_default();
    assert!(reason.starts_with("failed to delete it"), "{out}");
    // status.json goes first: nothing else of the run went.
    for file in ["events.jsonl", "process-terminal.json", "output-0.log"] {
        assert!(dir.join(file).exists(), "{file} was deleted: {out}");
    }
    drop(pinned);
    let out = prune_json(&env, &["--older-than", "0s"]);
    assert_eq!(ids(&out["pruned"]), vec![id], "{out}");
}

#[test]
fn prune_keeps_the_budget_of_a_pruned_root_run_while_a_nested_run_uses_it() {
    let env = Env::new();
    let child_file = env.root().join("child-id");
    let script = format!(
        r#""$SUBAGENTS_BIN" run -- sleep 300 > '{}'"#,
        child_file.display()
    );
    let mut command = env.command(&["run", "--wait", "--", "sh", "-c", &script]);
    command.env("SUBAGENTS_BIN", env!("CARGO_BIN_EXE_subagents"));
    let out = command.output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let root = String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap()
        .to_owned();
    env.settled(&root);
    let child = std::fs::read_to_string(&child_file)
        .unwrap()
        .trim()
        .to_owned();
    let budget = budget_dir(&env, &root);
    assert_eq!(budget, budget_dir(&env, &child), "one budget for the tree");

    let out = prune_json(&env, &["--older-than", "0s"]);
    assert_eq!(ids(&out["pruned"]), vec![root], "{out}");
    assert_eq!(out["budgets"], serde_json::json!([]), "{out}");
    assert!(budget.is_dir(), "the budget went while {child} uses it");
    env.ok(&["stop", &child]);
}

#[test]
fn prune_leaves_a_budget_whose_lock_file_is_a_symlink() {
    let env = Env::new();
    let id = finished(&env);
    let budget = budget_dir(&env, &id);
    let lock = budget.join("admission.flock");
    let target = env.root().join("not-a-lock");
    std::fs::write(&target, "keep").unwrap();
    std::fs::remove_file(&lock).unwrap();
    std::os::unix::fs::symlink(&target, &lock).unwrap();

    let out = prune_json(&env, &["--older-than", "0s"]);
    assert_eq!(ids(&out["pruned"]), vec![id], "{out}");
    // The lock is not followed: the budget stays, the file it names too.
    assert_eq!(out["budgets"], serde_json::json!([]), "{out}");
    assert!(budget.is_dir(), "{out}");
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
}

#[test]
fn prune_leaves_a_hidden_budget_directory_that_a_run_names() {
    let env = Env::new();
    let id = finished(&env);
    // The run's descriptor is made to name a hidden entry of the budgets
    // directory, one prune never made, though its manifest names the run.
    let budget = budget_dir(&env, &id);
    let hidden = budget.with_file_name(".kept-by-someone");
    std::fs::rename(&budget, &hidden).unwrap();
    let descriptor = run_dir(&env, &id).join("run-fanout-budget.json");
    let mut value: Value = serde_json::from_slice(&std::fs::read(&descriptor).unwrap()).unwrap();
    value["directory"] = hidden.to_str().unwrap().into();
    std::fs::write(&descriptor, value.to_string()).unwrap();

    let out = prune_json(&env, &["--older-than", "0s"]);
    assert_eq!(ids(&out["pruned"]), vec![id], "{out}");
    assert_eq!(out["budgets"], serde_json::json!([]), "{out}");
    assert!(hidden.join("admission.flock").is_file(), "{out}");
}

/// A revival whose monitor and runner were killed leaves its session
/// lease behind; prune takes the lease with the run (a dry run only names
/// it) and keeps the lease of a run it keeps.
#[test]
fn prune_deletes_the_session_lease_a_killed_revival_left() {
    let f = crate::agents::Fixture::new();
    let (source, _) = f.launch(&["run", "--agent", "reviewer", "--task", "review", "--json"]);
    let hold = f.env.fifo("hold");
    let revived = f.resume_held(&source, "follow up", &hold);
    let status = f.env.status_json(&revived);
    crate::damaged::kill_all(&status, &["/monitorIdentity/pid", "/runnerIdentity/pid"]);
    f.ok(&["reconcile"]);
    let leases = f.env.root().join("session-leases");
    let lease = only_entry(&leases);
    let owner: Value =
        serde_json::from_slice(&std::fs::read(lease.join("owner.json")).unwrap()).unwrap();
    assert_eq!(owner["runId"], revived.as_str(), "{owner}");
    // A lease of a run prune keeps (its owner is the kept source run).
    let kept = leases.join("kept-session");
    std::fs::create_dir(&kept).unwrap();
    let mut other = owner.clone();
    other["runId"] = source.as_str().into();
    std::fs::write(kept.join("owner.json"), other.to_string()).unwrap();
    let name = lease.file_name().unwrap().to_str().unwrap().to_owned();
    let named = serde_json::json!([format!("{name} (run {revived})")]);
    age(&f.env, &revived, 8);

    let dry = prune_json(&f.env, &["--dry-run"]);
    assert_eq!(ids(&dry["pruned"]), vec![revived.clone()], "{dry}");
    assert_eq!(dry["leases"], named, "{dry}");
    assert!(lease.is_dir(), "--dry-run deleted the lease");

    let done = prune_json(&f.env, &[]);
    assert_eq!(done["leases"], named, "{done}");
    assert!(!lease.exists(), "{done}");
    assert!(kept.join("owner.json").is_file(), "{done}");
}

fn only_entry(dir: &std::path::Path) -> PathBuf {
    let entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(entries.len(), 1, "{entries:?}");
    entries.into_iter().next().unwrap()
}
