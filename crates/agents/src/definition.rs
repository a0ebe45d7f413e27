//! One agent definition file: YAML front matter between `---` lines, then
//! the system prompt.

use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_yaml_ng::Value;

/// A definition file larger than this is refused (it is a prompt, not data).
pub const MAX_FILE_BYTES: u64 = 1024 * 1024;

/// Which CLI runs the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RunnerKind {
    /// pi (`@mariozechner/pi-coding-agent`).
    Pi,
    /// Claude Code (`@anthropic-ai/claude-code`).
    Claude,
    /// Codex (`@openai/codex`).
    Codex,
    /// Any program, from the definition's `command` argv template.
    Command,
}

impl RunnerKind {
    /// The name used in front matter and in `$SUBAGENTS_AGENT_RUNNER`.
    pub fn as_str(self) -> &'static str {
        match self {
            RunnerKind::Pi => "pi",
            RunnerKind::Claude => "claude",
            RunnerKind::Codex => "codex",
            RunnerKind::Command => "command",
        }
    }

    /// The kind named `name`, if any.
    pub fn parse(name: &str) -> Option<Self> {
        match name.trim() {
            "pi" => Some(RunnerKind::Pi),
            "claude" => Some(RunnerKind::Claude),
            "codex" => Some(RunnerKind::Codex),
            "command" => Some(RunnerKind::Command),
            _ => None,
        }
    }

    /// A CLI whose output and session this crate understands.
    pub fn is_agent_cli(self) -> bool {
        self != RunnerKind::Command
    }
}

impl fmt::Display for RunnerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How the body is combined with the CLI's own system prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptMode {
    /// The body replaces the CLI's system prompt (pi-subagents' default).
    Replace,
    /// The body is appended to the CLI's system prompt.
    Append,
}

impl PromptMode {
    /// `replace` or `append`, as in the recovery descriptor.
    pub fn as_str(self) -> &'static str {
        match self {
            PromptMode::Replace => "replace",
            PromptMode::Append => "append",
        }
    }
}

/// What a resumed `command` run receives on stdin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResumePrompt {
    /// The follow-up exactly as given.
    Verbatim,
    /// The follow-up wrapped in the reference's revival prompt (for programs
    /// that keep no session of their own and must be told about the last one).
    Revival,
}

/// One parsed agent definition.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentDefinition {
    /// The agent's name (front matter `name`, else the file stem).
    pub name: String,
    /// One line on what the agent is for.
    pub description: Option<String>,
    /// Which CLI runs it.
    pub runner: RunnerKind,
    /// For [`RunnerKind::Command`]: the argv template (`{task_file}` allowed).
    pub command: Vec<String>,
    /// The model, as the CLI names it.
    pub model: Option<String>,
    /// Thinking level (`off`, `minimal`, `low`, `medium`, `high`, `xhigh`).
    pub thinking: Option<String>,
    /// Tool allowlist, as the CLI names its tools (empty: the CLI's default).
    pub tools: Vec<String>,
    /// Claude Code's `--permission-mode`, when set.
    pub permission_mode: Option<String>,
    /// Codex's `sandbox_mode` (`read-only`, `workspace-write`,
    /// `danger-full-access`), when set.
    pub sandbox: Option<String>,
    /// Working directory of the run (relative paths: from the caller's cwd).
    pub cwd: Option<PathBuf>,
    /// Wall-clock limit in milliseconds (`timeout: 20m` or `timeoutMs`).
    pub timeout_ms: Option<u64>,
    /// `idleTimeout` as written (`2m`, `0` for off): how long the agent may
    /// print nothing before its step is ended. Kept as text: the launcher
    /// parses it with the one duration syntax of `--idle-timeout`.
    pub idle_timeout: Option<String>,
    /// Extra environment of the agent's process.
    pub env: BTreeMap<String, String>,
    /// The body: the system prompt (trimmed; empty for none).
    pub system_prompt: String,
    /// How the system prompt is combined with the CLI's own.
    pub system_prompt_mode: PromptMode,
    /// What a resumed `command` run gets on stdin.
    pub resume_prompt: ResumePrompt,
    /// The file it was read from.
    pub path: PathBuf,
    /// Where its runs execute (`local` or `slurm`), when the definition says.
    pub executor: Option<String>,
    /// The Slurm partition of its runs (`slurmPartition`).
    pub slurm_partition: Option<String>,
    /// Extra `sbatch` options of its runs (`slurmArgs`).
    pub slurm_args: Vec<String>,
}

