//! Recovery files of single runs, and `subagents resume`.
//!
//! Every single run persists a launch contract (agent, cwd, argv with its
//! placeholders unexpanded, the explicitly passed environment, timeout,
//! session) and a version-1 recovery descriptor whose `launchContractDigest`
//! is the contract's sha256. Neither holds task text. `resume` verifies both,
//! transfers the source's capacity slot, reuses its fan-out budget (claiming
//! nothing), and launches a runner that must take the session lease and pass
//! the startup handshake before it starts anything.

use std::path::{Path, PathBuf};

use fanout_budget::Descriptor;
use recovery::{LaunchContract, RecoveryDescriptor};
use serde_json::json;
use status::{Layout, events, now_ms};

use crate::cli::ResumeArgs;
use crate::config::LaunchConfig;
use crate::error::{CliError, CliResult, Exit};
use crate::prepare::{Budget, Request, Revival, Slot};
use crate::root::parse_duration;
use crate::spec::{Plan, StepSpec};

/// Environment override of every startup-handshake wait, in milliseconds
/// (defaults: the reference's 10 s on the launcher side, 30 s on the runner's).
pub const STARTUP_TIMEOUT_ENV: &str = "SUBAGENTS_STARTUP_TIMEOUT_MS";

/// (launcher waits, runner waits) in ms.
pub fn startup_timeouts_ms() -> (u64, u64) {
    let configured = std::env::var(STARTUP_TIMEOUT_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok());
    match configured.filter(|ms| *ms > 0) {
        Some(ms) => (ms, ms),
        None => (10_000, 30_000),
    }
}

/// The session file of a run's lineage: a revival continues its source's;
/// a fresh run's is its own first output.
fn session_file(config: &LaunchConfig) -> PathBuf {
    match &config.revival {
        Some(revival) => revival.session_file.clone(),
        None => supervisor::runner::output_path(config, 0),
    }
}

/// Writes `launch-contract.json` and `recovery-descriptor.json` for a single run.
pub fn persist(config: &LaunchConfig, request: &Request, budget: &Descriptor) -> CliResult {
    let step = &config.steps[0];
    let contract = LaunchContract {
        version: 1,
        run_id: config.run_id.clone(),
        agent: step.agent.clone(),
        cwd: step.cwd.display().to_string(),
        command: step.command.clone(),
        env: request.env.clone(),
        timeout_ms: config.timeout_ms,
        session_id: config.session_id.clone(),
    };
    let fail = |e: String| CliError::failed(format!("failed to persist recovery descriptor: {e}"));
    let descriptor = json!({
        "version": 1,
        "runFanoutBudget": budget,
        "sourceRunId": config.run_id,
        "agent": step.agent,
        "sessionFile": session_file(config),
        "cwd": step.cwd,
        "systemPromptMode": "append",
        "inheritProjectContext": false,
        "inheritSkills": false,
        "outputPath": supervisor::runner::output_path(config, 0),
        "outputMode": "inline",
        "maxSubagentDepth": 2,
        "share": false,
    });
    let mut descriptor: RecoveryDescriptor =
        serde_json::from_value(descriptor).map_err(|e| fail(e.to_string()))?;
    let task = request.tasks.first().cloned().flatten().unwrap_or_default();
    match recovery::persist_recovery(&config.run_dir, &contract, &mut descriptor, &task) {
        // A task that equals a value the contract needs anyway (argv, cwd,
        // session) cannot be written without "containing" it: the run goes
        // on, but it cannot be resumed. Nothing was written.
        Err(recovery::ContractError::TaskText { .. }) => Ok(()),
        other => other.map(drop).map_err(|e| fail(e.to_string())),
    }
}

