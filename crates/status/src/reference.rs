//! Reconciliation of runs written by pi-subagents 0.49 (reference records).
//!
//! `subagents --root` may point at a live pi-subagents root, and a listing
//! writes its repairs into that tool's own files. So for a record without any
//! of our process identities we apply exactly the reference's rules and write
//! exactly what it would write:
//!
//! * only a `running` run with a numeric pid can be stale; `queued` and
//!   pid-less runs never are;
//! * a dead pid is stale at once; a live (or unprobeable) pid only after
//!   24 h without a status update;
//! * an existing result file `async-subagent-results/<runId>.json` decides an
//!   active run's final state (result-based repair), before any liveness;
//! * a failed repair also writes the failed result file and records its path
//!   in the `subagent.run.repaired_stale` event.
//!
//! Our own runs (they carry a runner, monitor or launcher identity) keep the
//! identity-based rules in [`crate::reconcile`].

use std::path::{Path, PathBuf};

use process_identity::{Liveness, pid_liveness};
use serde_json::{Map, Value, json};

use crate::model::{RunState, RunStatus, Step};
use crate::proof::ProcessTerminal;
use crate::reconcile::Options;
use crate::{Error, LIFECYCLE_ARTIFACT_VERSION, Result, io_err};

/// Directory of result files next to `async-subagent-runs`.
pub(crate) const RESULTS_DIR: &str = "async-subagent-results";

/// The reference's message of a result-based repair.
pub(crate) const RESULT_REPAIR_MESSAGE: &str =
    "Existing async result file was used to repair stale running status.";

/// Thinking levels a model suffix (`model:high`) or a step may name.
const THINKING_LEVELS: [&str; 7] = ["off", "minimal", "low", "medium", "high", "xhigh", "max"];

/// True for a record written by pi-subagents (none of our identities).
pub fn is_reference_record(status: &RunStatus) -> bool {
    status.runner_identity.is_none()
        && status.monitor_identity.is_none()
        && status.launcher_identity.is_none()
}

/// `<root>/async-subagent-results/<runId>.json` for a run directory
/// `<root>/async-subagent-runs/<dir>`; `None` for a directory elsewhere.
pub fn result_path(run_dir: &Path, run_id: &str) -> Option<PathBuf> {
    let runs = run_dir.parent()?;
    if runs.file_name()? != "async-subagent-runs" {
        return None;
    }
    Some(
        runs.parent()?
            .join(RESULTS_DIR)
            .join(format!("{run_id}.json")),
    )
}

/// Why a reference record is stale (docs/protocol/status.md §7.3), or `None`.
pub fn stale_message(status: &RunStatus, options: Options) -> Option<String> {
    if status.display_dismissed_at.is_some() || status.state != RunState::Running {
        return None;
    }
    let pid = status.pid?;
    if pid_liveness(pid) == Liveness::Dead {
        return Some(format!(
            "Async runner process {pid} exited or disappeared before writing a result. Marked run failed by stale-run reconciliation."
        ));
    }
    let since = status.last_update.or(status.started_at).unwrap_or(0);
    let age = options.now.saturating_sub(since);
    (age > options.stale_alive_pid_ms).then(|| format!(
        "Async runner process {pid} still has a live PID, but status has not updated for {age}ms. Marked run failed by stale-run reconciliation because PID ownership cannot be verified."
    ))
}

/// What a result file says about a finished run.
struct ResultData {
    state: RunState,
    results: Option<Vec<Map<String, Value>>>,
}

