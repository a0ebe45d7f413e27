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
use recovery::RecoveryDescriptor;
use recovery::seal::RootKey;
use serde_json::json;
use status::{Layout, events, now_ms};

use crate::api::{ResumeRequest, Resumed, Settings};
use crate::error::{Error, ErrorKind, Result};
use crate::prepare::{Budget, Request, Revival, Slot};
pub use crate::prepare::{STARTUP_TIMEOUT_ENV, persist, startup_timeouts_ms};
use crate::root::parse_duration;
use crate::spec::{Plan, StepSpec};

/// `subagents resume RUN --task TEXT`: verifies the source's recovery files
/// and launches the revival.
pub fn resume(layout: &Layout, args: &ResumeRequest, settings: &Settings) -> Result<Resumed> {
    // A malformed --timeout is a usage mistake (exit 2), found before any file is read.
    if let Some(text) = &args.timeout {
        crate::wait::parse_timeout(Some(text))?;
    }
    let source = crate::runs::resolve(layout, &args.run)?;
    let source_dir = layout.run_dir(&source);
    let refuse = |why: String| Error::failed(format!("failed to resume run '{source}': {why}"));
    let status =
        status::model::read_status(&source_dir)?.ok_or_else(|| crate::runs::no_status(&source))?;
    if status.state.is_active() {
        return Err(refuse(format!(
            "it is still {}; only a complete, failed or stopped run can be resumed",
            status.state
        )));
    }
    if let Some(mode) = composite_mode(&status) {
        return Err(refuse(format!(
            "it is a {mode} run, and resume continues single runs only (one step of a {mode} run cannot be resumed); start a new run for the follow-up"
        )));
    }
    let follow_up = follow_up(args, &source)?;
    let recovery = load(layout, &source_dir).map_err(&refuse)?;
    let request =
        revival_request(layout, args, &source, &status, recovery, &follow_up).map_err(&refuse)?;
    let request = Request {
        max_active: settings.max_active,
        ..request
    };
    let launched = crate::launch::launch(layout, &request)?;
    let fields = json!({"resumedAs": launched.run_id});
    let _ = events::append(
        &source_dir,
        "subagent.run.resumed",
        &source,
        now_ms(),
        fields,
    );
    Ok(Resumed {
        launched,
        source_run_id: source,
    })
}

/// `parallel` or `chain` for a composite run (out of resume's scope).
fn composite_mode(status: &status::RunStatus) -> Option<&str> {
    status
        .mode
        .as_deref()
        .filter(|m| matches!(*m, "parallel" | "chain"))
}

fn follow_up(args: &ResumeRequest, source: &str) -> Result<String> {
    if args.task.is_some() && args.task_file.is_some() {
        return Err(Error::of(
            ErrorKind::TaskTwice,
            format!(
                "failed to resume run '{source}': give the task as text or as a file, not both"
            ),
        ));
    }
    let text = match &args.task_file {
        Some(path) => std::fs::read_to_string(path).map_err(|e| Error::bad_task_file(path, e))?,
        None => args.task.clone().unwrap_or_default(),
    };
    if text.trim().is_empty() {
        return Err(Error::of(
            ErrorKind::MissingTask,
            format!("failed to resume run '{source}': a follow-up task is required"),
        ));
    }
    Ok(text)
}

/// The verified descriptor and contract of a run, with the live fan-out
/// check, the root key's seal, and the paths only the launcher knows.
pub fn load(layout: &Layout, run_dir: &Path) -> Result<recovery::Recovery, String> {
    let root = layout.fanout_budgets_dir();
    let check = crate::fanout::live_check(&root);
    let id = run_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let key = RootKey::load_or_create(layout.root()).map_err(|e| e.to_string())?;
    let recovery = recovery::load_recovery(run_dir, Some(&check), &key)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| {
            format!(
                "run '{id}' is missing its run fan-out recovery identity; start a new run instead"
            )
        })?;
    // A preset run's session file is its agent CLI's own (outside the root);
    // the seal vouches for it.
    let agent_session = crate::presets::preset_of(&recovery.contract).is_some();
    check_paths(layout, run_dir, &recovery.descriptor, agent_session)?;
    Ok(recovery)
}

/// The descriptor's paths must be where this launcher puts them: the output
/// in the run's own directory, the session file the first output of a run
/// of this root (its lineage's) unless `agent_session` (a preset run names
/// its CLI's session file), never a file elsewhere. Directories are
/// compared resolved, so another spelling of the root is not a mismatch.
fn check_paths(
    layout: &Layout,
    run_dir: &Path,
    descriptor: &RecoveryDescriptor,
    agent_session: bool,
) -> Result<(), String> {
    let file = recovery::descriptor_path(run_dir);
    let refuse = |field: &str, found: &str, expected: String| {
        format!(
            "failed to verify '{}': {field} '{found}' is not {expected}",
            file.display()
        )
    };
    let output = descriptor.output_path.as_deref().unwrap_or_default();
    if !is_first_output(Path::new(output), |dir| same_dir(dir, run_dir)) {
        let expected = format!(
            "this run's output '{}'",
            run_dir.join("output-0.log").display()
        );
        return Err(refuse("outputPath", output, expected));
    }
    let Some(session) = descriptor
        .session_file
        .as_deref()
        .filter(|_| !agent_session)
    else {
        return Ok(());
    };
    let runs = layout.runs_dir();
    let of_a_run = |dir: &Path| {
        dir.parent().is_some_and(|parent| same_dir(parent, &runs))
            && dir
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(status::layout::is_safe_run_id)
    };
    if !is_first_output(Path::new(session), of_a_run) {
        let expected = format!("the first output of a run under '{}'", runs.display());
        return Err(refuse("sessionFile", session, expected));
    }
    Ok(())
}

