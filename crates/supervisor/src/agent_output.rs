//! What the runner does for a preset run (one rendered by `crates/agents`
//! for pi, claude or codex, marked by `$SUBAGENTS_AGENT_RUNNER` in the
//! run's launch environment): after the step, `output-<i>.log` gets the
//! agent's final answer (the event stream stays in the stdout log), and the
//! agent's session id and session file are recorded in `status.json`
//! (`agentSessionId`, `sessionFile`, also on the step) and in a
//! `subagent.session.captured` event, so `resume` can continue that session.
//! A named agent's step in a composite run carries its preset in its own
//! step environment; its session is recorded on its step only.

use std::path::PathBuf;

use agents::RunnerKind;
use agents::capture::{Captured, capture, locate_session_file, session_store};
use serde_json::{Value, json};
use status::model::update_status;
use status::{events, now_ms};

use crate::config::LaunchConfig;
pub use crate::transitions::AnswerRef;
use crate::transitions::{log_path, output_path};

/// Cap on the event stream read back (the answer is near its end anyway).
const MAX_STREAM_BYTES: u64 = 64 * 1024 * 1024;

/// The preset of a single run, if it is one.
pub fn preset_kind(config: &LaunchConfig) -> Option<RunnerKind> {
    let kind = RunnerKind::parse(config.env.get(agents::RUNNER_ENV)?)?;
    (kind.is_agent_cli() && config.steps.len() == 1).then_some(kind)
}

/// The preset of step `i`: its own (a named agent in a composite run's
/// spec), else the run's (a single run).
pub fn step_kind(config: &LaunchConfig, i: usize) -> Option<RunnerKind> {
    let own = config.steps.get(i)?.env.get(agents::RUNNER_ENV);
    match own {
        Some(name) => RunnerKind::parse(name).filter(|k| k.is_agent_cli()),
        None => preset_kind(config),
    }
}

/// Variable `name` of step `i`'s environment: the step's, then the run's.
fn step_env<'a>(config: &'a LaunchConfig, i: usize, name: &str) -> Option<&'a String> {
    let own = config.steps.get(i).and_then(|s| s.env.get(name));
    own.or_else(|| config.env.get(name))
}

/// The session id chosen before the CLI started (a new Claude session, or
/// the one a revival continues).
fn known_session_id(config: &LaunchConfig, i: usize) -> Option<&String> {
    step_env(config, i, agents::SESSION_ID_ENV)
}

/// Adds what is known of step `i`'s agent before it starts to its
/// `subagent.step.started` fields (a composite run's named agents).
pub fn step_started_fields(config: &LaunchConfig, i: usize, fields: &mut Value) {
    let Some(kind) = step_kind(config, i) else {
        return;
    };
    fields["agentRunner"] = json!(kind.as_str());
    if let Some(id) = known_session_id(config, i) {
        fields["agentSessionId"] = json!(id);
    }
}

/// Adds what is known before the CLI starts to the `subagent.run.started`
/// fields: the runner, the session id and (for a revival) the session file.
pub fn started_fields(config: &LaunchConfig, fields: &mut Value) {
    let Some(kind) = preset_kind(config) else {
        return;
    };
    fields["agentRunner"] = json!(kind.as_str());
    if let Some(id) = known_session_id(config, 0) {
        fields["agentSessionId"] = json!(id);
    }
    if let Some(revival) = &config.revival {
        fields["sessionFile"] = json!(revival.session_file);
    }
}

/// What a step's output says, for its end's record.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepReport {
    /// The step's answer, when it completed with one.
    pub answer: Option<AnswerRef>,
    /// The agent's (or the COMMAND's) own words for a failure: the CLI's
    /// error, else its last (pi: first) stderr line; a preset stream that
    /// did not complete says so. Bounded and escaped, never the task text.
    pub words: Option<String>,
}

/// `answer.md` of a single-step run, `answer-<i>.md` of step `i` of a
/// composite one: where an agent preset's final answer is kept.
pub fn answer_path(config: &LaunchConfig, i: usize) -> PathBuf {
    if config.steps.len() == 1 {
        config.run_dir.join("answer.md")
    } else {
        config.run_dir.join(format!("answer-{i}.md"))
    }
}

