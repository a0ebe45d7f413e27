//! End-to-end tests of what the runner and the monitor do to real processes:
//! fail-fast on and off, a chain stopping at a failed step, the SIGKILL that
//! follows the SIGTERM grace, processes that left their step's group, the
//! concurrency cap of a parallel group, a step's own timeout, and the task
//! text of a composite run.
//!
//! Each test bounds its waits by a deadline sized to the behaviour (seconds,
//! not the suite's 180 s guard), so a regression fails fast; `Env` tears
//! down every process a test started even when it fails.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use serde_json::{Value, json};

/// Deadline of one `--wait` launch in these tests.
const RUN_DEADLINE: Duration = Duration::from_secs(25);

fn write_spec(env: &Env, name: &str, spec: &Value) -> String {
    let path = Path::new(env.work()).join(name);
    std::fs::write(&path, spec.to_string()).unwrap();
    path.display().to_string()
}

/// `run --spec FILE --cwd WORK --wait`, bounded; returns (exit code, run id).
fn run_spec(env: &Env, spec: &Value) -> (Option<i32>, String) {
    let file = write_spec(env, "spec.json", spec);
    let out = env.run_within(
        &["run", "--spec", &file, "--cwd", env.work(), "--wait"],
        RUN_DEADLINE,
    );
    let id = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(!id.is_empty(), "no run id: {out:?}");
    (out.status.code(), id)
}

fn work_file(env: &Env, name: &str) -> PathBuf {
    Path::new(env.work()).join(name)
}

fn read_pid(path: &Path) -> u32 {
    let text = std::fs::read_to_string(path).unwrap();
    text.trim()
        .parse()
        .unwrap_or_else(|_| panic!("{}: {text:?}", path.display()))
}

fn started_steps(env: &Env, id: &str) -> Vec<u64> {
    env.events(id)
        .iter()
        .filter(|e| e["type"] == "subagent.step.started")
        .map(|e| e["stepIndex"].as_u64().unwrap())
        .collect()
}

#[test]
fn a_composite_runs_task_texts_stay_in_their_task_files() {
    let env = Env::new();
    let secret = "SENTINEL-composite-5e1f";
    let step = |agent: &str, n: u32| {
        json!({"agent": agent, "command": ["sh", "-c", "cat >/dev/null; echo done"],
               "task": format!("task {n}: {secret}-{n}")})
    };
    let spec = json!({"mode": "chain", "steps": [
        step("first", 0),
        {"parallel": [step("left", 1), step("right", 2)]},
    ]});
    let (code, id) = run_spec(&env, &spec);
    assert_eq!(code, Some(0));
    env.settled(&id);
    assert_eq!(started_steps(&env, &id).len(), 3, "{:?}", env.events(&id));
    for event in env.events(&id) {
        if let Some(task) = event.get("task") {
            assert_eq!(task, "[prompt redacted]", "{event}");
        }
    }
    let mut task_files = 0;
    for path in walk(env.root()) {
        let text = String::from_utf8_lossy(&std::fs::read(&path).unwrap_or_default()).into_owned();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let is_task_file = name.starts_with("task") && name.ends_with(".md");
        assert_eq!(
            text.contains(secret),
            is_task_file,
            "{}: {text}",
            path.display()
        );
        task_files += usize::from(is_task_file);
    }
    assert_eq!(task_files, 3, "one task file per step");
}

#[test]
fn with_fail_fast_off_the_siblings_of_a_failed_task_run_to_their_end() {
    let env = Env::new();
    // "patient" goes on for a second after the runner has recorded the
    // failure: a fail-fast stop would reach it within that second.
    let patient = r#"i=0
until grep -q subagent.step.failed "$SUBAGENTS_RUN_DIR/events.jsonl"; do
  i=$((i+1)); [ $i -gt 300 ] && exit 9; sleep 0.05
done
sleep 1; echo survived"#;
    let spec = json!({"mode": "parallel", "failFast": false, "concurrency": 2, "tasks": [
        {"agent": "bad", "command": ["sh", "-c", "exit 7"]},
        {"agent": "patient", "command": ["sh", "-c", patient]},
        {"agent": "late", "command": ["sh", "-c", "echo late"]}
    ]});
    let (code, id) = run_spec(&env, &spec);
    assert_eq!(code, Some(1));
    let status = env.settled(&id);
    assert_eq!(status["state"], "failed");
    assert_eq!(status["error"], "Step failed: bad");
    let steps = &status["steps"];
    assert_eq!(steps[0]["exitCode"], 7, "{status}");
    assert_eq!(steps[1]["status"], "complete", "{status}");
    assert_eq!(steps[2]["status"], "complete", "a queued task still starts");
    let output = |i: usize| {
        std::fs::read_to_string(env.run_dir(&id).join(format!("output-{i}.log"))).unwrap()
    };
    assert_eq!(output(1), "survived\n");
    assert_eq!(output(2), "late\n");
}

#[test]
fn a_chain_stops_at_its_first_failed_step() {
    let env = Env::new();
    let spec = json!({"mode": "chain", "steps": [
        {"agent": "ok", "command": ["true"]},
        {"agent": "broken", "command": ["sh", "-c", "exit 3"]},
        {"agent": "after", "command": ["sh", "-c", "touch after.ran"]},
        {"parallel": [{"agent": "never", "command": ["sh", "-c", "touch never.ran"]}]}
    ]});
    let (code, id) = run_spec(&env, &spec);
    assert_eq!(code, Some(1));
    let status = env.settled(&id);
    assert_eq!(status["state"], "failed");
    assert_eq!(status["error"], "Step failed: broken");
    assert_eq!(status["steps"][1]["exitCode"], 3);
    for i in [2, 3] {
        let step = &status["steps"][i];
        assert!(
            step["externalProcess"].is_null(),
            "step {i} started: {step}"
        );
        assert_ne!(step["status"], "complete", "{step}");
    }
    assert_eq!(started_steps(&env, &id), [0, 1]);
    assert!(!work_file(&env, "after.ran").exists());
    assert!(!work_file(&env, "never.ran").exists());
}