/// Why a definition file could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DefinitionError {
    /// The file could not be read.
    #[error("failed to read agent definition {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file breaks a rule; `line` is 1-based in the file.
    #[error("failed to parse agent definition {}:{line}: {message}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The line of the problem (1-based, counted in the whole file).
        line: usize,
        /// What is wrong.
        message: String,
    },
}

impl DefinitionError {
    /// The file the error is about.
    pub fn path(&self) -> &Path {
        match self {
            DefinitionError::Read { path, .. } | DefinitionError::Invalid { path, .. } => path,
        }
    }
}

/// The front matter as written; unknown keys (pi-subagents and Claude Code
/// have many more) are ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct FrontMatter {
    name: Option<String>,
    description: Option<String>,
    runner: Option<String>,
    command: Option<Vec<String>>,
    model: Option<String>,
    thinking: Option<String>,
    tools: Option<Value>,
    permission_mode: Option<String>,
    sandbox: Option<String>,
    cwd: Option<String>,
    timeout: Option<Value>,
    timeout_ms: Option<u64>,
    idle_timeout: Option<String>,
    env: Option<BTreeMap<String, Value>>,
    system_prompt_mode: Option<String>,
    resume_prompt: Option<String>,
    executor: Option<String>,
    #[serde(alias = "slurm_partition")]
    slurm_partition: Option<String>,
    #[serde(alias = "slurm_args")]
    slurm_args: Option<Vec<String>>,
}

/// Reads and parses `path`; `default_runner` applies when the front matter
/// names none (`pi` for `.pi/agents`, `claude` for `.claude/agents`).
pub fn read_definition(
    path: &Path,
    default_runner: RunnerKind,
) -> Result<AgentDefinition, DefinitionError> {
    let read_error = |source| DefinitionError::Read {
        path: path.to_path_buf(),
        source,
    };
    // Non-blocking, then checked: a FIFO or device named `*.md` must not
    // hang or flood a listing.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(read_error)?;
    if !file.metadata().map_err(read_error)?.is_file() {
        return Err(invalid(path, 1, "not a regular file".into()));
    }
    let mut text = String::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(read_error)?;
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(invalid(
            path,
            1,
            format!("larger than {MAX_FILE_BYTES} bytes"),
        ));
    }
    parse_definition(&text, path, default_runner)
}

/// Parses the text of a definition file (`path` names it in errors and is
/// recorded as its origin).
pub fn parse_definition(
    text: &str,
    path: &Path,
    default_runner: RunnerKind,
) -> Result<AgentDefinition, DefinitionError> {
    let (yaml, body) = split(text).ok_or_else(|| {
        invalid(
            path,
            1,
            "missing front matter: the file must start with a '---' line and close it with another"
                .into(),
        )
    })?;
    // Line 1 is the opening `---`; YAML line 1 is file line 2.
    let front: FrontMatter = if yaml.trim().is_empty() {
        FrontMatter::default()
    } else {
        serde_yaml_ng::from_str(yaml).map_err(|e| {
            let line = e.location().map_or(1, |l| l.line()) + 1;
            invalid(path, line, yaml_message(&e))
        })?
    };
    build(front, yaml, body, path, default_runner)
}

/// The message of a YAML error without serde_yaml's own " at line N" tail.
fn yaml_message(e: &serde_yaml_ng::Error) -> String {
    let text = e.to_string();
    match text.find(" at line ") {
        Some(at) => text[..at].to_owned(),
        None => text,
    }
}

fn invalid(path: &Path, line: usize, message: String) -> DefinitionError {
    DefinitionError::Invalid {
        path: path.to_path_buf(),
        line,
        message,
    }
}

