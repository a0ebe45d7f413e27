//! End-to-end tests of the command-line surface that other tests take for
//! granted: `--task-file`, `--timeout 0`, the `SUBAGENTS_*` variables a
//! COMMAND receives, how the state root is chosen without `--root`, and the
//! usage exit code.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;
use serde_json::Value;

const DEADLINE: Duration = Duration::from_secs(25);

fn stdout_of(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[test]
fn a_task_file_reaches_the_command_and_is_copied_privately() {
    let env = Env::new();
    let task = Path::new(env.work()).join("prompt.txt");
    std::fs::write(&task, "review SENTINEL-taskfile-91c\nsecond line\n").unwrap();
    let script = r#"echo "stdin: $(cat)"; echo "file: $(cat "$SUBAGENTS_TASK_FILE")""#;
    let out = env.run_within(
        &[
            "run",
            "--wait",
            "--task-file",
            task.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            script,
        ],
        DEADLINE,
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let id = stdout_of(&out);
    let logs = env.ok(&["logs", &id]);
    assert_eq!(
        logs,
        "stdin: review SENTINEL-taskfile-91c\nsecond line\nfile: review SENTINEL-taskfile-91c\nsecond line\n"
    );
    let copy = env.run_dir(&id).join("task.md");
    assert_eq!(
        std::fs::read_to_string(&copy).unwrap(),
        std::fs::read_to_string(&task).unwrap()
    );
    let status = env.settled(&id);
    assert_eq!(status["steps"][0]["description"], "[prompt redacted]");
    for path in walk(env.root()) {
        let text = String::from_utf8_lossy(&std::fs::read(&path).unwrap_or_default()).into_owned();
        let leaked = text.contains("SENTINEL-taskfile-91c");
        let allowed = path == copy
            || path.file_name().is_some_and(|n| n == "output-0.log")
            || path
                .file_name()
                .is_some_and(|n| n == "external-0.stdout.log");
        assert!(!leaked || allowed, "{}", path.display());
    }
    // A task file that cannot be read: a clear error naming it, no run.
    let missing = Path::new(env.work()).join("missing.txt");
    let out = env.run_within(
        &[
            "run",
            "--task-file",
            missing.to_str().unwrap(),
            "--",
            "true",
        ],
        DEADLINE,
    );
    assert_eq!(
        out.status.code(),
        Some(2),
        "a usage mistake, as for resume: {out:?}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("missing.txt"), "{stderr}");
    assert_eq!(env.run_count(), 1, "no run for the unreadable task file");
}

#[test]
fn timeout_zero_means_no_deadline() {
    let env = Env::new();
    // The command runs until the test lets it go.
    let script = "i=0; while [ ! -e go ]; do i=$((i+1)); [ $i -gt 400 ] && exit 9; sleep 0.05; done; echo released";
    let id = env
        .ok(&[
            "run",
            "--timeout",
            "0",
            "--cwd",
            env.work(),
            "--",
            "sh",
            "-c",
            script,
        ])
        .trim()
        .to_owned();
    let status = env.wait_for_child_pid(&id);
    assert_eq!(status["state"], "running", "{status}");
    std::fs::write(Path::new(env.work()).join("go"), "").unwrap();
    let wait = env.run_within(&["wait", &id, "--timeout", "20s"], DEADLINE);
    assert_eq!(wait.status.code(), Some(0), "{wait:?}");
    let status = env.settled(&id);
    assert_eq!(status["state"], "complete");
    assert_ne!(status["timedOut"], true);
    assert_eq!(env.ok(&["logs", &id]), "released\n");
}

#[test]
fn the_command_gets_the_subagents_variables() {
    let env = Env::new();
    let names = [
        "SUBAGENTS_RUN_ID",
        "SUBAGENTS_ROOT",
        "SUBAGENTS_RUN_DIR",
        "SUBAGENTS_STEP_INDEX",
        "SUBAGENTS_OUTPUT_FILE",
        "SUBAGENTS_TASK_FILE",
        "SUBAGENTS_RUN_FANOUT_BUDGET",
    ];
    let script: String = names
        .iter()
        .map(|n| format!("echo \"{n}=${n}\" >> env.txt; "))
        .collect();
    let out = env.run_within(
        &[
            "run",
            "--wait",
            "--task",
            "t",
            "--cwd",
            env.work(),
            "--",
            "sh",
            "-c",
            &script,
        ],
        DEADLINE,
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let id = stdout_of(&out);
    let text = std::fs::read_to_string(Path::new(env.work()).join("env.txt")).unwrap();
    let seen: std::collections::BTreeMap<&str, &str> =
        text.lines().filter_map(|l| l.split_once('=')).collect();
    let dir = env.run_dir(&id);
    assert_eq!(seen["SUBAGENTS_RUN_ID"], id);
    assert_eq!(Path::new(seen["SUBAGENTS_ROOT"]), env.root());
    assert_eq!(Path::new(seen["SUBAGENTS_RUN_DIR"]), dir);
    assert_eq!(seen["SUBAGENTS_STEP_INDEX"], "0");
    assert_eq!(
        Path::new(seen["SUBAGENTS_OUTPUT_FILE"]),
        dir.join("output-0.log")
    );
    assert_eq!(Path::new(seen["SUBAGENTS_TASK_FILE"]), dir.join("task.md"));
    assert!(!seen["SUBAGENTS_RUN_FANOUT_BUDGET"].is_empty(), "{text}");
    env.settled(&id);
}

/// Launches `true` with `command` (no `--root`); returns the run id.
fn launch_without_root(mut command: Command) -> String {
    command.args(["run", "--wait", "--", "true"]);
    let out = output_within(command, DEADLINE);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    stdout_of(&out)
}

fn has_run(root: &Path, id: &str) -> bool {
    root.join("async-subagent-runs")
        .join(id)
        .join("status.json")
        .is_file()
}

#[test]
fn the_state_root_comes_from_the_flag_then_the_variables_then_home() {
    let env = Env::new();
    let work = PathBuf::from(env.work());
    let (explicit, variable, xdg, home) = (
        work.join("explicit"),
        work.join("variable"),
        work.join("xdg"),
        work.join("home"),
    );
    // --root wins over $SUBAGENTS_ROOT.
    let mut command = env.rootless_command(&["--root", explicit.to_str().unwrap()]);
    command.env("SUBAGENTS_ROOT", &variable);
    let id = launch_without_root(command);
    assert!(has_run(&explicit, &id) && !variable.exists());
    // $SUBAGENTS_ROOT wins over $XDG_STATE_HOME.
    let mut command = env.rootless_command(&[]);
    command
        .env("SUBAGENTS_ROOT", &variable)
        .env("XDG_STATE_HOME", &xdg);
    let id = launch_without_root(command);
    assert!(has_run(&variable, &id) && !xdg.exists());
    // $XDG_STATE_HOME/subagents wins over ~/.local/state/subagents.
    let mut command = env.rootless_command(&[]);
    command.env("XDG_STATE_HOME", &xdg).env("HOME", &home);
    let id = launch_without_root(command);
    assert!(has_run(&xdg.join("subagents"), &id) && !home.exists());
    // Last, ~/.local/state/subagents.
    let mut command = env.rootless_command(&[]);
    command.env("HOME", &home);
    let id = launch_without_root(command);
    assert!(has_run(&home.join(".local/state/subagents"), &id));
    // Every later command finds the run the same way.
    let mut command = env.rootless_command(&["status", &id, "--json"]);
    command.env("HOME", &home);
    let out = output_within(command, DEADLINE);
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status["state"], "complete", "{out:?}");
}

#[test]
fn usage_errors_exit_2_and_create_nothing() {
    let env = Env::new();
    for args in [
        &["run"][..],
        &["run", "--no-such-flag", "--", "true"],
        &["stop"],
        &["status"],
        &["no-such-command"],
        &["run", "--max-active", "many", "--", "true"],
    ] {
        let out = env.run_within(args, DEADLINE);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        assert!(!out.stderr.is_empty(), "{args:?}");
        assert_eq!(env.run_count(), 0, "{args:?}");
    }
}

#[test]
fn the_launch_variables_set_the_session_its_limit_and_the_budget() {
    let env = Env::new();
    let with_vars = |args: &[&str]| {
        let mut command = env.command(args);
        command
            .env("SUBAGENTS_SESSION_ID", "session-from-env")
            .env("SUBAGENTS_MAX_ACTIVE", "1")
            .env("SUBAGENTS_MAX_SPAWNS_PER_RUN", "5");
        output_within(command, DEADLINE)
    };
    // Holds the session's only slot until the test lets it go.
    let gate = "i=0; while [ ! -e go ]; do i=$((i+1)); [ $i -gt 400 ] && exit 9; sleep 0.05; done";
    let first = with_vars(&["run", "--cwd", env.work(), "--", "sh", "-c", gate]);
    assert_eq!(first.status.code(), Some(0), "{first:?}");
    let first = stdout_of(&first);
    let status = env.status_json(&first);
    assert_eq!(status["sessionId"], "session-from-env");
    assert_eq!(
        status["runFanoutBudget"],
        serde_json::json!({"used": 1, "limit": 5, "remaining": 4})
    );
    let refused = with_vars(&["run", "--", "true"]);
    assert_eq!(refused.status.code(), Some(3), "{refused:?}");
    assert_eq!(env.run_count(), 1, "nothing started over the limit");
    // A flag wins over its variable.
    let other = with_vars(&["run", "--wait", "--session", "other", "--", "true"]);
    assert_eq!(other.status.code(), Some(0), "{other:?}");
    assert_eq!(env.status_json(&stdout_of(&other))["sessionId"], "other");
    std::fs::write(Path::new(env.work()).join("go"), "").unwrap();
    let wait = env.run_within(&["wait", &first, "--timeout", "20s"], DEADLINE);
    assert_eq!(wait.status.code(), Some(0), "{wait:?}");
}
