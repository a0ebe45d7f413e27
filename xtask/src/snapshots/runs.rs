//! `status.json` as the launcher and its runner write it, in every run state,
//! for single, parallel and chain runs; the recovery descriptor and launch
//! contract of a single run; a session revival lease's owner record.
//!
//! Statuses come from `supervisor::transitions`, the same pure functions the
//! runner and launcher call, fed a pinned clock, pinned identities and a
//! fixed config; each one is written with `status::model::write_status`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use launcher::prepare::{Budget, Request, Slot};
use launcher::spec::{Plan, StepSpec};
use process_identity::ProcessIdentity;
use serde_json::json;
use status::{RunState, RunStatus};
use supervisor::config::{GroupConfig, LaunchConfig, StepConfig};
use supervisor::transitions::{self, StepEnd};

use super::{Artifact, Kind, PID, Scratch, T0};

const FAMILY: &str = "runs";
const RUNNER_ID: &str = "00000000-0000-4000-8000-00000000a001";

fn identity(pid: u32, start_time: u64) -> ProcessIdentity {
    ProcessIdentity {
        pid,
        start_time,
        boot_id: Some("00000000-0000-4000-8000-00000000f001".into()),
        machine_id: Some("0123456789abcdef0123456789abcdef".into()),
        host: Some("build-host".into()),
    }
}

fn step(run_dir: &Path, agent: &str, i: usize, task: bool, label: Option<&str>) -> StepConfig {
    StepConfig {
        agent: agent.into(),
        command: vec!["sh".into(), "-c".into(), format!("echo {agent}")],
        cwd: PathBuf::from("/home/alice/proj"),
        task_file: task.then(|| {
            run_dir.join(if label.is_some() {
                format!("task-{i}.md")
            } else {
                "task.md".into()
            })
        }),
        timeout_ms: None,
        fanout_label: label.map(str::to_owned),
        env: Default::default(),
        idle_timeout_ms: None,
        previous_in_task: false,
    }
}

fn config(
    scratch: &Scratch,
    id: &str,
    mode: &str,
    steps: &[(&str, Option<&str>)],
    groups: Vec<GroupConfig>,
) -> LaunchConfig {
    let run_dir = scratch.path().join("async-subagent-runs").join(id);
    let composite = mode != "single";
    LaunchConfig {
        run_id: id.into(),
        root: scratch.path().to_path_buf(),
        run_dir: run_dir.clone(),
        runner_process_instance_id: RUNNER_ID.into(),
        mode: mode.into(),
        steps: steps
            .iter()
            .enumerate()
            .map(|(i, (agent, label))| {
                step(
                    &run_dir,
                    agent,
                    i,
                    i == 0,
                    if composite { *label } else { None },
                )
            })
            .collect(),
        groups,
        timeout_ms: Some(1_800_000),
        session_id: Some("session-1".into()),
        fanout_descriptor: None,
        env: BTreeMap::new(),
        capacity_slot: None,
        revival: None,
        // A single run records the directory of its session (`sessionRoot`).
        session_root: (!composite).then(|| "/home/alice/.pi/agent/sessions/proj".into()),
        queue: None,
    }
}

fn group(start: usize, count: usize, parallel: bool) -> GroupConfig {
    GroupConfig {
        start,
        count,
        concurrency: 4,
        fail_fast: parallel,
        parallel,
    }
}

/// A recorder of statuses for one config.
struct Recorder<'a> {
    scratch: &'a Scratch,
    config: &'a LaunchConfig,
    out: Vec<Artifact>,
}

impl Recorder<'_> {
    fn record(&mut self, case: &str, status: &RunStatus, note: &str) -> anyhow::Result<()> {
        status::model::write_status(&self.config.run_dir, status)?;
        let path = self.config.run_dir.join("status.json");
        let artifact = self
            .scratch
            .record(FAMILY, case, Kind::Status, &path)?
            .note(note);
        self.out.push(artifact);
        Ok(())
    }
}

fn ended(
    status: &'static str,
    error: Option<&str>,
    exit_code: i64,
    start: u64,
    end: u64,
    process: (Option<i32>, Option<&str>),
) -> StepEnd {
    StepEnd {
        status,
        error: error.map(str::to_owned),
        exit_code,
        started_at: Some(start),
        closed_at: end,
        timed_out: false,
        process: Some((process.0, process.1.map(str::to_owned))),
        // A step that did not complete says why (here: its error).
        reason: error.filter(|_| status != "complete").map(str::to_owned),
        answer: None,
    }
}