/// (front matter, body) of a file that opens with a `---` line.
fn split(text: &str) -> Option<(&str, &str)> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let rest = text
        .strip_prefix("---\n")
        .or_else(|| text.strip_prefix("---\r\n"))?;
    let mut offset = 0;
    for line in rest.split_inclusive('\n') {
        if line.trim_end() == "---" {
            return Some((&rest[..offset], &rest[offset + line.len()..]));
        }
        offset += line.len();
    }
    None
}

/// The file line of front-matter key `key` (for errors found after parsing).
fn key_line(yaml: &str, key: &str) -> usize {
    yaml.lines()
        .position(|l| l.strip_prefix(key).is_some_and(|r| r.starts_with(':')))
        .map_or(1, |i| i + 2)
}

fn build(
    front: FrontMatter,
    yaml: &str,
    body: &str,
    path: &Path,
    default_runner: RunnerKind,
) -> Result<AgentDefinition, DefinitionError> {
    let fail = |key: &str, message: String| invalid(path, key_line(yaml, key), message);
    let name = match non_empty(front.name) {
        Some(name) => name,
        None => {
            file_stem(path).ok_or_else(|| fail("name", "name must be a non-empty string".into()))?
        }
    };
    if name.chars().any(|c| c.is_whitespace() || c == '/') {
        return Err(fail(
            "name",
            format!("name '{name}' must not contain spaces or '/'"),
        ));
    }
    let runner = match non_empty(front.runner) {
        Some(text) => RunnerKind::parse(&text).ok_or_else(|| {
            fail(
                "runner",
                format!("runner '{text}' is not one of pi, claude, codex, command"),
            )
        })?,
        None => default_runner,
    };
    let command = front.command.unwrap_or_default();
    match runner {
        RunnerKind::Command if command.first().is_none_or(|p| p.trim().is_empty()) => {
            return Err(fail(
                "runner",
                "runner 'command' needs 'command', a list whose first item is the program".into(),
            ));
        }
        RunnerKind::Command => {}
        _ if !command.is_empty() => {
            return Err(fail(
                "command",
                format!("'command' is only for runner 'command', not '{runner}'"),
            ));
        }
        _ => {}
    }
    let tools = match front.tools {
        None | Some(Value::Null) => Vec::new(),
        Some(value) => string_list(&value).ok_or_else(|| {
            fail(
                "tools",
                "tools must be a comma-separated string or a list of strings".into(),
            )
        })?,
    };
    let thinking = non_empty(front.thinking);
    if let Some(level) = &thinking
        && !THINKING_LEVELS.contains(&level.as_str())
    {
        return Err(fail(
            "thinking",
            format!(
                "thinking '{level}' is not one of {}",
                THINKING_LEVELS.join(", ")
            ),
        ));
    }
    let timeout_ms = timeout(front.timeout.as_ref(), front.timeout_ms).map_err(|message| {
        fail(
            if front.timeout.is_some() {
                "timeout"
            } else {
                "timeoutMs"
            },
            message,
        )
    })?;
    let env = environment(front.env.unwrap_or_default()).map_err(|m| fail("env", m))?;
    let system_prompt_mode = match non_empty(front.system_prompt_mode).as_deref() {
        None | Some("replace") => PromptMode::Replace,
        Some("append") => PromptMode::Append,
        Some(other) => {
            return Err(fail(
                "systemPromptMode",
                format!("systemPromptMode '{other}' is not one of replace, append"),
            ));
        }
    };
    let resume_prompt = match non_empty(front.resume_prompt).as_deref() {
        None | Some("verbatim") => ResumePrompt::Verbatim,
        Some("revival") => ResumePrompt::Revival,
        Some(other) => {
            return Err(fail(
                "resumePrompt",
                format!("resumePrompt '{other}' is not one of verbatim, revival"),
            ));
        }
    };
    let executor = non_empty(front.executor);
    if let Some(text) = &executor
        && !["local", "slurm"].contains(&text.as_str())
    {
        return Err(fail(
            "executor",
            format!("executor '{text}' is not one of local, slurm"),
        ));
    }
    Ok(AgentDefinition {
        executor,
        slurm_partition: non_empty(front.slurm_partition),
        slurm_args: front.slurm_args.unwrap_or_default(),
        name,
        description: non_empty(front.description),
        runner,
        command,
        // Claude Code's `model: inherit` means "the CLI's default".
        model: non_empty(front.model).filter(|m| m != "inherit"),
        thinking,
        tools,
        permission_mode: non_empty(front.permission_mode),
        sandbox: non_empty(front.sandbox),
        cwd: non_empty(front.cwd).map(PathBuf::from),
        timeout_ms,
        idle_timeout: non_empty(front.idle_timeout),
        env,
        system_prompt: body.trim().to_owned(),
        system_prompt_mode,
        resume_prompt,
        path: path.to_path_buf(),
    })
}

