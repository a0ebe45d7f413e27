//! The non-interactive invocation of each CLI, rendered from a definition,
//! and the invocation that continues the CLI's own session.
//!
//! Every preset reads the task from **stdin** (the runner connects the run's
//! task file to it), so the task is never on an argv. Each CLI prints a
//! machine-readable event stream that carries its session id and its final
//! answer ([`crate::capture`]):
//!
//! | runner | new run | resumed run |
//! | --- | --- | --- |
//! | `claude` | `claude -p --output-format stream-json --verbose --session-id <uuid> …` | `claude -p … --resume <id>` |
//! | `codex` | `codex exec --json --skip-git-repo-check … -` | `codex exec resume --json … <id> -` |
//! | `pi` | `pi -p --mode json …` | `pi -p --mode json … --session <file>` |
//!
//! The flags come from each CLI's `--help` (Claude Code 2.1, codex-cli
//! 0.171, pi 0.x); comments below cite the help text where the choice is
//! not obvious.

use std::collections::BTreeMap;
use std::path::Path;

use crate::definition::{AgentDefinition, PromptMode, ResumePrompt, RunnerKind};
use crate::{RESUME_PROMPT_ENV, RUNNER_ENV, SESSION_ID_ENV};

/// A rendered command: its argv and the environment it adds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    /// Program and arguments (no task text; `{task_file}` may remain for a
    /// `command` runner, the runner replaces it).
    pub argv: Vec<String>,
    /// The definition's `env` plus `$SUBAGENTS_AGENT_RUNNER` (and the
    /// session id when it is chosen up front).
    pub env: BTreeMap<String, String>,
}

/// Why an invocation could not be rendered.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum PresetError {
    /// A Claude session id must be a UUID (`claude --help`: `--session-id <uuid>`).
    #[error("failed to render the claude invocation: session id '{0}' is not a UUID")]
    NotUuid(String),
    /// A captured session id that cannot be handed to a CLI safely.
    #[error("failed to resume the agent session: session id '{0}' is not a plain id")]
    BadSessionId(String),
    /// The recorded command is not one this preset rendered.
    #[error(
        "failed to resume the agent session: the recorded command is not a {0} preset invocation"
    )]
    NotPreset(RunnerKind),
    /// A `command` runner has no session of its own to resume.
    #[error("failed to resume the agent session: runner 'command' keeps no session")]
    NoSession,
}

/// Renders the invocation of a new run of `def`. `session_id` is used where
/// the CLI lets the caller choose it (Claude: a UUID); others print theirs.
pub fn render(def: &AgentDefinition, session_id: &str) -> Result<Invocation, PresetError> {
    let mut env = def.env.clone();
    env.insert(RUNNER_ENV.into(), def.runner.as_str().into());
    let argv = match def.runner {
        RunnerKind::Claude => {
            if !is_uuid(session_id) {
                return Err(PresetError::NotUuid(session_id.into()));
            }
            env.insert(SESSION_ID_ENV.into(), session_id.into());
            claude(def, &["--session-id", session_id])
        }
        RunnerKind::Codex => codex(def),
        RunnerKind::Pi => pi(def),
        RunnerKind::Command => {
            if def.resume_prompt == ResumePrompt::Revival {
                env.insert(RESUME_PROMPT_ENV.into(), "revival".into());
            }
            def.command.clone()
        }
    };
    Ok(Invocation { argv, env })
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

/// `-p` prints the response and exits; with `--output-format stream-json`
/// every event is a JSON line, which `claude --help` says needs `--verbose`
/// in print mode. With no prompt argument, `-p` reads the prompt from stdin.
fn claude(def: &AgentDefinition, session: &[&str]) -> Vec<String> {
    let mut argv = strings(&[
        "claude",
        "-p",
        "--output-format",
        "stream-json",
        "--verbose",
    ]);
    argv.extend(strings(session));
    if let Some(model) = &def.model {
        argv.extend(["--model".into(), model.clone()]);
    }
    // `--effort <level>`: low, medium, high, xhigh, max; no "off".
    if let Some(effort) = def.thinking.as_deref().and_then(claude_effort) {
        argv.extend(["--effort".into(), effort.into()]);
    }
    if let Some(mode) = &def.permission_mode {
        argv.extend(["--permission-mode".into(), mode.clone()]);
    }
    if !def.system_prompt.is_empty() {
        let flag = match def.system_prompt_mode {
            PromptMode::Replace => "--system-prompt",
            PromptMode::Append => "--append-system-prompt",
        };
        argv.extend([flag.into(), def.system_prompt.clone()]);
    }
    // Last: `--tools <tools...>` is variadic; one comma-separated value.
    if !def.tools.is_empty() {
        argv.extend(["--tools".into(), def.tools.join(",")]);
    }
    argv
}

fn claude_effort(level: &str) -> Option<&'static str> {
    match level {
        "minimal" | "low" => Some("low"),
        "medium" => Some("medium"),
        "high" => Some("high"),
        "xhigh" => Some("xhigh"),
        _ => None,
    }
}

