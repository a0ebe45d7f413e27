//! Every change the launcher's processes make to `status.json`, as pure
//! functions of the current status and injected facts (time, identities).
//!
//! The runner, the launcher and `cargo xtask snapshots` call the same
//! functions, so a snapshot records exactly what a real run writes.

use process_identity::ProcessIdentity;
use serde_json::{Value, json};
use status::model::ExternalProcess;
use status::proof::{ProcessTerminal, ProofState};
use status::{LIFECYCLE_ARTIFACT_VERSION, PROMPT_REDACTED, RunState, RunStatus, Step};

use crate::config::LaunchConfig;

/// `output-<i>.log` of a run.
pub fn output_path(config: &LaunchConfig, step: usize) -> std::path::PathBuf {
    config.run_dir.join(format!("output-{step}.log"))
}

/// `external-<i>.<stream>.log` of a run.
pub fn log_path(config: &LaunchConfig, step: usize, stream: &str) -> std::path::PathBuf {
    config.run_dir.join(format!("external-{step}.{stream}.log"))
}

/// The record the launcher writes before any process exists.
pub fn queued(
    config: &LaunchConfig,
    fanout: Option<Value>,
    launcher: Option<ProcessIdentity>,
    now: u64,
) -> RunStatus {
    let mut queued = RunStatus::new(&config.run_id, RunState::Queued);
    queued.session_id = config.session_id.clone();
    queued.mode = Some(config.mode.clone());
    queued.last_update = Some(now);
    queued.cwd = config.steps.first().map(|s| s.cwd.display().to_string());
    queued.timeout_ms = config.timeout_ms;
    queued.chain_step_count = Some(config.chain_step_count());
    queued.launcher_identity = launcher;
    queued.runner_process_instance_id = Some(config.runner_process_instance_id.clone());
    queued.run_fanout_budget = fanout;
    if let Some(revival) = &config.revival {
        queued
            .extra
            .insert("resumedFrom".into(), json!(revival.source_run_id));
    }
    if let Some(root) = &config.session_root {
        queued.extra.insert("sessionRoot".into(), json!(root));
    }
    let steps = config.steps.iter().map(|s| Step {
        agent: s.agent.clone(),
        status: "pending".into(),
        description: s.task_file.as_ref().map(|_| PROMPT_REDACTED.to_owned()),
        ..Step::default()
    });
    queued.steps = Some(steps.collect());
    queued
}

/// The runner's first write.
pub fn running(
    current: Option<RunStatus>,
    config: &LaunchConfig,
    runner: &ProcessIdentity,
    monitor: Option<ProcessIdentity>,
    now: u64,
) -> RunStatus {
    let mut s = current.unwrap_or_else(|| RunStatus::new(&config.run_id, RunState::Running));
    s.lifecycle_artifact_version = Some(LIFECYCLE_ARTIFACT_VERSION);
    s.state = RunState::Running;
    s.mode = Some(config.mode.clone());
    s.pid = Some(runner.pid);
    s.runner_identity = Some(runner.clone());
    s.runner_process_instance_id = Some(config.runner_process_instance_id.clone());
    // The monitor registers itself before spawning us; our parent is only a
    // fallback (it may already be a reaper, not the monitor).
    s.monitor_identity = s.monitor_identity.take().or(monitor);
    s.started_at = Some(now);
    s.last_update = Some(now);
    s.last_activity_at = Some(now);
    s.current_step = Some(0);
    s.chain_step_count = Some(config.chain_step_count());
    s.deadline_at = config.timeout_ms.map(|t| now + t);
    s.output_file = Some(output_path(config, 0).display().to_string());
    s.extra
        .insert("parallelGroups".into(), json!(parallel_groups(config)));
    let pending = ProcessTerminal::new(
        ProofState::Pending,
        &config.run_id,
        &config.runner_process_instance_id,
    );
    s.process_terminal = Some(pending.to_value());
    s
}

/// `parallelGroups`: one `{start, count, stepIndex}` per parallel group.
pub fn parallel_groups(config: &LaunchConfig) -> Vec<Value> {
    let groups = config.groups.iter().enumerate().filter(|(_, g)| g.parallel);
    groups
        .map(|(i, g)| json!({"start": g.start, "count": g.count, "stepIndex": i}))
        .collect()
}

