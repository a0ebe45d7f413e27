//! A capacity slot's `owner.json` in each phase of its life.

use std::collections::HashSet;

use capacity::{Acquire, Capacity, Kind as RunKind, SlotHandle, Transfer};
use process_identity::ProcessIdentity;

use super::{Artifact, Kind, PID, Scratch, T0};

const FAMILY: &str = "capacity";

fn clock() -> u64 {
    T0 + 2000
}

fn token() -> String {
    "00000000-0000-4000-8000-00000000e001".into()
}

fn reserving_process() -> Option<ProcessIdentity> {
    Some(ProcessIdentity {
        pid: PID,
        start_time: 123_456,
        boot_id: Some("00000000-0000-4000-8000-00000000f001".into()),
        machine_id: Some("0123456789abcdef0123456789abcdef".into()),
        host: Some("build-host".into()),
    })
}

/// acquired → started → transferred (runner), acquired → started (workflow).
pub(super) fn artifacts() -> anyhow::Result<Vec<Artifact>> {
    let scratch = Scratch::new()?;
    let pools = Capacity::new(scratch.path().join("session-active-async-capacity"))
        .with_clock(clock)
        .with_reservation_tokens(token)
        .with_reserving_process(reserving_process);
    let runs = scratch.path().join("async-subagent-runs");
    let live = HashSet::new();
    let record = |case: &str, handle: &SlotHandle, note: &str| -> anyhow::Result<Artifact> {
        let path = handle.slot_dir().join("owner.json");
        Ok(scratch
            .record(FAMILY, case, Kind::CapacityOwner, &path)?
            .note(note))
    };
    let mut out = Vec::new();

    let source_dir = runs.join("run-7f3a");
    std::fs::create_dir_all(&source_dir)?;
    let acquire = Acquire {
        session_id: "session-1",
        limit: Some(2),
        run_id: "run-7f3a",
        kind: RunKind::Runner,
        async_dir: &source_dir,
        live_workflows: &live,
    };
    let mut slot = pools
        .acquire(&acquire)?
        .ok_or_else(|| anyhow::anyhow!("no slot with a limit"))?;
    out.push(record(
        "owner-acquired",
        &slot,
        "`Capacity::acquire` of a runner slot",
    )?);
    out.push(
        scratch
            .record(
                FAMILY,
                "run-name-acquired",
                Kind::CapacityRunName,
                &slot.slot_dir().join("run.0.run-7f3a"),
            )?
            .note(
                "`Capacity::acquire`: the slot's second record of its run, the reserving process",
            ),
    );
    slot.mark_started("00000000-0000-4000-8000-00000000a001")?;
    out.push(record(
        "owner-started",
        &slot,
        "after `SlotHandle::mark_started`",
    )?);

    // A transfer needs the source run to be over.
    atomic_file::write_json(
        &source_dir.join("status.json"),
        &serde_json::json!({"runId": "run-7f3a", "state": "complete"}),
    )?;
    let revival_dir = runs.join("run-9c1e");
    std::fs::create_dir_all(&revival_dir)?;
    let transfer = Transfer {
        session_id: "session-1",
        limit: Some(2),
        source_run_id: "run-7f3a",
        run_id: "run-9c1e",
        async_dir: &revival_dir,
        live_workflows: &live,
    };
    let moved = pools
        .transfer(&transfer)?
        .ok_or_else(|| anyhow::anyhow!("nothing transferred"))?;
    out.push(record(
        "owner-transferred",
        &moved,
        "`Capacity::transfer` of the finished run's slot to its revival",
    )?);

    let workflow_dir = runs.join("run-wf01");
    std::fs::create_dir_all(&workflow_dir)?;
    let acquire = Acquire {
        session_id: "session-2",
        run_id: "run-wf01",
        kind: RunKind::Workflow,
        async_dir: &workflow_dir,
        ..acquire
    };
    let mut workflow = pools
        .acquire(&acquire)?
        .ok_or_else(|| anyhow::anyhow!("no slot with a limit"))?;
    out.push(record(
        "owner-workflow-acquired",
        &workflow,
        "`Capacity::acquire` of a workflow slot",
    )?);
    workflow.mark_workflow_started()?;
    out.push(record(
        "owner-workflow-started",
        &workflow,
        "after `SlotHandle::mark_workflow_started`",
    )?);
    Ok(out)
}
