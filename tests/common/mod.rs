//! Helpers of the end-to-end tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A temporary state root and a work directory.
pub struct Env {
    root: tempfile::TempDir,
    work: tempfile::TempDir,
}

impl Env {
    pub fn new() -> Self {
        Self {
            root: tempfile::tempdir().unwrap(),
            work: tempfile::tempdir().unwrap(),
        }
    }

    pub fn root(&self) -> &Path {
        self.root.path()
    }

    pub fn work(&self) -> &str {
        self.work.path().to_str().unwrap()
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_subagents"));
        command
            .arg("--root")
            .arg(self.root.path())
            .args(args)
            .env_remove("SUBAGENTS_SESSION_ID");
        command
    }

    /// Runs the binary; a command that hangs fails the test after 180 s
    /// instead of hanging the suite.
    pub fn run(&self, args: &[&str]) -> Output {
        use std::process::Stdio;
        let child = self
            .command(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait_with_output());
        });
        match rx.recv_timeout(Duration::from_secs(180)) {
            Ok(output) => output.unwrap(),
            Err(_) => {
                kill(pid, libc::SIGKILL);
                panic!("subagents {args:?} did not finish within 180 s");
            }
        }
    }

    /// Runs and asserts exit 0; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(out.status.success(), "subagents {args:?} failed: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    }

    pub fn status_json(&self, id: &str) -> Value {
        serde_json::from_str(&self.ok(&["status", id, "--json"])).unwrap()
    }

    /// The status once the run is over and its proof is no longer pending.
    pub fn settled(&self, id: &str) -> Value {
        let _ = self.run(&["wait", id, "--timeout", "60s"]);
        let mut last = Value::Null;
        // `status` shows the proof sidecar as soon as it exists, and a
        // failed revival's launcher records `not-started` before the
        // monitor's verdict; the monitor overlays its proof on status.json
        // and only then releases the marker (of every run whose proof it
        // observed), so wait for that unless the proof stays `unknown`.
        poll(Duration::from_secs(30), || {
            last = self.status_json(id);
            let state = &last["processTerminal"]["state"];
            state != "pending" && (state == "unknown" || !self.marker(id).exists())
        });
        last
    }

    /// Polls until the run's command has been started; returns the status.
    pub fn wait_for_child_pid(&self, id: &str) -> Value {
        let mut last = Value::Null;
        poll(Duration::from_secs(20), || {
            last = self.status_json(id);
            last["steps"][0]["externalProcess"]["pid"].is_u64()
        });
        last
    }

    /// A named pipe in the work directory, for commands that wait on the test.
    pub fn fifo(&self, name: &str) -> PathBuf {
        let path = self.work.path().join(name);
        let made = Command::new("mkfifo").arg(&path).status().unwrap();
        assert!(made.success(), "mkfifo {}", path.display());
        path
    }

    /// Number of run directories.
    pub fn run_count(&self) -> usize {
        let runs = std::fs::read_dir(self.root.path().join("async-subagent-runs"));
        runs.map(|d| {
            d.filter(|e| {
                !e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with('.')
            })
            .count()
        })
        .unwrap_or(0)
    }

    pub fn marker(&self, id: &str) -> PathBuf {
        self.root
            .path()
            .join("async-subagent-runs/.active-runs")
            .join(id)
    }

    pub fn events(&self, id: &str) -> Vec<Value> {
        let text = std::fs::read_to_string(
            self.root
                .path()
                .join("async-subagent-runs")
                .join(id)
                .join("events.jsonl"),
        )
        .unwrap();
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

/// Polls `condition` until it holds; panics after `within`.
pub fn poll(within: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !condition() {
        assert!(
            Instant::now() < deadline,
            "condition not met within {within:?}"
        );
        // Poll interval, not synchronisation: the deadline above decides.
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A process is alive if it exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat
                .rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .chars()
                .next();
            !matches!(state, Some('Z' | 'X'))
        }
        Err(_) => false,
    }
}

pub fn proc_start_time(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = stat.rsplit(')').next().unwrap();
    rest.split_whitespace().nth(19).unwrap().parse().unwrap()
}

pub fn kill(pid: u32, sig: i32) {
    // SAFETY: kill(2) has no memory effects.
    unsafe {
        libc::kill(pid as i32, sig);
    }
}

pub fn kill_group(pgid: u32, sig: i32) {
    // SAFETY: kill(2) has no memory effects.
    unsafe {
        libc::kill(-(pgid as i32), sig);
    }
}

/// Every regular file below `dir`.
pub fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}

/// Every directory below `dir` (not `dir` itself).
pub fn walk_dirs(dir: &Path) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            dirs.push(path.clone());
            dirs.extend(walk_dirs(&path));
        }
    }
    dirs
}