#[test]
fn a_command_that_ignores_sigterm_is_killed_after_the_grace() {
    let env = Env::new();
    let script = r#"trap "" TERM; echo $$ > stubborn.pid; while :; do sleep 0.1; done"#;
    let id = env
        .ok(&[
            "run",
            "--timeout",
            "1s",
            "--cwd",
            env.work(),
            "--",
            "sh",
            "-c",
            script,
        ])
        .trim()
        .to_owned();
    // 1 s deadline + 2 s grace; 124 here means SIGKILL never came.
    let wait = env.run_within(&["wait", &id, "--timeout", "10s"], RUN_DEADLINE);
    assert_eq!(wait.status.code(), Some(1), "{wait:?}");
    let status = env.settled(&id);
    assert_eq!(status["state"], "failed");
    assert_eq!(status["timedOut"], true);
    assert_eq!(status["steps"][0]["status"], "failed", "{status}");
    assert_eq!(status["processTerminal"]["state"], "observed", "{status}");
    assert!(!alive(read_pid(&work_file(&env, "stubborn.pid"))));
}

#[test]
fn processes_that_left_the_step_group_end_with_the_run() {
    let env = Env::new();
    // Two grandchildren in sessions of their own (outside the step's process
    // group), one of them deaf to SIGTERM; the COMMAND exits 0 at once.
    let script = r#"setsid sh -c 'echo $$ > escaped.pid; exec sleep 300' </dev/null >/dev/null 2>&1 &
setsid sh -c 'trap "" TERM; echo $$ > stubborn.pid; while :; do sleep 0.1; done' </dev/null >/dev/null 2>&1 &
i=0
while [ ! -s escaped.pid ] || [ ! -s stubborn.pid ]; do
  i=$((i+1)); [ $i -gt 300 ] && exit 9; sleep 0.02
done
echo started"#;
    let out = env.run_within(
        &[
            "run",
            "--wait",
            "--cwd",
            env.work(),
            "--",
            "sh",
            "-c",
            script,
        ],
        RUN_DEADLINE,
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let id = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let status = env.settled(&id);
    assert_eq!(status["state"], "complete");
    for name in ["escaped.pid", "stubborn.pid"] {
        let pid = read_pid(&work_file(&env, name));
        assert!(!alive(pid), "{name}: {pid} outlived its run");
    }
    assert_eq!(status["processTerminal"]["state"], "observed", "{status}");
}

/// Most tasks of one group running at once, from the start and end
/// timestamps (ns) the tasks wrote.
fn max_overlap(dir: &Path, tasks: usize) -> usize {
    let stamp = |name: String| -> i128 {
        let path = dir.join(&name);
        std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .trim()
            .parse()
            .unwrap()
    };
    let mut edges: Vec<(i128, i32)> = Vec::new();
    for i in 0..tasks {
        edges.push((stamp(format!("start-{i}")), 1));
        // An end sorts before a start at the same instant.
        edges.push((stamp(format!("end-{i}")), -1));
    }
    edges.sort();
    let (mut running, mut most) = (0i32, 0i32);
    for (_, delta) in edges {
        running += delta;
        most = most.max(running);
    }
    most as usize
}

#[test]
fn a_parallel_group_runs_at_most_concurrency_tasks_at_once() {
    let env = Env::new();
    // Each task waits until two tasks have started (so two always overlap),
    // then stays a moment: without the cap all four would overlap.
    let task = r#"date +%s%N > start-$SUBAGENTS_STEP_INDEX
i=0
while [ "$(ls | grep -c '^start-')" -lt 2 ]; do
  i=$((i+1)); [ $i -gt 200 ] && break; sleep 0.05
done
sleep 0.3
date +%s%N > end-$SUBAGENTS_STEP_INDEX"#;
    let tasks: Vec<Value> = (0..4)
        .map(|i| json!({"agent": format!("t{i}"), "command": ["sh", "-c", task]}))
        .collect();
    let spec = json!({"mode": "parallel", "concurrency": 2, "tasks": tasks});
    let (code, id) = run_spec(&env, &spec);
    assert_eq!(code, Some(0));
    let status = env.settled(&id);
    for step in status["steps"].as_array().unwrap() {
        assert_eq!(step["status"], "complete", "{step}");
    }
    assert_eq!(max_overlap(Path::new(env.work()), 4), 2);
}

#[test]
fn a_step_timeout_ends_that_step_only() {
    let env = Env::new();
    let spec = json!({"mode": "parallel", "tasks": [
        {"agent": "slow", "command": ["sh", "-c", "echo $$ > slow.pid; exec sleep 300"], "timeout": "1s"},
        {"agent": "quick", "command": ["sh", "-c", "echo fine"]}
    ]});
    let (code, id) = run_spec(&env, &spec);
    assert_eq!(code, Some(1));
    let status = env.settled(&id);
    assert_eq!(status["state"], "failed");
    assert_eq!(status["error"], "Step failed: slow", "{status}");
    let steps = &status["steps"];
    assert_eq!(steps[0]["status"], "failed");
    assert_eq!(steps[0]["error"], "Subagent timed out after 1000ms.");
    assert_eq!(steps[1]["status"], "complete");
    assert!(!alive(read_pid(&work_file(&env, "slow.pid"))));
}
