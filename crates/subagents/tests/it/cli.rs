//! End-to-end tests of the `subagents` binary against temporary state roots.
//!
//! Every test drives the real binary, real runner and monitor processes and
//! real files. Waiting is done by `subagents wait` (file events) or by polling
//! a condition with a deadline, never by sleeping.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use common::*;
use serde_json::Value;

#[test]
fn a_run_completes_and_its_output_is_readable() {
    let env = Env::new();
    let out = env.ok(&["run", "--wait", "--", "sh", "-c", "echo hi"]);
    let id = out.trim().to_owned();
    assert_eq!(env.ok(&["logs", &id]), "hi\n");
    let status = env.status_json(&id);
    assert_eq!(status["state"], "complete");
    assert_eq!(status["processTerminal"]["state"], "observed", "{status}");
    assert_eq!(status["steps"][0]["exitCode"], 0);
    let text = env.ok(&["status", &id]);
    assert!(
        text.contains("| complete |") && text.contains("Process terminal: observed"),
        "{text}"
    );
    assert_eq!(env.ok(&["list"]).trim(), "No active async runs.");
    let all: Value = serde_json::from_str(&env.ok(&["list", "--all", "--json"])).unwrap();
    assert_eq!(all[0]["id"], id.as_str());
    assert!(
        !env.marker(&id).exists(),
        "an observed proof releases the marker"
    );
    let events = env.events(&id);
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "subagent.run.started",
            "subagent.step.started",
            "subagent.step.completed",
            "subagent.run.completed",
            "subagent.run.process_terminal"
        ]
    );
}

#[test]
fn run_json_reports_the_runner_and_status_is_visible_at_once() {
    let env = Env::new();
    let out = env.ok(&[
        "run", "--json", "--agent", "worker", "--", "sh", "-c", "exit 0",
    ]);
    let launched: Value = serde_json::from_str(&out).unwrap();
    let id = launched["runId"].as_str().unwrap().to_owned();
    assert!(launched["pid"].as_u64().unwrap() > 0);
    assert!(launched["runnerProcessInstanceId"].as_str().unwrap().len() >= 32);
    assert!(Path::new(launched["asyncDir"].as_str().unwrap()).is_dir());
    let status = env.status_json(&id);
    assert!(
        ["running", "complete"].contains(&status["state"].as_str().unwrap()),
        "{status}"
    );
    assert_eq!(status["steps"][0]["agent"], "worker");
    env.ok(&["wait", &id]);
}

#[test]
fn a_failing_command_fails_and_wait_exits_1() {
    let env = Env::new();
    let id = env
        .ok(&["run", "--", "sh", "-c", "echo oops >&2; exit 3"])
        .trim()
        .to_owned();
    let wait = env.run(&["wait", &id]);
    assert_eq!(wait.status.code(), Some(1), "{wait:?}");
    let status = env.status_json(&id);
    assert_eq!(status["state"], "failed");
    assert_eq!(status["error"], "oops");
    assert_eq!(status["reason"], "oops");
    assert_eq!(status["steps"][0]["exitCode"], 3);
    assert_eq!(status["steps"][0]["externalProcess"]["exitCode"], 3);
    assert_eq!(status["processTerminal"]["state"], "observed", "{status}");
    let failing = env.run(&["run", "--wait", "--", "false"]);
    assert_eq!(failing.status.code(), Some(1));
}

#[test]
fn a_missing_command_fails_the_run() {
    let env = Env::new();
    let out = env.run(&["run", "--wait", "--", "/nonexistent/agent-cli"]);
    assert_eq!(out.status.code(), Some(1));
    let id = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let status = env.status_json(&id);
    assert_eq!(status["state"], "failed");
    assert!(
        status["error"]
            .as_str()
            .unwrap()
            .contains("failed to start command"),
        "{status}"
    );
    assert_eq!(status["processTerminal"]["state"], "observed", "{status}");
    assert_eq!(
        status["steps"][0]["processTerminal"]["state"],
        "not-started"
    );
}