/// Runs after step `i` ended (`ok`: it exited 0 and nothing interrupted
/// it): records a preset's answer and session; says what the output tells
/// of the step.
pub fn after_step(config: &LaunchConfig, i: usize, ok: bool) -> StepReport {
    let stderr = read_ends(&log_path(config, i, "stderr"));
    let Some(kind) = step_kind(config, i) else {
        return StepReport {
            answer: None,
            words: stderr_line(&stderr, RunnerKind::Command).map(|l| clean(config, i, &l)),
        };
    };
    let stdout = read_capped(&log_path(config, i, "stdout"));
    let captured = capture(kind, &stdout);
    // output-<i>.log gets the answer, else the CLI's last words on stderr;
    // the event stream stays out of the output either way.
    let output = captured.answer.clone().or_else(|| stderr_tail(&stderr));
    if let Some(text) = &output {
        let mut text = text.clone();
        if !text.ends_with('\n') {
            text.push('\n');
        }
        let _ = atomic_file::write_private(&output_path(config, i), text.as_bytes());
    }
    let answer = match (&captured.answer, ok) {
        (Some(answer), true) => write_answer(config, i, answer),
        _ => None,
    };
    let words = preset_words(&captured, &stderr, kind).map(|w| clean(config, i, &w));
    let id = captured
        .session_id
        .or_else(|| known_session_id(config, i).cloned())
        .filter(|id| agents::preset::is_plain_session_id(id));
    if let Some(id) = id {
        let file = session_file(config, i, kind, &id);
        record(config, i, kind, &id, file.as_ref());
    }
    StepReport { answer, words }
}

/// The reason a preset's output gives: the CLI's own error, else its
/// stderr (and, for a stream cut before its final event, that it was cut).
fn preset_words(captured: &Captured, stderr: &str, kind: RunnerKind) -> Option<String> {
    if let Some(error) = &captured.error {
        return Some(error.clone());
    }
    let line = stderr_line(stderr, kind);
    if captured.completed {
        return line;
    }
    Some(match line {
        Some(line) => format!("{line} (the stream ended before its final message)"),
        None => "the stream ended before its final message".to_owned(),
    })
}

/// The stderr line that says why a COMMAND failed: the last non-blank one;
/// pi prints its error first and help after it, so its first.
fn stderr_line(stderr: &str, kind: RunnerKind) -> Option<String> {
    let mut lines = stderr.lines().map(str::trim).filter(|l| !l.is_empty());
    let line = if kind == RunnerKind::Pi {
        lines.next()
    } else {
        lines.next_back()
    };
    line.map(str::to_owned)
}

/// Longest reason kept, in characters.
pub const REASON_CHARS: usize = 500;

/// `text` as a recorded reason or activity: one escaped line, bounded,
/// without the step's task text.
pub fn clean(config: &LaunchConfig, i: usize, text: &str) -> String {
    let mut text = text.to_owned();
    let task = config.steps[i]
        .task_file
        .as_ref()
        .and_then(|p| std::fs::read_to_string(p).ok());
    if let Some(task) = task.as_deref().map(str::trim).filter(|t| t.len() >= 8) {
        text = text.replace(task, status::PROMPT_REDACTED);
    }
    atomic_file::escape(&agents::capture::bounded(text.trim(), REASON_CHARS))
}

fn write_answer(config: &LaunchConfig, i: usize, answer: &str) -> Option<AnswerRef> {
    let path = answer_path(config, i);
    atomic_file::write_private(&path, answer.as_bytes()).ok()?;
    Some(AnswerRef::of(path, answer))
}

/// The last 20 non-blank lines of `text`, if any.
fn stderr_tail(text: &str) -> Option<String> {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let tail = lines[lines.len().saturating_sub(20)..].join("\n");
    (!tail.is_empty()).then_some(tail)
}

/// Most bytes of stderr read from either end: its first line (pi's error)
/// and its last lines are what is used of it.
const STDERR_END_BYTES: u64 = 64 * 1024;

