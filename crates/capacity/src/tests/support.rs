//! A capacity root, run directories and run files as runners leave them.

use std::collections::HashSet;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::{Acquire, Capacity, CapacityError, Kind, SlotHandle, Snapshot, Transfer};

pub(crate) const SESSION: &str = "/home/u/.pi/sessions/parent.jsonl";

pub(crate) struct Fixture {
    pub(crate) tmp: tempfile::TempDir,
    pub(crate) cap: Capacity,
    pub(crate) none_live: HashSet<String>,
}

fn fixed_clock() -> u64 {
    1_700_000_000_000
}

impl Fixture {
    pub(crate) fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let cap =
            Capacity::new(tmp.path().join("session-active-async-capacity")).with_clock(fixed_clock);
        Self {
            tmp,
            cap,
            none_live: HashSet::new(),
        }
    }

    pub(crate) fn root(&self) -> PathBuf {
        self.tmp.path().join("session-active-async-capacity")
    }

    pub(crate) fn run_dir(&self, run_id: &str) -> PathBuf {
        let dir = self.tmp.path().join("async-subagent-runs").join(run_id);
        atomic_file::ensure_private_dir(&dir).unwrap();
        dir
    }

    pub(crate) fn acquire_kind(
        &self,
        run_id: &str,
        limit: u32,
        kind: Kind,
    ) -> Result<Option<SlotHandle>, CapacityError> {
        let dir = self.run_dir(run_id);
        self.cap.acquire(&Acquire {
            session_id: SESSION,
            limit: Some(limit),
            run_id,
            kind,
            async_dir: &dir,
            live_workflows: &self.none_live,
        })
    }

    pub(crate) fn acquire(&self, run_id: &str, limit: u32) -> SlotHandle {
        self.acquire_kind(run_id, limit, Kind::Runner)
            .unwrap()
            .unwrap()
    }

    pub(crate) fn transfer(
        &self,
        source: &str,
        run_id: &str,
        limit: Option<u32>,
    ) -> Result<Option<SlotHandle>, CapacityError> {
        let dir = self.run_dir(run_id);
        self.cap.transfer(&Transfer {
            session_id: SESSION,
            limit,
            source_run_id: source,
            run_id,
            async_dir: &dir,
            live_workflows: &self.none_live,
        })
    }

    pub(crate) fn reconcile(&self, limit: u32) -> Snapshot {
        self.cap
            .reconcile(SESSION, Some(limit), &self.none_live)
            .unwrap()
    }

    pub(crate) fn used(&self) -> usize {
        self.cap.count(SESSION, None).unwrap().used
    }

    /// A `status.json` as the runner writes it at the end.
    pub(crate) fn write_status(&self, run_id: &str, state: &str, runner: &str) -> PathBuf {
        let dir = self.run_dir(run_id);
        let status = json!({
            "runId": run_id,
            "sessionId": SESSION,
            "mode": "single",
            "state": state,
            "processTerminal": {
                "version": 1,
                "state": "pending",
                "runId": run_id,
                "runnerProcessInstanceId": runner,
            },
        });
        write_json(&dir.join("status.json"), &status);
        dir
    }
}

pub(crate) fn write_json(path: &Path, value: &Value) {
    atomic_file::write_json(path, value).unwrap();
}

pub(crate) fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&fs::read(path).unwrap()).unwrap()
}

pub(crate) fn mode(path: &Path) -> u32 {
    fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// Polls `done` until it holds; panics after a generous deadline.
pub(crate) fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// An identity of a process that certainly exited.
pub(crate) fn dead_identity() -> process_identity::ProcessIdentity {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let id = process_identity::ProcessIdentity::of(child.id()).unwrap_or(
        process_identity::ProcessIdentity {
            pid: child.id(),
            start_time: 0,
            boot_id: None,
            machine_id: None,
            host: None,
        },
    );
    child.wait().unwrap();
    id
}