/// Step `i`'s COMMAND was spawned as `pid`.
pub fn step_started(
    mut s: RunStatus,
    config: &LaunchConfig,
    i: usize,
    pid: u32,
    identity: Option<ProcessIdentity>,
    now: u64,
) -> RunStatus {
    s.last_update = Some(now);
    s.last_activity_at = Some(now);
    s.current_step = Some(i);
    s.output_file = Some(output_path(config, i).display().to_string());
    if let Some(step) = s.steps.get_or_insert_with(Vec::new).get_mut(i) {
        step.status = "running".into();
        step.started_at = Some(now);
        step.external_process = Some(ExternalProcess {
            pid: Some(pid),
            identity,
            started_at: now,
            stdout_path: log_path(config, i, "stdout").display().to_string(),
            stderr_path: log_path(config, i, "stderr").display().to_string(),
            ..ExternalProcess::default()
        });
        if let Some(ms) = config.steps.get(i).and_then(|c| c.idle_timeout_ms) {
            step.extra.insert(IDLE_TIMEOUT_KEY.into(), json!(ms));
        }
    }
    s
}

/// The step key of the last time the runner saw the step's COMMAND write
/// output (ms since the epoch; our extension, the reference ignores it).
pub const LAST_OUTPUT_KEY: &str = "lastOutputAt";

/// The step key of the step's idle limit in ms (our extension).
pub const IDLE_TIMEOUT_KEY: &str = "idleTimeoutMs";

/// `s` with the output times the runner saw, `(step, ms)`.
pub fn output_seen(mut s: RunStatus, seen: &[(usize, u64)], now: u64) -> RunStatus {
    s.last_update = Some(now);
    let steps = s.steps.get_or_insert_with(Vec::new);
    for (i, at) in seen {
        if let Some(step) = steps.get_mut(*i) {
            step.extra.insert(LAST_OUTPUT_KEY.into(), json!(at));
        }
    }
    s
}

/// Why a step was ended for printing nothing for `ms`: the text of its
/// `error` (and of any reason field shown for it).
pub fn idle_reason(ms: u64) -> String {
    format!("no output for {}", spell_duration(ms))
}

