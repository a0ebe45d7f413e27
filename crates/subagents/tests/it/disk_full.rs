//! A full or read-only root loses nothing: a run whose COMMAND exited 0
//! while the state root had no space left, or was read-only, ends
//! `complete`, not `failed`, with its slot released, and `logs` shows its
//! output — whether the root comes back while the runner still retries, or
//! only after the runner and its monitor gave up (then `reconcile`,
//! `status` or `list` restores the outcome from the step-end events).
//!
//! The state root is a small tmpfs. The tests need root to mount: when
//! mounting is not permitted they print why and pass, unless `CI` is set,
//! where they fail.

use crate::common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::{alive, poll, walk};
use serde_json::Value;

/// Why a mount could not be made: a failure under CI (where the tests run
/// as root), a printed skip elsewhere.
fn cannot_mount<T>(why: &str) -> Option<T> {
    assert!(
        std::env::var_os("CI").is_none(),
        "cannot mount, and CI is set: {why}"
    );
    println!("skipping: {why}");
    None
}

/// Runs `mount` with `args`; `Err` with why it failed.
fn mount(args: &[&std::ffi::OsStr]) -> Result<(), String> {
    match Command::new("mount").args(args).output() {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(String::from_utf8_lossy(&out.stderr).trim().to_owned()),
        Err(e) => Err(format!("cannot run mount: {e}")),
    }
}

/// A tmpfs mounted for one test on a unique temp directory; unmounted
/// (lazily, with anything mounted under it) on drop, even when the test
/// fails.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Option<Self> {
        let dir = tempfile::tempdir().unwrap();
        let options = format!("size={size},mode=0700");
        match mount(&[
            "-t".as_ref(),
            "tmpfs".as_ref(),
            "-o".as_ref(),
            options.as_ref(),
            "tmpfs".as_ref(),
            dir.path().as_os_str(),
        ]) {
            Ok(()) => Some(Self { dir }),
            Err(why) => cannot_mount(&format!("cannot mount a tmpfs: {why}")),
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Space comes back: the tmpfs grows to `size`.
    fn grow(&self, size: &str) {
        let options = format!("remount,size={size}");
        mount(&["-o".as_ref(), options.as_ref(), self.path().as_os_str()]).unwrap();
    }

    /// Writes a file until the tmpfs is full.
    fn fill(&self) -> PathBuf {
        let filler = self.path().join("filler");
        let mut file = std::fs::File::create(&filler).unwrap();
        let block = [0u8; 4096];
        loop {
            match file.write(&block) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("failed to fill the tmpfs: {e}"),
            }
        }
        // Also eat any page left over by the short write.
        while file.write(&block[..1]).is_ok_and(|n| n > 0) {}
        filler
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// `dir` made read-only while the run goes on. `mount -o remount,ro` of
/// the tmpfs itself is refused (EBUSY) while any file on it is open for
/// writing, and a run always holds its logs open; so `dir` is bind-mounted
/// over itself and that mount remounted read-only: every path-based write
/// (each state file's temp file and rename, each lock, each event append)
/// fails with EROFS, as on a root the kernel remounted read-only, while the
/// descriptors opened before (the logs) still write. Unmounted on drop.
struct ReadOnly {
    dir: PathBuf,
}

impl ReadOnly {
    fn over(dir: &Path) -> Option<Self> {
        if let Err(why) = mount(&["--bind".as_ref(), dir.as_os_str(), dir.as_os_str()]) {
            return cannot_mount(&format!("cannot bind-mount the root: {why}"));
        }
        let guard = Self {
            dir: dir.to_owned(),
        };
        if let Err(why) = mount(&["-o".as_ref(), "remount,ro,bind".as_ref(), dir.as_os_str()]) {
            return cannot_mount(&format!("cannot remount the root read-only: {why}"));
        }
        Some(guard)
    }

    /// The root is writable again (`remount,rw`).
    fn writable(&self) {
        mount(&[
            "-o".as_ref(),
            "remount,rw,bind".as_ref(),
            self.dir.as_os_str(),
        ])
        .unwrap();
    }
}

impl Drop for ReadOnly {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}

struct Run<'a> {
    root: &'a Path,
    retry_ms: &'a str,
}