/// `codex exec --json` prints events as JSON lines; `-` reads the prompt
/// from stdin (`codex exec --help`: "If not provided as an argument (or if
/// `-` is used), instructions are read from stdin"). A background run has no
/// one to answer the trust prompt of a directory outside git, hence
/// `--skip-git-repo-check`. Codex has no tool allowlist (its sandbox policy
/// comes from its own config), so `tools` is not rendered.
fn codex(def: &AgentDefinition) -> Vec<String> {
    let mut argv = strings(&["codex", "exec"]);
    argv.extend(codex_flags(def));
    argv.push("-".into());
    argv
}

fn codex_flags(def: &AgentDefinition) -> Vec<String> {
    let mut argv = strings(&["--json", "--skip-git-repo-check"]);
    if let Some(model) = &def.model {
        argv.extend(["-m".into(), model.clone()]);
    }
    if let Some(level) = &def.thinking {
        let effort = if level == "off" { "minimal" } else { level };
        argv.extend([
            "-c".into(),
            format!("model_reasoning_effort={}", toml_string(effort)),
        ]);
    }
    // `-c sandbox_mode=…` rather than `--sandbox`: `codex exec resume`
    // accepts `-c` but not `--sandbox`, and a resumed run keeps the flags.
    if let Some(mode) = &def.sandbox {
        argv.extend(["-c".into(), format!("sandbox_mode={}", toml_string(mode))]);
    }
    // Codex has no flag for a system prompt; `developer_instructions` in its
    // config adds a developer message to every turn (both modes map to it).
    if !def.system_prompt.is_empty() {
        argv.extend([
            "-c".into(),
            format!("developer_instructions={}", toml_string(&def.system_prompt)),
        ]);
    }
    argv
}

/// `pi -p` processes the prompt and exits; with no message argument it reads
/// piped stdin. `--mode json` prints the session header and every event as
/// JSON lines (pi's `--mode json` event stream; docs/protocol/agents.md §5.1).
fn pi(def: &AgentDefinition) -> Vec<String> {
    let mut argv = strings(&["pi", "-p", "--mode", "json"]);
    if let Some(model) = &def.model {
        argv.extend(["--model".into(), model.clone()]);
    }
    if let Some(level) = &def.thinking {
        argv.extend(["--thinking".into(), level.clone()]);
    }
    if !def.tools.is_empty() {
        argv.extend(["--tools".into(), def.tools.join(",")]);
    }
    if !def.system_prompt.is_empty() {
        let flag = match def.system_prompt_mode {
            PromptMode::Replace => "--system-prompt",
            PromptMode::Append => "--append-system-prompt",
        };
        argv.extend([flag.into(), def.system_prompt.clone()]);
    }
    argv
}

/// A TOML basic string (codex parses `-c key=value` values as TOML).
fn toml_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn is_uuid(text: &str) -> bool {
    let groups: Vec<&str> = text.split('-').collect();
    groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12])
        && groups
            .iter()
            .all(|g| g.chars().all(|c| c.is_ascii_hexdigit()))
}

