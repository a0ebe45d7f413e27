//! Flags, config keys and spec values that had no test of their own (the
//! tidy checks `every_cli_flag_is_named_by_some_test`,
//! `every_config_key_is_named_by_some_test` and
//! `every_spec_field_is_named_by_some_test` list them): each test shows what
//! the flag or key changes, so it fails when the flag or key is ignored.
use crate::common;

use std::time::Duration;

use common::*;
use serde_json::{Value, json};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn agents_prompt_json_wraps_the_snippet_in_an_object() {
    let env = Env::new();
    let run = |args: &[&str]| {
        let mut command = env.command(args);
        command.current_dir(env.work());
        let out = command.output().unwrap();
        assert!(out.status.success(), "{out:?}");
        text(&out.stdout)
    };
    let snippet = run(&["agents", "prompt"]);
    assert!(
        serde_json::from_str::<Value>(&snippet).is_err(),
        "{snippet}"
    );
    let json: Value = serde_json::from_str(&run(&["agents", "prompt", "--json"])).unwrap();
    assert_eq!(json["snippet"], snippet.as_str(), "{json}");
}

#[test]
fn budget_doctor_reports_the_fanout_limit_flag_as_json() {
    let env = Env::new();
    let run = |args: &[&str]| {
        let mut command = env.command(args);
        command
            .env_remove("SUBAGENTS_MAX_SPAWNS_PER_RUN")
            .env_remove("PI_SUBAGENT_MAX_SPAWNS_PER_RUN")
            .env_remove("SUBAGENTS_RUN_FANOUT_BUDGET")
            .env_remove("PI_SUBAGENT_RUN_FANOUT_BUDGET")
            .env_remove("SUBAGENTS_RUN_ID");
        let out = command.output().unwrap();
        assert!(out.status.success(), "{out:?}");
        text(&out.stdout)
    };
    let report: Value =
        serde_json::from_str(&run(&["budget", "doctor", "--fanout-limit", "5", "--json"])).unwrap();
    assert_eq!(report["newRootRun"]["limit"], 5, "{report}");
    assert_eq!(report["newRootRun"]["source"], "flag", "{report}");
    // Without the flag: the default; without --json: the text report.
    let default: Value = serde_json::from_str(&run(&["budget", "doctor", "--json"])).unwrap();
    assert_eq!(default["newRootRun"]["limit"], 64, "{default}");
    let plain = run(&["budget", "doctor", "--fanout-limit", "5"]);
    assert!(serde_json::from_str::<Value>(&plain).is_err(), "{plain}");
    assert!(plain.contains("limit 5 (from --fanout-limit)"), "{plain}");
}

#[test]
fn resume_reads_the_follow_up_from_its_task_file() {
    let env = Env::new();
    let script = r#"echo "task: $(cat)""#;
    let source = env
        .ok(&["run", "--wait", "--task", "first", "--", "sh", "-c", script])
        .trim()
        .to_owned();
    let file = std::path::Path::new(env.work()).join("follow-up.md");
    std::fs::write(&file, "the follow-up from a file").unwrap();
    let revived = env
        .ok(&["resume", &source, "--task-file", file.to_str().unwrap()])
        .trim()
        .to_owned();
    env.ok(&["wait", &revived]);
    let logs = env.ok(&["logs", &revived]);
    assert!(logs.contains("task: the follow-up from a file"), "{logs}");
    env.settled(&source);
    env.settled(&revived);
}

/// A config home holding `subagents/config.toml` with `text`.
fn config_home(text: &str) -> tempfile::TempDir {
    let config = tempfile::tempdir().unwrap();
    std::fs::create_dir(config.path().join("subagents")).unwrap();
    std::fs::write(config.path().join("subagents/config.toml"), text).unwrap();
    config
}

