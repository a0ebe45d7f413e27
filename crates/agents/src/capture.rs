//! Reads a preset CLI's event stream back: its final answer and its session
//! id; and finds the session file the CLI keeps for that id.
//!
//! The shapes (seen from the CLIs themselves, which print them before any
//! network call):
//!
//! * claude `stream-json`: `{"type":"system","subtype":"init","session_id":…}`
//!   first, `{"type":"result","result":"<answer>","session_id":…}` last.
//! * codex `--json`: `{"type":"thread.started","thread_id":…}`, then
//!   `{"type":"item.completed","item":{"type":"agent_message","text":…}}`.
//! * pi `--mode json`: `{"type":"session","id":…}` first, then events; the
//!   answer is the text of the last assistant `message_end` (or `agent_end`).
//!
//! Lines that are not JSON objects (warnings, progress) are skipped.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::definition::RunnerKind;

/// What a run's output says about the agent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Captured {
    /// The agent's final answer.
    pub answer: Option<String>,
    /// The CLI's session id.
    pub session_id: Option<String>,
}

/// Reads the event stream `stdout` of a `kind` run.
pub fn capture(kind: RunnerKind, stdout: &str) -> Captured {
    let mut captured = Captured::default();
    for event in stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l.trim()).ok())
        .filter(Value::is_object)
    {
        let (answer, id) = match kind {
            RunnerKind::Claude => claude_event(&event),
            RunnerKind::Codex => codex_event(&event),
            RunnerKind::Pi => pi_event(&event),
            RunnerKind::Command => (None, None),
        };
        if answer.is_some() {
            captured.answer = answer;
        }
        if captured.session_id.is_none() {
            captured.session_id = id;
        }
    }
    captured
}

fn text(value: &Value, key: &str) -> Option<String> {
    value.get(key).and_then(Value::as_str).map(str::to_owned)
}

fn claude_event(event: &Value) -> (Option<String>, Option<String>) {
    let answer = (text(event, "type").as_deref() == Some("result"))
        .then(|| text(event, "result"))
        .flatten();
    (answer, text(event, "session_id"))
}

fn codex_event(event: &Value) -> (Option<String>, Option<String>) {
    match text(event, "type").as_deref() {
        Some("thread.started") => (None, text(event, "thread_id")),
        Some("item.completed") => {
            let item = event.get("item").unwrap_or(&Value::Null);
            let message = text(item, "type").as_deref() == Some("agent_message");
            (message.then(|| text(item, "text")).flatten(), None)
        }
        _ => (None, None),
    }
}

fn pi_event(event: &Value) -> (Option<String>, Option<String>) {
    match text(event, "type").as_deref() {
        Some("session") => (None, text(event, "id")),
        Some("message_end") => (event.get("message").and_then(assistant_text), None),
        Some("agent_end") => {
            let messages = event.get("messages").and_then(Value::as_array);
            let last = messages.and_then(|m| m.iter().rev().find_map(assistant_text));
            (last, None)
        }
        _ => (None, None),
    }
}

/// The text parts of an assistant message, joined.
fn assistant_text(message: &Value) -> Option<String> {
    if text(message, "role").as_deref() != Some("assistant") {
        return None;
    }
    let parts: Vec<&str> = message
        .get("content")?
        .as_array()?
        .iter()
        .filter(|p| p.get("type").and_then(Value::as_str) == Some("text"))
        .filter_map(|p| p.get("text").and_then(Value::as_str))
        .collect();
    (!parts.is_empty()).then(|| parts.join(""))
}

/// Where each CLI keeps its sessions, from its environment:
/// claude `$CLAUDE_CONFIG_DIR` (else `~/.claude`) `/projects`, codex
/// `$CODEX_HOME` (else `~/.codex`) `/sessions`, pi `$PI_CODING_AGENT_DIR`
/// (else `~/.pi/agent`) `/sessions`.
pub fn session_store(kind: RunnerKind, env: &dyn Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let home = || env("HOME").filter(|h| !h.is_empty()).map(PathBuf::from);
    let dir = |var: &str| env(var).filter(|v| !v.is_empty()).map(PathBuf::from);
    match kind {
        RunnerKind::Claude => Some(
            dir("CLAUDE_CONFIG_DIR")
                .or_else(|| Some(home()?.join(".claude")))?
                .join("projects"),
        ),
        RunnerKind::Codex => Some(
            dir("CODEX_HOME")
                .or_else(|| Some(home()?.join(".codex")))?
                .join("sessions"),
        ),
        RunnerKind::Pi => Some(
            dir("PI_CODING_AGENT_DIR")
                .or_else(|| Some(home()?.join(".pi").join("agent")))?
                .join("sessions"),
        ),
        RunnerKind::Command => None,
    }
}

