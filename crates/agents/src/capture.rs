//! Reads a preset CLI's event stream back: its final answer, its session
//! id, its own words when it fails and its latest activity; and finds the
//! session file the CLI keeps for that id.
//!
//! The shapes (seen from the CLIs themselves, which print them before any
//! network call):
//!
//! * claude `stream-json`: `{"type":"system","subtype":"init","session_id":…}`
//!   first, `assistant` messages (text and `tool_use` parts), then
//!   `{"type":"result","subtype":…,"is_error":…,"result":"<answer>"}` last. A
//!   result with `is_error` or a subtype other than `success` (e.g.
//!   `error_max_turns`, which may carry no `result`) is a failure in the
//!   result's words, else its subtype's.
//! * codex `--json`: `{"type":"thread.started","thread_id":…}`,
//!   `item.completed` items (`agent_message` text, `command_execution`, …),
//!   `turn.completed` at the end of a good turn; `turn.failed` (`error.message`)
//!   and `error` events (`message`) in the CLI's words.
//! * pi `--mode json`: `{"type":"session","id":…}` first, then events; the
//!   answer is the text of the last assistant `message_end`, the stream is
//!   complete at `agent_end`; an assistant message whose `stopReason` is
//!   `error` or `aborted` carries the failure as `errorMessage`.
//!
//! A stream is *complete* only once its final event came (claude `result`,
//! codex `turn.completed`, pi `agent_end`); the text of a stream cut before
//! it is no answer. Lines that are not JSON objects (warnings, progress, a
//! line cut in the middle) are skipped.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::definition::RunnerKind;

/// Longest [`Captured::activity`] kept, in characters.
pub const ACTIVITY_CHARS: usize = 200;

/// What a run's output says about the agent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Captured {
    /// The agent's final answer: only when the stream completed without an
    /// error.
    pub answer: Option<String>,
    /// The CLI's session id.
    pub session_id: Option<String>,
    /// The CLI's own words for its failure, when it printed any.
    pub error: Option<String>,
    /// The stream ended with its final event.
    pub completed: bool,
    /// The first line of the latest assistant message or tool use (at most
    /// [`ACTIVITY_CHARS`] characters, not escaped).
    pub activity: Option<String>,
}

/// An event stream read as it grows: [`Stream::feed`] takes bytes as the
/// CLI writes them (a line cut between two reads is kept until its end
/// comes), [`Stream::captured`] says what is known so far.
#[derive(Debug, Clone)]
pub struct Stream {
    kind: RunnerKind,
    partial: Vec<u8>,
    captured: Captured,
    /// The latest assistant text, the answer once the stream completes.
    text: Option<String>,
    /// A turn failure (codex `turn.failed`), which wins over `error` events.
    failed: Option<String>,
}

/// Longest line kept while its end has not come (a longer one is dropped).
const MAX_LINE_BYTES: usize = 64 * 1024 * 1024;

impl Stream {
    /// An empty stream of a `kind` CLI.
    pub fn new(kind: RunnerKind) -> Self {
        Self {
            kind,
            partial: Vec::new(),
            captured: Captured::default(),
            text: None,
            failed: None,
        }
    }

    /// Reads the complete lines of `bytes` (after what came before).
    pub fn feed(&mut self, bytes: &[u8]) {
        let mut rest = bytes;
        while let Some(at) = rest.iter().position(|b| *b == b'\n') {
            let (line, tail) = rest.split_at(at);
            if self.partial.is_empty() {
                self.line(line);
            } else {
                let mut whole = std::mem::take(&mut self.partial);
                whole.extend_from_slice(line);
                self.line(&whole);
            }
            rest = &tail[1..];
        }
        if self.partial.len() + rest.len() <= MAX_LINE_BYTES {
            self.partial.extend_from_slice(rest);
        } else {
            self.partial.clear();
        }
    }

    /// What the stream said so far.
    pub fn captured(&self) -> &Captured {
        &self.captured
    }

    /// The end of the stream: a last line without its newline is read too
    /// (if it is a whole JSON object, it was not cut).
    pub fn finish(mut self) -> Captured {
        let last = std::mem::take(&mut self.partial);
        self.line(&last);
        self.captured
    }