/// The thinking levels pi names (`pi --help`); the other presets map them.
pub const THINKING_LEVELS: [&str; 6] = ["off", "minimal", "low", "medium", "high", "xhigh"];

fn non_empty(text: Option<String>) -> Option<String> {
    text.map(|t| t.trim().to_owned()).filter(|t| !t.is_empty())
}

fn file_stem(path: &Path) -> Option<String> {
    let stem = path.file_stem()?.to_string_lossy().into_owned();
    (!stem.is_empty()).then_some(stem)
}

/// `read, grep` or a YAML list, as pi-subagents and Claude Code accept.
fn string_list(value: &Value) -> Option<Vec<String>> {
    let items: Vec<String> = match value {
        Value::String(text) => text.split(',').map(str::to_owned).collect(),
        Value::Sequence(items) => items
            .iter()
            .map(|v| v.as_str().map(str::to_owned))
            .collect::<Option<_>>()?,
        _ => return None,
    };
    Some(
        items
            .into_iter()
            .map(|t| t.trim().to_owned())
            .filter(|t| !t.is_empty())
            .collect(),
    )
}

fn timeout(text: Option<&Value>, ms: Option<u64>) -> Result<Option<u64>, String> {
    let Some(value) = text else {
        return Ok(ms.filter(|ms| *ms > 0));
    };
    match value {
        // Bare seconds; 0 is "no limit", as `"0"`, `0s` and `timeoutMs: 0` are.
        Value::Number(n) => n
            .as_u64()
            .and_then(|s| s.checked_mul(1000))
            .map(|ms| (ms > 0).then_some(ms))
            .ok_or_else(|| "timeout must be a duration such as 90s, 20m or 1h".into()),
        Value::String(s) => parse_duration_ms(s)
            .map(|ms| (ms > 0).then_some(ms))
            .ok_or_else(|| format!("timeout '{s}' is not a duration such as 90s, 20m or 1h")),
        _ => Err("timeout must be a duration such as 90s, 20m or 1h".into()),
    }
}

/// `500ms`, `90s`, `20m`, `1h`, or bare seconds.
pub fn parse_duration_ms(text: &str) -> Option<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let n: u64 = digits.parse().ok()?;
    let factor = match unit.trim() {
        "ms" => 1,
        "" | "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return None,
    };
    n.checked_mul(factor)
}