/// The `config --json` entry of `key`.
fn shown_key(env: &Env, config: &tempfile::TempDir, key: &str) -> Value {
    let mut command = env.command(&["config", "--json"]);
    command
        .env("XDG_CONFIG_HOME", config.path())
        .env_remove("SUBAGENTS_IDLE_TIMEOUT");
    let out = command.output().unwrap();
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    shown["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["key"] == key)
        .cloned()
        .unwrap()
}

#[test]
fn the_config_files_idle_timeout_ends_a_silent_run() {
    let env = Env::new();
    let config = config_home("idle_timeout = \"1s\"\n");
    let mut command = env.command(&["run", "--", "sleep", "600"]);
    command
        .env("XDG_CONFIG_HOME", config.path())
        .env_remove("SUBAGENTS_IDLE_TIMEOUT");
    let out = output_within(command, Duration::from_secs(60));
    assert!(out.status.success(), "{out:?}");
    let id = text(&out.stdout).trim().to_owned();
    let status = env.settled_within(&id, Duration::from_secs(60));
    assert_eq!(status["state"], "failed", "{status}");
    assert_eq!(status["error"], "no output for 1s", "{status}");
    let entry = shown_key(&env, &config, "idle_timeout");
    assert_eq!(entry["value"], "1s", "{entry}");
    assert_eq!(entry["source"], "config", "{entry}");
}

#[test]
fn the_config_files_executor_makes_runs_slurm_runs() {
    let env = Env::new();
    let config = config_home("executor = \"slurm\"\n");
    // A Slurm run refuses our queue before anything is submitted; a local
    // run (no config) takes it.
    let mut command = env.command(&["run", "--queue", "--", "true"]);
    command.env("XDG_CONFIG_HOME", config.path());
    let out = output_within(command, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        text(&out.stderr).contains("`queue` does not apply to a Slurm run"),
        "{out:?}"
    );
    assert_eq!(env.run_count(), 0);
    let id = env.ok(&["run", "--queue", "--wait", "--", "true"]);
    assert_eq!(env.settled(id.trim())["state"], "complete");
    let entry = shown_key(&env, &config, "executor");
    assert_eq!(entry["value"], "slurm", "{entry}");
    assert_eq!(entry["source"], "config", "{entry}");
}

#[test]
fn a_spec_steps_zero_timeout_is_no_limit() {
    let env = Env::new();
    let spec = json!({"mode": "chain", "steps": [
        {"agent": "patient", "command": ["sh", "-c", "sleep 0.3; echo done"], "timeout": "0"}
    ]});
    let file = std::path::Path::new(env.work()).join("zero.json");
    std::fs::write(&file, spec.to_string()).unwrap();
    let id = env.ok(&["run", "--wait", "--spec", file.to_str().unwrap()]);
    let status = env.settled(id.trim());
    assert_eq!(status["state"], "complete", "{status}");
    assert_eq!(status["steps"][0]["status"], "complete", "{status}");
}

/// A bad default in the config file is refused against the file, its line
/// and its key, before anything runs, not later against a flag the user
/// never typed.
#[test]
fn a_bad_timeout_or_executor_in_the_config_file_is_refused_naming_the_line() {
    let env = Env::new();
    for (body, said) in [
        ("timeout = \"soon\"\n", "line 1: timeout: "),
        ("\nidle_timeout = \"-1s\"\n", "line 2: idle_timeout: "),
        (
            "executor = \"cloud\"\n",
            "line 1: executor must be \"local\" or \"slurm\", not 'cloud'",
        ),
    ] {
        let config = config_home(body);
        let mut command = env.command(&["run", "--", "true"]);
        command.env("XDG_CONFIG_HOME", config.path());
        let out = output_within(command, Duration::from_secs(60));
        assert_eq!(out.status.code(), Some(1), "{body}: {out:?}");
        let stderr = text(&out.stderr);
        assert!(stderr.contains(said), "{body}: {stderr}");
        assert!(stderr.contains("config.toml"), "{body}: {stderr}");
    }
    let runs = env.root().join("async-subagent-runs");
    let started = std::fs::read_dir(&runs).map(|d| d.count()).unwrap_or(0);
    assert_eq!(started, 0, "a run started under a bad config");
}