/// A session id safe to pass as one argument: letters, digits, `-`, `_`,
/// `.`; not starting with `-`; at most 200 characters.
pub fn is_plain_session_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 200
        && !id.starts_with(['-', '.'])
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// The argv that continues session `id` of the run whose argv was `argv`
/// (model, prompt and flags kept; the follow-up goes to stdin as the new
/// user turn). `file` is the session file, when known (pi opens it directly).
pub fn resume_argv(
    kind: RunnerKind,
    argv: &[String],
    id: &str,
    file: Option<&Path>,
) -> Result<Vec<String>, PresetError> {
    if !is_plain_session_id(id) {
        return Err(PresetError::BadSessionId(id.into()));
    }
    match kind {
        RunnerKind::Claude => resume_claude(argv, id),
        RunnerKind::Codex => resume_codex(argv, id),
        RunnerKind::Pi => resume_pi(argv, id, file),
        RunnerKind::Command => Err(PresetError::NoSession),
    }
}

/// Removes `flag VALUE` pairs from `argv`.
fn without(argv: &[String], flag: &str) -> Vec<String> {
    let mut out = Vec::with_capacity(argv.len());
    let mut skip = false;
    for arg in argv {
        if skip {
            skip = false;
        } else if arg == flag {
            skip = true;
        } else {
            out.push(arg.clone());
        }
    }
    out
}

/// `-r, --resume [value]`: "Resume a conversation by session ID" (it keeps
/// the id unless `--fork-session` is given).
fn resume_claude(argv: &[String], id: &str) -> Result<Vec<String>, PresetError> {
    if argv.get(1).map(String::as_str) != Some("-p") {
        return Err(PresetError::NotPreset(RunnerKind::Claude));
    }
    let mut out = without(&without(argv, "--session-id"), "--resume");
    out.splice(
        5.min(out.len())..5.min(out.len()),
        ["--resume".to_owned(), id.to_owned()],
    );
    Ok(out)
}

/// `codex exec resume [OPTIONS] [SESSION_ID] [PROMPT]`, `-` reading the
/// prompt from stdin; it accepts the `exec` flags this preset renders.
fn resume_codex(argv: &[String], id: &str) -> Result<Vec<String>, PresetError> {
    if argv.get(1).map(String::as_str) != Some("exec")
        || argv.last().map(String::as_str) != Some("-")
    {
        return Err(PresetError::NotPreset(RunnerKind::Codex));
    }
    let mut flags = &argv[2..argv.len() - 1];
    if flags.first().map(String::as_str) == Some("resume") {
        // A resumed run's argv: `exec resume FLAGS… OLD_ID -`.
        flags = &flags[1..flags.len().saturating_sub(1)];
    }
    let mut out = vec![argv[0].clone(), "exec".into(), "resume".into()];
    out.extend(flags.iter().cloned());
    out.extend([id.to_owned(), "-".to_owned()]);
    Ok(out)
}

/// `--session <path|id>`: "Use specific session file or partial UUID".
fn resume_pi(argv: &[String], id: &str, file: Option<&Path>) -> Result<Vec<String>, PresetError> {
    if argv.get(1).map(String::as_str) != Some("-p") {
        return Err(PresetError::NotPreset(RunnerKind::Pi));
    }
    let mut out = without(argv, "--session");
    let target = file.map_or_else(|| id.to_owned(), |f| f.display().to_string());
    out.extend(["--session".to_owned(), target]);
    Ok(out)
}

/// The session id `subagents agents show` and the snapshots render a new
/// Claude run with (`run` picks a fresh UUID).
pub const PLACEHOLDER_SESSION_ID: &str = "00000000-0000-4000-8000-000000000000";

