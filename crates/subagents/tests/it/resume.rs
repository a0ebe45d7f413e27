//! End-to-end tests of `resume` (recovery descriptor, launch contract,
//! session lease, startup handshake) and `validate`, with the real binary.

use crate::common;

use std::path::{Path, PathBuf};

use common::*;
use serde_json::{Value, json};

const ECHO: &str = r#"echo "task: $(cat)"; echo "previous: ${SUBAGENTS_PREVIOUS_OUTPUT:-none}"; echo "from: ${SUBAGENTS_RESUMED_FROM:-none}""#;

fn run_dir(env: &Env, id: &str) -> PathBuf {
    env.root().join("async-subagent-runs").join(id)
}

fn lease_dirs(env: &Env) -> Vec<String> {
    match std::fs::read_dir(env.root().join("session-leases")) {
        Ok(entries) => entries
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| !n.contains(".stale-") && !n.contains(".released-") && !n.starts_with('.'))
            .collect(),
        Err(_) => Vec::new(),
    }
}

#[test]
fn a_completed_run_is_revived_with_a_follow_up() {
    let env = Env::new();
    let source = env
        .ok(&["run", "--wait", "--task", "first", "--", "sh", "-c", ECHO])
        .trim()
        .to_owned();
    let out: Value =
        serde_json::from_str(&env.ok(&["resume", &source, "--task", "continue", "--json"]))
            .unwrap();
    assert_eq!(out["sourceRunId"], source.as_str());
    let revived = out["runId"].as_str().unwrap().to_owned();
    env.ok(&["wait", &revived]);
    let logs = env.ok(&["logs", &revived]);
    // The follow-up reaches the command as given: no revival wrapper.
    assert!(logs.contains("task: continue\n"), "{logs}");
    assert!(!logs.contains("Original run: "), "{logs}");
    let source_output = run_dir(&env, &source).join("output-0.log");
    assert!(
        logs.contains(&format!("previous: {}", source_output.display())),
        "{logs}"
    );
    assert!(logs.contains(&format!("from: {source}")), "{logs}");
    let status = env.settled(&revived);
    assert_eq!(status["state"], "complete");
    assert_eq!(status["resumedFrom"], source.as_str());
    assert_eq!(status["processTerminal"]["state"], "observed", "{status}");
    assert_eq!(
        status["processTerminal"]["canonicalSession"]["leaseDisposition"],
        "released"
    );
    assert!(lease_dirs(&env).is_empty(), "the lease is free");
    let events = env.events(&source);
    assert_eq!(events.last().unwrap()["type"], "subagent.run.resumed");
    assert_eq!(events.last().unwrap()["resumedAs"], revived.as_str());
    // The revival's own recovery files keep the lineage's session file, so it can be revived again.
    let again = env
        .ok(&["resume", &revived, "--task", "and again"])
        .trim()
        .to_owned();
    env.ok(&["wait", &again]);
    assert!(env.ok(&["logs", &again]).contains("task: and again\n"));
    let descriptor: Value = serde_json::from_slice(
        &std::fs::read(run_dir(&env, &again).join("recovery-descriptor.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(descriptor["sessionFile"], json!(source_output));
}

#[test]
fn a_failed_run_is_revived() {
    let env = Env::new();
    let source = env.run(&["run", "--wait", "--", "sh", "-c", "echo partial; exit 3"]);
    assert_eq!(source.status.code(), Some(1));
    let source = String::from_utf8(source.stdout).unwrap().trim().to_owned();
    let revived = env
        .ok(&["resume", &source, "--task", "try again"])
        .trim()
        .to_owned();
    let wait = env.run(&["wait", &revived]);
    assert_eq!(wait.status.code(), Some(1), "the same command fails again");
    assert_eq!(env.status_json(&revived)["resumedFrom"], source.as_str());
}

#[test]
fn two_concurrent_resumes_one_wins_the_other_gets_a_conflict() {
    let env = Env::new();
    let fifo = env.fifo("gate.fifo");
    // The source finishes at once; its revivals block on the fifo while they hold the lease.
    let script = format!(
        "[ -n \"$SUBAGENTS_RESUMED_FROM\" ] && read line < '{}'; true",
        fifo.display()
    );
    let source = env
        .ok(&["run", "--wait", "--", "sh", "-c", &script])
        .trim()
        .to_owned();
    let first = env
        .ok(&["resume", &source, "--task", "one"])
        .trim()
        .to_owned();
    let second = env.run(&["resume", &source, "--task", "two", "--json"]);
    assert_eq!(second.status.code(), Some(1), "{second:?}");
    let error: Value = serde_json::from_slice(&second.stdout).unwrap();
    let message = error["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("is already owned by run") && message.contains(&first),
        "{message}"
    );
    // The loser: failed, never proceeded, its runner gone, its proof observed.
    let runs: Value = serde_json::from_str(&env.ok(&["list", "--all", "--json"])).unwrap();
    let loser = runs
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] != first.as_str() && r["id"] != source.as_str())
        .unwrap()
        .clone();
    let loser_id = loser["id"].as_str().unwrap().to_owned();
    let status = env.settled(&loser_id);
    assert_eq!(status["state"], "failed");
    assert!(
        status["error"].as_str().unwrap().contains("already owned"),
        "{status}"
    );
    assert!(!alive(status["pid"].as_u64().unwrap_or(0) as u32) || status["pid"].is_null());
    assert_eq!(
        status["steps"][0]["processTerminal"]["state"], "not-started",
        "{status}"
    );
    let startup = run_dir(&env, &loser_id).join("runner-startup.json");
    assert_eq!(
        serde_json::from_str::<Value>(&std::fs::read_to_string(&startup).unwrap()).unwrap()["state"],
        "error"
    );
    assert_eq!(
        env.ok(&["validate", "--kind", "startup", startup.to_str().unwrap()])
            .lines()
            .count(),
        1
    );
    assert_eq!(lease_dirs(&env).len(), 1, "the winner holds the lease");
    std::fs::write(&fifo, "go\n").unwrap();
    env.settled(&first);
    assert_eq!(env.status_json(&first)["state"], "complete");
    assert!(
        lease_dirs(&env).is_empty(),
        "released after the winner finished"
    );
}

#[test]
fn what_is_not_resumable_is_refused_clearly() {
    let env = Env::new();
    let running = env.ok(&["run", "--", "sleep", "300"]).trim().to_owned();
    let out = env.run(&["resume", &running, "--task", "x"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is still running"),
        "{out:?}"
    );
    env.ok(&["stop", &running]);
    let done = env.ok(&["run", "--wait", "--", "true"]).trim().to_owned();
    let out = env.run(&["resume", &done]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("a follow-up task is required"),
        "{out:?}"
    );
    let spec = Path::new(env.work()).join("p.json");
    std::fs::write(
        &spec,
        json!({"mode": "parallel", "tasks": [{"agent": "a", "command": ["true"]}]}).to_string(),
    )
    .unwrap();
    let composite = env
        .ok(&["run", "--spec", spec.to_str().unwrap(), "--wait"])
        .trim()
        .to_owned();
    let out = env.run(&["resume", &composite, "--task", "x"]);
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("it is a parallel run, and resume continues single runs only"),
        "{out:?}"
    );
    assert_eq!(
        env.run(&["resume", "nope", "--task", "x"]).status.code(),
        Some(4)
    );
}

#[test]
fn a_corrupted_descriptor_or_tampered_contract_is_refused_naming_the_field() {
    let env = Env::new();
    let source = env.ok(&["run", "--wait", "--", "true"]).trim().to_owned();
    let dir = run_dir(&env, &source);
    let descriptor_path = dir.join("recovery-descriptor.json");
    let original = std::fs::read_to_string(&descriptor_path).unwrap();
    let mut unknown: Value = serde_json::from_str(&original).unwrap();
    unknown["surprise"] = json!(1);
    std::fs::write(&descriptor_path, unknown.to_string()).unwrap();
    let out = env.run(&["resume", &source, "--task", "x"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unknown field 'surprise'"),
        "{out:?}"
    );
    let mut wrong: Value = serde_json::from_str(&original).unwrap();
    wrong["share"] = json!("yes");
    std::fs::write(&descriptor_path, wrong.to_string()).unwrap();
    let out = env.run(&["resume", &source, "--task", "x"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("share"),
        "{out:?}"
    );
    std::fs::write(&descriptor_path, &original).unwrap();
    let contract = dir.join("launch-contract.json");
    let tampered = std::fs::read_to_string(&contract)
        .unwrap()
        .replace("\"true\"", "\"false\"");
    std::fs::write(&contract, tampered).unwrap();
    let out = env.run(&["resume", &source, "--task", "x"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("launch-contract.json"), "{stderr}");
    let runs = env.run_count();
    assert_eq!(runs, 1, "nothing was launched");
}

#[test]
fn the_task_text_never_reaches_the_recovery_files() {
    let env = Env::new();
    let secret = "SENTINEL-resume-4c1d";
    let source = env
        .ok(&[
            "run",
            "--wait",
            "--task",
            secret,
            "--",
            "sh",
            "-c",
            "cat >/dev/null",
        ])
        .trim()
        .to_owned();
    let revived = env
        .ok(&["resume", &source, "--task", &format!("{secret} again")])
        .trim()
        .to_owned();
    env.settled(&revived);
    for path in walk(env.root()) {
        let text = String::from_utf8_lossy(&std::fs::read(&path).unwrap_or_default()).into_owned();
        let is_task = path.file_name().unwrap() == "task.md";
        assert_eq!(text.contains(secret), is_task, "{}", path.display());
    }
}

/// The source's monitor freed its slot with its proof, so the revival
/// takes a slot of its own (a source that still held one would hand it on).
#[test]
fn a_revival_is_counted_in_its_sessions_capacity() {
    let env = Env::new();
    // Source and revival run the same argv: each waits for one line on the gate,
    // so the revival is provably still running when its slot is inspected.
    let gate = env.fifo("gate.fifo");
    let wait = format!("read line < '{}'", gate.display());
    let source = env
        .ok(&[
            "run",
            "--session",
            "s",
            "--max-active",
            "1",
            "--",
            "sh",
            "-c",
            &wait,
        ])
        .trim()
        .to_owned();
    std::fs::write(&gate, "go\n").unwrap();
    env.ok(&["wait", &source]);
    let freed: Value =
        serde_json::from_str(&env.ok(&["capacity", "--session", "s", "--json"])).unwrap();
    assert_eq!(freed["used"], 0, "{freed}");
    let revived = env
        .ok(&["resume", &source, "--task", "more", "--max-active", "1"])
        .trim()
        .to_owned();
    let capacity: Value =
        serde_json::from_str(&env.ok(&["capacity", "--session", "s", "--limit", "1", "--json"]))
            .unwrap();
    let slot = &capacity["slots"][0]["slot"];
    assert_eq!(slot["runId"], revived.as_str(), "{capacity}");
    assert_eq!(capacity["used"], 1, "{capacity}");
    std::fs::write(&gate, "go\n").unwrap();
    env.settled(&revived);
    let capacity: Value =
        serde_json::from_str(&env.ok(&["capacity", "--session", "s", "--limit", "1", "--json"]))
            .unwrap();
    assert_eq!(capacity["used"], 0, "{capacity}");
}

#[test]
fn validate_accepts_every_artifact_and_rejects_corrupted_copies() {
    let env = Env::new();
    let id = env
        .ok(&[
            "run",
            "--wait",
            "--session",
            "v",
            "--max-active",
            "5",
            "--",
            "true",
        ])
        .trim()
        .to_owned();
    env.settled(&id);
    let dir = run_dir(&env, &id);
    let manifest = std::fs::read_dir(env.root().join("run-fanout-budgets"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path()
        .join("manifest.json");
    let cases: Vec<(&str, PathBuf, &str, Value)> = vec![
        (
            "recovery",
            dir.join("recovery-descriptor.json"),
            "agent",
            json!(7),
        ),
        (
            "launch-contract",
            dir.join("launch-contract.json"),
            "command",
            json!("true"),
        ),
        (
            "fanout-descriptor",
            dir.join("run-fanout-budget.json"),
            "limit",
            json!(3),
        ),
        ("fanout-manifest", manifest, "limit", json!(-1)),
        (
            "process-terminal",
            dir.join("process-terminal.json"),
            "state",
            json!("bogus"),
        ),
        (
            "terminal-candidate",
            dir.join("process-terminal-candidate.json"),
            "writers",
            json!([]),
        ),
        ("status", dir.join("status.json"), "sessionId", json!(5)),
    ];
    for (kind, file, field, bad) in cases {
        env.ok(&["validate", "--kind", kind, file.to_str().unwrap()]);
        let mut value: Value =
            serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        value[field] = bad;
        let copy = Path::new(env.work()).join(format!("{kind}.json"));
        std::fs::write(&copy, value.to_string()).unwrap();
        let out = env.run(&["validate", "--kind", kind, copy.to_str().unwrap(), "--json"]);
        assert_eq!(out.status.code(), Some(1), "{kind}");
        let verdict: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(verdict["valid"], false);
        let error = verdict["error"].as_str().unwrap();
        assert!(
            error.contains(field) || (kind == "fanout-descriptor" && error.contains("manifest")),
            "{kind}: {error}"
        );
        assert!(
            error.contains(copy.to_str().unwrap())
                || kind == "fanout-manifest"
                || kind == "fanout-descriptor",
            "{kind}: {error}"
        );
    }
    // A live capacity owner record, and a corrupted copy of it.
    let sleeper = env
        .ok(&[
            "run",
            "--session",
            "v",
            "--max-active",
            "5",
            "--",
            "sleep",
            "300",
        ])
        .trim()
        .to_owned();
    let pools = env.root().join("session-active-async-capacity");
    let pool = std::fs::read_dir(&pools)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let owner = std::fs::read_dir(&pool)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.is_dir())
        .unwrap()
        .join("owner.json");
    env.ok(&[
        "validate",
        "--kind",
        "capacity-owner",
        owner.to_str().unwrap(),
    ]);
    let mut value: Value = serde_json::from_str(&std::fs::read_to_string(&owner).unwrap()).unwrap();
    value["runId"] = json!(3);
    let copy = Path::new(env.work()).join("owner.json");
    std::fs::write(&copy, value.to_string()).unwrap();
    let out = env.run(&[
        "validate",
        "--kind",
        "capacity-owner",
        copy.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("runId"),
        "{out:?}"
    );
    env.ok(&["stop", &sleeper]);
}

#[test]
fn a_revival_that_never_proceeded_gives_its_slot_back() {
    let env = Env::new();
    let fifo = env.fifo("hold.fifo");
    let script = format!(
        "[ -n \"$SUBAGENTS_RESUMED_FROM\" ] && read line < '{}'; true",
        fifo.display()
    );
    let limited = ["--session", "cap", "--max-active", "2"];
    let mut run = vec!["run", "--wait"];
    run.extend(limited);
    run.extend(["--", "sh", "-c", &script]);
    let source = env.ok(&run).trim().to_owned();
    let mut resume = vec!["resume", source.as_str(), "--task", "one"];
    resume.extend(&limited[2..]);
    let winner = env.ok(&resume).trim().to_owned();
    // The loser takes a fresh slot, fails its handshake (lease conflict), its
    // runner is seen gone, and the slot is rolled back: 1 used, not 2.
    let mut again = vec!["resume", source.as_str(), "--task", "two"];
    again.extend(&limited[2..]);
    assert_eq!(env.run(&again).status.code(), Some(1));
    let capacity: Value =
        serde_json::from_str(&env.ok(&["capacity", "--session", "cap", "--limit", "2", "--json"]))
            .unwrap();
    assert_eq!(capacity["used"], 1, "{capacity}");
    assert_eq!(
        capacity["slots"][0]["slot"]["runId"],
        winner.as_str(),
        "{capacity}"
    );
    std::fs::write(&fifo, "go\n").unwrap();
    env.settled(&winner);
}

#[test]
fn a_task_equal_to_a_contract_value_still_runs_but_is_not_resumable() {
    let env = Env::new();
    let id = env
        .ok(&["run", "--wait", "--task", "cat", "--", "cat"])
        .trim()
        .to_owned();
    // stdin ends with a newline; the task file holds the text as given.
    assert_eq!(env.ok(&["logs", &id]), "cat\n");
    assert!(!run_dir(&env, &id).join("recovery-descriptor.json").exists());
    let out = env.run(&["resume", &id, "--task", "more"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("missing its run fan-out recovery identity"),
        "{out:?}"
    );
}

/// Edits a JSON file in place.
fn edit_json(path: &Path, edit: impl FnOnce(&mut Value)) {
    let mut value: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    edit(&mut value);
    std::fs::write(path, serde_json::to_vec_pretty(&value).unwrap()).unwrap();
}

fn sha256_hex(bytes: &[u8]) -> String {
    recovery::sha256_hex(bytes)
}

/// A refused resume: exit 1, one stderr line naming `file` and `field`,
/// nothing launched, no lease taken, the source's slot left alone.
fn assert_refused(env: &Env, source: &str, file: &str, field: &str) {
    let out = env.run(&["resume", source, "--task", "x"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(file) && stderr.contains(field),
        "{file} {field}: {stderr}"
    );
    assert_eq!(env.run_count(), 1, "nothing was launched");
    assert!(lease_dirs(env).is_empty());
    let capacity: Value =
        serde_json::from_str(&env.ok(&["capacity", "--session", "s", "--json"])).unwrap();
    let owners: Vec<&Value> = capacity["slots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| &s["slot"]["runId"])
        .collect();
    assert!(owners.iter().all(|o| *o == source), "{capacity}");
}

/// A finished run of session `s` whose command prints a marker; returns its
/// id and run directory.
fn finished_source(env: &Env) -> (String, PathBuf) {
    let source = env
        .ok(&[
            "run",
            "--session",
            "s",
            "--wait",
            "--",
            "sh",
            "-c",
            "echo ran-original",
        ])
        .trim()
        .to_owned();
    let dir = run_dir(env, &source);
    (source, dir)
}

#[test]
fn resume_refuses_a_rewritten_contract_with_a_recomputed_digest() {
    let env = Env::new();
    let (source, dir) = finished_source(&env);
    let marker = Path::new(env.work()).join("edited-command-ran");
    let evil = format!("touch '{}'", marker.display());
    let contract = dir.join("launch-contract.json");
    edit_json(&contract, |c| c["command"] = json!(["sh", "-c", evil]));
    let digest = sha256_hex(&std::fs::read(&contract).unwrap());
    let descriptor = dir.join("recovery-descriptor.json");
    edit_json(&descriptor, |d| d["launchContractDigest"] = json!(digest));
    assert_refused(&env, &source, "recovery-seal.json", "changed after launch");
    assert!(!marker.exists(), "the edited command never ran");
}

#[test]
fn resume_refuses_a_descriptor_whose_cwd_was_edited_and_resumes_once_restored() {
    let env = Env::new();
    let (source, dir) = finished_source(&env);
    let descriptor = dir.join("recovery-descriptor.json");
    let original = std::fs::read(&descriptor).unwrap();
    edit_json(&descriptor, |d| d["cwd"] = json!("/"));
    assert_refused(&env, &source, "recovery-descriptor.json", "cwd '/'");
    // Fields the two files do not share are covered by the seal alone.
    std::fs::write(&descriptor, &original).unwrap();
    edit_json(&descriptor, |d| d["sessionFile"] = json!("/etc/passwd"));
    assert_refused(&env, &source, "recovery-seal.json", "changed after launch");
    // Intact files resume.
    std::fs::write(&descriptor, &original).unwrap();
    let revived = env
        .ok(&["resume", &source, "--task", "go on"])
        .trim()
        .to_owned();
    env.ok(&["wait", &revived]);
    assert!(env.ok(&["logs", &revived]).contains("ran-original"));
}

#[test]
fn resume_refuses_a_descriptor_whose_source_run_id_was_edited() {
    let env = Env::new();
    let (source, dir) = finished_source(&env);
    let descriptor = dir.join("recovery-descriptor.json");
    edit_json(&descriptor, |d| d["sourceRunId"] = json!("someone-else"));
    assert_refused(
        &env,
        &source,
        "recovery-descriptor.json",
        "sourceRunId 'someone-else'",
    );
}

#[test]
fn resume_refuses_a_run_without_a_seal() {
    // Deleting the seal must not lead back to the unverified path.
    let env = Env::new();
    let (source, dir) = finished_source(&env);
    std::fs::remove_file(dir.join("recovery-seal.json")).unwrap();
    assert_refused(&env, &source, "recovery-seal.json", "no recovery seal");
}

#[test]
fn a_loosened_or_foreign_root_key_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let env = Env::new();
    let source = env.ok(&["run", "--wait", "--", "true"]).trim().to_owned();
    let key = env.root().join(".recovery-key");
    assert_eq!(
        std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
        0o600
    );
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = env.run(&["resume", &source, "--task", "x"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(".recovery-key") && stderr.contains("mode 0644"),
        "{stderr}"
    );
    // A new single run cannot be sealed either: refused, nothing left behind.
    let out = env.run(&["run", "--", "true"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(".recovery-key"), "{stderr}");
    assert_eq!(env.run_count(), 1, "no half-made run");
    // A fresh key (the old one lost) cannot vouch for the run.
    std::fs::remove_file(&key).unwrap();
    let out = env.run(&["resume", &source, "--task", "x"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("sealed under key"),
        "{out:?}"
    );
    assert_eq!(env.run_count(), 1);
}

#[test]
fn concurrent_first_launches_agree_on_one_root_key() {
    // Several real processes find no key and race to create it; every run
    // must be sealed under the one key that won, so every run resumes.
    let env = Env::new();
    let launches: Vec<_> = (0..4)
        .map(|_| {
            env.command(&["run", "--", "true"])
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let ids: Vec<String> = launches
        .into_iter()
        .map(|child| {
            let out = child.wait_with_output().unwrap();
            assert!(out.status.success(), "{out:?}");
            String::from_utf8(out.stdout).unwrap().trim().to_owned()
        })
        .collect();
    let leftovers: Vec<_> = std::fs::read_dir(env.root())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("recovery-key") && n != ".recovery-key")
        .collect();
    assert!(leftovers.is_empty(), "no temp key left: {leftovers:?}");
    for id in &ids {
        env.settled(id);
        let revived = env.ok(&["resume", id, "--task", "again"]).trim().to_owned();
        env.settled(&revived);
    }
}

#[test]
fn resume_refuses_a_status_whose_session_disagrees_with_the_contract() {
    // status.json is not sealed: the verified contract's session is used,
    // and a status claiming another one is refused rather than trusted.
    let env = Env::new();
    let (source, dir) = finished_source(&env);
    edit_json(&dir.join("status.json"), |s| {
        s["sessionId"] = json!("another-session")
    });
    assert_refused(&env, &source, "status.json", "sessionId 'another-session'");
}

/// Seals the run's recovery files again with the root's own key, as a
/// launcher of this root would: the seal no longer tells an edit apart, so
/// what is checked past it is.
fn reseal(env: &Env, dir: &Path) {
    let key = recovery::seal::RootKey::load(&recovery::seal::RootKey::path(env.root())).unwrap();
    let contract = std::fs::read(dir.join("launch-contract.json")).unwrap();
    let descriptor = std::fs::read(dir.join("recovery-descriptor.json")).unwrap();
    let seal = key.seal(&contract, &descriptor);
    std::fs::write(
        dir.join("recovery-seal.json"),
        serde_json::to_vec(&seal).unwrap(),
    )
    .unwrap();
}

#[test]
fn resume_refuses_resealed_output_and_session_paths_that_are_not_this_roots() {
    let env = Env::new();
    let (source, dir) = finished_source(&env);
    let descriptor = dir.join("recovery-descriptor.json");
    let original = std::fs::read(&descriptor).unwrap();
    let runs = env.root().join("async-subagent-runs");
    let elsewhere = Path::new(env.work()).join("0123456789");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let cases = [
        ("outputPath", elsewhere.join("output-0.log")),
        ("outputPath", dir.join("output-1.log")),
        ("outputPath", PathBuf::from("output-0.log")),
        ("sessionFile", elsewhere.join("output-0.log")),
        ("sessionFile", runs.join("..bad").join("output-0.log")),
        ("sessionFile", runs.join(&source).join("session.log")),
    ];
    for (field, path) in cases {
        std::fs::write(&descriptor, &original).unwrap();
        edit_json(&descriptor, |d| d[field] = json!(path));
        reseal(&env, &dir);
        let shown = format!("{field} '{}' is not", path.display());
        assert_refused(&env, &source, "recovery-descriptor.json", &shown);
    }
    // Resealed with the same output spelled another way, it resumes:
    // directories are compared resolved.
    std::fs::write(&descriptor, &original).unwrap();
    let spelled = runs
        .join("../async-subagent-runs")
        .join(&source)
        .join("output-0.log");
    edit_json(&descriptor, |d| d["outputPath"] = json!(spelled));
    reseal(&env, &dir);
    let revived = env.ok(&["resume", &source, "--task", "go on"]);
    env.ok(&["wait", revived.trim()]);
}

#[test]
fn resume_with_timeout_zero_has_no_deadline() {
    let env = Env::new();
    let args = ["run", "--wait", "--", "sh", "-c", "sleep 1; echo slept"];
    let source = env.ok(&args).trim().to_owned();
    let revived = env.ok(&["resume", &source, "--timeout", "0", "--task", "again"]);
    let status = env.settled(revived.trim());
    assert_eq!(status["state"], "complete", "{status}");
}
