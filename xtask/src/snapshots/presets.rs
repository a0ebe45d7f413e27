//! The files of a preset run (`run --agent reviewer`, runner `claude`): its
//! launch contract and recovery descriptor (`revive::persist` with the
//! preset's fields), and `status.json` after the runner read the CLI's
//! event stream back (`supervisor::agent_output::after_step`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use agents::RunnerKind;
use launcher::prepare::{Budget, Request, Slot};
use launcher::spec::{Plan, StepSpec};
use serde_json::json;
use status::RunState;
use supervisor::config::{GroupConfig, LaunchConfig, StepConfig};
use supervisor::transitions;

use super::{Artifact, Kind, Scratch, T0};

const FAMILY: &str = "presets";
const SESSION: &str = "5a4b7c1e-0000-4000-8000-00000000c001";
const DEFINITION: &str = "---\nname: reviewer\ndescription: Reviews code\nrunner: claude\nmodel: sonnet\nthinking: high\ntools: Read, Grep, Glob\n---\nYou review code.\n";

fn config(scratch: &Scratch, argv: Vec<String>, env: BTreeMap<String, String>) -> LaunchConfig {
    let run_dir = scratch
        .path()
        .join("async-subagent-runs")
        .join("run-preset");
    LaunchConfig {
        run_id: "run-preset".into(),
        root: scratch.path().to_path_buf(),
        run_dir: run_dir.clone(),
        runner_process_instance_id: "00000000-0000-4000-8000-00000000a001".into(),
        mode: "single".into(),
        steps: vec![StepConfig {
            agent: "reviewer".into(),
            command: argv,
            cwd: PathBuf::from("/home/alice/proj"),
            task_file: Some(run_dir.join("task.md")),
            timeout_ms: None,
            fanout_label: None,
            env: Default::default(),
            idle_timeout_ms: None,
            previous_in_task: false,
        }],
        groups: vec![GroupConfig {
            start: 0,
            count: 1,
            concurrency: 1,
            fail_fast: false,
            parallel: false,
        }],
        timeout_ms: Some(1_800_000),
        session_id: Some("session-1".into()),
        fanout_descriptor: None,
        env,
        capacity_slot: None,
        revival: None,
        session_root: None,
        queue: None,
    }
}

fn recovery_files(
    scratch: &Scratch,
    config: &LaunchConfig,
    preset: &launcher::presets::Preset,
    out: &mut Vec<Artifact>,
) -> anyhow::Result<()> {
    let budgets = scratch.path().join("run-fanout-budgets");
    let descriptor = fanout_budget::Descriptor::from_json(
        &json!({"version": 1, "rootRunId": "run-preset", "directory": budgets.join("run-preset-00000000-0000-4000-8000-000000000001"), "limit": 64}).to_string(),
    )
    .map_err(anyhow::Error::msg)?;
    let spec = StepSpec {
        agent: "reviewer".into(),
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
        env: config.env.clone(),
        session_root: None,
        preset: Some(preset.record()),
        name: None,
        executor: Default::default(),
    };
    launcher::revive::persist(config, &request, &descriptor)
        .map_err(|e| anyhow::anyhow!(e.message))?;
    let note = "`revive::persist` of `run --agent reviewer` (runner claude): the argv the preset rendered, its environment";
    let contract = config.run_dir.join("launch-contract.json");
    out.push(
        scratch
            .record(
                FAMILY,
                "preset-launch-contract",
                Kind::LaunchContract,
                &contract,
            )?
            .note(note),
    );
    let note = "`revive::persist` with the preset's model, thinking, tools, systemPromptMode and agentFilePath; no sessionFile until the CLI names its session";
    let path = config.run_dir.join("recovery-descriptor.json");
    out.push(
        scratch
            .record(FAMILY, "preset-recovery-descriptor", Kind::Recovery, &path)?
            .note(note),
    );
    Ok(())
}

