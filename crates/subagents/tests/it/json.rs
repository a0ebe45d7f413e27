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