fn environment(raw: BTreeMap<String, Value>) -> Result<BTreeMap<String, String>, String> {
    let mut env = BTreeMap::new();
    for (name, value) in raw {
        if name.is_empty() || name.contains(['=', '\0']) {
            return Err(format!("env name '{name}' is not a variable name"));
        }
        let text = match value {
            Value::String(s) => s,
            Value::Number(n) => n.to_string(),
            Value::Bool(b) => b.to_string(),
            _ => return Err(format!("env '{name}' must be a string")),
        };
        env.insert(name, text);
    }
    Ok(env)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<AgentDefinition, DefinitionError> {
        parse_definition(text, Path::new("/a/reviewer.md"), RunnerKind::Pi)
    }

    #[test]
    fn reads_a_pi_subagents_file() {
        let def = parse(
            "---\nname: scout\ndescription: Fast recon\ntools: read, grep, find\nthinking: high\nsystemPromptMode: append\ntimeoutMs: 900000\ninheritSkills: false\n---\n\nYou scout.\n",
        )
        .unwrap();
        assert_eq!(def.name, "scout");
        assert_eq!(def.runner, RunnerKind::Pi);
        assert_eq!(def.tools, ["read", "grep", "find"]);
        assert_eq!(def.system_prompt_mode, PromptMode::Append);
        assert_eq!(def.timeout_ms, Some(900_000));
        assert_eq!(def.system_prompt, "You scout.");
    }

    #[test]
    fn the_executor_and_slurm_options_are_read() {
        let def = parse(
            "---\nexecutor: slurm\nslurmPartition: gpu\nslurmArgs:\n  - --gres=gpu:1\n  - --mem=8G\n---\nBody",
        )
        .unwrap();
        assert_eq!(def.executor.as_deref(), Some("slurm"));
        assert_eq!(def.slurm_partition.as_deref(), Some("gpu"));
        assert_eq!(def.slurm_args, ["--gres=gpu:1", "--mem=8G"]);
        let e = parse("---\nexecutor: kubernetes\n---\nBody").unwrap_err();
        assert!(e.to_string().contains("executor"), "{e}");
    }

    #[test]
    fn name_defaults_to_the_file_stem_and_lists_may_be_yaml() {
        let def = parse("---\nrunner: claude\ntools:\n  - Read\n  - Grep\ntimeout: 20m\n---\nBody")
            .unwrap();
        assert_eq!(def.name, "reviewer");
        assert_eq!(def.runner, RunnerKind::Claude);
        assert_eq!(def.tools, ["Read", "Grep"]);
        assert_eq!(def.timeout_ms, Some(1_200_000));
    }

    #[test]
    fn a_claude_code_agent_file_is_read() {
        let def = parse_definition(
            "---\nname: code-reviewer\ndescription: Reviews code\ntools: Read, Grep, Glob\nmodel: inherit\ncolor: blue\n---\nYou review.\n",
            Path::new("/p/.claude/agents/code-reviewer.md"),
            RunnerKind::Claude,
        )
        .unwrap();
        assert_eq!(def.runner, RunnerKind::Claude);
        assert_eq!(def.model, None);
        assert_eq!(def.tools, ["Read", "Grep", "Glob"]);
    }

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let tmp = tempfile::tempdir().unwrap();
        let fifo = tmp.path().join("pipe.md");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo with a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = read_definition(&fifo, RunnerKind::Pi).unwrap_err();
        assert!(
            e.to_string().ends_with("pipe.md:1: not a regular file"),
            "{e}"
        );
    }

    #[test]
    fn errors_name_the_line() {
        let e = parse("---\nname: x\nrunner: gemini\n---\n").unwrap_err();
        assert_eq!(
            e.to_string(),
            "failed to parse agent definition /a/reviewer.md:3: runner 'gemini' is not one of pi, claude, codex, command"
        );
        let e = parse("---\nname: x\ntools: [read\n---\n").unwrap_err();
        assert!(
            matches!(e, DefinitionError::Invalid { line, .. } if line >= 3),
            "{e}"
        );
        let e = parse("no front matter").unwrap_err();
        assert!(
            e.to_string()
                .contains("reviewer.md:1: missing front matter"),
            "{e}"
        );
        let e = parse("---\nrunner: command\n---\n").unwrap_err();
        assert!(e.to_string().contains(":2: runner 'command' needs"), "{e}");
    }
}

#[cfg(test)]
mod optional_fields {
    //! Every optional front-matter key, one by one: absent, null (`~`), of
    //! the wrong type (a nested list) and empty (`""`), starting from a
    //! definition that sets all of them, so no other key can hide a case.

    use super::*;

    /// Every optional key with a value of its own (`timeout` wins over
    /// `timeoutMs`, so each is checked without the other).
    const FULL: [(&str, &str); 14] = [
        ("name", "worker"),
        ("description", "reviews"),
        ("runner", "pi"),
        ("model", "m1"),
        ("thinking", "high"),
        ("tools", "read, grep"),
        ("permissionMode", "plan"),
        ("sandbox", "read-only"),
        ("cwd", "/w"),
        ("timeout", "20m"),
        ("timeoutMs", "5000"),
        ("env", "{A: b}"),
        ("systemPromptMode", "append"),
        ("resumePrompt", "revival"),
    ];