/// `status.json` once the runner has read Claude's stream-json back.
fn captured_status(
    scratch: &Scratch,
    config: &LaunchConfig,
    out: &mut Vec<Artifact>,
) -> anyhow::Result<()> {
    let queued = transitions::queued(config, None, None, T0);
    let mut status = queued;
    status.state = RunState::Complete;
    if let Some(step) = status.steps.as_mut().and_then(|s| s.first_mut()) {
        step.status = "complete".into();
    }
    status::model::write_status(&config.run_dir, &status)?;
    let stream = format!(
        "{}\n{}\n",
        json!({"type": "system", "subtype": "init", "session_id": SESSION}),
        json!({"type": "result", "subtype": "success", "result": "No problems found.", "session_id": SESSION}),
    );
    std::fs::write(config.run_dir.join("external-0.stdout.log"), stream)?;
    let project = scratch.path().join("claude/projects/-home-alice-proj");
    std::fs::create_dir_all(&project)?;
    std::fs::write(project.join(format!("{SESSION}.jsonl")), "")?;
    // The CLI's session store, inside the scratch root (the runner reads the
    // run's env first); kept out of the contract, whose digest is pinned.
    let mut config = config.clone();
    let store = scratch.path().join("claude").display().to_string();
    config.env.insert("CLAUDE_CONFIG_DIR".into(), store);
    supervisor::agent_output::after_step(&config, 0, true);
    let path = config.run_dir.join("status.json");
    out.push(
        scratch
            .record(FAMILY, "preset-status-captured", Kind::Status, &path)?
            .note("`agent_output::after_step`: the session id and file read back from the CLI's events and session store"),
    );
    Ok(())
}

/// `status.json` of a parallel spec with a named agent (`{"agent":
/// "reviewer", "task": ...}`, no command) beside a command with an idle
/// limit, while both run: the command's `idleTimeoutMs` and the
/// `lastOutputAt` the runner saw, then the agent step's own session.
fn composite_status(
    scratch: &Scratch,
    single: &LaunchConfig,
    out: &mut Vec<Artifact>,
) -> anyhow::Result<()> {
    let mut config = single.clone();
    config.run_id = "run-spec".into();
    config.run_dir = scratch.path().join("async-subagent-runs").join("run-spec");
    config.mode = "parallel".into();
    std::fs::create_dir_all(&config.run_dir)?;
    let mut agent = config.steps[0].clone();
    agent.task_file = Some(config.run_dir.join("task-0.md"));
    agent.fanout_label = Some("tasks[0]".into());
    // The preset's environment is the step's own in a composite run.
    agent.env = std::mem::take(&mut config.env);
    let store = scratch.path().join("claude").display().to_string();
    agent.env.insert("CLAUDE_CONFIG_DIR".into(), store);
    let mut command = agent.clone();
    command.agent = "lint".into();
    command.command = vec!["sh".into(), "-c".into(), "make lint".into()];
    command.task_file = None;
    command.fanout_label = Some("tasks[1]".into());
    command.env = BTreeMap::new();
    command.idle_timeout_ms = Some(120_000);
    config.steps = vec![agent, command];
    config.groups = vec![GroupConfig {
        start: 0,
        count: 2,
        concurrency: 4,
        fail_fast: false,
        parallel: true,
    }];
    let mut status = transitions::queued(&config, None, None, T0);
    status = transitions::step_started(status, &config, 0, 4101, None, T0 + 10);
    status = transitions::step_started(status, &config, 1, 4102, None, T0 + 11);
    status = transitions::output_seen(status, &[(1, T0 + 3_000)], T0 + 5_011);
    status.state = RunState::Running;
    status::model::write_status(&config.run_dir, &status)?;
    let stream = format!(
        "{}\n",
        json!({"type": "result", "subtype": "success", "result": "No problems found.", "session_id": SESSION}),
    );
    std::fs::write(config.run_dir.join("external-0.stdout.log"), stream)?;
    supervisor::agent_output::after_step(&config, 0, true);
    let path = config.run_dir.join("status.json");
    out.push(
        scratch
            .record(FAMILY, "preset-composite-status", Kind::Status, &path)?
            .note("a parallel spec's named agent (its session on its step only, none on the run) and a command step with `idleTimeoutMs` and the runner's `lastOutputAt`"),
    );
    Ok(())
}

pub(super) fn artifacts() -> anyhow::Result<Vec<Artifact>> {
    let scratch = Scratch::new()?;
    let file = Path::new("/home/alice/proj/.subagents/agents/reviewer.md");
    let definition = agents::definition::parse_definition(DEFINITION, file, RunnerKind::Pi)?;
    let invocation = agents::preset::render(&definition, SESSION)?;
    let config = config(&scratch, invocation.argv.clone(), invocation.env.clone());
    std::fs::create_dir_all(&config.run_dir)?;
    let preset = launcher::presets::Preset {
        definition,
        invocation,
    };
    let mut out = Vec::new();
    recovery_files(&scratch, &config, &preset, &mut out)?;
    captured_status(&scratch, &config, &mut out)?;
    composite_status(&scratch, &config, &mut out)?;
    Ok(out)
}
