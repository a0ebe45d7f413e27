//! End-to-end tests of composite runs (`run --spec`) and the run fan-out
//! budget across nested launches, with the real binary and real processes.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::*;
use serde_json::{Value, json};

fn write_spec(env: &Env, name: &str, spec: &Value) -> String {
    let path = Path::new(env.work()).join(name);
    std::fs::write(&path, spec.to_string()).unwrap();
    path.display().to_string()
}

fn claims(env: &Env) -> Vec<Value> {
    let mut out = Vec::new();
    for budget in std::fs::read_dir(env.root().join("run-fanout-budgets")).unwrap() {
        for claim in std::fs::read_dir(budget.unwrap().path().join("claims")).unwrap() {
            out.push(
                serde_json::from_str(&std::fs::read_to_string(claim.unwrap().path()).unwrap())
                    .unwrap(),
            );
        }
    }
    out
}

#[test]
fn a_chain_hands_each_step_the_previous_output() {
    let env = Env::new();
    let spec = json!({"mode": "chain", "steps": [
        {"agent": "scout", "command": ["sh", "-c", "echo three"], "task": "look"},
        {"parallel": [
            {"agent": "a", "command": ["sh", "-c", "echo \"a got $(cat \"$SUBAGENTS_PREVIOUS_OUTPUT\")\""]},
            {"agent": "b", "command": ["sh", "-c", "echo \"b got $(cat \"$SUBAGENTS_PREVIOUS_OUTPUT\")\""]}
        ], "concurrency": 2},
        {"agent": "writer", "command": ["sh", "-c", "cat \"$SUBAGENTS_PREVIOUS_OUTPUT\""]}
    ]});
    let file = write_spec(&env, "chain.json", &spec);
    let id = env
        .ok(&["run", "--spec", &file, "--wait"])
        .trim()
        .to_owned();
    // Every step's output under its header; the last step's alone with --step.
    assert_eq!(
        env.ok(&["logs", &id]),
        "=== scout (step 1) ===\nthree\n=== a (step 2) ===\na got three\n=== b (step 3) ===\nb got three\n\
         === writer (step 4) ===\n=== a (step 2) ===\na got three\n=== b (step 3) ===\nb got three\n"
    );
    assert_eq!(
        env.ok(&["logs", &id, "--step", "4"]),
        "=== writer (step 4) ===\n=== a (step 2) ===\na got three\n=== b (step 3) ===\nb got three\n"
    );
    let status = env.status_json(&id);
    assert_eq!(status["mode"], "chain");
    assert_eq!(status["chainStepCount"], 3);
    assert_eq!(
        status["parallelGroups"],
        json!([{"start": 1, "count": 2, "stepIndex": 1}])
    );
    let steps = status["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 4);
    for (i, step) in steps.iter().enumerate() {
        assert_eq!(step["status"], "complete", "{step}");
        assert_eq!(step["exitCode"], 0);
        assert!(
            step["outputFile"]
                .as_str()
                .unwrap()
                .ends_with(&format!("output-{i}.log"))
        );
        assert_eq!(step["processTerminal"]["state"], "observed");
    }
    assert_eq!(steps[0]["description"], "[prompt redacted]");
    assert_eq!(
        status["runFanoutBudget"],
        json!({"used": 4, "limit": 64, "remaining": 60})
    );
    let mut paths: Vec<String> = claims(&env)
        .iter()
        .map(|c| c["path"].as_str().unwrap().to_owned())
        .collect();
    paths.sort();
    assert_eq!(
        paths,
        [
            "chain[0]",
            "chain[1].parallel[0]",
            "chain[1].parallel[1]",
            "chain[2]"
        ]
    );
    let text = env.ok(&["status", &id]);
    assert!(
        text.contains("Run fan-out: 4/64 used, 60 remaining"),
        "{text}"
    );
}

#[test]
fn fail_fast_stops_the_siblings_of_a_failed_task() {
    let env = Env::new();
    let spec = json!({"mode": "parallel", "failFast": true, "concurrency": 3, "tasks": [
        {"agent": "sleeper", "command": ["sh", "-c", "echo $$ > sleeper.pid; exec sleep 300"]},
        {"agent": "bad", "command": ["sh", "-c", "while [ ! -s sleeper.pid ]; do :; done; exit 7"]},
        // Holds the third slot until fail-fast ends it: a `late` that ended
        // on its own would free a slot for `never` while `bad` still runs.
        {"agent": "late", "command": ["sleep", "300"]},
        {"agent": "never", "command": ["true"]}
    ]});
    let file = write_spec(&env, "par.json", &spec);
    // Bounded: a fail-fast that never stops the sleeper must fail here, fast.
    let out = env.run_within(
        &["run", "--spec", &file, "--cwd", env.work(), "--wait"],
        Duration::from_secs(20),
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let id = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let status = env.status_json(&id);
    assert_eq!(status["state"], "failed");
    assert_eq!(status["error"], "bad: command ended with exit code 7");
    let steps = &status["steps"];
    assert_eq!(steps[1]["exitCode"], 7);
    // Recorded `failed` (as the reference records it), shown as what
    // happened to it: it was stopped.
    assert_eq!(steps[0]["status"], "stopped");
    assert!(
        steps[0]["error"].as_str().unwrap().contains("failFast"),
        "{status}"
    );
    // Recorded `failed`; it never ran, so it is shown `skipped`.
    assert_eq!(steps[3]["status"], "skipped");
    assert!(
        steps[3]["externalProcess"].is_null(),
        "a queued task never started"
    );
    let sleeper: u32 = std::fs::read_to_string(Path::new(env.work()).join("sleeper.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(!alive(sleeper), "the sibling kept running");
    let text = env.ok(&["list", "--all"]);
    assert!(text.contains("| parallel |"), "{text}");
}

#[test]
fn a_launch_over_the_fanout_limit_starts_nothing() {
    let env = Env::new();
    let spec = json!({"mode": "parallel", "tasks": [
        {"agent": "a", "command": ["true"]}, {"agent": "b", "command": ["true"]}, {"agent": "c", "command": ["true"]}
    ]});
    let file = write_spec(&env, "three.json", &spec);
    let out = env.run(&["run", "--spec", &file, "--fanout-limit", "2", "--json"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let error: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        error["runFanoutRejection"],
        json!({"code": "RUN_FANOUT_LIMIT", "path": "tasks[2]", "requested": 3, "used": 0, "limit": 2, "remaining": 2})
    );
    let runs = env.run_count();
    assert_eq!(runs, 0, "no run directory");
    assert!(claims(&env).is_empty(), "the batch claimed nothing");
}

#[test]
fn a_self_recursive_agent_stops_when_the_root_budget_is_spent() {
    let env = Env::new();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/recursive-agent.sh");
    let root_id = env
        .command(&[
            "run",
            "--agent",
            "recursive",
            "--",
            script.to_str().unwrap(),
        ])
        .env("SUBAGENTS_BIN", env!("CARGO_BIN_EXE_subagents"))
        .output()
        .unwrap();
    assert!(root_id.status.success(), "{root_id:?}");
    let root_id = String::from_utf8(root_id.stdout).unwrap().trim().to_owned();
    let count = || env.run_count();
    poll(Duration::from_secs(180), || {
        count() >= 64 && env.ok(&["list"]).trim() == "No active async runs."
    });
    assert_eq!(count(), 64, "exactly 64 runs in the tree");
    assert_eq!(claims(&env).len(), 64);
    let root = env.status_json(&root_id);
    assert_eq!(
        root["runFanoutBudget"],
        json!({"used": 64, "limit": 64, "remaining": 0})
    );
    assert!(
        env.ok(&["status", &root_id])
            .contains("Run fan-out: 64/64 used, 0 remaining")
    );
    let nested = claims(&env)
        .into_iter()
        .filter(|c| c["path"].as_str().unwrap().contains('/'))
        .count();
    assert_eq!(
        nested, 63,
        "every run but the root claimed under a parent path"
    );
}

#[test]
fn a_nested_claim_is_qualified_with_the_inherited_parent_path() {
    let env = Env::new();
    let bin = env!("CARGO_BIN_EXE_subagents");
    let script = format!("'{bin}' budget claim --path extra");
    let id = env
        .ok(&["run", "--wait", "--", "sh", "-c", &script])
        .trim()
        .to_owned();
    assert_eq!(
        env.ok(&["logs", &id]).trim(),
        r#"{"used":2,"limit":64,"remaining":62}"#
    );
    let mut paths: Vec<String> = claims(&env)
        .iter()
        .map(|c| c["path"].as_str().unwrap().to_owned())
        .collect();
    paths.sort();
    assert_eq!(paths, ["extra", "single"]);
}

#[test]
fn a_bad_spec_names_the_file_and_field() {
    let env = Env::new();
    let file = write_spec(
        &env,
        "bad.json",
        &json!({"mode": "parallel", "tasks": [{"agent": "a", "command": ["x"], "bogus": 1}]}),
    );
    let out = env.run(&["run", "--spec", &file]);
    assert_eq!(out.status.code(), Some(2), "a bad spec is a usage mistake");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("bad.json") && stderr.contains("tasks[0]: unknown field `bogus`"),
        "{stderr}"
    );
    assert!(
        !env.root().join("async-subagent-runs").exists()
            || std::fs::read_dir(env.root().join("async-subagent-runs"))
                .unwrap()
                .count()
                == 0
    );
}

#[test]
fn budget_plumbing_claims_all_or_nothing() {
    let env = Env::new();
    let descriptor = env.ok(&["budget", "create", "--root-run-id", "r1", "--limit", "3"]);
    let file = Path::new(env.work()).join("d.json");
    std::fs::write(&file, &descriptor).unwrap();
    let file = file.to_str().unwrap();
    env.ok(&[
        "budget",
        "claim",
        "--descriptor",
        file,
        "--path",
        "a",
        "--path",
        "b",
    ]);
    let refused = env.run(&[
        "budget",
        "claim",
        "--descriptor",
        file,
        "--path",
        "c",
        "--path",
        "d",
        "--json",
    ]);
    assert_eq!(refused.status.code(), Some(3));
    let rejection: Value = serde_json::from_slice(&refused.stdout).unwrap();
    assert_eq!(rejection["code"], "RUN_FANOUT_LIMIT");
    assert_eq!(rejection["path"], "d");
    assert_eq!(
        env.ok(&["budget", "show", "--descriptor", file]).trim(),
        r#"{"used":2,"limit":3,"remaining":1}"#
    );
    let mut tampered: Value = serde_json::from_str(&descriptor).unwrap();
    tampered["limit"] = json!(100);
    std::fs::write(file, tampered.to_string()).unwrap();
    let out = env.run(&["budget", "show", "--descriptor", file]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not match its manifest"));
}

#[test]
fn quick_parallel_tasks_all_end_even_when_their_exits_arrive_together() {
    let env = Env::new();
    // Exits that arrive while another task's group is being emptied, and a
    // group with fewer tasks than its concurrency, must not be missed.
    for (n, concurrency) in [(1, 4), (3, 3), (6, 2)] {
        let tasks: Vec<Value> = (0..n)
            .map(|i| json!({"agent": format!("t{i}"), "command": ["true"]}))
            .collect();
        let file = write_spec(
            &env,
            &format!("quick-{n}.json"),
            &json!({"mode": "parallel", "concurrency": concurrency, "tasks": tasks}),
        );
        let id = env.ok(&["run", "--spec", &file]).trim().to_owned();
        // A lost exit leaves the run waiting forever: fail in 15 s, not 60.
        let wait = env.run_within(&["wait", &id, "--timeout", "15s"], Duration::from_secs(20));
        assert_eq!(wait.status.code(), Some(0), "{n} tasks: {wait:?}");
    }
}

#[test]
fn a_nested_run_outlives_the_command_that_started_it() {
    let env = Env::new();
    let bin = env!("CARGO_BIN_EXE_subagents");
    let script = format!(
        "'{bin}' run --session inner --max-active 1 -- sh -c 'sleep 3; echo inner done' > inner.id"
    );
    let outer = env
        .ok(&[
            "run",
            "--wait",
            "--cwd",
            env.work(),
            "--",
            "sh",
            "-c",
            &script,
        ])
        .trim()
        .to_owned();
    assert_eq!(env.status_json(&outer)["state"], "complete");
    let inner = std::fs::read_to_string(Path::new(env.work()).join("inner.id"))
        .unwrap()
        .trim()
        .to_owned();
    let status = env.settled(&inner);
    assert_eq!(status["state"], "complete", "{status}");
    assert_eq!(status["processTerminal"]["state"], "observed", "{status}");
    assert_eq!(env.ok(&["logs", &inner]), "inner done\n");
    let capacity: Value =
        serde_json::from_str(&env.ok(&["capacity", "--session", "inner", "--json"])).unwrap();
    assert_eq!(capacity["used"], 0, "{capacity}");
}

#[test]
fn a_step_with_a_bad_cwd_reserves_and_leaves_nothing() {
    let env = Env::new();
    let spec = json!({"mode": "chain", "steps": [
        {"agent": "a", "command": ["true"], "task": "first"},
        {"agent": "b", "command": ["true"], "cwd": "does-not-exist"}
    ]});
    let file = write_spec(&env, "badcwd.json", &spec);
    let out = env.run(&[
        "run",
        "--spec",
        &file,
        "--session",
        "s",
        "--max-active",
        "1",
    ]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("does-not-exist"),
        "{out:?}"
    );
    assert_eq!(env.run_count(), 0);
    assert!(!env.root().join("run-fanout-budgets").exists() || claims(&env).is_empty());
    env.ok(&[
        "run",
        "--session",
        "s",
        "--max-active",
        "1",
        "--wait",
        "--",
        "true",
    ]);
}

#[test]
fn fail_fast_also_stops_siblings_when_a_task_cannot_start() {
    let env = Env::new();
    let spec = json!({"mode": "parallel", "failFast": true, "concurrency": 2, "tasks": [
        {"agent": "sleeper", "command": ["sh", "-c", "echo $$ > sleeper.pid; exec sleep 300"]},
        {"agent": "broken", "command": ["/nonexistent/agent"]},
        {"agent": "never", "command": ["true"]}
    ]});
    let file = write_spec(&env, "spawnfail.json", &spec);
    // Bounded: a fail-fast that never stops the sleeper must fail here, fast.
    let out = env.run_within(
        &["run", "--spec", &file, "--cwd", env.work(), "--wait"],
        Duration::from_secs(20),
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let id = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let status = env.status_json(&id);
    assert_eq!(status["steps"][0]["status"], "stopped", "{status}");
    let pid_file = Path::new(env.work()).join("sleeper.pid");
    if let Ok(pid) = std::fs::read_to_string(&pid_file) {
        assert!(
            !alive(pid.trim().parse().unwrap()),
            "the sibling kept running"
        );
    }
}
