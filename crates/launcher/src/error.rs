//! Typed command errors and their exit codes.

use serde_json::{Value, json};

/// Exit codes of the `subagents` command (cli.md "Exit codes").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// 1: the operation or the run failed.
    Failed,
    /// 2: the command line is wrong.
    Usage,
    /// 3: a limit refused the launch; nothing was started.
    Limit,
    /// 4: no such run, or an ambiguous prefix.
    NotFound,
    /// 124: `wait` gave up.
    Timeout,
}

impl Exit {
    /// The process exit code.
    pub fn code(self) -> i32 {
        match self {
            Self::Failed => 1,
            Self::Usage => 2,
            Self::Limit => 3,
            Self::NotFound => 4,
            Self::Timeout => 124,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Failed => "FAILED",
            Self::Usage => "USAGE",
            Self::Limit => "LIMIT",
            Self::NotFound => "NOT_FOUND",
            Self::Timeout => "TIMEOUT",
        }
    }
}

/// A command failure: what failed, the exit code, optional structured detail.
#[derive(Debug)]
pub struct CliError {
    /// Exit code.
    pub exit: Exit,
    /// One-line message, `<what failed>: <why>`.
    pub message: String,
    /// Extra JSON merged into the `--json` error object.
    pub detail: Option<Box<Value>>,
    /// Already reported (e.g. a run that failed after `--wait` printed it).
    pub quiet: bool,
    /// Detail lines printed on stderr after the message.
    pub notes: Vec<String>,
    /// What the user can change (our flags and env vars), printed as a
    /// `hint:` line and carried as `error.hint` in `--json`.
    pub hint: Option<String>,
}

impl CliError {
    /// An error with exit code `exit`.
    pub fn new(exit: Exit, message: impl Into<String>) -> Self {
        Self {
            exit,
            message: message.into(),
            detail: None,
            quiet: false,
            notes: Vec::new(),
            hint: None,
        }
    }

    /// Exit 1.
    pub fn failed(message: impl Into<String>) -> Self {
        Self::new(Exit::Failed, message)
    }

    /// An exit code with nothing more to print.
    pub fn silent(exit: Exit) -> Self {
        Self {
            exit,
            message: String::new(),
            detail: None,
            quiet: true,
            notes: Vec::new(),
            hint: None,
        }
    }

    /// The `--json` error object.
    pub fn to_json(&self) -> Value {
        let mut value = json!({"error": {"code": self.exit.name(), "message": self.message}});
        if let Some(hint) = &self.hint {
            value["error"]["hint"] = json!(hint);
        }
        if let Some(Value::Object(detail)) = self.detail.as_deref()
            && let Value::Object(map) = &mut value
        {
            map.extend(detail.clone());
        }
        value
    }
}

impl From<anyhow::Error> for CliError {
    fn from(e: anyhow::Error) -> Self {
        Self::failed(format!("{e:#}"))
    }
}

impl From<status::Error> for CliError {
    fn from(e: status::Error) -> Self {
        Self::failed(e.to_string())
    }
}

impl From<atomic_file::Error> for CliError {
    fn from(e: atomic_file::Error) -> Self {
        Self::failed(e.to_string())
    }
}

/// Result alias of the commands.
pub type CliResult<T = ()> = Result<T, CliError>;