    fn line(&mut self, line: &[u8]) {
        let Ok(text) = std::str::from_utf8(line) else {
            return;
        };
        let Ok(event) = serde_json::from_str::<Value>(text.trim()) else {
            return;
        };
        if !event.is_object() {
            return;
        }
        match self.kind {
            RunnerKind::Claude => self.claude(&event),
            RunnerKind::Codex => self.codex(&event),
            RunnerKind::Pi => self.pi(&event),
            RunnerKind::Command => {}
        }
    }

    fn session(&mut self, id: Option<String>) {
        // An empty id names no session: a later event's id still counts.
        if self.captured.session_id.is_none() {
            self.captured.session_id = id.filter(|id| !id.is_empty());
        }
    }

    fn said(&mut self, text: String) {
        self.captured.activity = first_line(&text);
        self.text = Some(text);
    }

    fn complete(&mut self, answer: Option<String>) {
        self.captured.completed = true;
        self.captured.answer = answer.or_else(|| self.text.clone());
    }

    fn claude(&mut self, event: &Value) {
        self.session(text(event, "session_id"));
        match text(event, "type").as_deref() {
            Some("assistant") => {
                let message = event.get("message").unwrap_or(&Value::Null);
                self.message_parts(message, "tool_use", "input");
            }
            Some("result") => {
                let subtype = text(event, "subtype").unwrap_or_default();
                let is_error = event.get("is_error").and_then(Value::as_bool) == Some(true);
                let result = text(event, "result").filter(|r| !r.trim().is_empty());
                if is_error || (!subtype.is_empty() && subtype != "success") {
                    self.captured.completed = false;
                    self.captured.answer = None;
                    self.captured.error = result.or_else(|| {
                        let subtype = if subtype.is_empty() {
                            "error"
                        } else {
                            &subtype
                        };
                        Some(format!("claude ended with {subtype}"))
                    });
                } else {
                    self.complete(result);
                }
            }
            _ => {}
        }
    }

    fn codex(&mut self, event: &Value) {
        match text(event, "type").as_deref() {
            Some("thread.started") => self.session(text(event, "thread_id")),
            Some("item.started" | "item.completed") => {
                let item = event.get("item").unwrap_or(&Value::Null);
                let completed = text(event, "type").as_deref() == Some("item.completed");
                match text(item, "type").as_deref() {
                    Some("agent_message") if completed => {
                        if let Some(t) = text(item, "text") {
                            self.said(t);
                        }
                    }
                    Some("command_execution") => {
                        let command = text(item, "command").unwrap_or_default();
                        self.captured.activity = first_line(&format!("$ {command}"));
                    }
                    Some(kind @ ("file_change" | "mcp_tool_call" | "web_search")) => {
                        self.captured.activity = Some(kind.replace('_', " "));
                    }
                    _ => {}
                }
            }
            Some("turn.completed") if self.failed.is_none() => self.complete(None),
            Some("turn.failed") => {
                let message = event.get("error").and_then(|e| words(e, "message"));
                self.failed = Some(message.unwrap_or_else(|| "codex turn failed".into()));
                self.captured.error = self.failed.clone();
                self.captured.completed = false;
                self.captured.answer = None;
            }
            Some("error") if self.failed.is_none() => {
                self.captured.error = words(event, "message").or(self.captured.error.take());
            }
            _ => {}
        }
    }

    fn pi(&mut self, event: &Value) {
        match text(event, "type").as_deref() {
            Some("session") => self.session(text(event, "id")),
            Some("message_end") => {
                let message = event.get("message").unwrap_or(&Value::Null);
                if text(message, "role").as_deref() != Some("assistant") {
                    return;
                }
                let stop = text(message, "stopReason").unwrap_or_default();
                if stop == "error" || stop == "aborted" {
                    let words = text(message, "errorMessage").filter(|m| !m.trim().is_empty());
                    self.captured.error = Some(words.unwrap_or_else(|| format!("pi {stop}")));
                    self.text = None;
                    return;
                }
                self.message_parts(message, "toolCall", "arguments");
            }
            Some("tool_execution_start") => {
                let name = text(event, "toolName").unwrap_or_default();
                self.captured.activity = first_line(&tool_label(&name, event.get("args")));
            }
            Some("agent_end") if self.captured.error.is_none() => {
                let messages = event.get("messages").and_then(Value::as_array);
                let last = messages.and_then(|m| m.iter().rev().find_map(assistant_text));
                self.complete(self.text.clone().or(last));
            }
            _ => {}
        }
    }