/// `<dir>/output-0.log` whose `dir` passes `dir_ok`.
fn is_first_output(path: &Path, dir_ok: impl Fn(&Path) -> bool) -> bool {
    path.is_absolute()
        && path.file_name().is_some_and(|n| n == "output-0.log")
        && path.parent().is_some_and(dir_ok)
}

fn same_dir(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

fn revival_request(
    layout: &Layout,
    args: &ResumeRequest,
    source: &str,
    status: &status::RunStatus,
    recovery: recovery::Recovery,
    follow_up: &str,
) -> Result<Request, String> {
    let recovery::Recovery {
        descriptor,
        contract,
    } = recovery;
    let budget: Descriptor = serde_json::to_value(&descriptor.run_fanout_budget)
        .and_then(serde_json::from_value)
        .map_err(|e| e.to_string())?;
    let timeout_ms = match &args.timeout {
        Some(text) => Some(parse_duration(text)?.as_millis() as u64).filter(|ms| *ms > 0),
        None => contract.timeout_ms,
    };
    // The contract is verified, status.json is not: the contract's session wins, and a status naming another one is refused.
    if let (Some(verified), Some(claimed)) = (&contract.session_id, &status.session_id)
        && verified != claimed
    {
        return Err(format!(
            "failed to verify '{}': sessionId '{claimed}' differs from the launch contract's '{verified}'",
            layout.run_dir(source).join("status.json").display()
        ));
    }
    let session = contract
        .session_id
        .clone()
        .or(status.session_id.clone())
        .unwrap_or_else(|| crate::admission::session_id(None));
    // A preset run continues its CLI's own session; any other command gets
    // the follow-up as given, wrapped only where its definition asked.
    let (command, session_file, task, env, preset) = match crate::presets::preset_of(&contract) {
        Some(kind) => {
            let c = crate::presets::continue_session(kind, source, status, &descriptor, &contract)?;
            (
                c.command,
                c.session_file,
                follow_up.to_owned(),
                c.env,
                Some(c.record),
            )
        }
        None => {
            let session_file = descriptor
                .session_file
                .as_deref()
                .map(PathBuf::from)
                .filter(|p| p.exists())
                .ok_or_else(|| format!("run '{source}' has no recorded session file to resume"))?;
            let task = if crate::presets::wants_revival_prompt(&contract) {
                revived_task(source, &contract.agent, &session_file, follow_up)
            } else {
                follow_up.to_owned()
            };
            (contract.command, session_file, task, contract.env, None)
        }
    };
    let spec = StepSpec {
        agent: contract.agent,
        command,
        name: None,
        command_label: None,
        task: None,
        task_file: None,
        cwd: None,
        timeout: None,
        idle_timeout: None,
    };
    Ok(Request {
        plan: Plan::single(spec),
        cwd: PathBuf::from(&contract.cwd),
        timeout_ms,
        tasks: vec![Some(task)],
        explicit_id: None,
        session,
        max_active: None,
        budget: Budget::Reuse(budget),
        slot: Slot::Transfer(source.to_owned()),
        revival: Some(Revival {
            source_run_id: source.to_owned(),
            session_file,
        }),
        env,
        preset,
        // A revival belongs to its source's session, and so to its directory.
        session_root: status
            .extra
            .get("sessionRoot")
            .and_then(serde_json::Value::as_str)
            .map(PathBuf::from),
        // A revival keeps its source's name.
        name: status
            .extra
            .get(listing::format::NAME_KEY)
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned),
        // A revival runs here: its session file is on this machine.
        executor: crate::executor::Executor::Local,
    })
}

/// The revived task text (docs/protocol/recovery.md §9).
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

#[cfg(test)]
mod tests {
    use super::*;

    fn descriptor(output: &Path, session: &Path) -> RecoveryDescriptor {
        serde_json::from_value(json!({
            "version": 1,
            "runFanoutBudget": {"version": 1, "rootRunId": "r1", "directory": "/b/r1", "limit": 64},
            "sourceRunId": "r1", "agent": "a", "cwd": "/",
            "systemPromptMode": "append", "inheritProjectContext": false, "inheritSkills": false,
            "outputMode": "inline", "maxSubagentDepth": 2, "share": false,
            "outputPath": output, "sessionFile": session,
        }))
        .unwrap()
    }

    #[test]
    fn paths_outside_the_run_or_the_root_are_refused_by_name() {
        let root = tempfile::tempdir().unwrap();
        let layout = Layout::new(root.path());
        let run = layout.run_dir("r1");
        let lineage = layout.run_dir("r0").join("output-0.log");
        let output = run.join("output-0.log");
        assert!(check_paths(&layout, &run, &descriptor(&output, &lineage), false).is_ok());
        assert!(check_paths(&layout, &run, &descriptor(&output, &output), false).is_ok());
        let err = check_paths(
            &layout,
            &run,
            &descriptor(&output, Path::new("/etc/passwd")),
            false,
        )
        .unwrap_err();
        assert!(
            err.contains("recovery-descriptor.json") && err.contains("sessionFile '/etc/passwd'"),
            "{err}"
        );
        let elsewhere = layout.run_dir("r0").join("output-0.log");
        let err = check_paths(&layout, &run, &descriptor(&elsewhere, &lineage), false).unwrap_err();
        assert!(err.contains("outputPath"), "{err}");
        let nested = run.join("x").join("output-0.log");
        let err = check_paths(&layout, &run, &descriptor(&output, &nested), false).unwrap_err();
        assert!(err.contains("sessionFile"), "{err}");
    }
}
