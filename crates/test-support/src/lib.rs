//! What the tests of every crate share: the end-to-end [`Env`] (a
//! temporary state root, the binary under test, and the leftover-process
//! guard of its `Drop`), poll-with-deadline helpers, process helpers, the
//! fake agent CLIs ([`fakes_dir`]) and [`reexec`], which runs one test in a
//! process of its own.
//!
//! A dev-dependency only; it depends on no crate of the workspace, so a
//! protocol crate's tests can use it without a second copy of that crate.

pub mod reexec;

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A temporary state root and a work directory, and the binary that runs in
/// them.
pub struct Env {
    binary: PathBuf,
    root: tempfile::TempDir,
    work: tempfile::TempDir,
}

impl Env {
    /// Fresh directories for `binary` (an integration test passes
    /// `env!("CARGO_BIN_EXE_subagents")`).
    pub fn new(binary: impl Into<PathBuf>) -> Self {
        Self {
            binary: binary.into(),
            root: tempfile::tempdir().unwrap(),
            work: tempfile::tempdir().unwrap(),
        }
    }

    /// The state root (`--root`).
    pub fn root(&self) -> &Path {
        self.root.path()
    }

    /// The work directory: for files a test's commands use.
    pub fn work(&self) -> &str {
        self.work.path().to_str().unwrap()
    }

