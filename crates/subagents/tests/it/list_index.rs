//! `list --all` prints the same bytes with the listing index as without it,
//! over a root of varied runs, after runs change and after runs are gone.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use serde_json::{Value, json};

fn index(env: &Env) -> PathBuf {
    env.root().join("listing-index/finished-runs-v2")
}

fn index_rows(env: &Env) -> Option<u64> {
    let text = std::fs::read_to_string(index(env)).ok()?;
    let header: Value = serde_json::from_str(text.lines().nth(1)?).ok()?;
    header["rows"].as_u64()
}

/// Finished runs whose listing facts are frozen: the ones the index holds
/// (a dismissed one too, hidden).
fn frozen_runs(env: &Env) -> u64 {
    let runs = env.root().join("async-subagent-runs");
    let mut count = 0;
    for entry in std::fs::read_dir(&runs).unwrap().flatten() {
        let status = std::fs::read_to_string(entry.path().join("status.json"));
        let status: Value = status
            .ok()
            .and_then(|s| serde_json::from_str(&s).ok())
            .unwrap_or_default();
        if status.get("listingFacts").is_some() {
            count += 1;
        }
    }
    count
}

/// Lists until the index holds every frozen run (statuses are indexed once
/// they are a couple of seconds old), returning the last listing.
fn warm_listing(env: &Env, rows: u64) -> String {
    let mut out = String::new();
    poll(Duration::from_secs(120), || {
        out = env.ok(&["list", "--all"]);
        index_rows(env) == Some(rows)
    });
    out
}

/// A listing with no index at all.
fn cold_listing(env: &Env) -> String {
    let _ = std::fs::remove_file(index(env));
    env.ok(&["list", "--all"])
}

/// `list --all` with the index as it is, then without it: the same bytes.
fn assert_same(env: &Env, what: &str) -> String {
    let warm = env.ok(&["list", "--all"]);
    assert!(index(env).exists());
    let cold = cold_listing(env);
    assert_eq!(
        without_ages(&warm),
        without_ages(&cold),
        "{what}: the index changed the listing"
    );
    warm
}

/// The listing with an active run's "active 3s ago" made "active <age> ago":
/// the two listings may straddle a second, and active runs are never indexed
/// (rows that show a time relative to now are read live).
fn without_ages(listing: &str) -> String {
    listing
        .lines()
        .map(|line| match line.split_once("| active ") {
            Some((head, rest)) => match rest.split_once(" ago") {
                Some((_, tail)) => format!("{head}| active <age> ago{tail}"),
                None => line.to_owned(),
            },
            None => line.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A finished run as pi-subagents writes it: no frozen listing facts.
fn reference_run(env: &Env, id: &str) {
    let dir = env.root().join("async-subagent-runs").join(id);
    std::fs::create_dir_all(&dir).unwrap();
    let now = status::now_ms();
    let status = json!({
        "runId": id, "lifecycleArtifactVersion": 3, "mode": "single",
        "state": "complete", "startedAt": now - 9000, "endedAt": now - 8000,
        "lastUpdate": now - 8000, "currentStep": 0, "cwd": env.work(),
        "steps": [{"agent": "worker", "status": "complete", "durationMs": 1000}],
        "processTerminal": {"version": 1, "state": "observed", "runId": id,
            "runnerProcessInstanceId": format!("runner-{id}")}
    });
    std::fs::write(dir.join("status.json"), status.to_string()).unwrap();
    chmod_private(&dir);
}

fn chmod_private(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    for path in [dir.parent().unwrap(), dir] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    let file = dir.join("status.json");
    std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o600)).unwrap();
}

#[test]
fn list_all_is_the_same_with_and_without_the_index() {
    let env = Env::new();
    let ok = env.ok(&["run", "--wait", "--", "true"]).trim().to_owned();
    let failed = env.run(&["run", "--wait", "--", "sh", "-c", "exit 3"]);
    assert!(!failed.status.success());
    let secret = "TASK-TEXT-NEVER-IN-THE-INDEX";
    env.ok(&["run", "--wait", "--task", secret, "--", "cat"]);
    let stopped = env.ok(&["run", "--", "sleep", "300"]).trim().to_owned();
    env.ok(&["stop", &stopped]);
    env.settled(&stopped);
    let spec = json!({"mode": "chain", "steps": [
        {"agent": "scout", "command": ["sh", "-c", "echo one"]},
        {"parallel": [
            {"agent": "a", "command": ["true"]},
            {"agent": "b", "command": ["true"]}
        ], "concurrency": 2}
    ]});
    let spec_file = Path::new(env.work()).join("chain.json");
    std::fs::write(&spec_file, spec.to_string()).unwrap();
    let chain = env.ok(&["run", "--spec", spec_file.to_str().unwrap(), "--wait"]);
    let chain = chain.trim().to_owned();
    reference_run(&env, "ref-complete");
    let active = env.ok(&["run", "--", "sleep", "300"]).trim().to_owned();

    let rows = frozen_runs(&env);
    assert_eq!(rows, 5, "our five finished runs are frozen");
    let warm = warm_listing(&env, rows);
    for id in [&ok, &stopped, &chain, &active] {
        assert!(warm.contains(id.as_str()), "{id} missing:\n{warm}");
    }
    assert!(warm.contains("ref-complete"));
    let first = assert_same(&env, "fresh index");
    assert_eq!(without_ages(&first), without_ages(&warm));
    let stored = std::fs::read_to_string(index(&env)).unwrap();
    assert!(
        !stored.contains(secret),
        "task text in the index:\n{stored}"
    );

    // A status rewritten in place after indexing, same size, same mtime:
    // only its change time moved.
    warm_listing(&env, rows);
    let path = env.run_dir(&ok).join("status.json");
    let before = std::fs::metadata(&path).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let changed = text.replacen("\"mode\": \"single\"", "\"mode\": \"SINGLE\"", 1);
    assert_ne!(changed, text);
    std::fs::write(&path, &changed).unwrap();
    let file = std::fs::File::options().write(true).open(&path).unwrap();
    file.set_modified(before.modified().unwrap()).unwrap();
    let after = assert_same(&env, "a run changed after indexing");
    assert!(after.contains("SINGLE"), "{after}");

    // A run deleted, another dismissed.
    warm_listing(&env, rows);
    std::fs::remove_dir_all(env.run_dir(&chain)).unwrap();
    env.ok(&["dismiss", &stopped, "--force"]);
    let after = assert_same(&env, "a run deleted and one dismissed");
    assert!(!after.contains(chain.as_str()) && !after.contains(stopped.as_str()));
    warm_listing(&env, frozen_runs(&env));
    assert_same(&env, "after the index dropped them");

    env.ok(&["stop", &active]);
    env.settled(&active);
}
