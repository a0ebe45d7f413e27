//! The compact view of a run summary: what an agent acts on (which run,
//! its state and step, its timings, how it ended and why, where its output
//! is), without the process identities, proofs and budget records that make
//! a full summary a few kilobytes. The MCP tools return it unless asked for
//! `detail: "full"`.
//!
//! Every field has the name and the type it has in the full summary (or a
//! name the full summary does not use), so a full summary satisfies the
//! compact schema too: one output schema describes both.

use std::path::PathBuf;

use listing::list::RunSummary;
use schemars::JsonSchema;
use serde::Serialize;
use serde_json::{Map, Value};
use status::model::Step;

/// A run, compact: identity, state, step, timings, outcome, output paths.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunBrief {
    /// Run id.
    pub id: String,
    /// Run directory.
    pub async_dir: PathBuf,
    /// What `list` shows: the run's name, else its agent or command.
    pub label: String,
    /// The name given at launch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `queued`, `running`, `complete`, `failed`, `stopped`, `paused`, ...
    pub state: String,
    /// `single`, `parallel`, `chain` or `workflow`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// Owning session.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// The step running now, counted from 0 (as in `status.json`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current_step: Option<usize>,
    /// Steps of a chain.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chain_step_count: Option<usize>,
    /// Runner start (ms since the epoch).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at: Option<u64>,
    /// End (ms since the epoch).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<u64>,
    /// Last write of the status (ms since the epoch).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_update: Option<u64>,
    /// The run's deadline (ms after its start).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Its timeout ended the run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timed_out: Option<bool>,
    /// A stop ended the run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped: Option<bool>,
    /// Why it was stopped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<String>,
    /// Why it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The failure in the agent's own words (see `reason` of the steps).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The run's final answer, up to the documented cap.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer: Option<String>,
    /// The file that holds the whole answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer_path: Option<String>,
    /// The answer was cut at the cap (the whole is in `answerPath`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer_truncated: Option<bool>,
    /// The answer's first characters (`list`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer_preview: Option<String>,
    /// The agent CLI's session id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_session_id: Option<String>,
    /// The run's output file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_file: Option<String>,
    /// The run this one revives (`resume`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resumed_from: Option<String>,
    /// One entry per step.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<StepBrief>,
}

/// A step, compact.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StepBrief {
    /// The step's agent (or argv\[0\] of its command).
    pub agent: String,
    /// The step's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `pending`, `running`, `complete`, `failed`, `stopped`, `skipped`, ...
    pub status: String,
    /// Start (ms since the epoch).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at: Option<u64>,
    /// End (ms since the epoch).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<u64>,
    /// Duration (ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// The command's exit code.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i64>,
    /// The signal that ended the command (e.g. `SIGTERM`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    /// Why the step failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// A timeout ended the step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timed_out: Option<bool>,
    /// A stop ended the step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped: Option<bool>,
    /// The failure in the agent's own words (its CLI's error, else the
    /// command's last stderr line, else the exit code or signal).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The step's final answer, up to the documented cap.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer: Option<String>,
    /// The file that holds the whole answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer_path: Option<String>,
    /// The answer was cut at the cap (the whole is in `answerPath`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer_truncated: Option<bool>,
    /// The agent CLI's session id, recorded as soon as the CLI printed it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_session_id: Option<String>,
    /// The last time the step wrote output (ms since the epoch).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_output_at: Option<u64>,
    /// The agent's latest activity (escaped, bounded).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_activity: Option<String>,
    /// The step's output file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_file: Option<String>,
    /// The command's stdout log.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stdout_path: Option<String>,
    /// The command's stderr log.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stderr_path: Option<String>,
}

impl RunBrief {
    /// The compact view of `run`.
    pub fn of(run: &RunSummary) -> Self {
        let s = &run.status;
        Self {
            id: run.id.clone(),
            async_dir: run.async_dir.clone(),
            label: listing::format::run_label(s),
            name: text(&s.extra, "name"),
            state: s.state.to_string(),
            mode: s.mode.clone(),
            session_id: s.session_id.clone(),
            current_step: s.current_step,
            chain_step_count: s.chain_step_count,
            started_at: s.started_at,
            ended_at: s.ended_at,
            last_update: s.last_update,
            timeout_ms: s.timeout_ms,
            timed_out: s.timed_out,
            stopped: s.stopped,
            stop_reason: s.stop_reason.clone(),
            error: s.error.clone(),
            reason: text(&s.extra, "reason"),
            answer: text(&s.extra, "answer"),
            answer_path: text(&s.extra, "answerPath"),
            answer_truncated: flag(&s.extra, "answerTruncated"),
            answer_preview: text(&s.extra, "answerPreview"),
            agent_session_id: text(&s.extra, "agentSessionId"),
            output_file: s.output_file.clone(),
            resumed_from: text(&s.extra, "resumedFrom"),
            steps: s.steps().iter().map(StepBrief::of).collect(),
        }
    }
}

impl StepBrief {
    /// The compact view of `step`.
    pub fn of(step: &Step) -> Self {
        let process = step.external_process.as_ref();
        Self {
            agent: step.agent.clone(),
            name: text(&step.extra, "name"),
            status: step.status.clone(),
            started_at: step.started_at,
            ended_at: step.ended_at,
            duration_ms: step.duration_ms,
            exit_code: step.exit_code,
            signal: process.and_then(|p| p.process_signal.clone()),
            error: step.error.clone(),
            timed_out: step.timed_out,
            stopped: step.stopped,
            reason: text(&step.extra, "reason"),
            answer: text(&step.extra, "answer"),
            answer_path: text(&step.extra, "answerPath"),
            answer_truncated: flag(&step.extra, "answerTruncated"),
            agent_session_id: text(&step.extra, "agentSessionId"),
            last_output_at: step.extra.get("lastOutputAt").and_then(Value::as_u64),
            last_activity: text(&step.extra, "lastActivity"),
            output_file: text(&step.extra, "outputFile"),
            stdout_path: process.map(|p| p.stdout_path.clone()),
            stderr_path: process.map(|p| p.stderr_path.clone()),
        }
    }
}

fn flag(map: &Map<String, Value>, key: &str) -> Option<bool> {
    map.get(key).and_then(Value::as_bool)
}

fn text(map: &Map<String, Value>, key: &str) -> Option<String> {
    map.get(key).and_then(Value::as_str).map(str::to_owned)
}