    /// The field `key` fills, as text; the default `claude` runner of the
    /// file's directory applies when `runner` is unset, the file stem when
    /// `name` is.
    fn field(d: &AgentDefinition, key: &str) -> String {
        match key {
            "name" => d.name.clone(),
            "description" => format!("{:?}", d.description),
            "runner" => d.runner.to_string(),
            "model" => format!("{:?}", d.model),
            "thinking" => format!("{:?}", d.thinking),
            "tools" => format!("{:?}", d.tools),
            "permissionMode" => format!("{:?}", d.permission_mode),
            "sandbox" => format!("{:?}", d.sandbox),
            "cwd" => format!("{:?}", d.cwd),
            "timeout" | "timeoutMs" => format!("{:?}", d.timeout_ms),
            "env" => format!("{:?}", d.env),
            "systemPromptMode" => format!("{:?}", d.system_prompt_mode),
            _ => format!("{:?}", d.resume_prompt),
        }
    }

    fn parse_with(key: &str, value: Option<&str>) -> Result<AgentDefinition, DefinitionError> {
        let yaml: String = FULL
            .iter()
            .filter(|(k, _)| {
                !matches!(
                    (key, *k),
                    ("timeoutMs", "timeout") | ("timeout", "timeoutMs")
                )
            })
            .filter_map(|(k, v)| match (*k == key, value) {
                (true, None) => None,
                (true, Some(given)) => Some(format!("{k}: {given}\n")),
                (false, _) => Some(format!("{k}: {v}\n")),
            })
            .collect();
        parse_definition(
            &format!("---\n{yaml}---\nbody\n"),
            Path::new("/a/x.md"),
            RunnerKind::Claude,
        )
    }

    /// (key, what absent / null / empty read as; whether empty is refused).
    const UNSET: [(&str, &str, bool); 14] = [
        ("name", "x", false),
        ("description", "None", false),
        ("runner", "claude", false),
        ("model", "None", false),
        ("thinking", "None", false),
        ("tools", "[]", false),
        ("permissionMode", "None", false),
        ("sandbox", "None", false),
        ("cwd", "None", false),
        ("timeout", "None", true),
        ("timeoutMs", "None", true),
        ("env", "{}", true),
        ("systemPromptMode", "Replace", false),
        ("resumePrompt", "Verbatim", false),
    ];

    #[test]
    fn the_full_definition_sets_every_field() {
        let full = parse_with("", None).unwrap();
        for (key, unset, _) in UNSET {
            assert_ne!(field(&full, key), unset, "{key} is set in the fixture");
        }
        assert_eq!(
            parse_with("timeoutMs", Some("5000")).unwrap().timeout_ms,
            Some(5000)
        );
    }

    #[test]
    fn absent_null_and_empty_read_as_unset_and_a_wrong_type_names_the_key() {
        for (key, unset, empty_refused) in UNSET {
            for (case, value) in [("absent", None), ("null", Some("~"))] {
                let def = parse_with(key, value).unwrap_or_else(|e| panic!("{key} {case}: {e}"));
                assert_eq!(field(&def, key), unset, "{key} {case}");
            }
            match parse_with(key, Some("\"\"")) {
                Ok(def) => {
                    assert!(!empty_refused, "{key} empty accepted");
                    assert_eq!(field(&def, key), unset, "{key} empty");
                }
                Err(e) => assert!(empty_refused, "{key} empty: {e}"),
            }
            let err = parse_with(key, Some("[[1]]")).unwrap_err().to_string();
            assert!(
                err.starts_with("failed to parse agent definition /a/x.md:"),
                "{err}"
            );
            assert!(err.contains(key), "{key}: {err}");
        }
    }

    #[test]
    fn a_zero_timeout_is_no_limit_whichever_way_it_is_written() {
        for (key, zero) in [
            ("timeout", "0"),
            ("timeout", "\"0\""),
            ("timeout", "0s"),
            ("timeout", "0m"),
            ("timeoutMs", "0"),
        ] {
            let def = parse_with(key, Some(zero)).unwrap_or_else(|e| panic!("{key}: {zero}: {e}"));
            assert_eq!(def.timeout_ms, None, "{key}: {zero}");
        }
        assert_eq!(
            parse_with("timeout", Some("90")).unwrap().timeout_ms,
            Some(90_000)
        );
        // Seconds that overflow in milliseconds are refused, not wrapped.
        let err = parse_with("timeout", Some("18446744073709551615")).unwrap_err();
        assert!(
            err.to_string().contains("timeout must be a duration"),
            "{err}"
        );
    }
}