    /// An assistant message: its text is what the agent said, a tool call
    /// (`tool_kind`, arguments under `args_key`) what it is doing.
    fn message_parts(&mut self, message: &Value, tool_kind: &str, args_key: &str) {
        let Some(parts) = message.get("content").and_then(Value::as_array) else {
            return;
        };
        let said: Vec<&str> = parts
            .iter()
            .filter(|p| p.get("type").and_then(Value::as_str) == Some("text"))
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect();
        if !said.is_empty() {
            self.said(said.join(""));
        }
        let tool = parts
            .iter()
            .rev()
            .find(|p| p.get("type").and_then(Value::as_str) == Some(tool_kind));
        if let Some(tool) = tool {
            let name = text(tool, "name").unwrap_or_default();
            self.captured.activity = first_line(&tool_label(&name, tool.get(args_key)));
        }
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

/// Reads the whole event stream `stdout` of a `kind` run.
pub fn capture(kind: RunnerKind, stdout: &str) -> Captured {
    let mut stream = Stream::new(kind);
    stream.feed(stdout.as_bytes());
    stream.finish()
}

fn text(value: &Value, key: &str) -> Option<String> {
    value.get(key).and_then(Value::as_str).map(str::to_owned)
}

/// A CLI's failure words under `key`, none when blank (an empty error
/// would say nothing where the CLI's fallback names the failure).
fn words(value: &Value, key: &str) -> Option<String> {
    text(value, key).filter(|w| !w.trim().is_empty())
}

/// `tool NAME: <its main argument>` (a command, a path, a pattern).
fn tool_label(name: &str, args: Option<&Value>) -> String {
    let main = ["command", "file_path", "path", "pattern", "url", "query"]
        .iter()
        .find_map(|key| args.and_then(|a| a.get(*key)).and_then(Value::as_str));
    match main {
        Some(arg) => format!("tool {name}: {arg}"),
        None => format!("tool {name}"),
    }
}

/// The first non-blank line of `text`, trimmed, at most [`ACTIVITY_CHARS`].
pub fn first_line(text: &str) -> Option<String> {
    let line = text.lines().map(str::trim).find(|l| !l.is_empty())?;
    Some(bounded(line, ACTIVITY_CHARS))
}

/// `text` cut to `chars` characters, with `…` when it was longer.
pub fn bounded(text: &str, chars: usize) -> String {
    match text.char_indices().nth(chars) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
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
            r#"{"type":"agent_end","messages":[]}"#,
            "\n",
        );
        let c = capture(RunnerKind::Pi, out);
        assert_eq!(c.answer.as_deref(), Some("ab"));
        assert_eq!(c.session_id.as_deref(), Some("p1"));
    }

    /// `lines` joined, each ending with a newline.
    fn stream(lines: &[&str]) -> String {
        lines.iter().map(|l| format!("{l}\n")).collect()
    }

    #[test]
    fn a_claude_error_result_is_its_reason_and_no_answer() {
        let out = stream(&[
            r#"{"type":"system","subtype":"init","session_id":"s1"}"#,
            r#"{"type":"assistant","message":{"role":"assistant","content":[{"type":"text","text":"Not logged in · Please run /login"}]},"session_id":"s1","error":"authentication_failed"}"#,
            r#"{"type":"result","subtype":"success","is_error":true,"result":"Not logged in · Please run /login","session_id":"s1"}"#,
        ]);
        let c = capture(RunnerKind::Claude, &out);
        assert_eq!(c.answer, None);
        assert!(!c.completed);
        assert_eq!(
            c.error.as_deref(),
            Some("Not logged in · Please run /login")
        );
        // A subtype without a result text: the subtype names the failure.
        let out = stream(&[
            r#"{"type":"assistant","message":{"role":"assistant","content":[{"type":"tool_use","name":"Bash","input":{"command":"cargo test\nmore"}}]}}"#,
            r#"{"type":"result","subtype":"error_max_turns","is_error":false,"num_turns":3}"#,
        ]);
        let c = capture(RunnerKind::Claude, &out);
        assert_eq!(
            c.error.as_deref(),
            Some("claude ended with error_max_turns")
        );
        assert_eq!(c.activity.as_deref(), Some("tool Bash: cargo test"));
        assert_eq!(c.answer, None);
    }