/// `subagents resume RUN --task TEXT`.
pub fn resume(layout: &Layout, args: &ResumeArgs) -> CliResult {
    let source = crate::commands::resolve(layout, &args.run)?;
    let source_dir = layout.run_dir(&source);
    let refuse = |why: String| CliError::failed(format!("failed to resume run '{source}': {why}"));
    let status = status::model::read_status(&source_dir)?.ok_or_else(|| {
        CliError::new(Exit::NotFound, format!("run '{source}' has no status.json"))
    })?;
    if status.state.is_active() {
        return Err(refuse(format!(
            "Async child '{source}' is still {}. Only complete, failed or stopped runs can be resumed.",
            status.state
        )));
    }
    let follow_up = follow_up(args).map_err(|e| CliError::new(Exit::Usage, e))?;
    let recovery = load(layout, &source_dir).map_err(&refuse)?;
    let request =
        revival_request(layout, args, &source, &status, recovery, &follow_up).map_err(&refuse)?;
    let launched = crate::launch::launch(layout, &request)?;
    let fields = json!({"resumedAs": launched.run_id});
    let _ = events::append(
        &source_dir,
        "subagent.run.resumed",
        &source,
        now_ms(),
        fields,
    );
    if args.json {
        let mut out = serde_json::to_value(&launched).unwrap_or_default();
        out["sourceRunId"] = json!(source);
        println!("{out}");
    } else {
        println!("{}", launched.run_id);
    }
    Ok(())
}

fn follow_up(args: &ResumeArgs) -> Result<String, String> {
    let text = match &args.task_file {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| format!("failed to read task file '{}': {e}", path.display()))?,
        None => args.task.clone().unwrap_or_default(),
    };
    if text.trim().is_empty() {
        return Err("a follow-up task is required (--task or --task-file).".into());
    }
    Ok(text)
}

/// The verified descriptor and contract of a run, with the live fan-out check.
pub fn load(layout: &Layout, run_dir: &Path) -> Result<recovery::Recovery, String> {
    let root = layout.fanout_budgets_dir();
    let check = crate::fanout::live_check(&root);
    let id = run_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    recovery::load_recovery(run_dir, Some(&check)).map_err(|e| e.to_string())?.ok_or_else(|| {
        format!("Async child '{id}' is missing its required run fan-out recovery identity. Start a new run instead.")
    })
}

fn revival_request(
    layout: &Layout,
    args: &ResumeArgs,
    source: &str,
    status: &status::RunStatus,
    recovery: recovery::Recovery,
    follow_up: &str,
) -> Result<Request, String> {
    let recovery::Recovery {
        descriptor,
        contract,
    } = recovery;
    let session_file = descriptor
        .session_file
        .as_deref()
        .map(PathBuf::from)
        .filter(|p| p.exists())
        .ok_or_else(|| {
            format!("Async child '{source}' has no persisted session file to resume.")
        })?;
    let budget: Descriptor = serde_json::to_value(&descriptor.run_fanout_budget)
        .and_then(serde_json::from_value)
        .map_err(|e| e.to_string())?;
    let timeout_ms = match &args.timeout {
        Some(text) => Some(parse_duration(text)?.as_millis() as u64).filter(|ms| *ms > 0),
        None => contract.timeout_ms,
    };
    let session = status
        .session_id
        .clone()
        .or(contract.session_id.clone())
        .unwrap_or_else(|| crate::admission::session_id(None));
    let task = revived_task(source, &contract.agent, &session_file, follow_up);
    let spec = StepSpec {
        agent: contract.agent,
        command: contract.command,
        task: None,
        cwd: None,
        timeout: None,
    };
    let _ = layout;
    Ok(Request {
        plan: Plan::single(spec),
        cwd: PathBuf::from(&contract.cwd),
        timeout_ms,
        tasks: vec![Some(task)],
        explicit_id: None,
        session,
        max_active: args.max_active,
        budget: Budget::Reuse(budget),
        slot: Slot::Transfer(source.to_owned()),
        revival: Some(Revival {
            source_run_id: source.to_owned(),
            session_file,
        }),
        env: contract.env,
        // A revival belongs to its source's session, and so to its directory.
        session_root: status
            .extra
            .get("sessionRoot")
            .and_then(serde_json::Value::as_str)
            .map(PathBuf::from),
    })
}

/// recovery.md §8.3: the revived task text.
fn revived_task(source: &str, agent: &str, session_file: &Path, follow_up: &str) -> String {
    [
        "You are reviving a previous subagent conversation.".to_owned(),
        String::new(),
        format!("Original run: {source}"),
        format!("Original agent: {agent}"),
        format!("Original session file: {}", session_file.display()),
        String::new(),
        "Use the stored session context as background. Answer the orchestrator's follow-up below. Do not assume the original child process is still alive.".to_owned(),
        String::new(),
        "Follow-up:".to_owned(),
        follow_up.to_owned(),
    ]
    .join("\n")
}
