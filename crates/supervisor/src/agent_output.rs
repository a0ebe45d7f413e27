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
use agents::capture::{capture, locate_session_file, session_store};
use serde_json::{Value, json};
use status::model::update_status;
use status::{events, now_ms};

use crate::config::LaunchConfig;
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

/// Runs after step `i` ended: extracts the answer and the session.
pub fn after_step(config: &LaunchConfig, i: usize) {
    let Some(kind) = step_kind(config, i) else {
        return;
    };
    let stdout = read_capped(&log_path(config, i, "stdout"));
    let captured = capture(kind, &stdout);
    // No answer (the CLI failed before one): its last words on stderr are
    // the best summary; the event stream stays out of the output either way.
    let answer = captured
        .answer
        .clone()
        .or_else(|| stderr_tail(&read_capped(&log_path(config, i, "stderr"))));
    if let Some(answer) = &answer {
        let mut text = answer.clone();
        if !text.ends_with('\n') {
            text.push('\n');
        }
        let _ = atomic_file::write_private(&output_path(config, i), text.as_bytes());
    }
    let id = captured
        .session_id
        .or_else(|| known_session_id(config, i).cloned())
        .filter(|id| agents::preset::is_plain_session_id(id));
    let Some(id) = id else { return };
    let file = session_file(config, i, kind, &id);
    record(config, i, kind, &id, file.as_ref());
}

/// The last 20 non-blank lines of `text`, if any.
fn stderr_tail(text: &str) -> Option<String> {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let tail = lines[lines.len().saturating_sub(20)..].join("\n");
    (!tail.is_empty()).then_some(tail)
}

fn read_capped(path: &std::path::Path) -> String {
    use std::io::Read;
    let mut bytes = Vec::new();
    if let Ok(file) = std::fs::File::open(path) {
        let _ = file.take(MAX_STREAM_BYTES).read_to_end(&mut bytes);
    }
    String::from_utf8_lossy(&bytes).into_owned()
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

        after_step(&config, 0);

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
        after_step(&config, 0);
        let expected: String = (6..=25).map(|i| format!("line {i}\n")).collect();
        let output = std::fs::read_to_string(output_path(&config, 0)).unwrap();
        assert_eq!(output, expected);
        // No session id anywhere: nothing recorded.
        assert!(status::model::read_status(tmp.path()).unwrap().is_none());
    }

    #[test]
    fn a_blank_stderr_has_no_tail() {
        assert_eq!(stderr_tail(""), None);
        assert_eq!(stderr_tail("\n  \n\t\n"), None);
        assert_eq!(stderr_tail(" \nerror: x\n\n"), Some("error: x".into()));
    }
}