/// Reads a result file for repair: `Ok(None)` when it does not exist.
fn read_result(path: &Path) -> Result<Option<ResultData>> {
    // Safe read: a FIFO or an oversize file in the results folder is refused, not waited on.
    let text = match atomic_file::read::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(io_err("read async result file", path, e.into_io())),
    };
    let invalid = |reason: String| Error::Invalid {
        what: "async result file",
        path: path.display().to_string(),
        reason,
    };
    let value: Value = serde_json::from_str(&text).map_err(|e| invalid(e.to_string()))?;
    let truthy = |v: Option<&Value>| match v {
        Some(Value::Bool(b)) => *b,
        Some(Value::Number(n)) => n.as_f64().is_some_and(|f| f != 0.0),
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(_) | Value::Object(_)) => true,
        Some(Value::Null) | None => false,
    };
    let state_is = |s: &str| value.get("state").and_then(Value::as_str) == Some(s);
    let state = if truthy(value.get("success")) {
        RunState::Complete
    } else if state_is("stopped") {
        RunState::Stopped
    } else if state_is("paused") || value.get("exitCode").and_then(Value::as_f64) == Some(0.0) {
        RunState::Paused
    } else {
        RunState::Failed
    };
    let results = match value.get("results") {
        Some(Value::Array(entries)) => {
            let mut children = Vec::with_capacity(entries.len());
            for (i, entry) in entries.iter().enumerate() {
                let child = entry.as_object().cloned().unwrap_or_default();
                for key in ["model", "thinking"] {
                    if child.get(key).is_some_and(|v| !v.is_string()) {
                        return Err(invalid(format!("results[{i}].{key} must be a string")));
                    }
                }
                children.push(child);
            }
            Some(children)
        }
        _ => None,
    };
    Ok(Some(ResultData { state, results }))
}

/// Result-based repair (docs/protocol/status.md §7.4) of an active run whose result file
/// exists; `Ok(None)` when the run is not active or has no result file.
pub fn repair_from_result(
    status: &RunStatus,
    result: &Path,
    now: u64,
) -> Result<Option<RunStatus>> {
    if !status.state.is_active() {
        return Ok(None);
    }
    let Some(data) = read_result(result)? else {
        return Ok(None);
    };
    let mut repaired = status.clone();
    for (i, step) in repaired.steps.iter_mut().flatten().enumerate() {
        if matches!(step.status.as_str(), "running" | "pending") {
            let child = data.results.as_ref().and_then(|r| r.get(i));
            finish_step_from_child(step, data.state, child, now);
        }
    }
    let proof_pending = status
        .process_terminal
        .as_ref()
        .is_none_or(|p| p.get("state").and_then(Value::as_str) == Some("pending"));
    if status.lifecycle_artifact_version == Some(LIFECYCLE_ARTIFACT_VERSION) && proof_pending {
        let proof = ProcessTerminal::unknown(
            &status.run_id,
            "observer-unavailable",
            "observer-unavailable",
            None,
        );
        repaired.process_terminal = Some(proof.to_value());
    }
    repaired.state = data.state;
    if data.state == RunState::Stopped {
        repaired.stopped = Some(true);
    }
    repaired.extra.remove("activityState");
    repaired.last_update = Some(now);
    repaired.ended_at.get_or_insert(now);
    repaired.display_dismissed_at = None;
    Ok(Some(repaired))
}

fn finish_step_from_child(
    step: &mut Step,
    overall: RunState,
    child: Option<&Map<String, Value>>,
    now: u64,
) {
    let field = |key: &str| child.and_then(|c| c.get(key)).filter(|v| !v.is_null());
    let state = match field("success") {
        Some(Value::Bool(true)) => RunState::Complete,
        Some(Value::Bool(false)) => RunState::Failed,
        _ => overall,
    };
    step.status = state.as_str().to_owned();
    step.ended_at.get_or_insert(now);
    if let (Some(start), None) = (step.started_at, step.duration_ms) {
        step.duration_ms = Some(now.saturating_sub(start));
    }
    let ok = matches!(state, RunState::Complete | RunState::Paused);
    step.exit_code.get_or_insert(if ok { 0 } else { 1 });
    if matches!(state, RunState::Failed | RunState::Stopped) && step.error.is_none() {
        step.error = field("error").and_then(Value::as_str).map(str::to_owned);
    }
    if state == RunState::Stopped {
        step.stopped = Some(true);
    }
    if !step.extra.contains_key("sessionFile")
        && let Some(session) = field("sessionFile")
    {
        step.extra.insert("sessionFile".into(), session.clone());
    }
    let model = field("model")
        .cloned()
        .or_else(|| step.extra.get("model").cloned());
    let thinking = field("thinking")
        .cloned()
        .or_else(|| step.extra.get("thinking").cloned());
    set_or_remove(&mut step.extra, "model", model.clone());
    let effective = effective_thinking(model.as_ref(), thinking.as_ref());
    set_or_remove(&mut step.extra, "thinking", effective);
    for key in ["attemptedModels", "modelAttempts"] {
        if let Some(value) = field(key) {
            step.extra.insert(key.into(), value.clone());
        }
    }
}

