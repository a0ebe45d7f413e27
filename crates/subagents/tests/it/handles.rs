//! Run handles and durations through the real binary: `last`, `wait` with no
//! ids, several ids for `stop`/`dismiss`/`wait`, `resume --wait`, `logs
//! --follow`'s exit, `logs` of a silent run, compound durations.

use crate::common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use common::*;
use serde_json::Value;

/// A command that waits for `file` to exist, printing nothing.
fn gated(file: &Path) -> String {
    format!("while [ ! -e '{}' ]; do sleep 0.05; done", file.display())
}

/// The binary in `session` (`$SUBAGENTS_SESSION_ID`).
fn in_session(env: &Env, session: &str, args: &[&str]) -> Command {
    let mut command = env.command(args);
    command.env("SUBAGENTS_SESSION_ID", session);
    command
}

fn run_in(env: &Env, session: &str, args: &[&str]) -> Output {
    output_within(in_session(env, session, args), Duration::from_secs(60))
}

fn ok_in(env: &Env, session: &str, args: &[&str]) -> String {
    let out = run_in(env, session, args);
    assert!(out.status.success(), "subagents {args:?} failed: {out:?}");
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn durations_take_compound_and_day_forms() {
    let env = Env::new();
    let go = Path::new(env.work()).join("go");
    let id = env
        .ok(&["run", "--timeout", "1h30m", "--", "sh", "-c", &gated(&go)])
        .trim()
        .to_owned();
    assert_eq!(env.status_json(&id)["timeoutMs"], 5_400_000);
    let day = env
        .ok(&["run", "--timeout", "1d", "--", "true"])
        .trim()
        .to_owned();
    assert_eq!(env.status_json(&day)["timeoutMs"], 86_400_000);
    std::fs::write(&go, "").unwrap();
    env.ok(&["wait", "--timeout", "2m30s", &id, &day]);
    let pruned: Value =
        serde_json::from_str(&env.ok(&["prune", "--older-than", "1d12h", "--dry-run", "--json"]))
            .unwrap();
    assert_eq!(pruned["olderThanMs"], 129_600_000_u64, "{pruned}");
}

#[test]
fn a_bare_number_is_not_a_duration() {
    let env = Env::new();
    for args in [
        &["run", "--timeout", "10", "--", "true"][..],
        &["wait", "--timeout", "10", "nope"][..],
        &["prune", "--older-than", "7"][..],
    ] {
        let out = env.run(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        let err = stderr(&out);
        assert!(err.contains("needs a unit"), "{args:?}: {err}");
        assert!(
            err.contains("hint:") && err.contains("1h30m"),
            "{args:?}: {err}"
        );
    }
    assert_eq!(env.run_count(), 0, "nothing was launched");
    let out = env.run(&["run", "--timeout", "30m1h", "--", "true"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(stderr(&out).contains("largest to smallest"), "{out:?}");
}

#[test]
fn wait_timeout_zero_is_no_deadline() {
    let env = Env::new();
    let id = env
        .ok(&["run", "--", "sh", "-c", "sleep 0.5"])
        .trim()
        .to_owned();
    let out = env.run(&["wait", "--timeout", "0", &id]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(env.settled(&id)["state"], "complete");
}

#[test]
fn last_is_the_newest_run_of_the_session() {
    let env = Env::new();
    ok_in(
        &env,
        "a",
        &[
            "run", "--wait", "--id", "a-one", "--", "sh", "-c", "echo one",
        ],
    );
    ok_in(
        &env,
        "b",
        &[
            "run", "--wait", "--id", "b-one", "--", "sh", "-c", "echo bee",
        ],
    );
    // A newer run of session a that fails: `list --all` puts it first, and
    // the README's old `jq '.[0]'` idiom found a failed run before the
    // newest one.
    run_in(
        &env,
        "a",
        &[
            "run",
            "--wait",
            "--id",
            "a-old-fail",
            "--",
            "sh",
            "-c",
            "exit 3",
        ],
    );
    let out = run_in(&env, "a", &["run", "--", "sh", "-c", "echo two"]);
    let newest = String::from_utf8(out.stdout.clone()).unwrap();
    // `run` prints the id alone: `id=$(subagents run -- ...)`.
    assert!(newest.ends_with('\n') && !newest.trim().contains(char::is_whitespace));
    let newest = newest.trim();
    ok_in(&env, "a", &["wait", "last"]);
    assert_eq!(ok_in(&env, "a", &["logs", "last"]), "two\n");
    let status: Value =
        serde_json::from_str(&ok_in(&env, "a", &["status", "last", "--json"])).unwrap();
    assert_eq!(status["id"], newest, "{status}");
    assert_eq!(ok_in(&env, "b", &["logs", "last"]), "bee\n");
    let out = run_in(&env, "c", &["logs", "last"]);
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    let err = stderr(&out);
    assert!(
        err.contains("session 'c' has no run") && err.contains("hint:"),
        "{err}"
    );
}

#[test]
fn an_explicit_id_may_not_be_last() {
    let env = Env::new();
    let out = env.run(&["run", "--id", "last", "--", "true"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(stderr(&out).contains("reserved"), "{out:?}");
    assert_eq!(env.run_count(), 0);
}

#[test]
fn wait_without_ids_waits_for_the_sessions_active_runs() {
    let env = Env::new();
    let out = run_in(&env, "a", &["wait"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(stderr(&out).contains("no active run"), "{out:?}");

    let other = Path::new(env.work()).join("other-go");
    let elsewhere = ok_in(&env, "b", &["run", "--", "sh", "-c", &gated(&other)]);
    let good = ok_in(&env, "a", &["run", "--", "sh", "-c", "sleep 0.3"]);
    let bad = ok_in(&env, "a", &["run", "--", "sh", "-c", "sleep 0.3; exit 3"]);
    let out = run_in(&env, "a", &["wait"]);
    assert_eq!(out.status.code(), Some(1), "one run failed: {out:?}");
    let stdout = String::from_utf8(out.stdout.clone()).unwrap();
    assert!(
        stdout.contains(&format!("{} complete", good.trim())),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("{} failed", bad.trim())),
        "{stdout}"
    );
    assert!(
        !stdout.contains(elsewhere.trim()),
        "another session's run: {stdout}"
    );
    assert_eq!(env.status_json(elsewhere.trim())["state"], "running");
    std::fs::write(&other, "").unwrap();
    env.ok(&["wait", elsewhere.trim()]);
}

#[test]
fn stop_and_dismiss_take_several_runs() {
    let env = Env::new();
    let go = Path::new(env.work()).join("never");
    let one = env
        .ok(&["run", "--", "sh", "-c", &gated(&go)])
        .trim()
        .to_owned();
    let two = env
        .ok(&["run", "--", "sh", "-c", &gated(&go)])
        .trim()
        .to_owned();
    let out = env.ok(&["stop", &one, &two]);
    assert!(out.contains(&format!("{one} stopped")), "{out}");
    assert!(out.contains(&format!("{two} stopped")), "{out}");
    let waited = env.run(&["wait", &one, &two]);
    assert_eq!(waited.status.code(), Some(1), "stopped runs: {waited:?}");
    let out = env.run(&["dismiss", &one, "no-such-run", &two]);
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    let stdout = String::from_utf8(out.stdout.clone()).unwrap();
    assert!(stdout.contains(&format!("{one} dismissed")), "{stdout}");
    assert!(stdout.contains(&format!("{two} dismissed")), "{stdout}");
    assert!(stderr(&out).contains("no-such-run"), "{out:?}");
}

#[test]
fn resume_wait_exits_as_run_wait() {
    let env = Env::new();
    let source = env
        .ok(&[
            "run",
            "--wait",
            "--task",
            "first",
            "--",
            "sh",
            "-c",
            "grep -q first",
        ])
        .trim()
        .to_owned();
    let out = env.run(&["resume", &source, "--task", "second", "--wait"]);
    assert_eq!(out.status.code(), Some(1), "the revival failed: {out:?}");
    let revived = String::from_utf8(out.stdout.clone())
        .unwrap()
        .trim()
        .to_owned();
    assert_ne!(revived, source);
    assert!(
        stderr(&out).contains(&format!("{revived} failed")),
        "{out:?}"
    );
    assert_eq!(env.status_json(&revived)["state"], "failed");
}

#[test]
fn logs_follow_exits_as_wait_with_the_outcome() {
    let env = Env::new();
    let id = env
        .ok(&["run", "--", "sh", "-c", "echo out; sleep 0.3; exit 3"])
        .trim()
        .to_owned();
    let out = env.run(&["logs", "--follow", &id]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(String::from_utf8(out.stdout.clone()).unwrap(), "out\n");
    assert!(stderr(&out).contains(&format!("{id} failed")), "{out:?}");
    let fine = env
        .ok(&["run", "--", "sh", "-c", "echo fine"])
        .trim()
        .to_owned();
    let out = env.run(&["logs", "-f", &fine]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        stderr(&out).contains(&format!("{fine} complete")),
        "{out:?}"
    );
}

#[test]
fn logs_of_a_run_without_output_says_so() {
    let env = Env::new();
    let go = Path::new(env.work()).join("go");
    let id = env
        .ok(&["run", "--", "sh", "-c", &gated(&go)])
        .trim()
        .to_owned();
    poll(Duration::from_secs(30), || {
        env.status_json(&id)["state"] == "running"
    });
    let out = env.run(&["logs", &id]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");
    let err = stderr(&out);
    assert!(
        err.contains(&format!("run {id} has no output yet (running step 1/1)")),
        "{err}"
    );
    std::fs::write(&go, "").unwrap();
    env.ok(&["wait", &id]);
}
