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

#[test]
fn top_refuses_without_a_terminal() {
    let env = Env::new();
    let out = env.run(&["top"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("top needs a terminal"));
}