#[test]
fn timeout_kills_the_whole_process_group() {
    let env = Env::new();
    let script = "sleep 300 & echo $! > grandchild.pid; wait";
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
    let wait = env.run_within(&["wait", &id, "--timeout", "15s"], Duration::from_secs(20));
    assert_eq!(wait.status.code(), Some(1), "{wait:?}");
    let status = env.status_json(&id);
    assert_eq!(status["state"], "failed");
    assert_eq!(status["timedOut"], true);
    assert_eq!(status["error"], "timed out after 1s");
    let grandchild: u32 = std::fs::read_to_string(Path::new(env.work()).join("grandchild.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        !alive(grandchild),
        "the grandchild {grandchild} survived the timeout"
    );
    assert_eq!(status["processTerminal"]["state"], "observed", "{status}");
}

#[test]
fn stop_ends_runner_and_children_and_keeps_the_reason() {
    let env = Env::new();
    let script = "sleep 300 & echo $! > grandchild.pid; wait";
    let id = env
        .ok(&["run", "--cwd", env.work(), "--", "sh", "-c", script])
        .trim()
        .to_owned();
    let pid_file = Path::new(env.work()).join("grandchild.pid");
    poll(Duration::from_secs(20), || {
        pid_file.exists() && !std::fs::read_to_string(&pid_file).unwrap().is_empty()
    });
    let out = env.ok(&["stop", &id, "--reason", "no longer needed"]);
    assert!(out.contains("stopped"), "{out}");
    let status = env.settled(&id);
    assert_eq!(status["state"], "stopped");
    assert_eq!(status["error"], "no longer needed");
    assert_eq!(status["stopReason"], "no longer needed");
    assert_eq!(status["steps"][0]["status"], "stopped");
    assert_eq!(status["processTerminal"]["state"], "observed", "{status}");
    let grandchild: u32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(!alive(grandchild));
    assert_eq!(env.run(&["wait", &id]).status.code(), Some(1));
}

#[test]
fn a_runner_killed_with_sigkill_ends_failed_and_its_command_dies() {
    let env = Env::new();
    let id = env.ok(&["run", "--", "sleep", "300"]).trim().to_owned();
    let status = env.wait_for_child_pid(&id);
    let runner = status["pid"].as_u64().unwrap() as u32;
    let child = status["steps"][0]["externalProcess"]["pid"]
        .as_u64()
        .unwrap() as u32;
    kill(runner, libc::SIGKILL);
    let status = env.settled(&id);
    assert_eq!(status["state"], "failed");
    assert!(
        status["error"]
            .as_str()
            .unwrap()
            .contains("exited with signal SIGKILL"),
        "{status}"
    );
    assert_eq!(status["processTerminal"]["state"], "observed", "{status}");
    assert_eq!(
        status["processTerminal"]["instances"][0]["signal"],
        "SIGKILL"
    );
    assert!(!alive(child), "the command outlived its runner");
    assert!(!env.marker(&id).exists());
}

#[test]
fn reconcile_marks_a_run_failed_when_runner_and_monitor_are_gone() {
    let env = Env::new();
    let id = env.ok(&["run", "--", "sleep", "300"]).trim().to_owned();
    let status = env.wait_for_child_pid(&id);
    let runner = status["pid"].as_u64().unwrap() as u32;
    let monitor = status["monitorIdentity"]["pid"].as_u64().unwrap() as u32;
    let child = status["steps"][0]["externalProcess"]["pid"]
        .as_u64()
        .unwrap() as u32;
    kill(monitor, libc::SIGKILL);
    kill(runner, libc::SIGKILL);
    poll(Duration::from_secs(20), || {
        !alive(runner) && !alive(monitor)
    });
    let out: Value = serde_json::from_str(&env.ok(&["reconcile", "--json"])).unwrap();
    assert_eq!(out["repaired"][0]["runId"], id.as_str(), "{out}");
    let status = env.status_json(&id);
    assert_eq!(status["state"], "failed");
    assert!(
        status["steps"][0]["error"]
            .as_str()
            .unwrap()
            .contains("exited or disappeared"),
        "{status}"
    );
    // The observer proved every process gone, so the proof is observed.
    assert!(!alive(child), "the command outlived reconcile");
    assert_eq!(status["processTerminal"]["state"], "observed");
    assert!(!env.marker(&id).exists());
    assert_eq!(env.ok(&["list"]).trim(), "No active async runs.");
}

#[test]
fn a_recycled_pid_is_not_mistaken_for_the_runner() {
    let env = Env::new();
    // A run whose recorded runner pid is alive (this test process) but whose
    // recorded start time belongs to an earlier process with that pid.
    let me = std::process::id();
    let start = proc_start_time(me);
    for (id, start_time) in [("recycled", start + 1), ("genuine", start)] {
        let dir = env.root().join("async-subagent-runs").join(id);
        std::fs::create_dir_all(&dir).unwrap();
        let status = serde_json::json!({
            "lifecycleArtifactVersion": 3, "runId": id, "mode": "single", "state": "running",
            "startedAt": 1, "lastUpdate": 2, "pid": me,
            "runnerIdentity": {"pid": me, "startTime": start_time},
            "steps": [{"agent": "a", "status": "running"}]
        });
        std::fs::write(dir.join("status.json"), status.to_string()).unwrap();
    }
    env.ok(&["reconcile"]);
    assert_eq!(env.status_json("recycled")["state"], "failed");
    assert_eq!(env.status_json("genuine")["state"], "running");
}

#[test]
fn the_task_text_is_only_in_the_task_file() {
    let env = Env::new();
    let secret = "SENTINEL-7f3a-task-text";
    let id = env
        .ok(&[
            "run",
            "--wait",
            "--task",
            &format!("please {secret} now"),
            "--",
            "sh",
            "-c",
            "wc -c >/dev/null; echo done",
        ])
        .trim()
        .to_owned();
    let task_file = env
        .root()
        .join("async-subagent-runs")
        .join(&id)
        .join("task.md");
    for path in walk(env.root()) {
        let bytes = std::fs::read(&path).unwrap_or_default();
        let found = String::from_utf8_lossy(&bytes).contains(secret);
        assert_eq!(found, path == task_file, "{}", path.display());
    }
    let status = env.status_json(&id);
    assert_eq!(status["steps"][0]["description"], "[prompt redacted]");
    let started = &env.events(&id)[0];
    assert_eq!(started["task"], "[prompt redacted]");
    assert_eq!(started["goal"], "[prompt redacted]");
}

/// COMMAND's stdin and `$SUBAGENTS_TASK_FILE` are the same bytes, for a task
/// with and without a final newline, from `--task`, `--task-file` and a spec.
#[test]
fn stdin_is_byte_for_byte_the_task_file() {
    let env = Env::new();
    let same = ["sh", "-c", r#"cmp - "$SUBAGENTS_TASK_FILE""#];
    let file = Path::new(env.work()).join("prompt.txt");
    std::fs::write(&file, "from a file, no newline").unwrap();
    let file = file.to_str().unwrap().to_owned();
    let spec = Path::new(env.work()).join("spec.json");
    let steps = serde_json::json!({"mode": "parallel", "tasks": [
        {"agent": "a", "command": same, "task": "first, no newline"},
        {"agent": "b", "command": same, "task": "second\nwith one\n"},
    ]});
    std::fs::write(&spec, steps.to_string()).unwrap();
    let spec = spec.to_str().unwrap().to_owned();
    let launches: [Vec<&str>; 4] = [
        vec!["--task", "no newline"],
        vec!["--task", "ends with one\n"],
        vec!["--task-file", &file],
        vec!["--spec", &spec],
    ];
    for launch in launches {
        let mut args = vec!["run", "--wait"];
        args.extend(&launch);
        if !launch.contains(&"--spec") {
            args.push("--");
            args.extend(same);
        }
        let out = env.run(&args);
        let id = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        assert_eq!(out.status.code(), Some(0), "{launch:?}: {out:?}");
        let status = env.settled(&id);
        assert_eq!(status["state"], "complete", "{launch:?}: {status}");
        for step in status["steps"].as_array().unwrap() {
            assert_eq!(step["exitCode"], 0, "{launch:?}: {status}");
        }
    }
}

#[test]
fn the_task_reaches_the_command_on_stdin_env_and_placeholder() {
    let env = Env::new();
    let script = r#"read line; echo "stdin=$line"; echo "env=$(cat "$SUBAGENTS_TASK_FILE")"; echo "arg=$(cat "$1")""#;
    let id = env
        .ok(&[
            "run",
            "--wait",
            "--task",
            "hello task",
            "--",
            "sh",
            "-c",
            script,
            "sh",
            "{task_file}",
        ])
        .trim()
        .to_owned();
    assert_eq!(
        env.ok(&["logs", &id]),
        "stdin=hello task\nenv=hello task\narg=hello task\n"
    );
}

#[test]
fn every_file_is_0600_and_every_directory_0700() {
    let env = Env::new();
    let id = env
        .ok(&[
            "run",
            "--wait",
            "--task",
            "t",
            "--",
            "sh",
            "-c",
            "echo x; echo y >&2",
        ])
        .trim()
        .to_owned();
    env.ok(&["status", &id]);
    let files = walk(env.root());
    assert!(files.len() >= 8, "{files:?}");
    for path in files {
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600,
            "{}",
            path.display()
        );
    }
    for dir in walk_dirs(env.root()) {
        assert_eq!(
            std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
            0o700,
            "{}",
            dir.display()
        );
    }
}

#[test]
fn concurrent_runs_from_several_processes_get_distinct_ids_and_complete() {
    let env = Env::new();
    let children: Vec<_> = (0..8)
        .map(|i| {
            env.command(&["run", "--", "sh", "-c", &format!("echo {i}")])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut ids: Vec<String> = children
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().unwrap();
            assert!(out.status.success(), "{out:?}");
            String::from_utf8(out.stdout).unwrap().trim().to_owned()
        })
        .collect();
    let mut args = vec!["wait".to_owned()];
    args.extend(ids.iter().cloned());
    env.ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 8);
    let all: Value = serde_json::from_str(&env.ok(&["list", "--all", "--json"])).unwrap();
    assert!(
        all.as_array()
            .unwrap()
            .iter()
            .all(|r| r["state"] == "complete")
    );
}

