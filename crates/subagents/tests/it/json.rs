//! Every command takes `--json` and prints exactly one JSON value on stdout,
//! errors and usage errors included.

use crate::common;

use serde_json::Value;

use common::Env;

/// Runs the binary; returns (exit code, the one JSON value on stdout).
fn json_of(env: &Env, args: &[&str]) -> (i32, Value) {
    let out = env.run(args);
    let text = String::from_utf8_lossy(&out.stdout);
    let value = serde_json::from_str(text.trim())
        .unwrap_or_else(|e| panic!("{args:?}: stdout is not one JSON value ({e}): {text:?}"));
    (out.status.code().unwrap(), value)
}

fn error_code(value: &Value) -> &str {
    value["error"]["code"].as_str().unwrap_or_default()
}

#[test]
fn budget_create_and_show_take_json() {
    let env = Env::new();
    let (code, descriptor) = json_of(
        &env,
        &[
            "budget",
            "create",
            "--root-run-id",
            "r",
            "--limit",
            "3",
            "--json",
        ],
    );
    assert_eq!(code, 0);
    assert_eq!(descriptor["limit"], 3);
    let file = env.root().join("descriptor.json");
    std::fs::write(&file, descriptor.to_string()).unwrap();
    let (code, snapshot) = json_of(
        &env,
        &[
            "budget",
            "show",
            "--descriptor",
            file.to_str().unwrap(),
            "--json",
        ],
    );
    assert_eq!(code, 0);
    assert_eq!(
        snapshot,
        serde_json::json!({"used": 0, "limit": 3, "remaining": 3})
    );

    let (code, error) = json_of(
        &env,
        &[
            "budget",
            "create",
            "--root-run-id",
            "r",
            "--limit",
            "0",
            "--json",
        ],
    );
    assert_eq!(code, 1);
    assert_eq!(error_code(&error), "FAILED");
    let (code, error) = json_of(
        &env,
        &["budget", "show", "--descriptor", "/nonexistent", "--json"],
    );
    assert_eq!(code, 1);
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("/nonexistent")
    );
}

#[test]
fn logs_and_dismiss_take_json() {
    let env = Env::new();
    let (code, launched) = json_of(&env, &["run", "--json", "--", "sh", "-c", "echo hello"]);
    assert_eq!(code, 0);
    let id = launched["runId"].as_str().unwrap().to_string();
    env.ok(&["wait", &id]);

    let (code, logs) = json_of(&env, &["logs", &id, "--json"]);
    assert_eq!(code, 0);
    assert_eq!(logs["runId"], id.as_str());
    assert_eq!(logs["state"], "complete");
    let texts: Vec<&str> = logs["logs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["text"].as_str().unwrap())
        .collect();
    assert_eq!(texts, ["hello\n"]);

    let (code, dismissed) = json_of(&env, &["dismiss", &id, "--json"]);
    assert_eq!(code, 0);
    assert_eq!(dismissed["runId"], id.as_str());
    assert!(dismissed["displayDismissedAt"].is_u64());
    assert!(env.status_json(&id)["displayDismissedAt"].is_u64());

    for args in [["logs", "nope", "--json"], ["dismiss", "nope", "--json"]] {
        let (code, error) = json_of(&env, &args);
        assert_eq!(code, 4, "{args:?}");
        assert_eq!(error_code(&error), "NOT_FOUND");
    }
}

#[test]
fn usage_errors_are_json_when_json_is_on_the_command_line() {
    let env = Env::new();
    for args in [
        vec!["list", "--bogus", "--json"],
        vec!["budget", "create", "--json"],
        vec!["logs", "x", "--follow", "--json"],
        vec!["status", "--json"],
    ] {
        let (code, error) = json_of(&env, &args);
        assert_eq!(code, 2, "{args:?}");
        assert_eq!(error_code(&error), "USAGE", "{args:?}");
        assert!(!error["error"]["message"].as_str().unwrap().is_empty());
    }
    // Without --json (or with it only after `--`, where it belongs to COMMAND)
    // clap's own text stays on stderr and stdout is empty.
    for args in [
        vec!["list", "--bogus"],
        vec!["run", "--bogus", "--", "x", "--json"],
    ] {
        let out = env.run(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

/// One rule for every command's `--json`: one line on a pipe (one value
/// per line for `jq` and `read`), indented on a terminal.
#[test]
fn json_is_one_line_on_a_pipe_and_pretty_on_a_terminal() {
    let env = Env::new();
    let id = env.ok(&["run", "--", "true"]).trim().to_owned();
    env.settled(&id);
    let descriptor = env.root().join("descriptor.json");
    std::fs::write(
        &descriptor,
        env.ok(&["budget", "create", "--root-run-id", "r"]),
    )
    .unwrap();
    let commands: Vec<Vec<&str>> = vec![
        vec!["status", &id, "--json"],
        vec!["list", "--all", "--json"],
        vec!["list", "--all", "--sort", "started", "--json"],
        vec!["wait", &id, "--json"],
        vec!["stop", &id, "--json"],
        vec!["logs", &id, "--json"],
        vec!["reconcile", "--json"],
        vec!["capacity", "--json"],
        vec!["prune", "--dry-run", "--json"],
        vec!["config", "--json"],
        vec!["agents", "--json"],
        vec!["budget", "--json"],
        vec![
            "budget",
            "show",
            "--descriptor",
            descriptor.to_str().unwrap(),
            "--json",
        ],
        vec!["status", "no-such-run", "--json"],
    ];
    for args in &commands {
        let out = env.run(args);
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(text.lines().count(), 1, "{args:?} on a pipe: {text}");
        serde_json::from_str::<Value>(&text).unwrap_or_else(|e| panic!("{args:?}: {e}"));
    }
    // On a terminal (script(1) gives the command one), the same values indented.
    let script = std::process::Command::new("script")
        .arg("--version")
        .output();
    if !script.is_ok_and(|o| o.status.success()) {
        eprintln!("skipped the terminal half: script(1) is not installed");
        return;
    }
    for args in &commands[..3] {
        let mut line = format!(
            "'{}' --root '{}'",
            env!("CARGO_BIN_EXE_subagents"),
            env.root().display()
        );
        for arg in args {
            line.push_str(&format!(" '{arg}'"));
        }
        let mut command = std::process::Command::new("script");
        command
            .args(["-qec", &line, "/dev/null"])
            .env("XDG_CONFIG_HOME", env.root().join("no-config"))
            .stdin(std::process::Stdio::null());
        let out = common::output_within(command, std::time::Duration::from_secs(60));
        let text = String::from_utf8_lossy(&out.stdout).replace('\r', "");
        assert!(text.lines().count() > 3, "{args:?} on a terminal: {text}");
        assert!(text.contains("\n  "), "{args:?} on a terminal: {text}");
        // Written a row at a time, it is what the pretty printer makes of
        // the whole value.
        let value = serde_json::from_str::<Value>(&text)
            .unwrap_or_else(|e| panic!("{args:?} on a terminal: {e}: {text}"));
        assert_eq!(
            text.trim_end(),
            serde_json::to_string_pretty(&value).unwrap(),
            "{args:?} on a terminal"
        );
    }
}
