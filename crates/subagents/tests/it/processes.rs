//! End-to-end tests of what the runner and the monitor do to real processes:
//! fail-fast on and off, a chain stopping at a failed step, the SIGKILL that
//! follows the SIGTERM grace, processes that left their step's group, the
//! concurrency cap of a parallel group, a step's own timeout, and the task
//! text of a composite run.
//!
//! Each test bounds its waits by a deadline sized to the behaviour (seconds,
//! not the suite's 60 s guard), so a regression fails fast; `Env` tears
//! down every process a test started even when it fails.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use serde_json::{Value, json};
use supervisor::config::{GroupConfig, LaunchConfig, StepConfig};

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
    assert_eq!(status["error"], "bad: command ended with exit code 7");
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
    assert_eq!(status["error"], "broken: command ended with exit code 3");
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
    // Grandchildren in sessions of their own (outside the step's process
    // group): one deaf to SIGTERM, one whose command line looks like a nested
    // run's monitor (`sh __monitor`) without being one. The COMMAND exits 0.
    std::fs::write(
        work_file(&env, "__monitor"),
        "echo $$ > impostor.pid; while :; do sleep 0.1; done\n",
    )
    .unwrap();
    let script = r#"setsid sh -c 'echo $$ > escaped.pid; exec sleep 300' </dev/null >/dev/null 2>&1 &
setsid sh -c 'trap "" TERM; echo $$ > stubborn.pid; while :; do sleep 0.1; done' </dev/null >/dev/null 2>&1 &
setsid sh __monitor </dev/null >/dev/null 2>&1 &
i=0
while [ ! -s escaped.pid ] || [ ! -s stubborn.pid ] || [ ! -s impostor.pid ]; do
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
    for name in ["escaped.pid", "stubborn.pid", "impostor.pid"] {
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
    assert_eq!(status["error"], "slow: timed out after 1s", "{status}");
    let steps = &status["steps"];
    assert_eq!(steps[0]["status"], "failed");
    assert_eq!(steps[0]["error"], "timed out after 1s");
    assert_eq!(steps[1]["status"], "complete");
    assert!(!alive(read_pid(&work_file(&env, "slow.pid"))));
}

/// A one-step config, as `run --id ID --cwd WORK -- COMMAND` would make it.
fn single_config(env: &Env, id: &str, command: &[&str]) -> LaunchConfig {
    LaunchConfig {
        run_id: id.to_owned(),
        root: env.root().to_path_buf(),
        run_dir: env.run_dir(id),
        runner_process_instance_id: uuid::Uuid::new_v4().to_string(),
        mode: "single".into(),
        steps: vec![StepConfig {
            agent: "sh".into(),
            command: command.iter().map(|s| s.to_string()).collect(),
            cwd: PathBuf::from(env.work()),
            task_file: None,
            timeout_ms: None,
            fanout_label: None,
            env: Default::default(),
            idle_timeout_ms: None,
            previous_in_task: false,
        }],
        groups: vec![GroupConfig {
            start: 0,
            count: 1,
            concurrency: 1,
            fail_fast: false,
            parallel: false,
        }],
        timeout_ms: Some(60_000),
        session_id: None,
        fanout_descriptor: None,
        env: Default::default(),
        capacity_slot: None,
        revival: None,
        session_root: None,
        queue: None,
    }
}

/// What `run` does before any process exists: the run directory, the
/// queued status and the active marker.
fn queue(config: &LaunchConfig) {
    atomic_file::ensure_private_dir(&config.run_dir).unwrap();
    let queued = supervisor::transitions::queued(config, None, None, status::now_ms());
    status::model::write_status(&config.run_dir, &queued).unwrap();
    status::index::create_marker(&config.run_dir).unwrap();
}

