//! The `list` output, human and JSON, over fixture runs read back by
//! `status::list::list` (what `subagents list --all` prints).

use serde_json::json;
use status::Layout;
use status::list::{Hooks, ListOptions, list};
use status::model::{ExternalProcess, RunState, RunStatus, Step, write_status};
use status::{LIFECYCLE_ARTIFACT_VERSION, PROMPT_REDACTED, index};

use super::{Artifact, Kind, PID, Scratch, T0};

const FAMILY: &str = "list";
const NOW: u64 = T0 + 90_000;

fn step(agent: &str, status: &str) -> Step {
    Step {
        agent: agent.into(),
        status: status.into(),
        description: Some(PROMPT_REDACTED.into()),
        ..Step::default()
    }
}

fn fixtures(runs: &std::path::Path) -> Vec<RunStatus> {
    let mut running = RunStatus::new("run-7f3a", RunState::Running);
    running.lifecycle_artifact_version = Some(LIFECYCLE_ARTIFACT_VERSION);
    running.session_id = Some("session-1".into());
    running.mode = Some("parallel".into());
    running.pid = Some(PID);
    running.cwd = Some("/work/project".into());
    running.started_at = Some(T0);
    running.last_update = Some(T0 + 60_000);
    running.last_activity_at = Some(T0 + 58_000);
    running.run_fanout_budget = Some(json!({"used": 2, "limit": 64, "remaining": 62}));
    running.output_file = Some("output-0.log".into());
    running.session_file = Some("/work/sessions/session-1.jsonl".into());
    let mut scout = step("scout", "running");
    scout.started_at = Some(T0);
    scout
        .extra
        .insert("model".into(), json!("anthropic/claude-sonnet:high"));
    scout
        .extra
        .insert("lastActivityAt".into(), json!(T0 + 58_000));
    scout.extra.insert("currentTool".into(), json!("read"));
    scout.extra.insert("turnCount".into(), json!(3));
    scout.external_process = Some(ExternalProcess {
        pid: Some(PID + 1),
        started_at: T0,
        stdout_path: runs.join("run-7f3a/output-0.log").display().to_string(),
        stderr_path: runs
            .join("run-7f3a/step-0.stderr.log")
            .display()
            .to_string(),
        ..ExternalProcess::default()
    });
    let mut reviewer = step("reviewer", "complete");
    reviewer.duration_ms = Some(42_000);
    reviewer.exit_code = Some(0);
    reviewer.extra.insert(
        "tokens".into(),
        json!({"input": 1200, "output": 300, "total": 1500}),
    );
    running.steps = Some(vec![scout, reviewer]);

    let mut queued = RunStatus::new("run-8b2c", RunState::Queued);
    queued.mode = Some("single".into());
    queued.last_update = Some(T0 + 80_000);
    queued.steps = Some(vec![step("worker", "pending")]);

    let mut failed = RunStatus::new("run-9d4e", RunState::Failed);
    failed.mode = Some("chain".into());
    failed.started_at = Some(T0 - 600_000);
    failed.ended_at = Some(T0 - 540_000);
    failed.last_update = Some(T0 - 540_000);
    failed.error = Some("Step failed: worker".into());
    let mut worker = step("worker", "failed");
    worker.duration_ms = Some(60_000);
    worker.exit_code = Some(3);
    failed.steps = Some(vec![worker]);

    let mut complete = RunStatus::new("run-0a1b", RunState::Complete);
    complete.mode = Some("single".into());
    complete.last_update = Some(T0 - 900_000);
    complete.steps = Some(vec![step("scout", "complete")]);
    vec![running, queued, failed, complete]
}

/// `list --all` as text and as JSON.
pub(super) fn artifacts() -> anyhow::Result<Vec<Artifact>> {
    let scratch = Scratch::new()?;
    let layout = Layout::new(scratch.path());
    for status in fixtures(&layout.runs_dir()) {
        let dir = layout.run_dir(&status.run_id);
        atomic_file::ensure_private_dir(&dir)?;
        write_status(&dir, &status)?;
        if status.state.is_active() {
            index::create_marker(&dir)?;
        }
    }
    let options = ListOptions {
        all: true,
        session: None,
        limit: None,
        reconcile: false,
        now: NOW,
        hooks: Hooks::default(),
    };
    let runs = list(&layout, &options)?.runs;
    let human = status::format::format_run_list(&runs, "Async runs", NOW, None);
    Ok(vec![
        scratch
            .text(FAMILY, "human", Kind::ListHuman, "stdout of `list --all`", &format!("{human}\n"))
            .note("`status::format::format_run_list` over four fixture runs, 90 s after T0"),
        scratch
            .text(
                FAMILY,
                "json",
                Kind::ListJson,
                "stdout of `list --all --json`",
                &format!("{}\n", serde_json::to_string_pretty(&runs)?),
            )
            .note("`serde_json::to_string_pretty` of the `RunSummary` list, as the launcher prints it"),
    ])
}