#[cfg(test)]
mod units_and_values {
    use super::*;

    #[test]
    fn a_name_with_a_space_or_a_slash_and_a_command_for_another_runner_are_refused() {
        let parse = |yaml: &str| {
            parse_definition(
                &format!("---\n{yaml}\n---\n"),
                Path::new("/a/x.md"),
                RunnerKind::Pi,
            )
        };
        for name in ["'a b'", "a/b"] {
            let err = parse(&format!("name: {name}")).unwrap_err().to_string();
            assert!(
                err.contains("must not contain spaces or '/'"),
                "{name}: {err}"
            );
        }
        let err = parse("runner: pi\ncommand: [echo]")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("'command' is only for runner 'command'"),
            "{err}"
        );
    }

    #[test]
    fn every_duration_unit_counts() {
        assert_eq!(parse_duration_ms("500ms"), Some(500));
        assert_eq!(parse_duration_ms("90s"), Some(90_000));
        assert_eq!(parse_duration_ms("90"), Some(90_000));
        assert_eq!(parse_duration_ms("20m"), Some(1_200_000));
        assert_eq!(parse_duration_ms("1h"), Some(3_600_000));
        assert_eq!(parse_duration_ms("1d"), None);
    }

    #[test]
    fn env_numbers_and_booleans_become_text_and_a_bad_name_is_refused() {
        let def = parse_definition(
            "---\nenv: {N: 3, B: true, S: x}\n---\n",
            Path::new("/a/x.md"),
            RunnerKind::Pi,
        )
        .unwrap();
        let env: Vec<(&str, &str)> = def
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(env, [("B", "true"), ("N", "3"), ("S", "x")]);
        for bad in ["'A=B': x", "'': x"] {
            let err = parse_definition(
                &format!("---\nenv: {{{bad}}}\n---\n"),
                Path::new("/a/x.md"),
                RunnerKind::Pi,
            )
            .unwrap_err();
            assert!(
                err.to_string().contains("is not a variable name"),
                "{bad}: {err}"
            );
        }
    }
}

#[cfg(test)]
mod sizes_and_names {
    use super::*;

    /// A definition file of exactly `bytes` bytes whose prompt ends in `END`.
    fn file_of(dir: &Path, bytes: usize) -> PathBuf {
        let head = "---\nname: big\n---\n";
        let body = "x".repeat(bytes - head.len() - 3);
        let path = dir.join(format!("big-{bytes}.md"));
        std::fs::write(&path, format!("{head}{body}END")).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), bytes as u64);
        path
    }

    #[test]
    fn a_file_of_one_mebibyte_is_read_whole_and_one_byte_more_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        // The limit written out, not taken from the constant under test.
        let limit = 1024 * 1024;
        let def = read_definition(&file_of(tmp.path(), limit), RunnerKind::Pi).unwrap();
        assert_eq!(
            def.system_prompt.len(),
            limit - "---\nname: big\n---\n".len()
        );
        assert!(def.system_prompt.ends_with("xEND"));
        let path = file_of(tmp.path(), limit + 1);
        let err = read_definition(&path, RunnerKind::Pi).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "failed to parse agent definition {}:1: larger than 1048576 bytes",
                path.display()
            )
        );
    }

    #[test]
    fn only_the_command_runner_is_not_an_agent_cli() {
        for kind in [RunnerKind::Pi, RunnerKind::Claude, RunnerKind::Codex] {
            assert!(kind.is_agent_cli(), "{kind}");
        }
        assert!(!RunnerKind::Command.is_agent_cli());
    }

    #[test]
    fn a_prompt_mode_is_named_as_in_the_front_matter() {
        for (written, mode) in [
            ("replace", PromptMode::Replace),
            ("append", PromptMode::Append),
        ] {
            let def = parse_definition(
                &format!("---\nsystemPromptMode: {written}\n---\nBody"),
                Path::new("/a/x.md"),
                RunnerKind::Pi,
            )
            .unwrap();
            assert_eq!(def.system_prompt_mode, mode);
            assert_eq!(def.system_prompt_mode.as_str(), written);
        }
    }
}