    #[test]
    fn codex_failures_are_its_own_words() {
        let reconnecting =
            r#"{"type":"error","message":"Reconnecting... 2/5 (stream disconnected)"}"#;
        let out = stream(&[
            r#"{"type":"thread.started","thread_id":"t1"}"#,
            reconnecting,
            r#"{"type":"item.completed","item":{"type":"agent_message","text":"half"}}"#,
            r#"{"type":"turn.failed","error":{"message":"unexpected status 401 Unauthorized"}}"#,
            r#"{"type":"error","message":"later noise"}"#,
        ]);
        let c = capture(RunnerKind::Codex, &out);
        assert_eq!(
            c.error.as_deref(),
            Some("unexpected status 401 Unauthorized")
        );
        assert_eq!(c.answer, None);
        assert_eq!(c.activity.as_deref(), Some("half"));
        let c = capture(RunnerKind::Codex, &stream(&[reconnecting]));
        assert_eq!(
            c.error.as_deref(),
            Some("Reconnecting... 2/5 (stream disconnected)")
        );
    }

    #[test]
    fn a_pi_error_message_is_its_reason() {
        let out = stream(&[
            r#"{"type":"session","id":"p1"}"#,
            r#"{"type":"tool_execution_start","toolCallId":"c1","toolName":"read","args":{"path":"src/lib.rs"}}"#,
            r#"{"type":"message_end","message":{"role":"assistant","content":[],"stopReason":"error","errorMessage":"429 rate limited"}}"#,
            r#"{"type":"agent_end","messages":[]}"#,
        ]);
        let c = capture(RunnerKind::Pi, &out);
        assert_eq!(c.error.as_deref(), Some("429 rate limited"));
        assert_eq!(c.answer, None);
        assert!(!c.completed);
        assert_eq!(c.activity.as_deref(), Some("tool read: src/lib.rs"));
    }

    #[test]
    fn a_stream_cut_before_its_final_event_has_no_answer() {
        let codex = concat!(
            r#"{"type":"thread.started","thread_id":"t1"}"#,
            "\n",
            r#"{"type":"item.completed","item":{"type":"agent_message","text":"interim"}}"#,
            "\n",
            r#"{"type":"turn.comp"#,
        );
        let c = capture(RunnerKind::Codex, codex);
        assert_eq!((c.answer, c.completed), (None, false));
        assert_eq!(c.session_id.as_deref(), Some("t1"));
        let pi = stream(&[
            r#"{"type":"session","id":"p1"}"#,
            r#"{"type":"message_end","message":{"role":"assistant","content":[{"type":"text","text":"interim"}]}}"#,
        ]);
        assert_eq!(capture(RunnerKind::Pi, &pi).answer, None);
        let claude = stream(&[
            r#"{"type":"assistant","message":{"role":"assistant","content":[{"type":"text","text":"interim"}]}}"#,
        ]);
        assert_eq!(capture(RunnerKind::Claude, &claude).answer, None);
    }

    #[test]
    fn a_line_split_between_reads_is_read_once_whole() {
        let line = r#"{"type":"result","subtype":"success","result":"done","session_id":"s1"}"#;
        let mut s = Stream::new(RunnerKind::Claude);
        let (a, b) = line.split_at(20);
        s.feed(a.as_bytes());
        assert_eq!(s.captured().session_id, None);
        s.feed(format!("{b}\n").as_bytes());
        assert_eq!(s.captured().answer.as_deref(), Some("done"));
        assert_eq!(s.captured().session_id.as_deref(), Some("s1"));
        // A last line without its newline still counts when it is whole.
        assert_eq!(
            capture(RunnerKind::Claude, line).answer.as_deref(),
            Some("done")
        );
    }