/// What `run` does next, done by the test so it can act in between: starts
/// the detached monitor with the config on stdin and the ready pipe as
/// descriptor 3, and returns what arrived on the pipe before it closed.
fn start_monitor(config: &LaunchConfig) -> (std::process::Child, String) {
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};

    let (read_end, write_end) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
    let log = |name: &str| {
        std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(config.run_dir.join(name))
            .unwrap()
    };
    let fd = write_end.as_raw_fd();
    let mut command = Command::new(env!("CARGO_BIN_EXE_subagents"));
    command
        .arg("__monitor")
        .current_dir(&config.run_dir)
        .env(supervisor::config::READY_FD_ENV, "3")
        .stdin(Stdio::piped())
        .stdout(log("runner.stdout.log"))
        .stderr(log("runner.stderr.log"));
    // SAFETY: only async-signal-safe calls (setsid, dup2, fcntl) between fork and exec.
    unsafe {
        command.pre_exec(move || {
            libc::setsid();
            supervisor::spawn::inherit_as_fd3(fd)
        });
    }
    let mut monitor = command.spawn().unwrap();
    drop(write_end);
    let mut stdin = monitor.stdin.take().unwrap();
    stdin
        .write_all(&serde_json::to_vec(config).unwrap())
        .unwrap();
    drop(stdin);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::fs::File::from(read_end).read_to_string(&mut text);
        let _ = tx.send(text);
    });
    let text = rx
        .recv_timeout(Duration::from_secs(15))
        .expect("the ready pipe stayed open for 15 s");
    (monitor, text)
}

#[test]
fn a_stop_that_reaches_a_queued_run_wins_and_nothing_starts() {
    let env = Env::new();
    let id = "queued-stop";
    let config = single_config(&env, id, &["sh", "-c", "touch started; exec sleep 300"]);
    queue(&config);
    // The stop lands while the run is queued: no runner to signal yet.
    let stop = env.command(&["stop", id, "--reason", "changed my mind"]);
    let stopper = std::thread::spawn(move || output_within(stop, Duration::from_secs(20)));
    poll(Duration::from_secs(10), || {
        env.status_json(id)["stopReason"] == "changed my mind"
    });
    let (mut monitor, ready) = start_monitor(&config);
    assert!(ready.starts_with("ready "), "{ready:?}");
    let stopped = stopper.join().unwrap();
    assert_eq!(stopped.status.code(), Some(0), "{stopped:?}");
    let status = env.settled_within(id, Duration::from_secs(15));
    monitor.wait().unwrap();
    assert_eq!(status["state"], "stopped", "{status}");
    assert_eq!(status["error"], "changed my mind");
    // It never ran: shown `skipped` (recorded `stopped`).
    assert_eq!(status["steps"][0]["status"], "skipped", "{status}");
    assert!(status["steps"][0]["externalProcess"].is_null(), "{status}");
    assert!(started_steps(&env, id).is_empty());
    assert!(!work_file(&env, "started").exists(), "the command started");
    assert_eq!(status["processTerminal"]["state"], "observed", "{status}");
    assert!(!env.marker(id).exists());
}

#[test]
fn a_runner_that_dies_before_ready_closes_the_pipe_and_the_monitor_fails_the_run() {
    let env = Env::new();
    let id = "dies-early";
    let config = single_config(&env, id, &["sh", "-c", "touch started"]);
    queue(&config);
    // The runner's first act is to (re)create its active marker: make that
    // impossible, so it exits before it reports ready.
    let index = env.root().join("async-subagent-runs/.active-runs");
    std::fs::remove_dir_all(&index).unwrap();
    std::fs::write(&index, "not a directory").unwrap();
    let (mut monitor, ready) = start_monitor(&config);
    assert_eq!(ready, "", "no ready line from a runner that failed");
    let status = env.settled_within(id, Duration::from_secs(15));
    monitor.wait().unwrap();
    assert_eq!(status["state"], "failed", "{status}");
    let error = status["error"].as_str().unwrap();
    assert!(
        error.contains("exited with exit code 1 before writing a final status"),
        "{error}"
    );
    assert!(
        error.contains(".active-runs"),
        "the runner's own error: {error}"
    );
    assert!(!work_file(&env, "started").exists(), "the command started");
    assert_ne!(status["processTerminal"]["state"], "pending", "{status}");
}