impl Run<'_> {
    fn command(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_subagents"))
            .arg("--root")
            .arg(self.root)
            .args(args)
            .env_remove("SUBAGENTS_SESSION_ID")
            .env("SUBAGENTS_WRITE_RETRY_MS", self.retry_ms)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.command(args);
        assert!(out.status.success(), "subagents {args:?}: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    }

    fn status(&self, id: &str) -> Value {
        let text = std::fs::read_to_string(
            self.root
                .join("async-subagent-runs")
                .join(id)
                .join("status.json"),
        )
        .unwrap();
        serde_json::from_str(&text).unwrap()
    }

    /// Starts a run whose COMMAND waits for a line on `gate`, then exits 0.
    fn start(&self, gate: &Path) -> String {
        self.start_script(&format!("read line < '{}'; exit 0", gate.display()))
    }

    /// Starts a run of `sh -c script`; returns once its COMMAND runs.
    fn start_script(&self, script: &str) -> String {
        let id = self
            .ok(&[
                "run",
                "--session",
                "s",
                "--max-active",
                "2",
                "--",
                "sh",
                "-c",
                script,
            ])
            .trim()
            .to_owned();
        poll(Duration::from_secs(20), || {
            self.status(&id)["steps"][0]["externalProcess"]["pid"].is_u64()
        });
        id
    }

    /// The pids of the run's runner, monitor and COMMAND.
    fn processes(&self, id: &str) -> [u32; 3] {
        let status = self.status(id);
        let pid = |v: &Value| v.as_u64().unwrap() as u32;
        [
            pid(&status["runnerIdentity"]["pid"]),
            pid(&status["monitorIdentity"]["pid"]),
            pid(&status["steps"][0]["externalProcess"]["pid"]),
        ]
    }

    /// `subagents logs` of the run: what it printed on stdout.
    fn logs(&self, id: &str) -> String {
        self.ok(&["logs", id])
    }

    /// Complete, observed, marker and slot released, every JSON file intact.
    fn assert_completed_cleanly(&self, id: &str) {
        let status = self.status(id);
        assert_eq!(status["state"], "complete", "{status}");
        assert_eq!(status["processTerminal"]["state"], "observed", "{status}");
        let marker = self.root.join("async-subagent-runs/.active-runs").join(id);
        assert!(!marker.exists(), "the active marker is released");
        let capacity: Value =
            serde_json::from_str(&self.ok(&["capacity", "--session", "s", "--json"])).unwrap();
        assert_eq!(capacity["slots"], serde_json::json!([]), "{capacity}");
        let dir = self.root.join("async-subagent-runs").join(id);
        for path in walk(&dir) {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(&path).unwrap();
            if name.ends_with(".json") {
                serde_json::from_str::<Value>(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
            }
            if name == "events.jsonl" {
                for line in text.lines() {
                    serde_json::from_str::<Value>(line)
                        .unwrap_or_else(|e| panic!("{name}: {e}: {line}"));
                }
            }
        }
    }
}

fn release(gate: &Path) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(gate)
        .unwrap()
        .write_all(b"go\n")
        .unwrap();
}

fn fifo(dir: &Path) -> PathBuf {
    let path = dir.join("gate.fifo");
    assert!(
        Command::new("mkfifo")
            .arg(&path)
            .status()
            .unwrap()
            .success()
    );
    path
}

fn stderr_log(root: &Path, id: &str) -> String {
    std::fs::read_to_string(
        root.join("async-subagent-runs")
            .join(id)
            .join("runner.stderr.log"),
    )
    .unwrap_or_default()
}

#[test]
fn space_back_while_the_runner_retries_completes_the_run() {
    let Some(tmpfs) = Tmpfs::mount("300k") else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let gate = fifo(work.path());
    let run = Run {
        root: &tmpfs.path().join("state"),
        retry_ms: "120000",
    };
    let id = run.start(&gate);
    let filler = tmpfs.fill();
    release(&gate);
    // The runner says on its pre-reserved stderr that it is retrying.
    poll(Duration::from_secs(60), || {
        stderr_log(run.root, &id).contains("retrying while space is short")
    });
    assert_eq!(
        run.status(&id)["state"],
        "running",
        "a full disk is no failure"
    );
    std::fs::remove_file(filler).unwrap();
    let _ = run.command(&["wait", &id, "--timeout", "60s"]);
    poll(Duration::from_secs(60), || {
        run.status(&id)["processTerminal"]["state"] != "pending"
    });
    run.ok(&["reconcile"]);
    run.assert_completed_cleanly(&id);
    assert!(stderr_log(run.root, &id).contains("full-disk retries"));
}

#[test]
fn space_back_after_everyone_gave_up_is_restored_from_the_events() {
    let Some(tmpfs) = Tmpfs::mount("300k") else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let gate = fifo(work.path());
    let run = Run {
        root: &tmpfs.path().join("state"),
        retry_ms: "300",
    };
    let id = run.start(&gate);
    let status = run.status(&id);
    let runner = status["runnerIdentity"]["pid"].as_u64().unwrap() as u32;
    let monitor = status["monitorIdentity"]["pid"].as_u64().unwrap() as u32;
    let filler = tmpfs.fill();
    release(&gate);
    // Both give up: the runner could not write its final status, the
    // monitor could not write the proof.
    poll(Duration::from_secs(60), || {
        !alive(runner) && !alive(monitor)
    });
    assert_ne!(
        run.status(&id)["state"],
        "failed",
        "a full disk is no failure"
    );
    let events = std::fs::read_to_string(
        run.root
            .join("async-subagent-runs")
            .join(&id)
            .join("events.jsonl"),
    )
    .unwrap();
    assert!(
        events.contains("\"subagent.step.completed\"") && events.contains("\"exitCode\":0"),
        "the step's end is evidence on disk: {events}"
    );
    std::fs::remove_file(filler).unwrap();
    let mut reports = String::new();
    poll(Duration::from_secs(60), || {
        reports.push_str(&run.ok(&["reconcile"]));
        run.status(&id)["processTerminal"]["state"] == "observed"
    });
    run.assert_completed_cleanly(&id);
    // The report names the repair, not a failure, for a run restored complete.
    let line = reports
        .lines()
        .find(|l| l.contains("so the run is complete"));
    assert!(
        line.is_some_and(|l| l.starts_with(&format!("{id} repaired: "))),
        "{reports}"
    );
}

#[test]
fn a_command_that_fills_the_root_ends_with_its_outcome_and_its_logs_once_space_returns() {
    let Some(tmpfs) = Tmpfs::mount("2m") else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let gate = fifo(work.path());
    let run = Run {
        root: &tmpfs.path().join("state"),
        retry_ms: "300",
    };
    // Its own stdout fills the root; `head` fails for lack of space, the
    // COMMAND exits 0. The gate holds it until its start is recorded.
    let script = format!(
        "echo first-line; read line < '{}'; head -c 4M /dev/zero; exit 0",
        gate.display()
    );
    let id = run.start_script(&script);
    let processes = run.processes(&id);
    release(&gate);
    // Runner and monitor give up on the full root, the COMMAND is over.
    poll(Duration::from_secs(60), || {
        processes.iter().all(|pid| !alive(*pid))
    });
    assert_ne!(
        run.status(&id)["state"],
        "failed",
        "a full disk is no failure"
    );
    tmpfs.grow("8m");
    // `status` alone, on the writable root, ends the run with its outcome.
    let shown: Value = serde_json::from_str(&run.ok(&["status", &id, "--json"])).unwrap();
    assert_eq!(shown["state"], "complete", "{shown}");
    let active: Value = serde_json::from_str(&run.ok(&["list", "--json"])).unwrap();
    assert_eq!(
        active,
        serde_json::json!([]),
        "nothing stays running: {active}"
    );
    run.assert_completed_cleanly(&id);
    // The copy into the output file did not fit; the stdout log has it.
    let stdout_log = run
        .root
        .join("async-subagent-runs")
        .join(&id)
        .join("external-0.stdout.log");
    assert!(std::fs::metadata(stdout_log).unwrap().len() > 1024 * 1024);
    let logs = run.logs(&id);
    assert!(
        logs.starts_with("first-line\n"),
        "{:?}",
        &logs[..logs.len().min(40)]
    );
}

#[test]
fn a_root_read_only_while_the_command_exits_ends_complete_once_writable() {
    let Some(tmpfs) = Tmpfs::mount("8m") else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let gate = fifo(work.path());
    let run = Run {
        root: &tmpfs.path().join("state"),
        retry_ms: "120000",
    };
    let script = format!(
        "echo before; read line < '{}'; echo after; exit 0",
        gate.display()
    );
    let id = run.start_script(&script);
    let [runner, _, command] = run.processes(&id);
    let Some(read_only) = ReadOnly::over(run.root) else {
        release(&gate);
        return;
    };
    release(&gate);
    // The runner saw the COMMAND's exit 0 and waits for the root.
    poll(Duration::from_secs(60), || {
        stderr_log(run.root, &id).contains("retrying while the root is read-only")
    });
    assert!(!alive(command));
    assert!(alive(runner), "the runner keeps the outcome");
    assert_eq!(run.status(&id)["state"], "running");
    read_only.writable();
    let _ = run.command(&["wait", &id, "--timeout", "60s"]);
    poll(Duration::from_secs(60), || {
        run.status(&id)["processTerminal"]["state"] != "pending"
    });
    run.assert_completed_cleanly(&id);
    assert_eq!(run.logs(&id), "before\nafter\n");
    assert!(stderr_log(run.root, &id).contains("read-only retries"));
}

/// What a run whose root turned read-only past the runner's retry budget
/// (8 s), and writable only once the runner gave up, ends with: the run is
/// started with `run_args`, its COMMANDs wait on `gates` (the step `last`
/// started last), and the status is returned once the monitor exited by
/// itself.
fn read_only_past_the_runner_budget(
    run: &Run<'_>,
    run_args: &[&str],
    gates: &[&Path],
    last: usize,
) -> Option<(String, Value)> {
    let mut args = vec!["run", "--session", "s", "--max-active", "2"];
    args.extend_from_slice(run_args);
    let id = run.ok(&args).trim().to_owned();
    poll(Duration::from_secs(20), || {
        run.status(&id)["steps"][last]["externalProcess"]["pid"].is_u64()
    });
    let status = run.status(&id);
    let runner = status["runnerIdentity"]["pid"].as_u64().unwrap() as u32;
    let monitor = status["monitorIdentity"]["pid"].as_u64().unwrap() as u32;
    let Some(read_only) = ReadOnly::over(run.root) else {
        gates.iter().for_each(|gate| release(gate));
        return None;
    };
    gates.iter().for_each(|gate| release(gate));
    poll(Duration::from_secs(60), || !alive(runner));
    assert!(alive(monitor), "the monitor retries its finalization");
    assert_eq!(
        run.status(&id)["state"],
        "running",
        "nothing could be written"
    );
    read_only.writable();
    // No command needed: the monitor ends the run itself.
    poll(Duration::from_secs(60), || !alive(monitor));
    let status = run.status(&id);
    assert_eq!(status["processTerminal"]["state"], "observed", "{status}");
    let marker = run.root.join("async-subagent-runs/.active-runs").join(&id);
    assert!(!marker.exists(), "the active marker is released");
    let dir = run.root.join("async-subagent-runs").join(&id);
    assert_eq!(common::processes_under(&[&dir]), Vec::<u32>::new());
    Some((id, status))
}

#[test]
fn a_monitor_that_outlives_its_runner_on_a_read_only_root_ends_the_run_once_writable() {
    let Some(tmpfs) = Tmpfs::mount("8m") else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let gate = fifo(work.path());
    // The runner gives up after 8 s; its monitor retries 8 s more: wide
    // enough that a loaded machine makes the root writable in time.
    let run = Run {
        root: &tmpfs.path().join("state"),
        retry_ms: "8000",
    };
    let script = format!(
        "echo before; read line < '{}'; echo after; exit 0",
        gate.display()
    );
    let args = ["--", "sh", "-c", &script];
    let Some((id, status)) = read_only_past_the_runner_budget(&run, &args, &[&gate], 0) else {
        return;
    };
    // The runner handed the outcome it saw to its monitor before it exited.
    assert_eq!(status["state"], "complete", "{status}");
    assert_eq!(status["steps"][0]["status"], "complete", "{status}");
    assert_eq!(status["steps"][0]["exitCode"], 0, "{status}");
    assert_eq!(run.logs(&id), "before\nafter\n");
    run.assert_completed_cleanly(&id);
}

#[test]
fn a_failure_seen_while_the_root_was_read_only_keeps_its_exit_code() {
    let Some(tmpfs) = Tmpfs::mount("8m") else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let gate = fifo(work.path());
    let run = Run {
        root: &tmpfs.path().join("state"),
        retry_ms: "8000",
    };
    let script = format!("read line < '{}'; exit 3", gate.display());
    let args = ["--", "sh", "-c", &script];
    let Some((_, status)) = read_only_past_the_runner_budget(&run, &args, &[&gate], 0) else {
        return;
    };
    assert_eq!(status["state"], "failed", "{status}");
    assert_eq!(status["steps"][0]["status"], "failed", "{status}");
    assert_eq!(status["steps"][0]["exitCode"], 3, "{status}");
    let error = status["error"].as_str().unwrap();
    assert!(!error.contains("before writing a final status"), "{error}");
}

#[test]
fn a_chain_that_ended_while_the_root_was_read_only_keeps_every_step() {
    let Some(tmpfs) = Tmpfs::mount("8m") else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let gate = fifo(work.path());
    let run = Run {
        root: &tmpfs.path().join("state"),
        retry_ms: "8000",
    };
    let spec = serde_json::json!({"mode": "chain", "steps": [
        {"agent": "first", "command": ["sh", "-c", "echo one; exit 0"]},
        {"agent": "second", "command": ["sh", "-c",
            format!("read line < '{}'; echo two; exit 0", gate.display())]}
    ]});
    let file = work.path().join("chain.json");
    std::fs::write(&file, spec.to_string()).unwrap();
    let args = ["--spec", file.to_str().unwrap()];
    let Some((id, status)) = read_only_past_the_runner_budget(&run, &args, &[&gate], 1) else {
        return;
    };
    assert_eq!(status["state"], "complete", "{status}");
    for step in 0..2 {
        assert_eq!(status["steps"][step]["status"], "complete", "{status}");
        assert_eq!(status["steps"][step]["exitCode"], 0, "{status}");
    }
    let logs = run.logs(&id);
    assert!(logs.contains("one\n") && logs.contains("two\n"), "{logs}");
    run.assert_completed_cleanly(&id);
}

#[test]
fn a_parallel_run_that_ended_while_the_root_was_read_only_keeps_each_exit_code() {
    let Some(tmpfs) = Tmpfs::mount("8m") else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let gate = fifo(work.path());
    let second = work.path().join("second.fifo");
    assert!(
        Command::new("mkfifo")
            .arg(&second)
            .status()
            .unwrap()
            .success()
    );
    let run = Run {
        root: &tmpfs.path().join("state"),
        retry_ms: "8000",
    };
    let waits = |gate: &Path, code: u8| {
        serde_json::json!([
            "sh",
            "-c",
            format!("read line < '{}'; exit {code}", gate.display())
        ])
    };
    let spec = serde_json::json!({"mode": "parallel", "tasks": [
        {"agent": "a", "command": waits(&gate, 0)},
        {"agent": "b", "command": waits(&second, 4)}
    ]});
    let file = work.path().join("parallel.json");
    std::fs::write(&file, spec.to_string()).unwrap();
    let args = ["--spec", file.to_str().unwrap()];
    let gates = [gate.as_path(), second.as_path()];
    let Some((_, status)) = read_only_past_the_runner_budget(&run, &args, &gates, 1) else {
        return;
    };
    assert_eq!(status["state"], "failed", "{status}");
    assert_eq!(status["steps"][0]["status"], "complete", "{status}");
    assert_eq!(status["steps"][0]["exitCode"], 0, "{status}");
    assert_eq!(status["steps"][1]["status"], "failed", "{status}");
    assert_eq!(status["steps"][1]["exitCode"], 4, "{status}");
}

#[test]
fn a_queued_launch_that_cannot_create_its_run_directory_leaves_no_place_in_line() {
    let Some(tmpfs) = Tmpfs::mount("8m") else {
        return;
    };
    let run = Run {
        root: &tmpfs.path().join("state"),
        retry_ms: "20000",
    };
    // Ends by itself if the test fails before it stops it.
    let holder = run.start_script("sleep 60");
    let queued = ["run", "--session", "s", "--max-active", "1", "--queue"];
    let runs = run.root.join("async-subagent-runs");
    // The pools stay writable, so the place in line is taken; the run's
    // own directory then cannot be made.
    let Some(read_only) = ReadOnly::over(&runs) else {
        run.ok(&["stop", &holder]);
        return;
    };
    let out = run.command(&[&queued[..], &["--", "true"]].concat());
    read_only.writable();
    drop(read_only);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("failed to create run directory"),
        "{stderr}"
    );
    assert_eq!(crate::queue::places_in_line(run.root), Vec::<String>::new());
    // The next one in line is first.
    let next = run.ok(&[&queued[..], &["--", "true"]].concat());
    let next = next.trim();
    let listed: Value = serde_json::from_str(&run.ok(&["status", next, "--json"])).unwrap();
    assert_eq!(listed["queuedForSlot"]["position"], 1, "{listed}");
    run.ok(&["stop", &holder]);
    let _ = run.command(&["wait", next, "--timeout", "30s"]);
    poll(Duration::from_secs(30), || {
        run.status(next)["processTerminal"]["state"] != "pending"
    });
    assert_eq!(run.status(next)["state"], "complete");
}
