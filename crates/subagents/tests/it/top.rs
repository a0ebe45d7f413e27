//! `subagents top` driven for real in tmux against a live composite run:
//! keys are sent with `send-keys`, the screen is read with `capture-pane`.

use crate::common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use common::*;
use serde_json::json;

/// One tmux server of our own (its socket name), killed when dropped.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn cmd(&self, args: &[&str]) -> Output {
        Command::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            .args(args)
            .env("LANG", "C.UTF-8")
            .env_remove("SUBAGENTS_SESSION_ID")
            .env_remove("TMUX")
            .output()
            .unwrap()
    }

    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.cmd(&["capture-pane", "-p", "-t", "top"]).stdout).into_owned()
    }

    /// Polls the screen until it shows `text`; the panic message shows the last screen.
    fn expect(&self, text: &str) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let last = self.screen();
            if last.contains(text) {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the screen never showed {text:?}; last screen:\n{last}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn keys(&self, keys: &str) {
        assert!(self.cmd(&["send-keys", "-t", "top", keys]).status.success());
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd(&["kill-server"]);
    }
}

fn tmux_available() -> bool {
    Command::new("tmux")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn top_shows_a_live_parallel_run_and_stops_it_after_confirmation() {
    if !tmux_available() {
        eprintln!("skipping: tmux is not installed (apt-get install tmux)");
        return;
    }
    let env = Env::new();
    let spec = json!({"mode": "parallel", "concurrency": 2, "tasks": [
        {"agent": "reviewer-a", "command": ["sh", "-c", "echo hello from a; exec sleep 300"]},
        {"agent": "reviewer-b", "command": ["sh", "-c", "echo hello from b >&2; exec sleep 300"]}
    ]});
    let file = Path::new(env.work()).join("spec.json");
    std::fs::write(&file, spec.to_string()).unwrap();
    let id = env
        .ok(&[
            "run",
            "--spec",
            file.to_str().unwrap(),
            "--session",
            "tmux-test",
        ])
        .trim()
        .to_owned();
    let tmux = Tmux {
        socket: format!("subagents-top-{}", std::process::id()),
    };
    let started = tmux.cmd(&[
        "-f",
        "/dev/null",
        "new-session",
        "-d",
        "-s",
        "top",
        "-x",
        "120",
        "-y",
        "40",
        env!("CARGO_BIN_EXE_subagents"),
        "--root",
        env.root().to_str().unwrap(),
        "top",
    ]);
    assert!(started.status.success(), "tmux failed: {started:?}");

    // The run, its steps, its session, and both steps' output (stderr apart).
    tmux.expect(&id);
    tmux.expect("Session tmux-test");
    tmux.expect("1. reviewer-a  running");
    tmux.expect("2. reviewer-b  running");
    tmux.expect("hello from a");
    tmux.expect("reviewer-b (stderr)");
    tmux.expect("hello from b");

    // The logs view and back.
    tmux.keys("l");
    tmux.expect(&format!("Logs of {id}"));
    tmux.keys("Escape");
    tmux.expect(&format!("Output of {id}"));

    // `s` asks first; any other key keeps the run.
    tmux.keys("s");
    tmux.expect(&format!("Stop run {id}?"));
    tmux.keys("n");
    tmux.expect(&format!("kept {id}"));
    assert_eq!(env.status_json(&id)["state"], "running");

    tmux.keys("s");
    tmux.expect(&format!("Stop run {id}?"));
    tmux.keys("y");
    poll(Duration::from_secs(30), || {
        env.status_json(&id)["state"] == "stopped"
    });
    // The stopped run leaves the active view on the file events alone.
    tmux.expect("No active runs.");

    tmux.keys("q");
    poll(Duration::from_secs(10), || {
        !tmux.cmd(&["has-session", "-t", "top"]).status.success()
    });
}

impl Tmux {
    /// Polls the screen until `holds` is true of it.
    fn expect_that(&self, what: &str, holds: impl Fn(&str) -> bool) -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let last = self.screen();
            if holds(&last) {
                return last;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the screen never showed {what}; last screen:\n{last}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn start_top(env: &Env, name: &str) -> Tmux {
        let tmux = Tmux {
            socket: format!("subagents-top-{name}-{}", std::process::id()),
        };
        let started = tmux.cmd(&[
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-s",
            "top",
            "-x",
            "120",
            "-y",
            "40",
            "env",
            "-u",
            "SUBAGENTS_MAX_ACTIVE",
            env!("CARGO_BIN_EXE_subagents"),
            "--root",
            env.root().to_str().unwrap(),
            "top",
        ]);
        assert!(started.status.success(), "tmux failed: {started:?}");
        tmux
    }
}

/// The ids of the screen's run rows, top to bottom, and which is selected.
fn rows(screen: &str, ids: &[String]) -> (Vec<String>, Option<String>) {
    let mut order = Vec::new();
    let mut selected = None;
    for line in screen.lines() {
        let cell = line.trim_start_matches('│');
        for id in ids {
            if cell.starts_with(&format!("> {id} ")) {
                selected = Some(id.clone());
            }
            if cell.starts_with(&format!("> {id} ")) || cell.starts_with(&format!("  {id} ")) {
                order.push(id.clone());
            }
        }
    }
    (order, selected)
}

#[test]
fn top_labels_runs_counts_only_active_slots_scrolls_logs_and_keeps_the_selection() {
    if !tmux_available() {
        eprintln!("skipping: tmux is not installed (apt-get install tmux)");
        return;
    }
    const SESSION: &str = "tmux-names";
    let env = Env::new();
    let launch = |name: &str| {
        env.ok(&[
            "run",
            "--session",
            SESSION,
            "--name",
            name,
            "--",
            "sh",
            "-c",
            "seq 1 300; exec sleep 300",
        ])
        .trim()
        .to_owned()
    };
    let ids: Vec<String> = ["alpha run", "beta run", "gamma run"]
        .into_iter()
        .map(launch)
        .collect();
    // A finished run whose slot was never freed: occupied, but no active run.
    let done = env
        .ok(&["run", "--wait", "--session", SESSION, "--", "true"])
        .trim()
        .to_owned();
    let layout = status::Layout::new(env.root());
    let slot = capacity::Capacity::new(layout.capacity_dir())
        .acquire(&capacity::Acquire {
            session_id: SESSION,
            limit: Some(u32::MAX),
            run_id: &done,
            kind: capacity::Kind::Runner,
            async_dir: &env.run_dir(&done),
            live_workflows: &std::collections::HashSet::new(),
        })
        .unwrap();
    assert!(slot.is_some());
    for id in &ids {
        poll(Duration::from_secs(30), || {
            std::fs::read_to_string(env.run_dir(id).join("external-0.stdout.log"))
                .is_ok_and(|t| t.contains("300\n"))
        });
    }

    let tmux = Tmux::start_top(&env, "names");
    tmux.expect("alpha run");
    tmux.expect("beta run");
    tmux.expect("gamma run");
    tmux.expect(&format!(
        "Session {SESSION} · capacity 3 used, no limit · 1 slot held by no active run"
    ));
    tmux.expect("last output");

    // The logs view scrolls: g to the start, G back to the end, the step's
    // header always on top.
    tmux.keys("l");
    tmux.expect("Logs of");
    tmux.expect_that("the end of the output", |s| s.contains("│300 "));
    tmux.keys("g");
    let screen = tmux.expect_that("the start of the output", |s| {
        s.contains("│1 ") && !s.contains("│300 ")
    });
    assert!(screen.contains("│── step 1 sh -c ──"), "{screen}");
    tmux.keys("PageDown");
    let screen = tmux.expect_that("the next page", |s| {
        !s.contains("│1 ") && !s.contains("│300 ")
    });
    assert!(screen.contains("│── step 1 sh -c ──"), "{screen}");
    tmux.keys("G");
    let screen = tmux.expect_that("the end again", |s| s.contains("│300 "));
    assert!(screen.contains("│── step 1 sh -c ──"), "{screen}");
    tmux.keys("k");
    tmux.expect_that("one line up", |s| {
        s.contains("│299 ") && !s.contains("│300 ")
    });
    tmux.keys("Escape");
    tmux.expect("Output of");

    // Select the middle row, stop it: the selection goes to the next row.
    let screen = tmux.expect_that("three rows", |s| rows(s, &ids).0.len() == 3);
    let (order, selected) = rows(&screen, &ids);
    assert_eq!(selected.as_deref(), Some(order[0].as_str()), "{screen}");
    tmux.keys("Down");
    tmux.expect_that("the second row selected", |s| {
        rows(s, &ids).1.as_deref() == Some(order[1].as_str())
    });
    tmux.keys("s");
    tmux.expect(&format!("Stop run {}?", order[1]));
    tmux.keys("y");
    let screen = tmux.expect_that("the stopped run gone", |s| rows(s, &ids).0.len() == 2);
    assert_eq!(
        rows(&screen, &ids).1.as_deref(),
        Some(order[2].as_str()),
        "{screen}"
    );
    tmux.expect(&format!(
        "Session {SESSION} · capacity 2 used, no limit · 1 slot held by no active run"
    ));

    tmux.keys("q");
    poll(Duration::from_secs(10), || {
        !tmux.cmd(&["has-session", "-t", "top"]).status.success()
    });
    for id in [&order[0], &order[2]] {
        env.ok(&["stop", id]);
    }
}

#[test]
fn top_refuses_without_a_terminal() {
    let env = Env::new();
    let out = env.run(&["top"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("top needs a terminal"));
}