/// `ms` in the units a duration is written with, largest first (`90000` is
/// `1m30s`); not a whole second: in ms.
pub fn spell_duration(ms: u64) -> String {
    if !ms.is_multiple_of(1000) || ms == 0 {
        return format!("{ms}ms");
    }
    let mut left = ms / 1000;
    let mut text = String::new();
    for (unit, secs) in [("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)] {
        if left >= secs {
            text.push_str(&format!("{}{unit}", left / secs));
            left %= secs;
        }
    }
    text
}

/// Where a step's answer is kept.
#[derive(Debug, Clone, PartialEq)]
pub struct AnswerRef {
    /// `answer.md` (`answer-<i>.md`) of a preset, `output-<i>.log` of a command.
    pub path: std::path::PathBuf,
    /// The answer's length in bytes.
    pub bytes: u64,
}

impl AnswerRef {
    /// The reference of `answer`, kept at `path`.
    pub fn of(path: std::path::PathBuf, answer: &str) -> Self {
        Self {
            path,
            bytes: answer.len() as u64,
        }
    }

    /// The reference of the file at `path`.
    pub fn of_file(path: std::path::PathBuf) -> Option<Self> {
        let bytes = std::fs::metadata(&path).ok()?.len();
        Some(Self { path, bytes })
    }
}

/// How one step ended.
#[derive(Debug, Clone, PartialEq)]
pub struct StepEnd {
    /// `complete`, `failed`, `stopped` or `pending`.
    pub status: &'static str,
    /// The step error.
    pub error: Option<String>,
    /// The step exit code (0 complete, the child's, else 1).
    pub exit_code: i64,
    /// When it started, if it did.
    pub started_at: Option<u64>,
    /// When its end was observed.
    pub closed_at: u64,
    /// A timeout ended it.
    pub timed_out: bool,
    /// The child's exit code and signal name, if it ran.
    pub process: Option<(Option<i32>, Option<String>)>,
    /// Why a step that did not complete ended, in the agent's own words
    /// when it gave any (`steps[i].reason`, our extension).
    pub reason: Option<String>,
    /// The answer of a step that completed with one (`steps[i].answerPath`,
    /// `answerPreview`, `answerBytes`, our extension).
    pub answer: Option<AnswerRef>,
}

/// Step `i` ended.
pub fn step_ended(
    mut s: RunStatus,
    config: &LaunchConfig,
    i: usize,
    end: &StepEnd,
    now: u64,
) -> RunStatus {
    s.last_update = Some(now);
    if end.started_at.is_some() && end.process.is_none() && end.status == "failed" {
        // Its COMMAND could not be started, so `step_started` never ran: the
        // run's current step is still this one, not the one before it.
        s.current_step = Some(i);
    }
    if let Some(step) = s.steps.get_or_insert_with(Vec::new).get_mut(i) {
        step.status = end.status.into();
        step.ended_at = Some(end.closed_at);
        step.duration_ms = end.started_at.map(|t| end.closed_at.saturating_sub(t));
        step.exit_code = Some(end.exit_code);
        step.error = end.error.clone();
        step.timed_out = end.timed_out.then_some(true);
        step.stopped = (end.status == "stopped").then_some(true);
        step.extra
            .insert("outputFile".into(), json!(output_path(config, i)));
        match &end.reason {
            Some(reason) => step.extra.insert("reason".into(), json!(reason)),
            None => step.extra.remove("reason"),
        };
        // No preview of the answer here: it may quote the task, which
        // stays out of the status (listings read the answer file's start).
        for key in ["answerPath", "answerBytes"] {
            step.extra.remove(key);
        }
        if let Some(answer) = &end.answer {
            step.extra.insert("answerPath".into(), json!(answer.path));
            step.extra.insert("answerBytes".into(), json!(answer.bytes));
        }
        if let (Some(process), Some((code, signal))) =
            (step.external_process.as_mut(), &end.process)
        {
            process.ended_at = Some(end.closed_at);
            process.duration_ms = Some(end.closed_at.saturating_sub(process.started_at));
            process.exit_code = *code;
            process.process_signal = signal.clone();
        }
    }
    s
}

/// What the runner saw of a running step's output (`steps[i]`'s
/// `lastOutputAt`, `lastActivity`, `agentSessionId`, `sessionFile`; our
/// extension). `None` leaves a field as it is.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepLive {
    /// When its stdout or stderr last grew (ms).
    pub last_output_at: Option<u64>,
    /// The first line of its latest assistant message or tool use.
    pub activity: Option<String>,
    /// The agent CLI's session id, once printed.
    pub session_id: Option<String>,
    /// The CLI's session file, once written.
    pub session_file: Option<String>,
}

/// Step `i` is running and its output said `live`. The session goes on
/// the run too, where `resume` and listings read it.
pub fn step_live(mut s: RunStatus, i: usize, live: &StepLive, now: u64) -> RunStatus {
    s.last_update = Some(now);
    if let Some(at) = live.last_output_at {
        s.last_activity_at = Some(at.max(s.last_activity_at.unwrap_or(0)));
    }
    if let Some(id) = &live.session_id {
        s.extra.insert("agentSessionId".into(), json!(id));
    }
    if let Some(file) = &live.session_file {
        s.session_file = Some(file.clone());
    }
    if let Some(step) = s.steps.as_mut().and_then(|steps| steps.get_mut(i)) {
        let fields = [
            ("lastOutputAt", live.last_output_at.map(|t| json!(t))),
            ("lastActivity", live.activity.as_ref().map(|a| json!(a))),
            ("agentSessionId", live.session_id.as_ref().map(|v| json!(v))),
            ("sessionFile", live.session_file.as_ref().map(|v| json!(v))),
        ];
        for (key, value) in fields {
            if let Some(value) = value {
                step.extra.insert(key.into(), value);
            }
        }
    }
    s
}