/// The session file of `id` in `store`: claude `<project>/<id>.jsonl`, codex
/// `YYYY/MM/DD/rollout-<time>-<id>.jsonl`, pi `<cwd>/<time>_<id>.jsonl`.
/// The newest match wins; none when the CLI wrote none (yet).
pub fn locate_session_file(store: &Path, id: &str) -> Option<PathBuf> {
    if !crate::preset::is_plain_session_id(id) {
        return None;
    }
    let suffix = format!("{id}.jsonl");
    let mut found = Vec::new();
    walk(store, 0, &suffix, &mut found);
    found
        .into_iter()
        .max_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
}

fn walk(dir: &Path, depth: usize, suffix: &str, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        let name = entry.file_name().to_string_lossy().into_owned();
        if kind.is_dir() && depth < 4 {
            walk(&entry.path(), depth + 1, suffix, out);
        } else if kind.is_file() && name.ends_with(suffix) {
            let stem = &name[..name.len() - suffix.len()];
            // The id is whole: `<id>.jsonl`, `…-<id>.jsonl` or `…_<id>.jsonl`.
            if stem.is_empty() || stem.ends_with(['-', '_']) {
                out.push(entry.path());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claude_stream() {
        let out = concat!(
            r#"{"type":"system","subtype":"init","session_id":"s1"}"#,
            "\n",
            "warning: not json\n",
            r#"{"type":"result","subtype":"success","result":"done","session_id":"s1"}"#,
            "\n",
        );
        let c = capture(RunnerKind::Claude, out);
        assert_eq!(c.answer.as_deref(), Some("done"));
        assert_eq!(c.session_id.as_deref(), Some("s1"));
    }

    #[test]
    fn codex_stream() {
        let out = concat!(
            r#"{"type":"thread.started","thread_id":"t1"}"#,
            "\n",
            r#"{"type":"item.completed","item":{"id":"item_0","type":"reasoning","text":"hmm"}}"#,
            "\n",
            r#"{"type":"item.completed","item":{"id":"item_1","type":"agent_message","text":"answer"}}"#,
            "\n",
            r#"{"type":"turn.completed","usage":{}}"#,
            "\n",
        );
        let c = capture(RunnerKind::Codex, out);
        assert_eq!(c.answer.as_deref(), Some("answer"));
        assert_eq!(c.session_id.as_deref(), Some("t1"));
    }

    #[test]
    fn pi_stream() {
        let out = concat!(
            r#"{"type":"session","version":3,"id":"p1","cwd":"/x"}"#,
            "\n",
            r#"{"type":"message_end","message":{"role":"user","content":[{"type":"text","text":"q"}]}}"#,
            "\n",
            r#"{"type":"message_end","message":{"role":"assistant","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}}"#,
            "\n",
        );
        let c = capture(RunnerKind::Pi, out);
        assert_eq!(c.answer.as_deref(), Some("ab"));
        assert_eq!(c.session_id.as_deref(), Some("p1"));
    }

    #[test]
    fn finds_whole_ids_only() {
        let tmp = tempfile::tempdir().unwrap();
        let day = tmp.path().join("2026/11/30");
        std::fs::create_dir_all(&day).unwrap();
        std::fs::write(day.join("rollout-2026-11-30T06-31-27-abc.jsonl"), "").unwrap();
        std::fs::write(day.join("rollout-xabc.jsonl"), "").unwrap();
        let found = locate_session_file(tmp.path(), "abc").unwrap();
        assert!(found.ends_with("rollout-2026-11-30T06-31-27-abc.jsonl"));
        assert_eq!(locate_session_file(tmp.path(), "zzz"), None);
    }
}