/// The whole of a short file; the first and last [`STDERR_END_BYTES`] of a
/// long one (the lines cut at either side dropped).
fn read_ends(path: &std::path::Path) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut file) = std::fs::File::open(path) else {
        return String::new();
    };
    let len = file.metadata().map_or(0, |m| m.len());
    if len <= 2 * STDERR_END_BYTES {
        return read_capped(path);
    }
    let mut head = Vec::new();
    let _ = (&mut file).take(STDERR_END_BYTES).read_to_end(&mut head);
    let mut tail = Vec::new();
    if file.seek(SeekFrom::Start(len - STDERR_END_BYTES)).is_ok() {
        let _ = file.read_to_end(&mut tail);
    }
    let head = String::from_utf8_lossy(&head);
    let tail = String::from_utf8_lossy(&tail);
    let head = head.rsplit_once('\n').map_or("", |(whole, _)| whole);
    let tail = tail.split_once('\n').map_or("", |(_, whole)| whole);
    format!("{head}\n{tail}")
}

fn read_capped(path: &std::path::Path) -> String {
    use std::io::Read;
    let mut bytes = Vec::new();
    if let Ok(file) = std::fs::File::open(path) {
        let _ = file.take(MAX_STREAM_BYTES).read_to_end(&mut bytes);
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The session file of a running step's CLI, once it wrote one.
pub(crate) fn live_session_file(
    config: &LaunchConfig,
    i: usize,
    kind: RunnerKind,
    id: &str,
) -> Option<PathBuf> {
    session_file(config, i, kind, id)
}

/// The CLI's own session file; for a revival whose CLI wrote it elsewhere,
/// the lineage's leased file.
fn session_file(config: &LaunchConfig, i: usize, kind: RunnerKind, id: &str) -> Option<PathBuf> {
    let env = |name: &str| {
        step_env(config, i, name)
            .cloned()
            .or_else(|| std::env::var(name).ok())
    };
    session_store(kind, &env)
        .and_then(|store| locate_session_file(&store, id))
        .or_else(|| config.revival.as_ref().map(|r| r.session_file.clone()))
}

fn record(config: &LaunchConfig, i: usize, kind: RunnerKind, id: &str, file: Option<&PathBuf>) {
    let file_text = file.map(|f| f.display().to_string());
    // A composite run's steps each have their own session: only a single
    // run's is the run's (the one `resume` continues).
    let single = config.steps.len() == 1;
    let _ = update_status(&config.run_dir, |s| {
        let mut s = s?;
        if single {
            s.extra.insert("agentRunner".into(), json!(kind.as_str()));
            s.extra.insert("agentSessionId".into(), json!(id));
            if let Some(file) = &file_text {
                s.session_file = Some(file.clone());
            }
        }
        if let Some(step) = s.steps.as_mut().and_then(|steps| steps.get_mut(i)) {
            step.extra
                .insert("agentRunner".into(), json!(kind.as_str()));
            step.extra.insert("agentSessionId".into(), json!(id));
            if let Some(file) = &file_text {
                step.extra.insert("sessionFile".into(), json!(file));
            }
        }
        Some(s)
    });
    let fields = json!({"stepIndex": i, "agentRunner": kind.as_str(), "agentSessionId": id, "sessionFile": file_text});
    let _ = events::append(
        &config.run_dir,
        "subagent.session.captured",
        &config.run_id,
        now_ms(),
        fields,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RevivalConfig;
    use crate::config::tests::launch_config;

    /// A single-step run whose launch environment names `runner`.
    fn preset(run_dir: &std::path::Path, runner: &str) -> LaunchConfig {
        let mut config = launch_config(run_dir);
        config.steps.truncate(1);
        config.groups.truncate(1);
        config.env.insert(agents::RUNNER_ENV.into(), runner.into());
        config
    }

    #[test]
    fn only_a_single_step_agent_cli_run_is_a_preset() {
        let dir = std::path::Path::new("/nonexistent");
        assert_eq!(
            preset_kind(&preset(dir, "claude")),
            Some(RunnerKind::Claude)
        );
        assert_eq!(preset_kind(&preset(dir, "command")), None);
        assert_eq!(preset_kind(&preset(dir, "nonsense")), None);
        assert_eq!(preset_kind(&launch_config(dir)), None);
        let mut chain = launch_config(dir);
        chain.env.insert(agents::RUNNER_ENV.into(), "claude".into());
        assert_eq!(preset_kind(&chain), None);
    }

    #[test]
    fn the_started_event_names_the_runner_and_what_is_known_of_the_session() {
        let dir = std::path::Path::new("/nonexistent");
        let mut fields = json!({"runId": "r"});
        started_fields(&preset(dir, "command"), &mut fields);
        assert_eq!(fields, json!({"runId": "r"}));

        let mut config = preset(dir, "claude");
        config
            .env
            .insert(agents::SESSION_ID_ENV.into(), "s-1".into());
        config.revival = Some(RevivalConfig {
            source_run_id: "r0".into(),
            session_file: PathBuf::from("/sessions/s-1.jsonl"),
            lease_root: PathBuf::from("/leases"),
            token: "t".into(),
            timeouts_ms: (1, 1),
        });
        started_fields(&config, &mut fields);
        assert_eq!(
            fields,
            json!({"runId": "r", "agentRunner": "claude", "agentSessionId": "s-1",
                   "sessionFile": "/sessions/s-1.jsonl"})
        );
    }

    #[test]
    fn a_step_started_event_names_the_steps_own_agent_and_session() {
        let dir = std::path::Path::new("/nonexistent");
        let mut config = launch_config(dir);
        assert!(config.steps.len() > 1, "a composite run");
        config
            .env
            .insert(agents::SESSION_ID_ENV.into(), "run-session".into());
        let step = &mut config.steps[1].env;
        step.insert(agents::RUNNER_ENV.into(), "codex".into());
        step.insert(agents::SESSION_ID_ENV.into(), "step-session".into());
        config.steps[0]
            .env
            .insert(agents::RUNNER_ENV.into(), "claude".into());
        let started = |config: &LaunchConfig, i: usize| {
            let mut fields = json!({"stepIndex": i});
            step_started_fields(config, i, &mut fields);
            fields
        };
        assert_eq!(
            started(&config, 1),
            json!({"stepIndex": 1, "agentRunner": "codex", "agentSessionId": "step-session"})
        );
        // Without a session of its own the step has the run's.
        assert_eq!(
            started(&config, 0),
            json!({"stepIndex": 0, "agentRunner": "claude", "agentSessionId": "run-session"})
        );
        // A plain command step, in a run that is no preset, has no agent.
        config.steps[0].env.clear();
        assert_eq!(started(&config, 0), json!({"stepIndex": 0}));
    }

    #[test]
    fn the_answer_and_session_are_taken_from_the_end_of_a_long_stream() {
        let tmp = tempfile::tempdir().unwrap();
        let run_dir = tmp.path().join("run");
        std::fs::create_dir(&run_dir).unwrap();
        let mut config = preset(&run_dir, "claude");
        // Claude's session store, holding this session's file.
        let store = tmp.path().join("claude");
        let session = store.join("projects/p/sess-1.jsonl");
        std::fs::create_dir_all(session.parent().unwrap()).unwrap();
        std::fs::write(&session, "{}\n").unwrap();
        config
            .env
            .insert("CLAUDE_CONFIG_DIR".into(), store.display().to_string());
        let mut status = status::model::RunStatus::new("r", status::RunState::Running);
        status.steps = Some(vec![status::model::Step::default()]);
        status::model::write_status(&run_dir, &status).unwrap();
        // 2 MiB of stream before the result: more than any cap below 64 MiB.
        let mut stream = "{\"type\":\"noise\"}\n".repeat(2 * 1024 * 1024 / 17);
        stream.push_str(r#"{"type":"result","result":"the answer","session_id":"sess-1"}"#);
        stream.push('\n');
        std::fs::write(log_path(&config, 0, "stdout"), stream).unwrap();

        after_step(&config, 0, true);

        let output = std::fs::read_to_string(output_path(&config, 0)).unwrap();
        assert_eq!(output, "the answer\n");
        let status = status::model::read_status(&run_dir).unwrap().unwrap();
        let file = session.display().to_string();
        assert_eq!(status.extra["agentRunner"], "claude");
        assert_eq!(status.extra["agentSessionId"], "sess-1");
        assert_eq!(status.session_file.as_deref(), Some(file.as_str()));
        let step = &status.steps.as_ref().unwrap()[0];
        assert_eq!(step.extra["agentSessionId"], "sess-1");
        assert_eq!(step.extra["sessionFile"], file.as_str());
        let captured: Vec<Value> = events::read_all(&run_dir)
            .into_iter()
            .filter(|e| e["type"] == "subagent.session.captured")
            .collect();
        assert_eq!(captured.len(), 1, "{captured:?}");
        assert_eq!(captured[0]["agentSessionId"], "sess-1");
        assert_eq!(captured[0]["sessionFile"], file.as_str());
    }

    #[test]
    fn without_an_answer_the_last_words_on_stderr_are_the_output() {
        let tmp = tempfile::tempdir().unwrap();
        let config = preset(tmp.path(), "codex");
        std::fs::write(log_path(&config, 0, "stdout"), "not json\n").unwrap();
        let stderr: String = (1..=25).map(|i| format!("line {i}\n\n")).collect();
        std::fs::write(log_path(&config, 0, "stderr"), stderr).unwrap();
        after_step(&config, 0, true);
        let expected: String = (6..=25).map(|i| format!("line {i}\n")).collect();
        let output = std::fs::read_to_string(output_path(&config, 0)).unwrap();
        assert_eq!(output, expected);
        // No session id anywhere: nothing recorded.
        assert!(status::model::read_status(tmp.path()).unwrap().is_none());
    }

    #[test]
    fn a_completed_answer_is_kept_in_answer_md_and_a_failure_has_none() {
        let tmp = tempfile::tempdir().unwrap();
        let config = preset(tmp.path(), "codex");
        let answer: String = (1..=5000).map(|i| format!("answer line {i}\n")).collect();
        let event =
            json!({"type": "item.completed", "item": {"type": "agent_message", "text": answer}});
        let stream = format!("{event}\n{{\"type\":\"turn.completed\"}}\n");
        std::fs::write(log_path(&config, 0, "stdout"), &stream).unwrap();
        let report = after_step(&config, 0, true);
        let path = tmp.path().join("answer.md");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), answer);
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&path).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
        let answer_ref = report.answer.unwrap();
        assert_eq!(answer_ref.path, path);
        assert_eq!(answer_ref.bytes, answer.len() as u64);
        assert_eq!(report.words, None);

        // The same stream from a step that failed: no answer.
        std::fs::remove_file(&path).unwrap();
        assert_eq!(after_step(&config, 0, false).answer, None);
        assert!(!path.exists());
    }

    #[test]
    fn the_words_of_a_failure_are_the_clis_own() {
        let tmp = tempfile::tempdir().unwrap();
        let mut config = preset(tmp.path(), "pi");
        let task = tmp.path().join("task.md");
        std::fs::write(&task, "the secret task text\n").unwrap();
        config.steps[0].task_file = Some(task);
        std::fs::write(
            log_path(&config, 0, "stdout"),
            "{\"type\":\"session\",\"id\":\"p1\"}\n",
        )
        .unwrap();
        let help = "No API key found for the selected model.\n\nUse /login to log in. See:\n  /docs/providers.md\n";
        std::fs::write(log_path(&config, 0, "stderr"), help).unwrap();
        let words = after_step(&config, 0, false).words.unwrap();
        assert_eq!(
            words,
            "No API key found for the selected model. (the stream ended before its final message)"
        );
        // A codex stream cut mid-line with nothing on stderr.
        let config = preset(tmp.path(), "codex");
        let cut = "{\"type\":\"thread.started\",\"thread_id\":\"t1\"}\n{\"type\":\"item.completed\",\"item\":{\"type\":\"agent_message\",\"text\":\"interim\"}}\n{\"type\":\"turn.comp";
        std::fs::write(log_path(&config, 0, "stdout"), cut).unwrap();
        std::fs::write(log_path(&config, 0, "stderr"), "").unwrap();
        let report = after_step(&config, 0, false);
        assert_eq!(report.answer, None);
        assert_eq!(
            report.words.as_deref(),
            Some("the stream ended before its final message")
        );
        // A plain command: its last stderr line, escaped, without the task text.
        let mut config = launch_config(tmp.path());
        config.steps[0].task_file = Some(tmp.path().join("task.md"));
        std::fs::write(
            log_path(&config, 0, "stderr"),
            "warning: x\nerror: the secret task text\tfailed\n",
        )
        .unwrap();
        let report = after_step(&config, 0, false);
        assert_eq!(
            report.words.as_deref(),
            Some("error: [prompt redacted]\\tfailed")
        );
    }

    #[test]
    fn a_long_stderr_is_read_at_both_ends() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("stderr");
        let middle = "noise line\n".repeat(100_000);
        std::fs::write(&path, format!("first words\n{middle}last words\n")).unwrap();
        let text = read_ends(&path);
        assert!(text.len() < 3 * STDERR_END_BYTES as usize, "{}", text.len());
        assert_eq!(
            stderr_line(&text, RunnerKind::Pi).as_deref(),
            Some("first words")
        );
        assert_eq!(
            stderr_line(&text, RunnerKind::Codex).as_deref(),
            Some("last words")
        );
    }

    #[test]
    fn a_stderr_up_to_twice_the_end_size_is_read_whole() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("stderr");
        // 100 KiB of distinct lines: more than one end, less than two.
        let text: String = (0..10_000).map(|i| format!("line {i:05}\n")).collect();
        assert!(
            text.len() as u64 > STDERR_END_BYTES + 2 && text.len() as u64 <= 2 * STDERR_END_BYTES
        );
        std::fs::write(&path, &text).unwrap();
        assert_eq!(read_ends(&path), text);
    }

    #[test]
    fn each_end_of_a_long_stderr_keeps_64_kib_of_whole_lines() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("stderr");
        // Lines of 2,000 bytes: an end of a few hundred bytes would hold none whole.
        let line = |c: char| format!("{}\n", c.to_string().repeat(1_999));
        let first = line('f');
        let middle = line('m').repeat(200);
        let last: String = ('a'..='t').map(line).collect();
        std::fs::write(&path, format!("{first}{middle}{last}")).unwrap();
        let text = read_ends(&path);
        assert!(text.starts_with(&first), "the first line is kept whole");
        assert!(text.ends_with(&last), "the last 20 lines are kept whole");
        let kept = text.lines().count();
        // 64 KiB is 32 lines of 2,000 bytes at each end, less the cut ones.
        assert!((60..=64).contains(&kept), "{kept} lines");
    }

    #[test]
    fn a_running_steps_session_file_is_found_in_its_clis_store() {
        let tmp = tempfile::tempdir().unwrap();
        let mut config = launch_config(tmp.path());
        let store = tmp.path().join("claude-config");
        let project = store.join("projects").join("-work-proj");
        std::fs::create_dir_all(&project).unwrap();
        let id = "0b7c3f1e-5a2d-4c7b-9e1f-2a3b4c5d6e7f";
        let file = project.join(format!("{id}.jsonl"));
        std::fs::write(&file, "{}\n").unwrap();
        config.steps[1]
            .env
            .insert("CLAUDE_CONFIG_DIR".into(), store.display().to_string());
        assert_eq!(
            live_session_file(&config, 1, RunnerKind::Claude, id),
            Some(file)
        );
        assert_eq!(
            live_session_file(
                &config,
                1,
                RunnerKind::Claude,
                "1b7c3f1e-5a2d-4c7b-9e1f-2a3b4c5d6e7f"
            ),
            None,
            "no file of that session"
        );
    }

    #[test]
    fn a_blank_stderr_has_no_tail() {
        assert_eq!(stderr_tail(""), None);
        assert_eq!(stderr_tail("\n  \n\t\n"), None);
        assert_eq!(stderr_tail(" \nerror: x\n\n"), Some("error: x".into()));
    }
}