fn set_or_remove(map: &mut Map<String, Value>, key: &str, value: Option<Value>) {
    match value {
        Some(v) => {
            map.insert(key.into(), v);
        }
        None => {
            map.remove(key);
        }
    }
}

/// The reference's thinking level: a known `:level` suffix of the model wins,
/// else the explicit level if it is a known one; nothing without a model.
fn effective_thinking(model: Option<&Value>, thinking: Option<&Value>) -> Option<Value> {
    let model = model?.as_str().filter(|m| !m.is_empty())?;
    if let Some((_, suffix)) = model.rsplit_once(':')
        && THINKING_LEVELS.contains(&suffix)
    {
        return Some(json!(suffix));
    }
    let level = thinking?.as_str()?;
    THINKING_LEVELS.contains(&level).then(|| json!(level))
}

/// The activity time a listing shows for a run, as the reference derives it:
/// a running run without `lastActivityAt` falls back to its output file's
/// mtime, the current step's `lastActivityAt`, then (except workflows) the
/// current step's or the run's start.
pub fn listed_last_activity(run_dir: &Path, status: &RunStatus) -> Option<u64> {
    if status.state != RunState::Running || status.last_activity_at.is_some() {
        return status.last_activity_at;
    }
    let current = status.current_step.and_then(|i| status.steps().get(i));
    let output_mtime = status.output_file.as_ref().and_then(|file| {
        let modified = std::fs::metadata(run_dir.join(file))
            .ok()?
            .modified()
            .ok()?;
        let since = modified.duration_since(std::time::UNIX_EPOCH).ok()?;
        Some(since.as_millis() as u64)
    });
    let step_activity = current.and_then(|s| s.extra.get("lastActivityAt")?.as_u64());
    let workflow = status.mode.as_deref() == Some("workflow");
    let started = (!workflow)
        .then(|| current.and_then(|s| s.started_at).or(status.started_at))
        .flatten();
    output_mtime.or(step_activity).or(started)
}

/// The failed result file (docs/protocol/status.md §7.4) for a run repaired with `message`
/// (`repaired` is the status after the repair, `original` before it).
pub fn failed_result(
    original: &RunStatus,
    repaired: &RunStatus,
    run_dir: &Path,
    message: &str,
    now: u64,
) -> Value {
    let steps = repaired.steps();
    let agent = steps
        .get(original.current_step.unwrap_or(0))
        .or(steps.first())
        .map_or("subagent", |s| s.agent.as_str());
    let results: Vec<Value> = steps.iter().map(|s| child_result(s, message)).collect();
    let mut result = Map::new();
    result.insert("id".into(), json!(original.run_id));
    result.insert("agent".into(), json!(agent));
    insert_some(
        &mut result,
        "mode",
        original.mode.as_ref().map(|m| json!(m)),
    );
    result.insert("success".into(), json!(false));
    result.insert("state".into(), json!("failed"));
    result.insert("summary".into(), json!(message));
    result.insert("results".into(), Value::Array(results));
    result.insert("exitCode".into(), json!(1));
    result.insert("timestamp".into(), json!(now));
    // The reference computes `now - startedAt`; without a start that is NaN,
    // which JSON writes as null.
    let duration = original.started_at.map(|s| json!(now.saturating_sub(s)));
    result.insert("durationMs".into(), duration.unwrap_or(Value::Null));
    result.insert("asyncDir".into(), json!(run_dir.display().to_string()));
    insert_some(
        &mut result,
        "sessionId",
        original.session_id.as_ref().map(|s| json!(s)),
    );
    insert_some(
        &mut result,
        "sessionFile",
        original.session_file.as_ref().map(|s| json!(s)),
    );
    Value::Object(result)
}

fn child_result(step: &Step, message: &str) -> Value {
    let complete = matches!(step.status.as_str(), "complete" | "completed");
    let mut child = Map::new();
    child.insert("agent".into(), json!(step.agent));
    child.insert("output".into(), json!(if complete { "" } else { message }));
    if !complete {
        let error = step.error.as_deref().unwrap_or(message);
        child.insert("error".into(), json!(error));
    }
    child.insert("success".into(), json!(complete));
    for key in ["model", "attemptedModels", "modelAttempts", "sessionFile"] {
        insert_some(&mut child, key, step.extra.get(key).cloned());
    }
    Value::Object(child)
}