/// An argv as it would be typed in a POSIX shell (for display only).
pub fn shell_words(argv: &[String]) -> String {
    argv.iter()
        .map(|a| {
            let plain = !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./:=,{}@+".contains(c));
            if plain {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_strings_are_escaped() {
        assert_eq!(toml_string("a \"b\"\n\\"), r#""a \"b\"\n\\""#);
    }

    #[test]
    fn session_ids_are_checked() {
        assert!(is_plain_session_id("01a22b26-b94d-7941-a97b-044129357545"));
        assert!(!is_plain_session_id("--dangerously-skip-permissions"));
        assert!(!is_plain_session_id("a b"));
        assert!(!is_uuid("not-a-uuid"));
    }

    #[test]
    fn a_resumed_codex_run_resumes_again() {
        let first: Vec<String> = strings(&["codex", "exec", "--json", "-m", "o3", "-"]);
        let second = resume_codex(&first, "id1").unwrap();
        assert_eq!(
            second,
            strings(&["codex", "exec", "resume", "--json", "-m", "o3", "id1", "-"])
        );
        assert_eq!(resume_codex(&second, "id1").unwrap(), second);
    }

    #[test]
    fn a_foreign_command_is_not_resumed() {
        let argv = strings(&["sh", "-c", "x"]);
        assert_eq!(
            resume_argv(RunnerKind::Claude, &argv, "abc", None),
            Err(PresetError::NotPreset(RunnerKind::Claude))
        );
        assert_eq!(
            resume_argv(RunnerKind::Pi, &argv, "-x", None),
            Err(PresetError::BadSessionId("-x".into()))
        );
    }

    fn definition(front_matter: &str, body: &str) -> AgentDefinition {
        crate::definition::parse_definition(
            &format!("---\n{front_matter}\n---\n{body}"),
            Path::new("/a/x.md"),
            RunnerKind::Pi,
        )
        .unwrap()
    }

    /// The value after `flag` in `argv`.
    fn after<'a>(argv: &'a [String], flag: &str) -> Option<&'a str> {
        let at = argv.iter().position(|a| a == flag)?;
        argv.get(at + 1).map(String::as_str)
    }

    #[test]
    fn each_thinking_level_is_a_claude_effort() {
        for (thinking, effort) in [
            ("off", None),
            ("minimal", Some("low")),
            ("low", Some("low")),
            ("medium", Some("medium")),
            ("high", Some("high")),
            ("xhigh", Some("xhigh")),
        ] {
            let def = definition(&format!("runner: claude\nthinking: {thinking}"), "");
            let argv = render(&def, PLACEHOLDER_SESSION_ID).unwrap().argv;
            assert_eq!(after(&argv, "--effort"), effort, "{thinking}: {argv:?}");
        }
    }

    #[test]
    fn a_control_character_of_a_codex_prompt_is_a_unicode_escape() {
        let def = definition("runner: codex", "Say \u{1b}[1mhi\u{7f} \"now\"\tplease");
        let argv = render(&def, "unused").unwrap().argv;
        assert_eq!(
            after(&argv, "-c"),
            Some(r#"developer_instructions="Say \u001B[1mhi\u007F \"now\"\tplease""#)
        );
    }

    #[test]
    fn a_claude_session_id_is_five_groups_of_hex_digits() {
        let def = definition("runner: claude", "");
        for id in [
            "0123abcd",
            "0123abcd-0123-4567-89ab",
            "0123abcd-0123-4567-89ab-0123456789abc",
            "0123abcg-0123-4567-89ab-0123456789ab",
            "0123abcd-0123-4567-89ab-0123456789a ",
        ] {
            assert_eq!(
                render(&def, id),
                Err(PresetError::NotUuid(id.into())),
                "{id}"
            );
        }
        let id = "0123ABCD-0123-4567-89ab-0123456789ab";
        let argv = render(&def, id).unwrap().argv;
        assert_eq!(after(&argv, "--session-id"), Some(id));
    }

    #[test]
    fn a_codex_argv_is_resumed_only_when_it_is_exec_reading_stdin() {
        for argv in [
            strings(&["codex", "exec", "--json", "the task"]),
            strings(&["codex", "--json", "-m", "o3", "-"]),
            strings(&["sh", "-c", "codex exec", "-"]),
        ] {
            assert_eq!(
                resume_argv(RunnerKind::Codex, &argv, "id1", None),
                Err(PresetError::NotPreset(RunnerKind::Codex)),
                "{argv:?}"
            );
        }
    }
}
