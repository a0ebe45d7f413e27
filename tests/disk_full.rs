//! A full disk loses nothing: a run whose COMMAND exited 0 while the state
//! root had no space left ends `complete`, not `failed`, with its slot
//! released — whether space comes back while the runner still retries, or
//! only after the runner and its monitor gave up (then `reconcile` restores
//! the outcome from the step-end events).
//!
//! The state root is a 300 KiB tmpfs; the tests skip (printing why) when
//! mounting is not permitted.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::{alive, poll, walk};
use serde_json::Value;

/// A tmpfs mounted for one test; unmounted (lazily) on drop.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Option<Self> {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(dir.path())
            .output();
        match out {
            Ok(out) if out.status.success() => Some(Self { dir }),
            Ok(out) => {
                let why = String::from_utf8_lossy(&out.stderr);
                println!("skipping: cannot mount a tmpfs: {}", why.trim());
                None
            }
            Err(e) => {
                println!("skipping: cannot run mount: {e}");
                None
            }
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
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
        let script = format!("read line < '{}'; exit 0", gate.display());
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
                &script,
            ])
            .trim()
            .to_owned();
        poll(Duration::from_secs(20), || {
            self.status(&id)["steps"][0]["externalProcess"]["pid"].is_u64()
        });
        id
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
    poll(Duration::from_secs(60), || {
        run.ok(&["reconcile"]);
        run.status(&id)["processTerminal"]["state"] == "observed"
    });
    run.assert_completed_cleanly(&id);
}