fn fanout() -> serde_json::Value {
    json!({"used": 1, "limit": 64, "remaining": 63})
}

/// A final case: name, state, run error, step end, timed out, stopped.
type Ending = (
    &'static str,
    RunState,
    Option<&'static str>,
    StepEnd,
    bool,
    bool,
);

/// Every state of a single run: queued, running, step running, complete,
/// failed, stopped, timed out.
fn single(scratch: &Scratch, out: &mut Vec<Artifact>) -> anyhow::Result<()> {
    let config = config(
        scratch,
        "run-single",
        "single",
        &[("worker", None)],
        vec![group(0, 1, false)],
    );
    std::fs::create_dir_all(&config.run_dir)?;
    let mut rec = Recorder {
        scratch,
        config: &config,
        out: Vec::new(),
    };
    let mut queued = transitions::queued(&config, Some(fanout()), Some(identity(PID - 1, 11)), T0);
    // A plain `run -- COMMAND`: the step's short form.
    let spec = StepSpec {
        agent: "worker".into(),
        command: config.steps[0].command.clone(),
        name: None,
        command_label: Some(launcher::format::command_label(&config.steps[0].command)),
        task: None,
        cwd: None,
        task_file: None,
        timeout: None,
        idle_timeout: None,
    };
    launcher::prepare::add_names(&mut queued, None, [&spec]);
    rec.record(
        "single-queued",
        &queued,
        "`transitions::queued`: written by `run` before any process exists",
    )?;
    // `run --queue` over the limit: the same queued status, waiting in the
    // session's line for a slot (our key; the reference reads `queued`).
    let mut waiting = queued.clone();
    status::slot_wait::set_queued_for_slot(&mut waiting, T0 - 40);
    rec.record(
        "single-queued-for-slot",
        &waiting,
        "`run --queue` over `--max-active`: queued, with `queuedForSlot.since` (its place in the session's line)",
    )?;
    let mut admitted = waiting;
    status::slot_wait::end_wait(&mut admitted, T0 - 20);
    let admitted = transitions::running(
        Some(admitted),
        &config,
        &identity(PID, 22),
        Some(identity(PID - 2, 21)),
        T0 + 100,
    );
    rec.record(
        "single-running-after-queue",
        &admitted,
        "the runner's first write after the monitor took the slot: `slotWait: {since, admittedAt}` kept",
    )?;
    let running = transitions::running(
        Some(queued),
        &config,
        &identity(PID, 22),
        Some(identity(PID - 2, 21)),
        T0 + 100,
    );
    rec.record(
        "single-running",
        &running,
        "`transitions::running`: the runner's first write",
    )?;
    let started = transitions::step_started(
        running,
        &config,
        0,
        PID + 1,
        Some(identity(PID + 1, 23)),
        T0 + 200,
    );
    rec.record(
        "single-step-running",
        &started,
        "`transitions::step_started`: COMMAND spawned",
    )?;
    let live = transitions::StepLive {
        last_output_at: Some(T0 + 400),
        activity: Some("tool Bash: cargo test".into()),
        session_id: Some("0b1c2d3e-agent-session".into()),
        session_file: Some("/home/alice/.claude/projects/p/0b1c2d3e-agent-session.jsonl".into()),
    };
    let live = transitions::step_live(started.clone(), 0, &live, T0 + 450);
    rec.record(
        "single-step-live",
        &live,
        "`transitions::step_live`: the runner saw output, an activity and the CLI's session",
    )?;
    let cases: [Ending; 4] = [
        (
            "single-complete",
            RunState::Complete,
            None,
            StepEnd {
                answer: Some(transitions::AnswerRef::of(
                    config.run_dir.join("answer.md"),
                    "The parser drops the last token.\nFix: keep it.\n",
                )),
                ..ended("complete", None, 0, T0 + 200, T0 + 1200, (Some(0), None))
            },
            false,
            false,
        ),
        (
            "single-failed",
            RunState::Failed,
            Some("Not logged in · Please run /login"),
            StepEnd {
                reason: Some("Not logged in · Please run /login".into()),
                ..ended(
                    "failed",
                    Some("command ended with exit code 3"),
                    3,
                    T0 + 200,
                    T0 + 1200,
                    (Some(3), None),
                )
            },
            false,
            false,
        ),
        (
            "single-stopped",
            RunState::Stopped,
            None,
            ended(
                "stopped",
                Some("Subagent stopped by user."),
                1,
                T0 + 200,
                T0 + 1200,
                (None, Some("SIGTERM")),
            ),
            false,
            true,
        ),
        (
            "single-timed-out",
            RunState::Failed,
            Some("Subagent timed out after 1800000ms."),
            StepEnd {
                timed_out: true,
                ..ended(
                    "failed",
                    Some("Subagent timed out after 1800000ms."),
                    1,
                    T0 + 200,
                    T0 + 1200,
                    (None, Some("SIGTERM")),
                )
            },
            true,
            false,
        ),
    ];
    for (case, state, error, end, timed_out, stopped) in cases {
        let mut status = transitions::step_ended(started.clone(), &config, 0, &end, T0 + 1200);
        if stopped {
            status.stop_reason = Some("no longer needed".into());
        }
        let status = transitions::finished(
            status,
            state,
            error.map(str::to_owned),
            timed_out,
            stopped,
            T0 + 1300,
        );
        rec.record(
            case,
            &status,
            "`transitions::step_ended` then `transitions::finished`",
        )?;
    }
    out.append(&mut rec.out);
    Ok(())
}

