//! The crash matrix: every meaningful (process × point) fault of
//! `SUBAGENTS_FAULT`, injected into a real run with a COMMAND that has a
//! grandchild, then `subagents reconcile` until the run settles.
//!
//! Each cell asserts, once settled:
//! * the fault fired (the faulted process wrote its `fault injected` line);
//! * the run is not `queued`/`running`, and has the cell's state and proof;
//! * no capacity slot of the session is held (every run in it is over);
//! * no process of the run is alive (recorded identities, the step groups,
//!   every process whose environment names the run, every process whose
//!   working directory is the run directory);
//! * the `.active-runs` marker exists iff the proof neither is `observed`
//!   nor `not-started` (an abandoned run, proven to have had no runner);
//! * every `*.json` file of the run directory parses, and so does every
//!   line of `events.jsonl`.
//!
//! CI runs each cell once; `CRASH_MATRIX_REPEAT=N` runs each N times and
//! prints `cell trials clean` lines (`scripts/crash-matrix.sh` runs 20×);
//! `CRASH_MATRIX_CELL=a:b,c:d` runs only the cells named.

use crate::common;

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use serde_json::Value;

/// The COMMAND: a grandchild that would outlive it, then a clean exit.
const COMMAND: &str = "sleep 30 & sleep 0.3; echo done";

/// One cell of the matrix.
struct Cell {
    process: &'static str,
    point: &'static str,
    /// Faulted while `resume` revives a finished run (the handshake points).
    revival: bool,
    /// The acceptable (state, proof) ends of the run; a state `None`: the
    /// run never got a status.json.
    ends: &'static [End],
}

/// A run's final state and `processTerminal.state`, as `status --json` says.
type End = (Option<&'static str>, Option<&'static str>);

const fn cell(
    process: &'static str,
    point: &'static str,
    revival: bool,
    ends: &'static [End],
) -> Cell {
    Cell {
        process,
        point,
        revival,
        ends,
    }
}

const FAILED_OBSERVED: End = (Some("failed"), Some("observed"));
const FAILED_NOT_STARTED: End = (Some("failed"), Some("not-started"));
const COMPLETE_OBSERVED: End = (Some("complete"), Some("observed"));

/// What each fault must leave once reconciled.
const CELLS: &[Cell] = &[
    // Queued status, marker and slot exist; no process was ever spawned.
    cell("launcher", "after-run-dir", false, &[FAILED_NOT_STARTED]),
    // The queued status was never renamed into place: no status at all.
    cell("launcher", "mid-status-write", false, &[(None, None)]),
    // The monitor and runner go on without the launcher — unless a
    // reconcile finds the dead launcher before the monitor registered
    // itself: then the run is abandoned and the monitor does not start it.
    cell(
        "launcher",
        "before-ready",
        false,
        &[COMPLETE_OBSERVED, FAILED_NOT_STARTED],
    ),
    cell("launcher", "after-ready", false, &[COMPLETE_OBSERVED]),
    // Ack written, never authorised: the runner gives up before proceed.
    cell("launcher", "after-ack", true, &[FAILED_OBSERVED]),
    // No runner ever existed; the launcher saw EOF on the ready pipe. The
    // monitor's first status write is the one registering its identity.
    cell("monitor", "mid-status-write", false, &[FAILED_NOT_STARTED]),
    cell("monitor", "after-run-dir", false, &[FAILED_NOT_STARTED]),
    // Nobody waits on the runner: the observer finalizes the run.
    cell("monitor", "during-step", false, &[COMPLETE_OBSERVED]),
    cell("monitor", "after-candidate", false, &[COMPLETE_OBSERVED]),
    cell("monitor", "after-proof", false, &[COMPLETE_OBSERVED]),
    // The monitor waited on the runner and repairs the run itself.
    cell("runner", "after-run-dir", false, &[FAILED_OBSERVED]),
    cell("runner", "mid-status-write", false, &[FAILED_OBSERVED]),
    cell("runner", "before-ready", false, &[FAILED_OBSERVED]),
    cell("runner", "after-ready", false, &[FAILED_OBSERVED]),
    cell("runner", "after-ack", true, &[FAILED_OBSERVED]),
    cell("runner", "during-step", false, &[FAILED_OBSERVED]),
    cell("runner", "after-candidate", false, &[COMPLETE_OBSERVED]),
];

