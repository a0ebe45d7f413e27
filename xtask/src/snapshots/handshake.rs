//! The three startup files in each state, and the pre-proceed failure record.
//!
//! Runner records are written by `RunnerHandshake` with the pid pinned to
//! [`PID`]. The launcher's `ack` and `proceed` come from a real
//! `run_launcher_side` exchange with a `sleep` child standing in for the
//! runner (so a failed exchange terminates only that child); those two
//! records carry no pid.

use std::path::Path;
use std::time::{Duration, Instant};

use handshake::{
    ACK_FILE, Binding, CANDIDATE_FILE, LauncherTimeouts, PROCEED_FILE, Runner, RunnerHandshake,
    RunnerTimeouts, STARTUP_FILE, STATUS_FILE, persist_pre_proceed_failure_at,
    report_startup_failure_as,
};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};

use anyhow::Context;
use serde_json::json;

use super::{Artifact, Kind, PID, Scratch, T0};

const FAMILY: &str = "handshake";
const TOKEN: &str = "00000000-0000-4000-8000-00000000d001";

fn binding() -> Binding {
    Binding {
        run_id: "run-7f3a".into(),
        runner_process_instance_id: "00000000-0000-4000-8000-00000000a001".into(),
    }
}

fn owner() -> serde_json::Value {
    json!({"version": 1, "token": TOKEN, "pid": PID, "sessionId": "session-1"})
}

fn fresh(scratch: &Scratch, case: &str) -> anyhow::Result<std::path::PathBuf> {
    let dir = scratch.path().join(case);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

fn runner(dir: &Path, pid: u32, proceed_wait: Duration) -> RunnerHandshake {
    let timeouts = RunnerTimeouts {
        ack: Duration::from_secs(10),
        proceed: proceed_wait,
    };
    RunnerHandshake::new(dir, binding(), TOKEN.into(), timeouts).with_pid(pid)
}

/// `ready`, `acknowledged`, `error`, `ack`, `proceed` and the failure record.
pub(super) fn artifacts() -> anyhow::Result<Vec<Artifact>> {
    let scratch = Scratch::new()?;
    let mut out = Vec::new();

    let dir = fresh(&scratch, "ready")?;
    runner(&dir, PID, Duration::ZERO).announce_ready(&owner())?;
    out.push(
        scratch
            .record(
                FAMILY,
                "startup-ready",
                Kind::Startup,
                &dir.join(STARTUP_FILE),
            )?
            .note("`RunnerHandshake::announce_ready` with the session-lease owner record"),
    );

    let dir = fresh(&scratch, "acknowledged")?;
    std::fs::write(dir.join(ACK_FILE), ack_fixture().to_string())?;
    // No launcher writes `proceed` here: the runner acknowledges, then times out.
    let _ = runner(&dir, PID, Duration::from_millis(1)).await_commit();
    out.push(
        scratch
            .record(
                FAMILY,
                "startup-acknowledged",
                Kind::Startup,
                &dir.join(STARTUP_FILE),
            )?
            .note("`RunnerHandshake::await_commit` after it read the launcher's ack"),
    );

    let dir = fresh(&scratch, "error")?;
    report_startup_failure_as(
        &dir,
        &binding(),
        "Session lease is held by another process.",
        PID,
    )?;
    out.push(
        scratch
            .record(
                FAMILY,
                "startup-error",
                Kind::Startup,
                &dir.join(STARTUP_FILE),
            )?
            .note("`report_startup_failure_as` for a lease conflict"),
    );

    let dir = fresh(&scratch, "exchange")?;
    launcher_exchange(&dir)?;
    out.push(
        scratch
            .record(FAMILY, "ack", Kind::StartupAck, &dir.join(ACK_FILE))?
            .note("written by `run_launcher_side` on reading `ready`"),
    );
    out.push(
        scratch
            .record(
                FAMILY,
                "proceed",
                Kind::StartupProceed,
                &dir.join(PROCEED_FILE),
            )?
            .note("written by `run_launcher_side` on reading `acknowledged` (the commit point)"),
    );

    let dir = fresh(&scratch, "pre-proceed-failure")?;
    atomic_file::write_json(
        &dir.join(STATUS_FILE),
        &json!({"runId": "run-7f3a", "mode": "single", "state": "queued", "startedAt": T0}),
    )?;
    persist_pre_proceed_failure_at(
        &dir,
        &binding(),
        Some("session-1"),
        "Timed out after 10000ms waiting for the async runner startup state 'ready'.",
        T0 + 10_000,
    )?;
    out.push(
        scratch
            .record(
                FAMILY,
                "pre-proceed-failure-status",
                Kind::Status,
                &dir.join(STATUS_FILE),
            )?
            .note("`persist_pre_proceed_failure_at` merged into a queued status"),
    );
    out.push(
        scratch
            .record(
                FAMILY,
                "pre-proceed-failure-candidate",
                Kind::Candidate,
                &dir.join(CANDIDATE_FILE),
            )?
            .note("`persist_pre_proceed_failure_at`: a candidate with no writer started"),
    );
    Ok(out)
}

/// The control record a launcher writes, as input for the runner side.
fn ack_fixture() -> serde_json::Value {
    let binding = binding();
    json!({"action": "ack", "token": TOKEN, "runId": binding.run_id,
        "runnerProcessInstanceId": binding.runner_process_instance_id})
}

/// Runs the launcher side against a stand-in runner process: `ready` is in
/// place before it starts, and a helper thread answers the ack with the
/// runner's real `acknowledged` record. Leaves `ack` and `proceed` behind.
fn launcher_exchange(dir: &Path) -> anyhow::Result<()> {
    let mut child = Command::new("sleep")
        .arg("30")
        .process_group(0)
        .spawn()
        .context("spawn the stand-in runner `sleep 30`")?;
    let result = exchange_with(dir, &mut child);
    let _ = child.kill();
    let _ = child.wait();
    result
}

fn exchange_with(dir: &Path, child: &mut Child) -> anyhow::Result<()> {
    let pid = child.id();
    runner(dir, pid, Duration::ZERO).announce_ready(&owner())?;
    // The runner's `acknowledged` record for this pid, made in a side directory
    // so the runner does not consume the launcher's files.
    let side = dir.join("side");
    std::fs::create_dir_all(&side)?;
    std::fs::write(side.join(ACK_FILE), ack_fixture().to_string())?;
    let _ = runner(&side, pid, Duration::from_millis(1)).await_commit();
    let acknowledged = std::fs::read(side.join(STARTUP_FILE))?;
    std::fs::remove_dir_all(&side)?;

    let ack = dir.join(ACK_FILE);
    let startup = dir.join(STARTUP_FILE);
    let helper = std::thread::spawn(move || -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ack.exists() {
            anyhow::ensure!(Instant::now() < deadline, "the launcher never acknowledged");
            std::thread::sleep(Duration::from_millis(2));
        }
        atomic_file::write_private(&startup, &acknowledged)?;
        Ok(())
    });
    let timeouts = LauncherTimeouts {
        ready: Duration::from_secs(10),
        acknowledged: Duration::from_secs(10),
        terminate_grace: Duration::ZERO,
        kill_grace: Duration::ZERO,
    };
    let result =
        handshake::run_launcher_side(dir, &binding(), None, Runner::Child(child), &timeouts);
    helper
        .join()
        .map_err(|_| anyhow::anyhow!("the helper thread panicked"))??;
    match result {
        Ok(_) => Ok(()),
        Err(failure) => anyhow::bail!("the launcher side failed: {}", failure.error),
    }
}