    /// The binary with `--root` and `args`, in an environment free of the
    /// developer's own settings.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(&self.binary);
        command
            .arg("--root")
            .arg(self.root.path())
            .args(args)
            .env_remove("SUBAGENTS_SESSION_ID")
            // The developer's own defaults must not leak into a test.
            .env_remove("SUBAGENTS_TIMEOUT")
            .env_remove("SUBAGENTS_COLOR")
            .env_remove("SUBAGENTS_EXECUTOR")
            .env("XDG_CONFIG_HOME", self.work.path().join("no-config"))
            // The revival handshake's 10 s default is a product deadline, not
            // a test's: on a starved machine a runner can need longer to
            // answer, and a test must not fail on speed. Tests of the
            // deadline itself set their own value.
            .env("SUBAGENTS_STARTUP_TIMEOUT_MS", "120000")
            // A pipe on stdin would be read as the task; callers may override.
            .stdin(std::process::Stdio::null());
        command
    }

    /// The binary without `--root` and without any variable that chooses
    /// the root, for tests of the root's resolution.
    pub fn rootless_command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(&self.binary);
        command
            .args(args)
            .env_remove("SUBAGENTS_ROOT")
            .env_remove("XDG_STATE_HOME")
            .env_remove("SUBAGENTS_SESSION_ID")
            .stdin(Stdio::null());
        command
    }

    /// Runs the binary; a command that hangs fails the test after 60 s
    /// instead of hanging the suite (no command of the suite needs more than
    /// a few seconds). Tests of a failure path use [`Env::run_within`] with a
    /// deadline sized to the behaviour instead.
    pub fn run(&self, args: &[&str]) -> Output {
        self.run_within(args, Duration::from_secs(60))
    }

    /// Runs the binary; fails the test if it has not finished `within`.
    pub fn run_within(&self, args: &[&str], within: Duration) -> Output {
        output_within(self.command(args), within)
    }

    /// Runs and asserts exit 0; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(out.status.success(), "subagents {args:?} failed: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    }

    /// `status <id> --json`, parsed.
    pub fn status_json(&self, id: &str) -> Value {
        serde_json::from_str(&self.ok(&["status", id, "--json"])).unwrap()
    }

    /// The status once the run is over for good: not active, its proof no
    /// longer pending, and its monitor and runner gone (the monitor adds the
    /// step-level proofs after the run-level one, and exits only after its
    /// last write). Both processes run with the run directory as their cwd,
    /// which is how they are found. Fails after 30 s.
    pub fn settled(&self, id: &str) -> Value {
        self.settled_within(id, Duration::from_secs(30))
    }

    /// [`Env::settled`] with a deadline sized to the behaviour under test.
    pub fn settled_within(&self, id: &str, within: Duration) -> Value {
        let dir = self.run_dir(id);
        let deadline = Instant::now() + within;
        loop {
            let left = processes_in(&[&dir]);
            let mut last = Value::Null;
            if left.is_empty() {
                last = self.status_json(id);
                let active = matches!(last["state"].as_str(), Some("queued" | "running"));
                let proof = &last["processTerminal"]["state"];
                // The marker goes after the overlay; an unknown proof keeps it.
                let released = proof == "unknown" || !self.marker(id).exists();
                if !active && proof != "pending" && released {
                    return last;
                }
            }
            assert!(
                Instant::now() < deadline,
                "run {id} not settled within {within:?}: processes {left:?}, status {last}"
            );
            // Poll interval, not synchronisation: the deadline above decides.
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The directory of run `id`.
    pub fn run_dir(&self, id: &str) -> PathBuf {
        self.root.path().join("async-subagent-runs").join(id)
    }

    /// Ids of the runs the active listing shows.
    fn active_ids(&self) -> Vec<String> {
        let Ok(out) = self
            .command(&["list", "--json"])
            .stdin(Stdio::null())
            .output()
        else {
            return Vec::new();
        };
        let runs: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        let ids = runs.as_array().into_iter().flatten();
        ids.filter_map(|r| r["id"].as_str().map(str::to_owned))
            .collect()
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

    /// The active-run marker of run `id`.
    pub fn marker(&self, id: &str) -> PathBuf {
        self.root
            .path()
            .join("async-subagent-runs/.active-runs")
            .join(id)
    }

    /// The events of run `id`, parsed.
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

/// Teardown, also when the test failed: every run of this root still
/// active is stopped, then whatever still lives with its cwd or environment
/// in the root or the work directory (monitors, runners, COMMANDs, their
/// escaped descendants) is killed with its process group, so a failing test
/// leaves no detached process behind.
impl Drop for Env {
    fn drop(&mut self) {
        let dirs = [self.root.path(), self.work.path()];
        if processes_under(&dirs).is_empty() {
            return;
        }
        for id in self.active_ids() {
            let stop = self
                .command(&["stop", &id, "--reason", "test teardown"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn();
            if let Ok(mut child) = stop {
                let deadline = Instant::now() + Duration::from_secs(10);
                while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(20));
                }
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        // SAFETY: getpgrp(2) has no memory effects.
        let own_group = unsafe { libc::getpgrp() } as u32;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = processes_under(&dirs);
            if left.is_empty() || Instant::now() >= deadline {
                if !left.is_empty() {
                    eprintln!("teardown: processes still alive: {left:?}");
                }
                return;
            }
            for pid in left {
                // SAFETY: getpgid(2) has no memory effects.
                let group = unsafe { libc::getpgid(pid as i32) };
                if group > 1 && group as u32 != own_group {
                    kill_group(group as u32, libc::SIGKILL);
                }
                kill(pid, libc::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Live processes (other than this one) whose cwd lies under one of `dirs`
/// or whose environment holds a path under one of them.
pub fn processes_under(dirs: &[&Path]) -> Vec<u32> {
    live_pids(|pid| cwd_under(pid, dirs) || env_under(pid, dirs))
}

/// Live processes (other than this one) whose cwd lies under one of `dirs`:
/// for a run directory, its monitor and runner.
pub fn processes_in(dirs: &[&Path]) -> Vec<u32> {
    live_pids(|pid| cwd_under(pid, dirs))
}

fn live_pids(mut keep: impl FnMut(u32) -> bool) -> Vec<u32> {
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let pids = entries.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok());
    pids.filter(|pid| *pid != me && keep(*pid) && alive(*pid))
        .collect()
}

fn cwd_under(pid: u32, dirs: &[&Path]) -> bool {
    std::fs::read_link(format!("/proc/{pid}/cwd"))
        .is_ok_and(|cwd| dirs.iter().any(|d| cwd.starts_with(d)))
}

fn env_under(pid: u32, dirs: &[&Path]) -> bool {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    environ.split(|b| *b == 0).any(|entry| {
        let value = entry.splitn(2, |b| *b == b'=').nth(1).unwrap_or_default();
        let value = Path::new(std::ffi::OsStr::from_bytes(value));
        value.is_absolute() && dirs.iter().any(|d| value.starts_with(d))
    })
}

/// Runs `command` with its output captured; kills it and fails the test if
/// it has not finished `within`.
pub fn output_within(mut command: Command, within: Duration) -> Output {
    let what = format!("{command:?}");
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let root = root_argument(&command);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(within) {
        Ok(output) => output.unwrap(),
        Err(_) => {
            // Where everything stands, before the kill changes it: a hang
            // must leave enough behind to be diagnosed from the test log.
            let state = root.map(|r| hang_report(&r, pid)).unwrap_or_default();
            kill(pid, libc::SIGKILL);
            panic!("{what} did not finish within {within:?}\n{state}");
        }
    }
}

fn root_argument(command: &Command) -> Option<PathBuf> {
    let args: Vec<_> = command.get_args().collect();
    let at = args.iter().position(|a| *a == "--root")?;
    args.get(at + 1).map(PathBuf::from)
}

/// The stuck command's and every run's processes (state, kernel wait
/// channel, stack) and the small state files of each run.
fn hang_report(root: &Path, command_pid: u32) -> String {
    let mut report = format!("--- hang report for root {}\n", root.display());
    let mut pids = vec![command_pid];
    pids.extend(processes_under(&[root]));
    for pid in pids {
        let read =
            |what: &str| std::fs::read_to_string(format!("/proc/{pid}/{what}")).unwrap_or_default();
        let cmdline = read("cmdline").replace('\0', " ");
        report.push_str(&format!(
            "pid {pid} [{}] wchan={} stat={}\n{}",
            cmdline.trim(),
            read("wchan"),
            read("stat").trim(),
            read("stack")
        ));
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
            for task in tasks.flatten() {
                let name = task.file_name();
                let wchan = std::fs::read_to_string(task.path().join("wchan")).unwrap_or_default();
                report.push_str(&format!(
                    "  task {} wchan={wchan}\n",
                    name.to_string_lossy()
                ));
            }
        }
    }
    let runs = root.join("async-subagent-runs");
    for run in std::fs::read_dir(&runs).into_iter().flatten().flatten() {
        for file in std::fs::read_dir(run.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let path = file.path();
            let small = file.metadata().is_ok_and(|m| m.is_file() && m.len() < 4096);
            let name = path
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            if small && !name.starts_with("task") {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                report.push_str(&format!("== {}\n{text}\n", path.display()));
            } else {
                report.push_str(&format!("== {} (not shown)\n", path.display()));
            }
        }
    }
    report
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

/// The start time of `pid` in clock ticks since boot (`/proc/<pid>/stat`).
pub fn proc_start_time(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = stat.rsplit(')').next().unwrap();
    rest.split_whitespace().nth(19).unwrap().parse().unwrap()
}

/// Sends `sig` to `pid`.
pub fn kill(pid: u32, sig: i32) {
    // SAFETY: kill(2) has no memory effects.
    unsafe {
        libc::kill(pid as i32, sig);
    }
}

/// Sends `sig` to process group `pgid`.
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

/// The fake agent CLIs (`claude`, `codex`, `pi`): put first on `PATH`, they
/// answer as the real ones do from what their arguments ask.
pub fn fakes_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fakes")
}

/// The permission bits of `path`.
pub fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// Now, in milliseconds since the epoch.
pub fn epoch_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The pid of a process that provably exited (started and reaped here).
pub fn dead_pid() -> u32 {
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    pid
}