    #[test]
    fn activity_is_one_bounded_line() {
        let long = "x".repeat(500);
        assert_eq!(
            first_line(&format!("\n  {long}\nsecond"))
                .unwrap()
                .chars()
                .count(),
            ACTIVITY_CHARS + 1
        );
        assert_eq!(first_line(" \n"), None);
        assert_eq!(bounded("héllo", 2), "hé…");
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

/// The fields of claude's `stream-json` the reader uses (`session_id`, and
/// the `result` event's `subtype`, `is_error`, `result`), each absent,
/// `null`, of the wrong type and empty: only `is_error: true` or a subtype
/// other than `success` is a failure (`false`, absent or a wrong type is
/// none), an unusable `result` leaves the last assistant text as the
/// answer, and an unusable session id is none, so a later event's id
/// counts (the init's and the result's ids differ, to show which is kept).
#[cfg(test)]
mod claude_fields {
    use serde_json::{Value, json};

    use super::*;

    fn stream(init_session: Option<Value>, result: &[(&str, Option<Value>)]) -> Captured {
        let mut init = json!({"type": "system", "subtype": "init", "session_id": "s-init"});
        let mut end = json!({"type": "result", "subtype": "success", "is_error": false,
                             "result": "the answer", "session_id": "s-result"});
        let set = |event: &mut Value, key: &str, value: &Option<Value>| match value {
            Some(v) => event[key] = v.clone(),
            None => {
                event.as_object_mut().unwrap().remove(key);
            }
        };
        if let Some(change) = init_session {
            set(&mut init, "session_id", &Some(change));
        }
        for (key, value) in result {
            set(&mut end, key, value);
        }
        let said = json!({"type": "assistant", "message": {"content": [{"type": "text", "text": "thinking"}]}});
        capture(RunnerKind::Claude, &format!("{init}\n{said}\n{end}\n"))
    }

    /// Completed, answer, error.
    type Outcome = (bool, Option<String>, Option<String>);

    fn ok(answer: &str) -> Outcome {
        (true, Some(answer.to_owned()), None)
    }

    fn outcome(c: &Captured) -> Outcome {
        (c.completed, c.answer.clone(), c.error.clone())
    }

    #[test]
    fn the_result_event_fields_absent_null_wrong_or_empty() {
        assert_eq!(outcome(&stream(None, &[])), ok("the answer"));
        let failed = (false, None, Some("the answer".to_owned()));
        let cases: [(&str, Option<Value>, Outcome); 15] = [
            ("is_error", None, ok("the answer")),
            ("is_error", Some(Value::Null), ok("the answer")),
            ("is_error", Some(json!("true")), ok("the answer")),
            ("is_error", Some(json!(true)), failed.clone()),
            ("subtype", None, ok("the answer")),
            ("subtype", Some(Value::Null), ok("the answer")),
            ("subtype", Some(json!(7)), ok("the answer")),
            ("subtype", Some(json!("")), ok("the answer")),
            ("subtype", Some(json!("error_max_turns")), failed),
            ("result", None, ok("thinking")),
            ("result", Some(Value::Null), ok("thinking")),
            ("result", Some(json!(7)), ok("thinking")),
            ("result", Some(json!("")), ok("thinking")),
            ("result", Some(json!("  \n")), ok("thinking")),
            ("result", Some(json!("the answer")), ok("the answer")),
        ];
        for (key, value, want) in cases {
            assert_eq!(
                outcome(&stream(None, &[(key, value.clone())])),
                want,
                "{key} = {value:?}"
            );
        }
        // A failure without words is named by its subtype, or as an error.
        let words = |changes: &[(&str, Option<Value>)]| stream(None, changes).error;
        let bare = [
            ("result", None),
            ("subtype", Some(json!("error_max_turns"))),
        ];
        assert_eq!(
            words(&bare).as_deref(),
            Some("claude ended with error_max_turns")
        );
        let bare = [
            ("result", None),
            ("is_error", Some(json!(true))),
            ("subtype", None),
        ];
        assert_eq!(words(&bare).as_deref(), Some("claude ended with error"));
    }

    #[test]
    fn an_unusable_session_id_is_none_and_a_later_one_counts() {
        assert_eq!(stream(None, &[]).session_id.as_deref(), Some("s-init"));
        for value in [Value::Null, json!(7), json!("")] {
            let c = stream(Some(value.clone()), &[]);
            assert_eq!(
                c.session_id.as_deref(),
                Some("s-result"),
                "init session_id = {value}"
            );
        }
        let none = stream(Some(json!("")), &[("session_id", Some(json!("")))]);
        assert_eq!(none.session_id, None);
    }
}

/// The fields of pi's `--mode json` and codex's `--json` the reader uses,
/// each absent, `null`, of the wrong type and empty: an unusable session
/// id is none; an unusable stop reason is no failure; a failure whose
/// words are unusable (absent, `null`, not text, blank) is named by the
/// CLI and its kind, never an empty error.
#[cfg(test)]
mod pi_and_codex_fields {
    use serde_json::{Value, json};

    use super::*;

    fn set(event: &mut Value, path: &[&str], value: &Option<Value>) {
        let (last, parents) = path.split_last().unwrap();
        let parent = parents.iter().fold(event, |v, k| &mut v[*k]);
        match value {
            Some(v) => parent[*last] = v.clone(),
            None => {
                parent.as_object_mut().unwrap().remove(*last);
            }
        }
    }

    fn unusable_text() -> [Option<Value>; 5] {
        [
            None,
            Some(Value::Null),
            Some(json!(7)),
            Some(json!("")),
            Some(json!(" \n")),
        ]
    }

    fn pi(session: Option<Option<Value>>, message: &[(&str, Option<Value>)]) -> Captured {
        let mut start = json!({"type": "session", "id": "pi-session"});
        if let Some(id) = session {
            set(&mut start, &["id"], &id);
        }
        let mut end = json!({"type": "message_end", "message": {
            "role": "assistant", "stopReason": "stop", "errorMessage": "quota exceeded",
            "content": [{"type": "text", "text": "pi answer"}]}});
        for (key, value) in message {
            set(&mut end, &["message", key], value);
        }
        let done = json!({"type": "agent_end"});
        capture(RunnerKind::Pi, &format!("{start}\n{end}\n{done}\n"))
    }

    #[test]
    fn pi_stop_reason_error_message_and_session_id() {
        let good = pi(None, &[]);
        assert_eq!(
            (good.answer.as_deref(), good.error),
            (Some("pi answer"), None)
        );
        assert_eq!(good.session_id.as_deref(), Some("pi-session"));
        for value in [None, Some(Value::Null), Some(json!(7)), Some(json!(""))] {
            let c = pi(None, &[("stopReason", value.clone())]);
            assert_eq!(
                c.answer.as_deref(),
                Some("pi answer"),
                "stopReason = {value:?}"
            );
            let c = pi(Some(value.clone()), &[]);
            assert_eq!(c.session_id, None, "session id = {value:?}");
        }
        for stop in ["error", "aborted"] {
            let c = pi(None, &[("stopReason", Some(json!(stop)))]);
            assert_eq!(
                (c.answer, c.error.as_deref()),
                (None, Some("quota exceeded")),
                "{stop}"
            );
            for words in unusable_text() {
                let c = pi(
                    None,
                    &[
                        ("stopReason", Some(json!(stop))),
                        ("errorMessage", words.clone()),
                    ],
                );
                let want = format!("pi {stop}");
                assert_eq!(
                    c.error.as_deref(),
                    Some(want.as_str()),
                    "{stop}, errorMessage = {words:?}"
                );
            }
        }
    }

    fn codex(thread: Option<Option<Value>>, last: Value) -> Captured {
        let mut start = json!({"type": "thread.started", "thread_id": "codex-thread"});
        if let Some(id) = thread {
            set(&mut start, &["thread_id"], &id);
        }
        let said = json!({"type": "item.completed", "item": {"type": "agent_message", "text": "codex answer"}});
        capture(RunnerKind::Codex, &format!("{start}\n{said}\n{last}\n"))
    }

    #[test]
    fn codex_failure_words_and_thread_id() {
        let good = codex(None, json!({"type": "turn.completed"}));
        assert_eq!(
            (good.answer.as_deref(), good.error),
            (Some("codex answer"), None)
        );
        assert_eq!(good.session_id.as_deref(), Some("codex-thread"));
        for value in [None, Some(Value::Null), Some(json!(7)), Some(json!(""))] {
            let c = codex(Some(value.clone()), json!({"type": "turn.completed"}));
            assert_eq!(c.session_id, None, "thread_id = {value:?}");
        }
        let failed = json!({"type": "turn.failed", "error": {"message": "rate limited"}});
        let c = codex(None, failed.clone());
        assert_eq!((c.answer, c.error.as_deref()), (None, Some("rate limited")));
        for words in unusable_text() {
            let mut event = failed.clone();
            set(&mut event, &["error", "message"], &words);
            let c = codex(None, event);
            assert_eq!(
                c.error.as_deref(),
                Some("codex turn failed"),
                "turn.failed message = {words:?}"
            );
        }
        let mut no_error = failed;
        set(&mut no_error, &["error"], &None);
        assert_eq!(
            codex(None, no_error).error.as_deref(),
            Some("codex turn failed")
        );
        // An `error` event's words, when usable, are the error until the
        // turn's own failure; unusable ones leave none.
        let error = json!({"type": "error", "message": "reconnecting"});
        assert_eq!(
            codex(None, error.clone()).error.as_deref(),
            Some("reconnecting")
        );
        for words in unusable_text() {
            let mut event = error.clone();
            set(&mut event, &["message"], &words);
            assert_eq!(codex(None, event).error, None, "error message = {words:?}");
        }
    }
}

/// The rules a unit test of each stream shape alone would not pin down:
/// long lines, codex's item kinds and failed turns, pi's fallback to the
/// messages of `agent_end`, where each CLI keeps its sessions, and how deep
/// a session store is searched.
#[cfg(test)]
mod stream_rules {
    use std::collections::BTreeMap;

    use super::*;

    fn stream(lines: &[&str]) -> String {
        lines.iter().map(|l| format!("{l}\n")).collect()
    }

    #[test]
    fn a_line_of_megabytes_split_over_reads_is_read_whole() {
        // 2 MiB of answer, fed as 1.5 MiB, then the rest, then the newline:
        // the kept part must grow by the sum of the reads, up to 64 MiB.
        let answer = "a".repeat(2 * 1024 * 1024);
        let line = format!(r#"{{"type":"result","subtype":"success","result":"{answer}"}}"#);
        let (head, tail) = line.split_at(1536 * 1024);
        let mut s = Stream::new(RunnerKind::Claude);
        s.feed(head.as_bytes());
        s.feed(tail.as_bytes());
        s.feed(b"\n");
        assert_eq!(s.captured().answer.as_deref(), Some(answer.as_str()));
        // Small reads of a line longer than a page add up the same way.
        let line = format!(
            r#"{{"type":"result","subtype":"success","result":"{}"}}"#,
            "b".repeat(30_000)
        );
        let mut s = Stream::new(RunnerKind::Claude);
        for chunk in line.as_bytes().chunks(10_000) {
            s.feed(chunk);
        }
        assert_eq!(s.finish().answer.map(|a| a.len()), Some(30_000));
    }

    #[test]
    fn codex_activity_names_the_command_or_the_kind_of_item() {
        let activity = |item: &str| {
            let event = format!(r#"{{"type":"item.started","item":{item}}}"#);
            capture(RunnerKind::Codex, &stream(&[&event])).activity
        };
        assert_eq!(
            activity(r#"{"type":"command_execution","command":"cargo test\n-p x"}"#).as_deref(),
            Some("$ cargo test")
        );
        for (kind, said) in [
            ("file_change", "file change"),
            ("mcp_tool_call", "mcp tool call"),
            ("web_search", "web search"),
        ] {
            let item = format!(r#"{{"type":"{kind}","id":"i1"}}"#);
            assert_eq!(activity(&item).as_deref(), Some(said), "{kind}");
        }
        assert_eq!(activity(r#"{"type":"reasoning","text":"hmm"}"#), None);
    }

    #[test]
    fn only_a_completed_codex_message_is_said() {
        let out = stream(&[
            r#"{"type":"thread.started","thread_id":"t1"}"#,
            r#"{"type":"item.completed","item":{"type":"agent_message","text":"final words"}}"#,
            r#"{"type":"item.started","item":{"type":"agent_message","text":"a draft"}}"#,
            r#"{"type":"turn.completed","usage":{}}"#,
        ]);
        let c = capture(RunnerKind::Codex, &out);
        assert_eq!(c.answer.as_deref(), Some("final words"));
        assert_eq!(c.activity.as_deref(), Some("final words"));
        assert!(c.completed);
    }

    #[test]
    fn a_failed_codex_turn_stays_failed_when_a_turn_completes_after_it() {
        let out = stream(&[
            r#"{"type":"thread.started","thread_id":"t1"}"#,
            r#"{"type":"item.completed","item":{"type":"agent_message","text":"half"}}"#,
            r#"{"type":"turn.failed","error":{"message":"quota exceeded"}}"#,
            r#"{"type":"turn.completed","usage":{}}"#,
        ]);
        let c = capture(RunnerKind::Codex, &out);
        assert_eq!(c.answer, None);
        assert!(!c.completed);
        assert_eq!(c.error.as_deref(), Some("quota exceeded"));
    }

    #[test]
    fn pi_falls_back_to_the_last_assistant_text_of_agent_end() {
        // No `message_end` came (the stream started late, or pi printed
        // none): the answer is the text of the last assistant message that
        // has any, read from `agent_end`'s messages.
        let out = stream(&[
            r#"{"type":"session","id":"p1"}"#,
            concat!(
                r#"{"type":"agent_end","messages":["#,
                r#"{"role":"user","content":[{"type":"text","text":"the question"}]},"#,
                r#"{"role":"assistant","content":[{"type":"text","text":"old"}]},"#,
                r#"{"role":"assistant","content":[{"type":"text","text":"the "},{"type":"toolCall","name":"read","arguments":{}},{"type":"text","text":"answer"}]},"#,
                r#"{"role":"assistant","content":[{"type":"toolCall","name":"ls","arguments":{}}]},"#,
                r#"{"role":"toolResult","content":[{"type":"text","text":"file list"}]}"#,
                r#"]}"#
            ),
        ]);
        let c = capture(RunnerKind::Pi, &out);
        assert_eq!(c.answer.as_deref(), Some("the answer"));
        assert!(c.completed);
        // With no assistant text at all there is no answer.
        let out = stream(&[concat!(
            r#"{"type":"agent_end","messages":["#,
            r#"{"role":"user","content":[{"type":"text","text":"the question"}]},"#,
            r#"{"role":"assistant","content":[{"type":"toolCall","name":"ls","arguments":{}}]}"#,
            r#"]}"#
        )]);
        let c = capture(RunnerKind::Pi, &out);
        assert_eq!((c.answer, c.completed), (None, true));
    }

    #[test]
    fn each_cli_keeps_its_sessions_under_its_variable_or_its_home_directory() {
        let env = |pairs: &[(&str, &str)]| {
            let vars: BTreeMap<String, String> = pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            move |key: &str| vars.get(key).cloned()
        };
        let home_only = env(&[("HOME", "/home/me")]);
        assert_eq!(
            session_store(RunnerKind::Claude, &home_only),
            Some(PathBuf::from("/home/me/.claude/projects"))
        );
        assert_eq!(
            session_store(RunnerKind::Codex, &home_only),
            Some(PathBuf::from("/home/me/.codex/sessions"))
        );
        assert_eq!(
            session_store(RunnerKind::Pi, &home_only),
            Some(PathBuf::from("/home/me/.pi/agent/sessions"))
        );
        assert_eq!(session_store(RunnerKind::Command, &home_only), None);
        let set = env(&[
            ("HOME", "/home/me"),
            ("CLAUDE_CONFIG_DIR", "/cfg/claude"),
            ("CODEX_HOME", "/cfg/codex"),
            ("PI_CODING_AGENT_DIR", "/cfg/pi"),
        ]);
        assert_eq!(
            session_store(RunnerKind::Claude, &set),
            Some(PathBuf::from("/cfg/claude/projects"))
        );
        assert_eq!(
            session_store(RunnerKind::Codex, &set),
            Some(PathBuf::from("/cfg/codex/sessions"))
        );
        assert_eq!(
            session_store(RunnerKind::Pi, &set),
            Some(PathBuf::from("/cfg/pi/sessions"))
        );
        // An empty variable is unset; an empty HOME is no home.
        let empty = env(&[("HOME", "/home/me"), ("CODEX_HOME", "")]);
        assert_eq!(
            session_store(RunnerKind::Codex, &empty),
            Some(PathBuf::from("/home/me/.codex/sessions"))
        );
        let no_home = env(&[("HOME", "")]);
        assert_eq!(session_store(RunnerKind::Claude, &no_home), None);
        assert_eq!(session_store(RunnerKind::Pi, &env(&[])), None);
    }

    #[test]
    fn a_session_file_is_found_four_directories_deep_and_no_deeper() {
        let tmp = tempfile::tempdir().unwrap();
        let four = tmp.path().join("a/b/c/d");
        std::fs::create_dir_all(four.join("e")).unwrap();
        std::fs::write(four.join("x_id4.jsonl"), "").unwrap();
        std::fs::write(four.join("e/x_id5.jsonl"), "").unwrap();
        assert_eq!(
            locate_session_file(tmp.path(), "id4"),
            Some(four.join("x_id4.jsonl"))
        );
        assert_eq!(locate_session_file(tmp.path(), "id5"), None);
    }
}
