//! Issue 24: every run is shown, a run's final state is what happened,
//! recorded text cannot forge rows, an uncheckable config file is only a
//! warning.
//!
//! Every command runs as a child process with a deadline; waiting is polling
//! a condition with a deadline, never a bare sleep.

use crate::common;

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use common::*;
use serde_json::Value;

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A label that would forge a row of the detailed listing, and clear the
/// screen, if it were printed as is.
const FORGING: &str = "evil\n- 0000000000 | complete | forged\u{1b}[2J";

/// Asserts that `text` shows exactly `runs` runs (rows starting `- `), holds
/// no control character but newlines, and shows the label escaped.
fn one_row_per_run(text: &str, runs: usize, what: &str) {
    let rows = text.lines().filter(|l| l.starts_with("- ")).count();
    assert_eq!(rows, runs, "{what}: {text}");
    assert!(
        !text.chars().any(|c| c.is_control() && c != '\n'),
        "{what}: {text:?}"
    );
    assert!(text.contains(r"evil\n- 0000000000"), "{what}: {text}");
    assert!(!text.contains("forged\n"), "{what}: {text}");
}

#[test]
fn a_label_with_a_newline_stays_on_its_row_in_every_text_output() {
    let env = Env::new();
    let out = env.run(&[
        "run", "--wait", "--agent", FORGING, "--", "sh", "-c", "exit 3",
    ]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let single = stdout(&out).trim().to_owned();
    let spec = Path::new(env.work()).join("spec.json");
    let steps = serde_json::json!({"mode": "chain", "steps": [
        {"agent": FORGING, "command": ["sh", "-c", "echo out; echo err >&2"]},
        {"agent": "second", "command": ["true"]},
    ]});
    std::fs::write(&spec, steps.to_string()).unwrap();
    let chain = env
        .ok(&["run", "--wait", "--spec", spec.to_str().unwrap()])
        .trim()
        .to_owned();
    env.settled(&single);
    env.settled(&chain);
    for args in [
        vec!["list", "--all"],
        vec!["list", "--all", "--long"],
        // Again: the rows now come from the listing index.
        vec!["list", "--all"],
    ] {
        one_row_per_run(&env.ok(&args), 2, &format!("{args:?}"));
    }
    one_row_per_run(&env.ok(&["status", &single]), 1, "status");
    one_row_per_run(&env.ok(&["status", &chain]), 1, "status of the chain");
    let out = env.run(&["logs", &chain]);
    assert!(out.status.success(), "{out:?}");
    for text in [stdout(&out), stderr(&out)] {
        let headers: Vec<&str> = text.lines().filter(|l| l.starts_with("=== ")).collect();
        assert!(
            headers
                .iter()
                .any(|h| h.starts_with(r"=== evil\n- 0000000000") && h.contains("(step 1) ===")),
            "{text:?}"
        );
        assert!(!text.contains('\u{1b}'), "{text:?}");
        assert!(!text.lines().any(|l| l.starts_with("- ")), "{text:?}");
    }
}

/// Runs `args` with `$XDG_CONFIG_HOME` set to `config_home`.
fn with_config_home(env: &Env, config_home: &Path, args: &[&str]) -> Output {
    let mut command = env.command(args);
    command.env("XDG_CONFIG_HOME", config_home);
    output_within(command, Duration::from_secs(60))
}

/// A config file that cannot be checked — its directory's parent is a
/// regular file (ENOTDIR), or a FIFO stands in its place — is one warning
/// line for every command that does not need it, never a failure; `config`,
/// which shows the file, fails with that one line.
#[test]
fn an_uncheckable_config_file_is_a_warning_not_a_failure() {
    let env = Env::new();
    let not_a_dir = Path::new(env.work()).join("plain-file");
    std::fs::write(&not_a_dir, "not a directory").unwrap();
    let fifo_home = Path::new(env.work()).join("fifo-home");
    std::fs::create_dir_all(fifo_home.join("subagents")).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(fifo_home.join("subagents/config.toml"))
        .status()
        .unwrap();
    assert!(made.success());
    for home in [&not_a_dir, &fifo_home] {
        let config = home.join("subagents/config.toml");
        let warning = format!(
            "subagents: warning: failed to read config: failed to read '{}': ",
            config.display()
        );
        let out = with_config_home(&env, home, &["run", "--wait", "--", "true"]);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        let id = stdout(&out).trim().to_owned();
        for out in [
            out,
            with_config_home(&env, home, &["list", "--all"]),
            with_config_home(&env, home, &["status", &id]),
            with_config_home(&env, home, &["wait", &id]),
        ] {
            assert_eq!(out.status.code(), Some(0), "{out:?}");
            let err = stderr(&out);
            assert_eq!(err.lines().count(), 1, "{err:?}");
            assert!(err.starts_with(&warning), "{err:?}");
            assert!(err.trim_end().ends_with("; going on without it"), "{err:?}");
        }
        let out = with_config_home(&env, home, &["config"]);
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "{err:?}");
        assert!(
            err.starts_with("subagents: failed to read config: failed to read '"),
            "{err:?}"
        );
    }
    // A file that reads but does not parse still fails every command.
    let bad = Path::new(env.work()).join("bad-home");
    std::fs::create_dir_all(bad.join("subagents")).unwrap();
    std::fs::write(bad.join("subagents/config.toml"), "max_active = many\n").unwrap();
    let out = with_config_home(&env, &bad, &["list"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(stderr(&out).contains("line 1: max_active"), "{out:?}");
}

/// Sends SIGCONT when dropped, so a failing assertion never leaves a
/// stopped runner behind.
struct Continue(u32);

impl Drop for Continue {
    fn drop(&mut self) {
        kill(self.0, libc::SIGCONT);
    }
}

/// Whether `pid`'s shared pending signals hold `sig` (`ShdPnd` in
/// `/proc/<pid>/status`).
fn pending(pid: u32, sig: i32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let mask = status
        .lines()
        .find_map(|l| l.strip_prefix("ShdPnd:"))
        .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
        .unwrap_or(0);
    mask & (1 << (sig - 1)) != 0
}

/// One trial: the COMMAND exits 0 and the stop's SIGTERM reaches the runner
/// before the runner has seen the exit. The runner is frozen (SIGSTOP)
/// while the COMMAND ends and `stop` records its request and signals; then
/// it runs on with both the exit and the stop pending. Returns the run's
/// final status and events.
fn stop_meets_the_end(env: &Env, trial: usize) -> (String, Value, Vec<Value>) {
    let fifo = env.fifo(&format!("end-{trial}.fifo"));
    let script = r#"read line < "$1"; exit 0"#;
    let id = env
        .ok(&[
            "run",
            "--",
            "sh",
            "-c",
            script,
            "sh",
            fifo.to_str().unwrap(),
        ])
        .trim()
        .to_owned();
    let status = env.wait_for_child_pid(&id);
    let child = status["steps"][0]["externalProcess"]["pid"]
        .as_u64()
        .unwrap() as u32;
    let runner = &status["runnerIdentity"];
    let pid = runner["pid"].as_u64().unwrap() as u32;
    // The runner is ours: the run recorded it, with this start time.
    assert_eq!(proc_start_time(pid), runner["startTime"].as_u64().unwrap());
    let guard = {
        // Not frozen inside a status write: `stop` must be able to write.
        let lock = std::fs::File::open(env.run_dir(&id).join(".status.lock")).unwrap();
        lock.lock().unwrap();
        kill(pid, libc::SIGSTOP);
        Continue(pid)
    };
    std::fs::write(&fifo, "end\n").unwrap();
    poll(Duration::from_secs(20), || !alive(child));
    let mut stop = env.command(&["stop", &id]);
    stop.stdout(std::process::Stdio::piped());
    let stop = stop.spawn().unwrap();
    poll(Duration::from_secs(20), || pending(pid, libc::SIGTERM));
    drop(guard);
    let out = stop.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let status = env.settled(&id);
    (id.clone(), status, env.events(&id))
}

/// A step that completed before the stop took effect leaves the run
/// complete, with the stop request in its events: 50 trials, each one
/// delivering the stop between the COMMAND's exit and the runner's look.
#[test]
fn a_stop_that_meets_a_completed_step_leaves_the_run_complete() {
    let trials: Vec<(String, Value, Vec<Value>)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..5)
            .map(|worker| {
                scope.spawn(move || {
                    let env = Env::new();
                    let runs: Vec<_> = (0..10).map(|t| stop_meets_the_end(&env, t)).collect();
                    drop(env);
                    (worker, runs)
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap().1)
            .collect()
    });
    assert_eq!(trials.len(), 50);
    for (id, status, events) in &trials {
        let step = &status["steps"][0];
        assert_eq!(step["externalProcess"]["exitCode"], 0, "{id}: {status}");
        assert_eq!(status["state"], "complete", "{id}: {status}");
        assert_eq!(step["status"], "complete", "{id}: {status}");
        assert_eq!(step["exitCode"], 0, "{id}: {status}");
        assert!(status["error"].is_null(), "{id}: {status}");
        assert_eq!(
            status["processTerminal"]["state"], "observed",
            "{id}: {status}"
        );
        let requested: Vec<&Value> = events
            .iter()
            .filter(|e| e["type"] == "subagent.run.stop_requested")
            .collect();
        assert_eq!(requested.len(), 1, "{id}: {events:?}");
        assert_eq!(requested[0]["reason"], "Subagent stopped by user.", "{id}");
        assert!(
            !events.iter().any(|e| e["type"] == "subagent.run.stopped"),
            "{id}: {events:?}"
        );
    }
}

/// Starts a run whose COMMAND waits for a line on a FIFO; returns its id and
/// the FIFO.
fn waiting_run(env: &Env, name: &str) -> (String, std::path::PathBuf) {
    let fifo = env.fifo(name);
    let script = r#"read line < "$1"; exit 0"#;
    let id = env
        .ok(&[
            "run",
            "--",
            "sh",
            "-c",
            script,
            "sh",
            fifo.to_str().unwrap(),
        ])
        .trim()
        .to_owned();
    env.wait_for_child_pid(&id);
    (id, fifo)
}

fn list_json(env: &Env) -> Vec<Value> {
    serde_json::from_str::<Value>(&env.ok(&["list", "--json"]))
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

/// A running run whose active marker is a directory, a FIFO or a symlink is
/// an unreadable row naming the marker's problem, in text and JSON; the
/// healthy run beside them is listed as usual.
#[test]
fn a_run_whose_marker_is_not_a_regular_file_is_an_unreadable_row() {
    let env = Env::new();
    let (healthy, _) = waiting_run(&env, "healthy.fifo");
    let mut damaged = Vec::new();
    for (kind, name) in [
        ("directory", "dir.fifo"),
        ("FIFO", "fifo.fifo"),
        ("symbolic link", "link.fifo"),
    ] {
        let (id, _) = waiting_run(&env, name);
        let marker = env.marker(&id);
        std::fs::remove_file(&marker).unwrap();
        match kind {
            "directory" => std::fs::create_dir(&marker).unwrap(),
            "FIFO" => {
                let made = std::process::Command::new("mkfifo")
                    .arg(&marker)
                    .status()
                    .unwrap();
                assert!(made.success());
            }
            _ => std::os::unix::fs::symlink(env.marker(&healthy), &marker).unwrap(),
        }
        let why = format!(
            "active marker '{}' is not a regular file ({kind})",
            marker.display()
        );
        damaged.push((id, why));
    }
    let rows = list_json(&env);
    assert_eq!(rows.len(), 4, "{rows:?}");
    assert_eq!(rows[0]["id"], healthy.as_str());
    assert_eq!(rows[0]["state"], "running");
    for (id, why) in &damaged {
        let row = rows.iter().find(|r| r["id"] == id.as_str()).unwrap();
        assert_eq!(row["state"], "unreadable", "{row}");
        assert_eq!(row["error"], why.as_str(), "{row}");
    }
    let text = env.ok(&["list"]);
    assert!(text.contains(&format!("- {healthy} | running")), "{text}");
    for (id, why) in &damaged {
        assert!(
            text.contains(&format!("- {id} | unreadable | {why}")),
            "{text}"
        );
    }
}

/// While a run's monitor is frozen (SIGSTOP) after its runner wrote the
/// final status, the run still holds its marker and slot: `list` shows it
/// `finishing`, and `wait --timeout` names it. Once the monitor runs on, the
/// run settles and leaves the active listing.
#[test]
fn a_run_whose_monitor_is_frozen_is_listed_finishing_and_waited_for_by_id() {
    let env = Env::new();
    let (id, fifo) = waiting_run(&env, "end.fifo");
    let status = env.status_json(&id);
    let monitor = &status["monitorIdentity"];
    let pid = monitor["pid"].as_u64().unwrap() as u32;
    // The monitor is ours: the run recorded it, with this start time.
    assert_eq!(proc_start_time(pid), monitor["startTime"].as_u64().unwrap());
    kill(pid, libc::SIGSTOP);
    let guard = Continue(pid);
    std::fs::write(&fifo, "end\n").unwrap();
    let runner = status["runnerIdentity"]["pid"].as_u64().unwrap() as u32;
    poll(Duration::from_secs(20), || !alive(runner));
    let rows = list_json(&env);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["id"], id.as_str());
    assert_eq!(rows[0]["state"], "complete", "{}", rows[0]);
    assert_eq!(rows[0]["finishing"], true, "{}", rows[0]);
    let text = env.ok(&["list"]);
    assert!(
        text.contains(&format!("- {id} | finishing (complete) |")),
        "{text}"
    );
    let out = env.run(&["wait", &id, "--timeout", "300ms"]);
    assert_eq!(out.status.code(), Some(124), "{out:?}");
    assert!(
        stderr(&out).contains(&format!("timed out waiting for {id}")),
        "{out:?}"
    );
    drop(guard);
    let settled = env.settled(&id);
    assert_eq!(settled["state"], "complete", "{settled}");
    assert_eq!(env.ok(&["list"]).trim(), "No active async runs.");
}