/// The runner's final write. `stopped` means a stop request ended the run:
/// its error is the recorded stop reason.
pub fn finished(
    mut s: RunStatus,
    state: RunState,
    error: Option<String>,
    timed_out: bool,
    stopped: bool,
    now: u64,
) -> RunStatus {
    s.state = state;
    s.error = error;
    s.ended_at = Some(now);
    s.last_update = Some(now);
    s.timed_out = timed_out.then_some(true);
    s.stopped = (state == RunState::Stopped).then_some(true);

    if stopped {
        s.error = Some(
            s.stop_reason
                .clone()
                .unwrap_or_else(|| "Subagent stopped by user.".to_owned()),
        );
    }
    // The run's answer (our extension) is its last step's: a single run's
    // or a chain's; a parallel run's answers stay on its steps.
    let last = s
        .steps()
        .last()
        .filter(|_| s.mode.as_deref() != Some("parallel"));
    let answer: Vec<(&str, Value)> = ["answerPath", "answerBytes"]
        .iter()
        .filter_map(|k| Some((*k, last?.extra.get(*k)?.clone())))
        .collect();
    for key in ["answerPath", "answerBytes"] {
        s.extra.remove(key);
    }
    if state == RunState::Complete {
        for (key, value) in answer {
            s.extra.insert(key.into(), value);
        }
    }
    // The run's reason (our extension) is its error: the failing step's
    // reason, the stop reason or the timeout.
    match s.error.clone().filter(|_| state != RunState::Complete) {
        Some(reason) => s.extra.insert("reason".into(), json!(reason)),
        None => s.extra.remove("reason"),
    };
    s
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::tests::launch_config;

    fn identity(pid: u32) -> ProcessIdentity {
        ProcessIdentity {
            pid,
            start_time: 7,
            boot_id: None,
            machine_id: None,
            host: None,
        }
    }

    #[test]
    fn an_idle_reason_spells_the_limit_as_a_duration_is_written() {
        assert_eq!(idle_reason(2_000), "no output for 2s");
        assert_eq!(idle_reason(90_000), "no output for 1m30s");
        assert_eq!(idle_reason(3_600_000), "no output for 1h");
        assert_eq!(idle_reason(90_061_000), "no output for 1d1h1m1s");
        assert_eq!(idle_reason(1_500), "no output for 1500ms");
        assert_eq!(spell_duration(0), "0ms");
    }

    #[test]
    fn output_seen_marks_only_the_steps_it_names() {
        let config = launch_config(Path::new("/runs/r"));
        let s = queued(&config, None, None, 5);
        let s = output_seen(s, &[(1, 70), (9, 80)], 90);
        let seen: Vec<_> = s
            .steps()
            .iter()
            .map(|st| st.extra.get(LAST_OUTPUT_KEY).cloned())
            .collect();
        assert_eq!(seen, [None, Some(json!(70)), None, None]);
        assert_eq!(s.last_update, Some(90));
    }

    #[test]
    fn a_step_with_an_idle_limit_records_it_when_it_starts() {
        let mut config = launch_config(Path::new("/runs/r"));
        config.steps[2].idle_timeout_ms = Some(4_000);
        let s = queued(&config, None, None, 5);
        let s = step_started(s, &config, 2, 77, None, 6);
        let s = step_started(s, &config, 1, 78, None, 7);
        assert_eq!(
            s.steps()[2].extra.get(IDLE_TIMEOUT_KEY),
            Some(&json!(4_000))
        );
        assert_eq!(s.steps()[1].extra.get(IDLE_TIMEOUT_KEY), None);
    }

    #[test]
    fn a_run_is_queued_with_every_step_pending_and_no_task_text() {
        let mut config = launch_config(Path::new("/runs/r"));
        config.steps[1].task_file = Some("/runs/r/task-1.md".into());
        let s = queued(&config, None, Some(identity(40)), 5);
        assert_eq!(s.state, RunState::Queued);
        assert_eq!(s.launcher_identity, Some(identity(40)));
        assert_eq!(s.chain_step_count, Some(3));
        let steps: Vec<_> = s
            .steps()
            .iter()
            .map(|st| {
                (
                    st.agent.as_str(),
                    st.status.as_str(),
                    st.description.clone(),
                )
            })
            .collect();
        assert_eq!(
            steps,
            [
                ("a", "pending", None),
                ("b", "pending", Some(PROMPT_REDACTED.to_owned())),
                ("c", "pending", None),
                ("d", "pending", None),
            ]
        );
    }

    #[test]
    fn running_records_the_runner_the_deadline_and_the_parallel_groups() {
        let mut config = launch_config(Path::new("/runs/r"));
        config.timeout_ms = Some(3);
        let s = running(None, &config, &identity(50), Some(identity(49)), 10);
        assert_eq!(s.pid, Some(50));
        assert_eq!(s.monitor_identity, Some(identity(49)));
        assert_eq!(s.deadline_at, Some(13));
        assert_eq!(
            s.extra["parallelGroups"],
            json!([{"start": 1, "count": 2, "stepIndex": 1}])
        );
        assert_eq!(s.output_file.as_deref(), Some("/runs/r/output-0.log"));
    }

    #[test]
    fn a_started_step_records_its_process() {
        let config = launch_config(Path::new("/runs/r"));
        let s = queued(&config, None, None, 1);
        let s = step_started(s, &config, 2, 60, Some(identity(60)), 20);
        assert_eq!(s.current_step, Some(2));
        assert_eq!(s.output_file.as_deref(), Some("/runs/r/output-2.log"));
        let step = &s.steps()[2];
        assert_eq!(step.status, "running");
        assert_eq!(
            step.external_process,
            Some(ExternalProcess {
                pid: Some(60),
                identity: Some(identity(60)),
                started_at: 20,
                stdout_path: "/runs/r/external-2.stdout.log".into(),
                stderr_path: "/runs/r/external-2.stderr.log".into(),
                ..ExternalProcess::default()
            })
        );
    }

    fn end(status: &'static str, process: Option<(Option<i32>, Option<String>)>) -> StepEnd {
        StepEnd {
            status,
            error: None,
            exit_code: 1,
            started_at: Some(20),
            closed_at: 25,
            timed_out: false,
            process,
            reason: None,
            answer: None,
        }
    }

    #[test]
    fn only_a_step_that_could_not_start_becomes_the_current_one_at_its_end() {
        let config = launch_config(Path::new("/runs/r"));
        let base = || {
            let s = queued(&config, None, None, 1);
            step_started(s, &config, 0, 60, None, 20)
        };
        // Step 3's command could not start: it is the current step now.
        let s = step_ended(base(), &config, 3, &end("failed", None), 30);
        assert_eq!(s.current_step, Some(3));
        // Any other end leaves the current step alone.
        for other in [
            end("failed", Some((Some(1), None))),
            end("stopped", None),
            StepEnd {
                started_at: None,
                ..end("failed", None)
            },
        ] {
            let s = step_ended(base(), &config, 3, &other, 30);
            assert_eq!(s.current_step, Some(0), "{other:?}");
        }
    }

    #[test]
    fn a_step_records_its_reason_answer_and_live_output_and_the_run_its_reason() {
        let config = launch_config(Path::new("/runs/r"));
        let s = step_started(queued(&config, None, None, 1), &config, 0, 60, None, 20);
        let live = StepLive {
            last_output_at: Some(22),
            activity: Some("tool Bash: ls".into()),
            session_id: Some("s-1".into()),
            session_file: None,
        };
        let s = step_live(s, 0, &live, 23);
        let step = &s.steps()[0];
        assert_eq!(step.extra["lastOutputAt"], 22);
        assert_eq!(step.extra["lastActivity"], "tool Bash: ls");
        assert_eq!(step.extra["agentSessionId"], "s-1");
        assert!(!step.extra.contains_key("sessionFile"));
        assert_eq!(s.extra["agentSessionId"], "s-1");
        assert_eq!((s.last_activity_at, s.last_update), (Some(22), Some(23)));

        let failed = StepEnd {
            reason: Some("Not logged in".into()),
            ..end("failed", Some((Some(1), None)))
        };
        let s = step_ended(s, &config, 0, &failed, 30);
        assert_eq!(s.steps()[0].extra["reason"], "Not logged in");
        assert!(!s.steps()[0].extra.contains_key("answerPath"));
        let done = StepEnd {
            answer: Some(AnswerRef::of("/runs/r/answer-1.md".into(), "the answer")),
            ..end("complete", Some((Some(0), None)))
        };
        let s = step_ended(s, &config, 1, &done, 31);
        let step = &s.steps()[1];
        assert_eq!(step.extra["answerPath"], "/runs/r/answer-1.md");
        assert!(
            !step.extra.contains_key("answerPreview"),
            "the answer may quote the task"
        );
        assert_eq!(step.extra["answerBytes"], 10);
        assert!(!step.extra.contains_key("reason"));
        let over = finished(
            s.clone(),
            RunState::Failed,
            Some("a: Not logged in".into()),
            false,
            false,
            40,
        );
        assert_eq!(over.extra["reason"], "a: Not logged in");
        let over = finished(over, RunState::Complete, None, false, false, 41);
        assert!(!over.extra.contains_key("reason"));
    }

    #[test]
    fn a_step_end_records_how_it_ended() {
        let config = launch_config(Path::new("/runs/r"));
        let s = step_started(queued(&config, None, None, 1), &config, 0, 60, None, 20);
        let stopped = end("stopped", Some((None, Some("SIGTERM".into()))));
        let s = step_ended(s, &config, 0, &stopped, 30);
        let step = &s.steps()[0];
        assert_eq!(step.stopped, Some(true));
        let process = step.external_process.as_ref().unwrap();
        assert_eq!(process.process_signal.as_deref(), Some("SIGTERM"));
        assert_eq!(process.ended_at, Some(25));
        let s = step_ended(s, &config, 1, &end("failed", Some((Some(2), None))), 30);
        assert_eq!(s.steps()[1].stopped, None);
    }

    #[test]
    fn only_a_stopped_run_is_flagged_stopped() {
        let config = launch_config(Path::new("/runs/r"));
        let base = || running(None, &config, &identity(50), None, 10);
        let s = finished(base(), RunState::Stopped, None, false, true, 40);
        assert_eq!(s.stopped, Some(true));
        assert_eq!(s.error.as_deref(), Some("Subagent stopped by user."));
        let s = finished(base(), RunState::Failed, Some("x".into()), true, false, 40);
        assert_eq!(s.stopped, None);
        assert_eq!(s.timed_out, Some(true));
        assert_eq!(s.error.as_deref(), Some("x"));
    }

    #[test]
    fn a_complete_chain_takes_its_last_steps_answer_and_a_parallel_run_none() {
        let config = launch_config(Path::new("/runs/r"));
        let s = step_started(queued(&config, None, None, 1), &config, 3, 60, None, 20);
        let done = StepEnd {
            answer: Some(AnswerRef::of(
                "/runs/r/answer-3.md".into(),
                "the last answer",
            )),
            ..end("complete", Some((Some(0), None)))
        };
        let s = step_ended(s, &config, 3, &done, 31);
        let complete = finished(s.clone(), RunState::Complete, None, false, false, 40);
        assert_eq!(complete.extra["answerPath"], "/runs/r/answer-3.md");
        assert_eq!(complete.extra["answerBytes"], 15);
        let failed = finished(
            complete,
            RunState::Failed,
            Some("x".into()),
            false,
            false,
            41,
        );
        assert!(
            !failed.extra.contains_key("answerPath"),
            "an answer only when complete"
        );
        assert!(!failed.extra.contains_key("answerBytes"));
        let mut parallel = s;
        parallel.mode = Some("parallel".into());
        let parallel = finished(parallel, RunState::Complete, None, false, false, 40);
        assert!(
            !parallel.extra.contains_key("answerPath"),
            "answers stay on the steps"
        );
        assert_eq!(
            parallel.steps()[3].extra["answerPath"],
            "/runs/r/answer-3.md"
        );
    }

    #[test]
    fn a_commands_answer_is_its_output_file_as_long_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("output-0.log");
        std::fs::write(&file, "twelve bytes").unwrap();
        let answer = AnswerRef::of_file(file.clone()).expect("the file exists");
        assert_eq!((answer.path, answer.bytes), (file, 12));
        assert_eq!(AnswerRef::of_file(dir.path().join("missing")), None);
    }
}