/// A parallel run while two tasks run, and after a fail-fast failure.
fn parallel(scratch: &Scratch, out: &mut Vec<Artifact>) -> anyhow::Result<()> {
    let steps = [
        ("a", Some("tasks[0]")),
        ("b", Some("tasks[1]")),
        ("c", Some("tasks[2]")),
    ];
    let config = config(
        scratch,
        "run-parallel",
        "parallel",
        &steps,
        vec![group(0, 3, true)],
    );
    std::fs::create_dir_all(&config.run_dir)?;
    let mut rec = Recorder {
        scratch,
        config: &config,
        out: Vec::new(),
    };
    let mut queued = transitions::queued(
        &config,
        Some(json!({"used": 3, "limit": 64, "remaining": 61})),
        None,
        T0,
    );
    // `run --name review --spec ...` whose first task has a `name`.
    let named = |name: Option<&str>| StepSpec {
        agent: String::new(),
        command: Vec::new(),
        name: name.map(str::to_owned),
        command_label: None,
        task: None,
        cwd: None,
        task_file: None,
        timeout: None,
        idle_timeout: None,
    };
    let specs = [named(Some("first pass")), named(None), named(None)];
    launcher::prepare::add_names(&mut queued, Some("review"), &specs);
    let running = transitions::running(Some(queued), &config, &identity(PID, 22), None, T0 + 100);
    let one = transitions::step_started(running, &config, 0, PID + 1, None, T0 + 200);
    let both = transitions::step_started(one, &config, 1, PID + 2, None, T0 + 210);
    rec.record(
        "parallel-running",
        &both,
        "two of three tasks running (`transitions::step_started` twice)",
    )?;
    let failed = transitions::step_ended(
        both,
        &config,
        1,
        &ended(
            "failed",
            Some("command ended with exit code 7"),
            7,
            T0 + 210,
            T0 + 900,
            (Some(7), None),
        ),
        T0 + 900,
    );
    let casualty = ended(
        "failed",
        Some("stopped: a sibling failed (failFast)"),
        1,
        T0 + 200,
        T0 + 950,
        (None, Some("SIGTERM")),
    );
    let stopped = transitions::step_ended(failed, &config, 0, &casualty, T0 + 950);
    let skipped = StepEnd {
        started_at: None,
        process: None,
        ..ended(
            "failed",
            Some("skipped: a sibling failed (failFast)"),
            1,
            0,
            T0 + 950,
            (None, None),
        )
    };
    let skipped = transitions::step_ended(stopped, &config, 2, &skipped, T0 + 950);
    let done = transitions::finished(
        skipped,
        RunState::Failed,
        Some("Step failed: b".into()),
        false,
        false,
        T0 + 1000,
    );
    rec.record(
        "parallel-failed-fail-fast",
        &done,
        "task b failed; failFast stopped a and skipped c",
    )?;
    out.append(&mut rec.out);
    Ok(())
}

