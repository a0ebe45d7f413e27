//! The `list` output, human and JSON, over fixture runs read back by
//! `listing::list::list` (what `subagents list --all` prints).

use listing::list::{Hooks, ListOptions, list};
use listing::list_index::{self, TextOptions, list_text};
use serde_json::json;
use status::Layout;
use status::model::{ExternalProcess, RunState, RunStatus, Step, write_status};
use status::{LIFECYCLE_ARTIFACT_VERSION, PROMPT_REDACTED, index};

use super::{Artifact, Kind, PID, Scratch, T0};

const FAMILY: &str = "list";
const NOW: u64 = T0 + 90_000;

/// `list --all` at the fixed clock, without reconciling.
fn all_runs() -> ListOptions<'static> {
    ListOptions {
        all: true,
        session: None,
        limit: None,
        reconcile: false,
        now: NOW,
        hooks: Hooks::default(),
    }
}

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
    let options = all_runs();
    let runs = list(&layout, &options)?.runs;
    let human = listing::format::format_run_list(&runs, "Async runs", NOW, None);
    Ok(vec![
        scratch
            .text(FAMILY, "human", Kind::ListHuman, "stdout of `list --all`", &format!("{human}\n"))
            .note("`listing::format::format_run_list` over four fixture runs, 90 s after T0"),
        scratch
            .text(
                FAMILY,
                "json",
                Kind::ListJson,
                "stdout of `list --all --json`",
                &format!("{}\n", serde_json::to_string_pretty(&runs)?),
            )
            .note("`serde_json::to_string_pretty` of the `RunSummary` list, as the launcher prints it"),
        index_artifact()?,
    ])
}

/// Three finished runs with frozen listing facts (one with a fan-out
/// budget, one dismissed), two active ones and an unfrozen finished one,
/// and the listing index a full listing writes for them.
fn index_artifact() -> anyhow::Result<Artifact> {
    let scratch = Scratch::new()?;
    let layout = Layout::new(scratch.path());
    let claims = layout.fanout_budgets_dir().join("run-0a1b-budget/claims");
    atomic_file::ensure_private_dir(&claims)?;
    let mut runs = fixtures(&layout.runs_dir());
    let freeze = |status: &mut RunStatus, budget: bool| {
        status.cwd = Some("/work/project".into());
        status.session_id = Some("session-1".into());
        status.process_terminal = Some(json!({"state": "observed", "runId": status.run_id}));
        let mut facts = json!({"frozenAt": T0});
        if budget {
            status.run_fanout_budget = Some(json!({"used": 2, "limit": 4, "remaining": 2}));
            facts["fanoutClaimsDir"] = json!(claims);
        }
        status
            .extra
            .insert(status::model::LISTING_FACTS.into(), facts);
    };
    freeze(&mut runs[2], false);
    freeze(&mut runs[3], true);
    let mut dismissed = runs[2].clone();
    dismissed.run_id = "run-5c6d".into();
    dismissed.display_dismissed_at = Some(T0);
    let mut unfrozen = runs[2].clone();
    unfrozen.run_id = "run-6e7f".into();
    unfrozen.extra.remove(status::model::LISTING_FACTS);
    runs.extend([dismissed, unfrozen]);
    for status in &runs {
        let dir = layout.run_dir(&status.run_id);
        atomic_file::ensure_private_dir(&dir)?;
        write_status(&dir, status)?;
        if status.state.is_active() {
            index::create_marker(&dir)?;
        }
    }
    // The budgeted run's persisted descriptor, older than its freeze.
    let descriptor = layout
        .run_dir(&runs[3].run_id)
        .join("run-fanout-budget.json");
    atomic_file::write_private(&descriptor, b"{}")?;
    let at_t0 = std::time::UNIX_EPOCH + std::time::Duration::from_millis(T0);
    std::fs::File::options()
        .write(true)
        .open(&descriptor)?
        .set_modified(at_t0)?;
    let options = all_runs();
    // A listing long after the statuses were written, so every frozen run
    // has settled (a real listing takes its own clock).
    let text = TextOptions {
        home: None,
        started: std::time::SystemTime::now() + std::time::Duration::from_secs(3600),
    };
    list_text(&layout, &options, &text)?;
    let index = std::fs::read_to_string(list_index::index_path(&layout))?;
    Ok(scratch
        .text(FAMILY, "index", Kind::ListIndex, "listing-index/finished-runs-v2", &redact(&index))
        .note("the listing index after `list --all` over two frozen runs (one with a fan-out budget), a dismissed frozen run, two active runs and an unfrozen run; each row's `stamp` (device, inode, size, owner, times of its `status.json`) and `claims` (the same of its budget's claims directory), the `renderer` fingerprint and the `end` checksum vary by machine and source and are redacted"))
}

/// The index with what varies by machine and build replaced.
fn redact(index: &str) -> String {
    let mut out = String::new();
    for line in index.split_inclusive('\n') {
        let Ok(mut value) = serde_json::from_str::<serde_json::Value>(line) else {
            out.push_str(if line.starts_with("end ") {
                "end <checksum>\n"
            } else {
                line
            });
            continue;
        };
        for (key, placeholder) in [
            ("stamp", "<stamp>"),
            ("claims", "<stamp>"),
            ("renderer", "<renderer>"),
        ] {
            if let Some(field) = value.get_mut(key).filter(|f| !f.is_null()) {
                *field = json!(placeholder);
            }
        }
        out.push_str(&value.to_string());
        out.push('\n');
    }
    out
}