fn insert_some(map: &mut Map<String, Value>, key: &str, value: Option<Value>) {
    if let Some(value) = value {
        map.insert(key.into(), value);
    }
}

/// Writes the failed result file (atomic, 0600, its directory 0700).
pub(crate) fn write_failed_result(path: &Path, result: &Value) -> Result<()> {
    if let Some(dir) = path.parent() {
        atomic_file::ensure_private_dir(dir)?;
    }
    atomic_file::write_json(path, result)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{read_status, write_status};
    use crate::reconcile::{Outcome, reconcile_run};

    const DAY: u64 = 24 * 60 * 60 * 1000;

    /// `<tmp>/async-subagent-runs/<id>` with a reference-style status.
    fn reference_run(tmp: &Path, id: &str, state: RunState, pid: Option<u32>) -> PathBuf {
        let dir = tmp.join("async-subagent-runs").join(id);
        std::fs::create_dir_all(&dir).unwrap();
        let mut status = RunStatus::new(id, state);
        status.lifecycle_artifact_version = Some(3);
        status.mode = Some("single".into());
        status.pid = pid;
        // Three distinct times, so a rule that reads the run's start for its
        // last update (or the run's start for its step's) fails a test.
        status.started_at = Some(1_000);
        status.last_update = Some(2_000);
        status.steps = Some(vec![Step {
            agent: "worker".into(),
            status: if state == RunState::Queued {
                "pending"
            } else {
                "running"
            }
            .into(),
            started_at: Some(1_500),
            ..Default::default()
        }]);
        write_status(&dir, &status).unwrap();
        dir
    }

    fn dead_pid() -> u32 {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        pid
    }

    fn unchanged(dir: &Path, now: u64) -> bool {
        let before = std::fs::read(dir.join("status.json")).unwrap();
        let outcome = reconcile_run(dir, Options::at(now)).unwrap();
        matches!(outcome, Outcome::Unchanged(_))
            && std::fs::read(dir.join("status.json")).unwrap() == before
    }

    #[test]
    fn queued_and_pid_less_reference_runs_are_never_stale() {
        let tmp = tempfile::tempdir().unwrap();
        let me = std::process::id();
        let queued_live = reference_run(tmp.path(), "q1", RunState::Queued, Some(me));
        let queued_dead = reference_run(tmp.path(), "q2", RunState::Queued, Some(dead_pid()));
        let queued_bare = reference_run(tmp.path(), "q3", RunState::Queued, None);
        let running_bare = reference_run(tmp.path(), "r1", RunState::Running, None);
        for dir in [&queued_live, &queued_dead, &queued_bare, &running_bare] {
            assert!(unchanged(dir, 10 * DAY), "{}", dir.display());
        }
        assert!(
            !tmp.path().join(RESULTS_DIR).exists(),
            "no result file written"
        );
    }

    #[test]
    fn a_live_pid_is_trusted_for_a_day_then_failed_with_a_result_file() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = reference_run(
            tmp.path(),
            "live",
            RunState::Running,
            Some(std::process::id()),
        );
        // A day after the last update, not after the start.
        assert!(unchanged(&dir, 2_000 + DAY));
        let now = 2_000 + DAY + 1;
        let Outcome::Repaired { status, message } = reconcile_run(&dir, Options::at(now)).unwrap()
        else {
            panic!("not repaired")
        };
        assert!(
            message.contains(&format!("not updated for {}ms", DAY + 1)),
            "{message}"
        );
        assert_eq!(status.state, RunState::Failed);
        assert_eq!(
            status.process_terminal.as_ref().unwrap()["reason"],
            "stale-repair"
        );
        let result_path = tmp.path().join(RESULTS_DIR).join("live.json");
        let result: Value =
            serde_json::from_str(&std::fs::read_to_string(&result_path).unwrap()).unwrap();
        assert_eq!(result["id"], "live");
        assert_eq!(result["agent"], "worker");
        assert_eq!(result["success"], false);
        assert_eq!(result["state"], "failed");
        assert_eq!(result["summary"], json!(message));
        assert_eq!(result["exitCode"], 1);
        assert_eq!(result["durationMs"], json!(now - 1_000));
        assert_eq!(result["results"][0]["error"], json!(message));
        assert_eq!(result["results"][0]["success"], false);
        assert_eq!(result["asyncDir"], json!(dir.display().to_string()));
        let event = crate::events::read_all(&dir).pop().unwrap();
        assert_eq!(
            event["resultPath"],
            json!(result_path.display().to_string())
        );
    }

    #[test]
    fn a_dead_pid_is_failed_at_once() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = reference_run(tmp.path(), "dead", RunState::Running, Some(dead_pid()));
        let outcome = reconcile_run(&dir, Options::at(2_000)).unwrap();
        assert!(matches!(outcome, Outcome::Repaired { .. }));
        assert!(tmp.path().join(RESULTS_DIR).join("dead.json").is_file());
    }

    fn with_result(tmp: &Path, id: &str, result: Value) {
        let dir = tmp.join(RESULTS_DIR);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("{id}.json")), result.to_string()).unwrap();
    }

    #[test]
    fn an_existing_result_file_decides_the_state() {
        let tmp = tempfile::tempdir().unwrap();
        let cases = [
            (
                "ok",
                json!({"success": true, "results": [{"success": true, "model": "m:high", "sessionFile": "/s"}]}),
                "complete",
                "complete",
            ),
            (
                "stop",
                json!({"success": false, "state": "stopped", "results": [{"error": "halt"}]}),
                "stopped",
                "stopped",
            ),
            (
                "pause",
                json!({"success": false, "exitCode": 0}),
                "paused",
                "paused",
            ),
            (
                "bad",
                json!({"success": false, "results": [{"success": false, "error": "boom"}]}),
                "failed",
                "failed",
            ),
        ];
        for (id, result, run_state, step_state) in cases {
            // A live pid: the result wins over any liveness verdict.
            let dir = reference_run(tmp.path(), id, RunState::Running, Some(std::process::id()));
            let before =
                std::fs::read(tmp.path().join(RESULTS_DIR).join(format!("{id}.json"))).ok();
            with_result(tmp.path(), id, result.clone());
            let Outcome::Repaired { status, message } =
                reconcile_run(&dir, Options::at(5_000)).unwrap()
            else {
                panic!("{id} not repaired")
            };
            assert_eq!(message, RESULT_REPAIR_MESSAGE);
            assert_eq!(status.state.as_str(), run_state, "{id}");
            let step = &status.steps()[0];
            assert_eq!(step.status, step_state, "{id}");
            assert_eq!(step.ended_at, Some(5_000));
            assert_eq!(step.duration_ms, Some(3_500), "from the step's start");
            let proof = status.process_terminal.as_ref().unwrap();
            assert_eq!(proof["state"], "unknown");
            assert_eq!(proof["runnerProcessInstanceId"], "observer-unavailable");
            assert_eq!(proof["reason"], "observer-unavailable");
            assert_eq!(read_status(&dir).unwrap().unwrap(), status);
            // The result file itself is left alone.
            let _ = before;
            let after: Value = serde_json::from_str(
                &std::fs::read_to_string(tmp.path().join(RESULTS_DIR).join(format!("{id}.json")))
                    .unwrap(),
            )
            .unwrap();
            assert_eq!(after, result);
        }
        let ok = read_status(&tmp.path().join("async-subagent-runs/ok"))
            .unwrap()
            .unwrap();
        assert_eq!(ok.steps()[0].exit_code, Some(0));
        assert_eq!(ok.steps()[0].extra["thinking"], "high");
        assert_eq!(ok.steps()[0].extra["sessionFile"], "/s");
        let stop = read_status(&tmp.path().join("async-subagent-runs/stop"))
            .unwrap()
            .unwrap();
        assert_eq!(stop.stopped, Some(true));
        assert_eq!(stop.steps()[0].error.as_deref(), Some("halt"));
        assert_eq!(stop.steps()[0].exit_code, Some(1));
    }

    #[test]
    fn a_malformed_result_model_names_the_field() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = reference_run(tmp.path(), "m", RunState::Running, None);
        with_result(
            tmp.path(),
            "m",
            json!({"success": true, "results": [{"model": 5}]}),
        );
        let err = reconcile_run(&dir, Options::at(5_000)).unwrap_err();
        assert!(
            err.to_string()
                .contains("results[0].model must be a string"),
            "{err}"
        );
    }
}