#[test]
fn unknown_and_ambiguous_runs_exit_4_and_bad_ids_are_refused() {
    let env = Env::new();
    assert_eq!(env.run(&["status", "nope"]).status.code(), Some(4));
    env.ok(&["run", "--id", "abc-1", "--wait", "--", "true"]);
    env.ok(&["run", "--id", "abc-2", "--wait", "--", "true"]);
    let ambiguous = env.run(&["status", "abc"]);
    assert_eq!(ambiguous.status.code(), Some(4));
    assert!(String::from_utf8_lossy(&ambiguous.stderr).contains("ambiguous"));
    assert_eq!(env.status_json("abc-1")["state"], "complete");
    let again = env.run(&["run", "--id", "abc-1", "--", "true"]);
    assert_eq!(again.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&again.stderr).contains("already exists"));
    let hostile = env.run(&["run", "--id", "../escape", "--", "true"]);
    assert_eq!(
        hostile.status.code(),
        Some(2),
        "an unsafe --id is a usage error"
    );
    assert!(!env.root().join("escape").exists());
    let json = env.run(&["status", "nope", "--json"]);
    let error: Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(error["error"]["code"], "NOT_FOUND");
}

#[test]
fn wait_times_out_with_124_and_dismiss_hides_a_run() {
    let env = Env::new();
    let id = env.ok(&["run", "--", "sleep", "300"]).trim().to_owned();
    assert_eq!(
        env.run(&["wait", &id, "--timeout", "200ms"]).status.code(),
        Some(124)
    );
    assert!(env.ok(&["list"]).contains(&id));
    env.ok(&["dismiss", &id, "--force"]);
    assert!(!env.ok(&["list"]).contains(&id));
    assert_eq!(
        env.status_json(&id)["state"],
        "running",
        "dismiss does not touch processes"
    );
    env.ok(&["stop", &id]);
}