/// A chain inside its parallel group, and complete.
fn chain(scratch: &Scratch, out: &mut Vec<Artifact>) -> anyhow::Result<()> {
    let steps = [
        ("scout", Some("chain[0]")),
        ("a", Some("chain[1].parallel[0]")),
        ("b", Some("chain[1].parallel[1]")),
        ("writer", Some("chain[2]")),
    ];
    let groups = vec![group(0, 1, false), group(1, 2, true), group(3, 1, false)];
    let config = config(scratch, "run-chain", "chain", &steps, groups);
    std::fs::create_dir_all(&config.run_dir)?;
    let mut rec = Recorder {
        scratch,
        config: &config,
        out: Vec::new(),
    };
    let queued = transitions::queued(
        &config,
        Some(json!({"used": 4, "limit": 64, "remaining": 60})),
        None,
        T0,
    );
    let mut status =
        transitions::running(Some(queued), &config, &identity(PID, 22), None, T0 + 100);
    let ok = |start: u64, end: u64| ended("complete", None, 0, start, end, (Some(0), None));
    status = transitions::step_started(status, &config, 0, PID + 1, None, T0 + 200);
    status = transitions::step_ended(status, &config, 0, &ok(T0 + 200, T0 + 400), T0 + 400);
    status = transitions::step_started(status, &config, 1, PID + 2, None, T0 + 500);
    status = transitions::step_started(status, &config, 2, PID + 3, None, T0 + 510);
    rec.record(
        "chain-in-parallel-group",
        &status,
        "step 2 of 3 is a parallel group with both tasks running",
    )?;
    status = transitions::step_ended(status, &config, 1, &ok(T0 + 500, T0 + 700), T0 + 700);
    status = transitions::step_ended(status, &config, 2, &ok(T0 + 510, T0 + 720), T0 + 720);
    status = transitions::step_started(status, &config, 3, PID + 4, None, T0 + 800);
    status = transitions::step_ended(status, &config, 3, &ok(T0 + 800, T0 + 900), T0 + 900);
    let status = transitions::finished(status, RunState::Complete, None, false, false, T0 + 1000);
    rec.record("chain-complete", &status, "every step complete")?;
    out.append(&mut rec.out);
    Ok(())
}

/// `launch-contract.json` and `recovery-descriptor.json` of a single run.
fn recovery_files(scratch: &Scratch, out: &mut Vec<Artifact>) -> anyhow::Result<()> {
    let config = config(
        scratch,
        "run-recovery",
        "single",
        &[("worker", None)],
        vec![group(0, 1, false)],
    );
    std::fs::create_dir_all(&config.run_dir)?;
    let budgets = scratch.path().join("run-fanout-budgets");
    let descriptor = fanout_budget::Descriptor::from_json(
        &json!({"version": 1, "rootRunId": "run-recovery", "directory": budgets.join("run-recovery-00000000-0000-4000-8000-000000000001"), "limit": 64}).to_string(),
    )
    .map_err(anyhow::Error::msg)?;
    let spec = StepSpec {
        agent: "worker".into(),
        command: config.steps[0].command.clone(),
        name: None,
        command_label: None,
        task: None,
        cwd: None,
        task_file: None,
        timeout: None,
        idle_timeout: None,
    };
    let request = Request {
        plan: Plan::single(spec),
        cwd: PathBuf::from("/home/alice/proj"),
        timeout_ms: config.timeout_ms,
        tasks: vec![Some("the task text never reaches these files".into())],
        explicit_id: None,
        session: "session-1".into(),
        max_active: None,
        budget: Budget::Reuse(descriptor.clone()),
        slot: Slot::Acquire,
        revival: None,
        env: BTreeMap::from([("AGENT_MODE".to_owned(), "review".to_owned())]),
        session_root: None,
        preset: None,
        name: None,
        executor: Default::default(),
    };
    // A fixed root key pins the seal's MAC (a real root's key is random).
    let key = recovery::seal::RootKey::path(&config.root);
    atomic_file::write_private(&key, &[0x5a; 32])?;
    launcher::revive::persist(&config, &request, &descriptor)
        .map_err(|e| anyhow::anyhow!(e.message))?;
    let contract = config.run_dir.join("launch-contract.json");
    out.push(
        scratch
            .record(FAMILY, "launch-contract", Kind::LaunchContract, &contract)?
            .note("`revive::persist` of a single run"),
    );
    let descriptor = config.run_dir.join("recovery-descriptor.json");
    let note = "`revive::persist`; launchContractDigest is the sha256 of the launch contract above";
    out.push(
        scratch
            .record(FAMILY, "recovery-descriptor", Kind::Recovery, &descriptor)?
            .note(note),
    );
    out.push(recovery_seal(scratch, &config.run_dir, &key)?);
    Ok(())
}