/// How long a cell may take to settle (kill graces, handshake timeouts);
/// `CRASH_MATRIX_SETTLE_S` overrides it.
fn settle_within() -> Duration {
    let secs = std::env::var("CRASH_MATRIX_SETTLE_S")
        .ok()
        .and_then(|v| v.parse().ok());
    Duration::from_secs(secs.unwrap_or(120))
}
/// The revival handshake waits, shortened so a dead peer is noticed quickly.
const STARTUP_TIMEOUT_MS: &str = "2000";

#[test]
fn every_fault_settles_cleanly() {
    let repeat: usize = std::env::var("CRASH_MATRIX_REPEAT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
        .max(1);
    let only = std::env::var("CRASH_MATRIX_CELL").ok();
    let mut failures = Vec::new();
    let mut table = Vec::new();
    for cell in CELLS {
        let name = format!("{}:{}", cell.process, cell.point);
        if only
            .as_deref()
            .is_some_and(|o| !o.split(',').any(|c| c == name))
        {
            continue;
        }
        let mut clean = 0;
        for trial in 0..repeat {
            match run_cell(cell) {
                Ok(()) => clean += 1,
                Err(why) => failures.push(format!("{name} (trial {}): {why}", trial + 1)),
            }
        }
        table.push(format!("{name} {repeat} {clean}"));
    }
    println!("cell trials clean");
    for line in &table {
        println!("{line}");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn run_dir(env: &Env, id: &str) -> PathBuf {
    env.root().join("async-subagent-runs").join(id)
}

fn run_ids(env: &Env) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(env.root().join("async-subagent-runs")) else {
        return Vec::new();
    };
    let mut ids: Vec<String> = entries
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    ids.sort();
    ids
}

/// Runs one cell in a fresh state root; `Err` names the first broken rule.
fn run_cell(cell: &Cell) -> Result<(), String> {
    let env = Env::new();
    let fault = format!("{}:{}", cell.process, cell.point);
    let before = if cell.revival {
        let source = env.run(&[
            "run",
            "--wait",
            "--session",
            "s",
            "--max-active",
            "2",
            "--",
            "sh",
            "-c",
            COMMAND,
        ]);
        if !source.status.success() {
            return Err(format!("the source run failed: {source:?}"));
        }
        run_ids(&env)
    } else {
        Vec::new()
    };
    let mut launch = match before.first() {
        Some(source) => env.command(&["resume", source, "--task", "again", "--max-active", "2"]),
        None => env.command(&[
            "run",
            "--session",
            "s",
            "--max-active",
            "2",
            "--",
            "sh",
            "-c",
            COMMAND,
        ]),
    };
    launch
        .env("SUBAGENTS_FAULT", &fault)
        .env("SUBAGENTS_STARTUP_TIMEOUT_MS", STARTUP_TIMEOUT_MS);
    let out = output_within(launch, Duration::from_secs(120))?;
    let launcher_stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if cell.process == "launcher" && out.status.signal() != Some(libc::SIGKILL) {
        return Err(format!("the launcher was not killed: {out:?}"));
    }
    let id = run_ids(&env)
        .into_iter()
        .find(|id| !before.contains(id))
        .ok_or("no run directory was created")?;
    let dir = run_dir(&env, &id);
    let mut last = String::new();
    let settle = settle_within();
    let deadline = std::time::Instant::now() + settle;
    loop {
        let reconciled = env.run(&["reconcile"]);
        last = match check(&env, cell, &id, &dir) {
            Ok(()) => break,
            Err(why) => format!("{why} (reconcile: {reconciled:?})"),
        };
        if std::time::Instant::now() > deadline {
            return Err(format!("not settled within {settle:?}: {last}"));
        }
        // Poll interval between reconcile passes; the deadline above decides.
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = last;
    let trace = format!("subagents: fault injected: {fault}");
    let stderr = std::fs::read_to_string(dir.join("runner.stderr.log")).unwrap_or_default();
    if !launcher_stderr.contains(&trace) && !stderr.contains(&trace) {
        return Err(format!(
            "the fault did not fire; launcher stderr: {launcher_stderr:?}; runner.stderr.log: {stderr:?}"
        ));
    }
    Ok(())
}

/// Every rule of a settled cell; `Err` names the first one broken.
fn check(env: &Env, cell: &Cell, id: &str, dir: &Path) -> Result<(), String> {
    let status: Option<Value> = match std::fs::read_to_string(dir.join("status.json")) {
        Ok(text) => Some(serde_json::from_str(&text).map_err(|e| format!("status.json: {e}"))?),
        Err(_) => None,
    };
    let state = status.as_ref().and_then(|s| s["state"].as_str());
    if matches!(state, Some("queued" | "running")) {
        return Err(format!("the run is still {}", state.unwrap_or_default()));
    }
    let alive = alive_processes(id, dir, status.as_ref());
    if !alive.is_empty() {
        return Err(format!("processes of the run alive: {alive:?}"));
    }
    // The proof as readers see it: `process-terminal.json` wins over the
    // copy overlaid on status.json.
    let shown = status.as_ref().map(|_| env.status_json(id));
    let proof = shown
        .as_ref()
        .and_then(|s| s["processTerminal"]["state"].as_str());
    if !cell.ends.contains(&(state, proof)) {
        return Err(format!(
            "state {state:?} proof {proof:?}, want one of {:?}",
            cell.ends
        ));
    }
    let marker = env.marker(id).exists();
    let released = matches!(proof, Some("observed" | "not-started")) || status.is_none();
    if marker == released {
        return Err(format!("marker present: {marker}, proof {proof:?}"));
    }
    let held = held_slots(env)?;
    if !held.is_empty() {
        return Err(format!("capacity slots still held: {held:?}"));
    }
    every_json_parses(dir)
}

/// Slots of session `s` that are still held (every run of the cell is over).
fn held_slots(env: &Env) -> Result<Vec<Value>, String> {
    let out = env.run(&["capacity", "--session", "s", "--json"]);
    let report: Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("capacity --json: {e}: {out:?}"))?;
    Ok(report["slots"].as_array().cloned().unwrap_or_default())
}

/// Pids of live processes of the run, found four ways.
fn alive_processes(id: &str, dir: &Path, status: Option<&Value>) -> Vec<u32> {
    let mut found = Vec::new();
    if let Some(status) = status {
        for key in ["runnerIdentity", "monitorIdentity"] {
            let identity = &status[key];
            if let (Some(pid), Some(start)) =
                (identity["pid"].as_u64(), identity["startTime"].as_u64())
                && alive(pid as u32)
                && proc_start_time(pid as u32) == start
            {
                found.push(pid as u32);
            }
        }
    }
    let groups: Vec<u32> = status
        .and_then(|s| s["steps"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter_map(|s| s["externalProcess"]["pid"].as_u64().map(|p| p as u32))
        .collect();
    let marker = format!("SUBAGENTS_RUN_ID={id}");
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if !alive(pid) || found.contains(&pid) {
            continue;
        }
        let in_group = process_group(pid).is_some_and(|g| groups.contains(&g));
        let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        let named = env.split(|b| *b == 0).any(|v| v == marker.as_bytes());
        let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).ok();
        if in_group || named || cwd.as_deref() == Some(dir) {
            found.push(pid);
        }
    }
    found
}

fn process_group(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')')
        .next()?
        .split_whitespace()
        .nth(2)?
        .parse()
        .ok()
}

fn every_json_parses(dir: &Path) -> Result<(), String> {
    for path in walk(dir) {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.ends_with(".json") {
            let text = std::fs::read_to_string(&path).map_err(|e| format!("{name}: {e}"))?;
            serde_json::from_str::<Value>(&text).map_err(|e| format!("{name}: {e}"))?;
        } else if name == "events.jsonl" {
            let text = std::fs::read_to_string(&path).map_err(|e| format!("{name}: {e}"))?;
            for line in text.lines() {
                serde_json::from_str::<Value>(line).map_err(|e| format!("{name}: {e}: {line}"))?;
            }
        }
    }
    Ok(())
}

/// Runs `command` to its end; a launcher that hangs is killed and reported.
fn output_within(
    mut command: std::process::Command,
    within: Duration,
) -> Result<std::process::Output, String> {
    use std::process::Stdio;
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(within) {
        Ok(output) => output.map_err(|e| e.to_string()),
        Err(_) => {
            kill(pid, libc::SIGKILL);
            Err(format!("the launcher did not finish within {within:?}"))
        }
    }
}