#[test]
fn a_malformed_status_is_a_clear_error() {
    let env = Env::new();
    let dir = env.root().join("async-subagent-runs").join("broken");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("status.json"), "{not json").unwrap();
    let out = env.run(&["status", "broken"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("subagents: failed to parse async status file"),
        "{stderr}"
    );
    assert!(stderr.contains("status.json"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1);
}

#[test]
fn completions_are_printed() {
    let env = Env::new();
    assert!(env.ok(&["completions", "bash"]).contains("subagents"));
    assert!(env.ok(&["completions", "zsh"]).contains("subagents"));
    assert!(env.ok(&["completions", "fish"]).contains("subagents"));
}

/// A command that blocks until `release` is called, without sleeping.
fn gated(env: &Env, name: &str) -> (String, Vec<String>) {
    let fifo = env.fifo(name);
    let script = format!("read line < '{}'", fifo.display());
    (
        fifo.display().to_string(),
        vec!["sh".into(), "-c".into(), script],
    )
}

/// Writes a line to `fifo` if some reader has it open; never blocks.
fn release_if_read(fifo: &str) {
    use std::os::unix::fs::OpenOptionsExt;
    let writer = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(fifo);
    if let Ok(mut writer) = writer {
        let _ = std::io::Write::write_all(&mut writer, b"go\n");
    }
}

fn release(fifo: &str) {
    std::fs::write(fifo, "go\n").unwrap();
}

#[test]
fn capacity_refuses_over_the_limit_and_frees_the_slot_only_after_the_proof() {
    let env = Env::new();
    let (fifo_a, cmd_a) = gated(&env, "a.fifo");
    let (fifo_b, cmd_b) = gated(&env, "b.fifo");
    let base = ["run", "--session", "s1", "--max-active", "2", "--"];
    let a = env
        .ok(&[
            &base[..],
            &cmd_a.iter().map(String::as_str).collect::<Vec<_>>()[..],
        ]
        .concat())
        .trim()
        .to_owned();
    let b = env
        .ok(&[
            &base[..],
            &cmd_b.iter().map(String::as_str).collect::<Vec<_>>()[..],
        ]
        .concat())
        .trim()
        .to_owned();
    let third = env.run(&[
        "run",
        "--session",
        "s1",
        "--max-active",
        "2",
        "--json",
        "--",
        "true",
    ]);
    assert_eq!(third.status.code(), Some(3), "{third:?}");
    let error: Value = serde_json::from_slice(&third.stdout).unwrap();
    assert_eq!(
        error["error"]["message"],
        "failed to launch run: Active async run capacity exhausted: 2/2 used."
    );
    assert_eq!(error["capacity"]["used"], 2);
    assert_eq!(env.run_count(), 2, "nothing was started");
    let capacity: Value =
        serde_json::from_str(&env.ok(&["capacity", "--session", "s1", "--json"])).unwrap();
    assert_eq!(capacity["used"], 2);
    assert_eq!(capacity["slots"][0]["release"]["state"], "retained");
    release(&fifo_a);
    let status = env.settled(&a);
    assert_eq!(status["processTerminal"]["state"], "observed", "{status}");
    let admitted = env.ok(&[
        "run",
        "--session",
        "s1",
        "--max-active",
        "2",
        "--wait",
        "--",
        "true",
    ]);
    assert!(!admitted.trim().is_empty());
    release(&fifo_b);
    env.settled(&b);
    // Another session has its own pool.
    env.ok(&[
        "run",
        "--session",
        "s2",
        "--max-active",
        "1",
        "--wait",
        "--",
        "true",
    ]);
}

#[test]
fn a_run_with_no_limit_still_takes_a_slot_that_a_later_limit_counts() {
    let env = Env::new();
    let (fifo, cmd) = gated(&env, "a.fifo");
    let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
    // `--max-active 0` is no limit, not "take no slot".
    let base = ["run", "--session", "s", "--max-active", "0", "--"];
    let a = env.ok(&[&base[..], &cmd[..]].concat()).trim().to_owned();
    let capacity: Value =
        serde_json::from_str(&env.ok(&["capacity", "--session", "s", "--json"])).unwrap();
    assert_eq!(capacity["used"], 1, "{capacity}");
    assert_eq!(
        capacity["slots"][0]["slot"]["runId"],
        a.as_str(),
        "{capacity}"
    );
    let limited = env.run(&["run", "--session", "s", "--max-active", "1", "--", "true"]);
    assert_eq!(limited.status.code(), Some(3), "{limited:?}");
    release(&fifo);
    env.settled(&a);
}

#[test]
fn concurrent_launches_respect_the_limit_exactly() {
    let env = Env::new();
    let (fifo, cmd) = gated(&env, "gate.fifo");
    let children: Vec<_> = (0..8)
        .map(|_| {
            let mut args = vec!["run", "--session", "race", "--max-active", "3", "--"];
            args.extend(cmd.iter().map(String::as_str));
            env.command(&args)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let codes: Vec<Option<i32>> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap().status.code())
        .collect();
    assert_eq!(
        codes.iter().filter(|c| **c == Some(0)).count(),
        3,
        "{codes:?}"
    );
    assert_eq!(
        codes.iter().filter(|c| **c == Some(3)).count(),
        5,
        "{codes:?}"
    );
    assert_eq!(env.run_count(), 3);
    let capacity: Value =
        serde_json::from_str(&env.ok(&["capacity", "--session", "race", "--json"])).unwrap();
    assert_eq!(capacity["used"], 3);
    // Readers may open the fifo at different times: keep opening it (without
    // blocking) until no run is active any more.
    poll(Duration::from_secs(60), || {
        release_if_read(&fifo);
        env.ok(&["list"]).trim() == "No active async runs."
    });
    let ids: Vec<String> = serde_json::from_str::<Value>(&env.ok(&["list", "--all", "--json"]))
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_owned())
        .collect();
    for id in ids {
        env.settled(&id);
    }
    let capacity: Value =
        serde_json::from_str(&env.ok(&["capacity", "--session", "race", "--json"])).unwrap();
    assert_eq!(capacity["used"], 0);
}

#[test]
fn a_relative_root_works() {
    let env = Env::new();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_subagents"))
        .current_dir(env.root())
        .args(["--root", "rel", "run", "--wait", "--", "true"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(env.root().join("rel/async-subagent-runs").is_dir());
}

#[test]
fn an_output_file_written_by_the_command_is_private() {
    let env = Env::new();
    let id = env
        .ok(&[
            "run",
            "--wait",
            "--",
            "sh",
            "-c",
            "echo result > \"$SUBAGENTS_OUTPUT_FILE\"; echo noise",
        ])
        .trim()
        .to_owned();
    let output = env
        .root()
        .join("async-subagent-runs")
        .join(&id)
        .join("output-0.log");
    assert_eq!(std::fs::read_to_string(&output).unwrap(), "result\n");
    assert_eq!(
        std::fs::metadata(&output).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert_eq!(env.ok(&["logs", &id]), "result\n");
}

#[test]
fn detached_processes_do_not_inherit_the_callers_descriptors() {
    let env = Env::new();
    let (read, write) = nix::unistd::pipe().unwrap();
    let id = env.ok(&["run", "--", "sleep", "30"]).trim().to_owned();
    let status = env.wait_for_child_pid(&id);
    let pipe_inode = std::fs::read_link(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&write)
    ))
    .unwrap();
    for pid in [
        status["pid"].as_u64().unwrap(),
        status["monitorIdentity"]["pid"].as_u64().unwrap(),
        status["steps"][0]["externalProcess"]["pid"]
            .as_u64()
            .unwrap(),
    ] {
        for fd in std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap() {
            let target = std::fs::read_link(fd.unwrap().path()).unwrap_or_default();
            assert_ne!(target, pipe_inode, "process {pid} holds the caller's pipe");
        }
    }
    drop((read, write));
    env.ok(&["stop", &id]);
}

#[test]
fn a_command_killed_by_an_outside_signal_ends_stopped() {
    let env = Env::new();
    let id = env.ok(&["run", "--", "sleep", "300"]).trim().to_owned();
    let status = env.wait_for_child_pid(&id);
    kill(
        status["steps"][0]["externalProcess"]["pid"]
            .as_u64()
            .unwrap() as u32,
        libc::SIGTERM,
    );
    let status = env.settled(&id);
    assert_eq!(status["state"], "stopped", "{status}");
    assert!(
        status["error"].as_str().unwrap().contains("signal SIGTERM"),
        "{status}"
    );
}

#[test]
fn an_active_listing_releases_the_marker_of_an_observed_run() {
    let env = Env::new();
    let id = env.ok(&["run", "--wait", "--", "true"]).trim().to_owned();
    std::fs::write(env.marker(&id), "").unwrap();
    assert_eq!(env.ok(&["list"]).trim(), "No active async runs.");
    assert!(!env.marker(&id).exists());
}

#[test]
fn logs_follow_streams_until_the_run_is_over() {
    use std::io::{BufRead, BufReader};
    let env = Env::new();
    let fifo = env.fifo("more.fifo");
    let script = format!("echo first; read line < '{}'; echo second", fifo.display());
    let id = env
        .ok(&["run", "--", "sh", "-c", &script])
        .trim()
        .to_owned();
    let mut follower = env
        .command(&["logs", &id, "--follow"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(follower.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "first");
    std::fs::write(&fifo, "go\n").unwrap();
    assert_eq!(lines.next().unwrap().unwrap(), "second");
    assert!(lines.next().is_none(), "follow ends with the run");
    assert!(follower.wait().unwrap().success());
}

/// One usage mistake of the table below: the arguments, and whether the
/// command takes `--json` (inserted right after the subcommand words).
struct Mistake {
    what: &'static str,
    args: Vec<String>,
    json_at: Option<usize>,
}

#[test]
fn every_usage_mistake_exits_2_with_one_line_and_a_hint() {
    let env = Env::new();
    let work = Path::new(env.work());
    // A named agent for `run --agent` without a task, found from the cwd.
    let agents = work.join(".subagents/agents");
    std::fs::create_dir_all(&agents).unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    std::fs::copy(
        repo.join("examples/agents/reviewer.md"),
        agents.join("reviewer.md"),
    )
    .unwrap();
    let done = env.ok(&["run", "--wait", "--", "true"]).trim().to_owned();
    let file = |name: &str, text: &str| {
        let path = work.join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let malformed = file("malformed.json", "{not json");
    let wrong_type = file(
        "wrong-type.json",
        r#"{"mode": "parallel", "tasks": [{"agent": "a", "command": "true"}]}"#,
    );
    let task = file("task.txt", "a task\n");
    let missing = work.join("missing.json").to_str().unwrap().to_owned();
    let m = |what, args: &[&str], json_at: Option<usize>| Mistake {
        what,
        args: args.iter().map(|a| (*a).to_owned()).collect(),
        json_at,
    };
    let table = [
        m(
            "run --agent without a task",
            &["run", "--agent", "reviewer"],
            Some(1),
        ),
        m("resume without a task", &["resume", &done], Some(1)),
        m(
            "task and task file",
            &["run", "--task", "x", "--task-file", &task, "--", "true"],
            Some(1),
        ),
        m(
            "unreadable task file",
            &["run", "--task-file", &missing, "--", "true"],
            Some(1),
        ),
        m("no command, agent or spec", &["run"], Some(1)),
        m("empty COMMAND", &["run", "--", ""], Some(1)),
        m(
            "word as --timeout",
            &["run", "--timeout", "soon", "--", "true"],
            Some(1),
        ),
        m(
            "negative --timeout",
            &["run", "--timeout=-5s", "--", "true"],
            Some(1),
        ),
        m(
            "--timeout with a bad unit",
            &["run", "--timeout", "5y", "--", "true"],
            Some(1),
        ),
        m(
            "resume with a bad --timeout",
            &["resume", &done, "--task", "x", "--timeout", "1x"],
            Some(1),
        ),
        m(
            "wait with a bad --timeout",
            &["wait", &done, "--timeout", "later"],
            Some(1),
        ),
        m("unknown subcommand", &["bogus"], Some(1)),
        m("unknown flag", &["list", "--bogus"], Some(1)),
        m("spec file missing", &["run", "--spec", &missing], Some(1)),
        m(
            "spec file malformed",
            &["run", "--spec", &malformed],
            Some(1),
        ),
        m(
            "spec field of the wrong type",
            &["run", "--spec", &wrong_type],
            Some(1),
        ),
        m(
            "spec with a task",
            &["run", "--spec", &wrong_type, "--task", "x"],
            Some(1),
        ),
        m(
            "unknown agent",
            &["run", "--agent", "nosuch", "--task", "x"],
            Some(1),
        ),
        m(
            "bad --max-active",
            &["run", "--max-active", "many", "--", "true"],
            Some(1),
        ),
        m(
            "unsafe --id",
            &["run", "--id", "../up", "--", "true"],
            Some(1),
        ),
        m(
            "empty --name",
            &["run", "--name", "", "--", "true"],
            Some(1),
        ),
        m(
            "--name over 64 characters",
            &["run", "--name", &"n".repeat(65), "--", "true"],
            Some(1),
        ),
        m(
            "--name with a newline",
            &["run", "--name", "a\nb", "--", "true"],
            Some(1),
        ),
        m(
            "validate of an unknown kind",
            &["validate", "--kind", "bogus", &task],
            None,
        ),
        m(
            "bad --older-than",
            &["prune", "--older-than", "ages"],
            Some(1),
        ),
        m(
            "logs --step out of range",
            &["logs", &done, "--step", "9"],
            Some(1),
        ),
    ];
    for mistake in &table {
        let args: Vec<&str> = mistake.args.iter().map(String::as_str).collect();
        let out = env.command(&args).current_dir(work).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{}: {out:?}", mistake.what);
        let lines: Vec<&str> = stderr.lines().collect();
        let messages: Vec<&&str> = lines
            .iter()
            .filter(|l| l.starts_with("subagents: "))
            .collect();
        assert_eq!(messages.len(), 1, "{}: {stderr}", mistake.what);
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("  hint: ") && l.len() > "  hint: ".len()),
            "{}: {stderr}",
            mistake.what
        );
        let Some(at) = mistake.json_at else { continue };
        let mut args = args.clone();
        args.insert(at, "--json");
        let out = env.command(&args).current_dir(work).output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(2),
            "{} --json: {out:?}",
            mistake.what
        );
        let error: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{} --json: {e}: {out:?}", mistake.what));
        assert_eq!(error["error"]["code"], "USAGE", "{}: {error}", mistake.what);
        assert_eq!(error["error"]["exitCode"], 2, "{}: {error}", mistake.what);
        assert!(
            error["error"]["hint"]
                .as_str()
                .is_some_and(|h| !h.is_empty()),
            "{}: {error}",
            mistake.what
        );
        // The same mistake as the text run: the same message.
        let text = messages[0].trim_start_matches("subagents: ");
        assert_eq!(error["error"]["message"], text, "{}", mistake.what);
    }
    assert_eq!(env.run_count(), 1, "no mistake started a run");
}

#[test]
fn a_usage_hint_names_the_flags_of_the_command_line() {
    let env = Env::new();
    let done = env.ok(&["run", "--wait", "--", "true"]).trim().to_owned();
    let out = env.run(&["resume", &done]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("  hint: give the follow-up task with --task TEXT or --task-file FILE"),
        "{stderr}"
    );
    let out = env.run(&["run", "--timeout", "soon", "--", "true"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("  hint: --timeout takes a duration"),
        "{stderr}"
    );
    let out = env.run(&["status", "--bogus"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("  hint: see `subagents status --help`"),
        "{stderr}"
    );
}

#[test]
fn list_limit_keeps_the_first_n_runs_of_the_listing() {
    let env = Env::new();
    for i in 0..3 {
        env.ok(&["run", "--wait", "--", "sh", "-c", &format!("echo {i}")]);
    }
    let ids = |args: &[&str]| -> Vec<String> {
        serde_json::from_str::<Value>(&env.ok(args))
            .unwrap()
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["id"].as_str().unwrap().to_owned())
            .collect()
    };
    let all = ids(&["list", "--all", "--json"]);
    assert_eq!(all.len(), 3, "{all:?}");
    for id in &all {
        env.settled(id);
    }
    let all = ids(&["list", "--all", "--json"]);
    assert_eq!(ids(&["list", "--all", "--limit", "2", "--json"]), all[..2]);
    assert_eq!(ids(&["list", "--all", "--limit", "5", "--json"]), all);
}