/// `recovery-seal.json`: checked against the files it seals, then its mac
/// pinned, since the files hold the scratch directory's random path.
fn recovery_seal(scratch: &Scratch, run_dir: &Path, key: &Path) -> anyhow::Result<Artifact> {
    let key = recovery::seal::RootKey::load(key)?;
    let read = |name: &str| std::fs::read(run_dir.join(name));
    let bytes = read("recovery-seal.json")?;
    let seal = recovery::seal::parse_seal(&bytes)
        .map_err(|(field, detail)| anyhow::anyhow!("seal refused: {field} {detail}"))?;
    let (contract, descriptor) = (
        read("launch-contract.json")?,
        read("recovery-descriptor.json")?,
    );
    anyhow::ensure!(
        key.verify(&seal, &contract, &descriptor),
        "the seal does not verify"
    );
    let pinned = recovery::seal::Seal {
        mac: "0".repeat(64),
        ..seal
    };
    let text = String::from_utf8(atomic_file::to_pretty_json(&pinned))?;
    let note = "`revive::persist` under a fixed test key (32 bytes of 0x5a); the mac (HMAC-SHA256 over the two files above) was verified, then pinned";
    Ok(scratch
        .text(
            FAMILY,
            "recovery-seal",
            Kind::RecoverySeal,
            "recovery-seal.json",
            &text,
        )
        .note(note))
}

/// A revival lease's `owner.json`; its process facts (pid, host, start
/// identity, boot id, times, token) are pinned after the real write.
fn lease_owner(scratch: &Scratch, out: &mut Vec<Artifact>) -> anyhow::Result<()> {
    let session = scratch.path().join("output-0.log");
    std::fs::write(&session, "")?;
    let root = recovery::lease::lease_root(scratch.path());
    let request = recovery::lease::LeaseRequest {
        session_file: session,
        run_id: "run-9c1e".into(),
        source_run_id: "run-7f3a".into(),
        parent_session_id: Some("session-1".into()),
    };
    let lease = recovery::lease::acquire_lease(&root, &request)?;
    let path = lease.lease_dir().join("owner.json");
    let mut owner: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    let pinned = [
        ("token", json!("00000000-0000-4000-8000-00000000b001")),
        ("pid", json!(PID)),
        ("hostname", json!("host")),
        ("processStartIdentity", json!("linux:123456")),
        ("bootId", json!("00000000-0000-4000-8000-00000000f001")),
        ("acquiredAt", json!("2026-01-01T00:00:03.000Z")),
        ("acquiredAtMs", json!(T0 + 3000)),
        ("updatedAtMs", json!(T0 + 3000)),
    ];
    for (key, value) in pinned {
        if owner.get(key).is_some() {
            owner[key] = value;
        }
    }
    let text = String::from_utf8(atomic_file::to_pretty_json(&owner))?;
    let note = "`recovery::lease::acquire_lease`; token, pid, host, start identity, boot id and times pinned after the write";
    out.push(
        scratch
            .text(FAMILY, "lease-owner", Kind::LeaseOwner, "owner.json", &text)
            .note(note),
    );
    lease.release()?;
    Ok(())
}

/// Every artifact of this family.
pub(super) fn artifacts() -> anyhow::Result<Vec<Artifact>> {
    let scratch = Scratch::new()?;
    let mut out = Vec::new();
    single(&scratch, &mut out)?;
    parallel(&scratch, &mut out)?;
    chain(&scratch, &mut out)?;
    recovery_files(&scratch, &mut out)?;
    lease_owner(&scratch, &mut out)?;
    run_processes(&scratch, &mut out)?;
    Ok(out)
}

/// `run-processes.json`, as the monitor writes it after spawning the runner.
fn run_processes(scratch: &Scratch, out: &mut Vec<Artifact>) -> anyhow::Result<()> {
    let dir = scratch.path().join("async-subagent-runs/run-single");
    std::fs::create_dir_all(&dir)?;
    let record = status::processes::RunProcesses {
        version: 1,
        run_id: "run-single".into(),
        session_id: Some("session-1".into()),
        runner_process_instance_id: RUNNER_ID.into(),
        monitor: identity(PID - 2, 21),
        runner: identity(PID, 22),
    };
    status::processes::write(&dir, &record)?;
    out.push(
        scratch
            .record(
                FAMILY,
                "run-processes",
                Kind::RunProcesses,
                &dir.join(status::processes::FILE),
            )?
            .note(
                "`status::processes::write`: the monitor, once, before the runner has its config",
            ),
    );
    Ok(())
}
