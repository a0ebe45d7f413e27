//! The one error type of the launcher's API: what failed, the exit code of
//! the `subagents` command, and the structured detail a refusal carries. The
//! command line prints it (text or `--json`); the MCP server returns the
//! same JSON as a tool error.

use schemars::JsonSchema;
use serde::Serialize;
use serde_json::{Map, Value, json};

/// Exit codes of the `subagents` command (0 is success).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Exit {
    /// 1: the operation or the run failed.
    Failed,
    /// 2: the request is malformed (a usage mistake).
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

    /// The `error.code` of the JSON error object.
    pub fn name(self) -> &'static str {
        match self {
            Self::Failed => "FAILED",
            Self::Usage => "USAGE",
            Self::Limit => "LIMIT",
            Self::NotFound => "NOT_FOUND",
            Self::Timeout => "TIMEOUT",
        }
    }
}

/// What a refusal knows beyond its message.
#[derive(Debug, Clone)]
pub enum Detail {
    /// A launch's fan-out batch was refused: `runFanoutRejection` and the
    /// budget's `runFanoutBudget` snapshot.
    RunFanout(fanout_budget::RunFanoutLimitError),
    /// A `budget claim` was refused: the rejection's own fields at the top level.
    BudgetClaim(fanout_budget::RunFanoutLimitError),
    /// The session's active-run capacity is exhausted: its snapshot as `capacity`.
    Capacity(capacity::Snapshot),
}

impl Detail {
    /// The fields merged into the JSON error object.
    pub fn to_json(&self) -> Map<String, Value> {
        let value = match self {
            Self::RunFanout(rejection) => json!({
                "runFanoutRejection": rejection,
                "runFanoutBudget": rejection.snapshot,
            }),
            Self::BudgetClaim(rejection) => json!(rejection),
            Self::Capacity(snapshot) => json!({"capacity": snapshot}),
        };
        match value {
            Value::Object(map) => map,
            _ => Map::new(),
        }
    }
}

/// A failure: what failed, the exit code, optional structured detail.
#[derive(Debug)]
pub struct Error {
    /// Exit code.
    pub exit: Exit,
    /// One-line message, `<what failed>: <why>`.
    pub message: String,
    /// Structured detail merged into the JSON error object.
    pub detail: Option<Box<Detail>>,
    /// Already reported (e.g. a run that failed after `--wait` printed it).
    pub quiet: bool,
    /// Detail lines printed on stderr after the message.
    pub notes: Vec<String>,
    /// What the user can change (our flags and env vars), printed as a
    /// `hint:` line and carried as `error.hint` in JSON.
    pub hint: Option<String>,
}

impl Error {
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

    /// Exit 2.
    pub fn usage(message: impl Into<String>) -> Self {
        Self::new(Exit::Usage, message)
    }

    /// An exit code with nothing more to print.
    pub fn silent(exit: Exit) -> Self {
        Self {
            quiet: true,
            ..Self::new(exit, "")
        }
    }

    /// Adds structured detail.
    pub fn with_detail(mut self, detail: Detail) -> Self {
        self.detail = Some(Box::new(detail));
        self
    }

    /// Adds a hint.
    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    /// The JSON error object: `{"error": {code, exitCode, message, hint?}, ...detail}`.
    pub fn to_json(&self) -> Value {
        let mut value = json!({"error": {
            "code": self.exit.name(),
            "exitCode": self.exit.code(),
            "message": self.message,
        }});
        if let Some(hint) = &self.hint {
            value["error"]["hint"] = json!(hint);
        }
        if let (Some(detail), Value::Object(map)) = (self.detail.as_deref(), &mut value) {
            map.extend(detail.to_json());
        }
        value
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

impl From<status::Error> for Error {
    fn from(e: status::Error) -> Self {
        Self::failed(e.to_string())
    }
}

impl From<atomic_file::Error> for Error {
    fn from(e: atomic_file::Error) -> Self {
        Self::failed(e.to_string())
    }
}

/// Result of the launcher's operations (`E` defaults to [`Error`]).
pub type Result<T = (), E = Error> = std::result::Result<T, E>;
