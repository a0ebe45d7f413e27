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

/// What went wrong: one variant per distinct mistake or failure. The exit
/// code is a function of the kind alone ([`ErrorKind::exit`]), so the same
/// mistake always exits the same way whichever front-end or call site
/// finds it. Usage kinds name the request field at fault (as the API and
/// MCP spell it); each front-end words its own hint from that.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The command line's parser refused the arguments (unknown subcommand,
    /// unknown flag, a value of the wrong type).
    Parse,
    /// A run of an agent, or a resume, without a task.
    MissingTask,
    /// Both a task text and a task file.
    TaskTwice,
    /// A task file that cannot be read.
    BadTaskFile,
    /// A duration that does not parse.
    BadDuration(DurationField),
    /// Request fields that do not go together (a spec with a command, ...).
    BadCombination,
    /// A spec, inline or a file, that cannot be read or is invalid.
    BadSpec,
    /// No agent definition of that name.
    UnknownAgent,
    /// An explicit run id that is not a safe file name.
    UnsafeId,
    /// A run's name that is empty, too long or holds a control character.
    BadName,
    /// A step number the run does not have.
    NoSuchStep,
    /// A request that must name a run (or a descriptor) and names none.
    NoRunNamed,
    /// No run has this id or prefix.
    UnknownRun,
    /// The prefix matches more than one run.
    AmbiguousPrefix,
    /// The run's directory has no `status.json`.
    NoStatus,
    /// The session's active-run capacity is exhausted.
    CapacityFull,
    /// The run fan-out budget refused a launch.
    FanoutRefused,
    /// The run fan-out budget refused a `budget claim`.
    BudgetRefused,
    /// `wait` gave up before every run was over.
    WaitTimedOut,
    /// The wait was cancelled (its client went away).
    WaitCancelled,
    /// A run that was waited for did not complete (already reported).
    RunFailed,
    /// A state file could not be read or written (the source names it).
    StateFile,
    /// An error built by a generic constructor ([`Error::new`],
    /// [`Error::usage`], [`Error::failed`], [`Error::silent`]).
    Other(Exit),
}

impl ErrorKind {
    /// The exit code of this kind: the one place it is chosen.
    pub fn exit(self) -> Exit {
        match self {
            Self::Parse
            | Self::MissingTask
            | Self::TaskTwice
            | Self::BadTaskFile
            | Self::BadDuration(_)
            | Self::BadCombination
            | Self::BadSpec
            | Self::UnknownAgent
            | Self::UnsafeId
            | Self::BadName
            | Self::NoSuchStep
            | Self::NoRunNamed => Exit::Usage,
            Self::UnknownRun | Self::AmbiguousPrefix | Self::NoStatus => Exit::NotFound,
            Self::CapacityFull | Self::FanoutRefused | Self::BudgetRefused => Exit::Limit,
            Self::WaitTimedOut => Exit::Timeout,
            Self::WaitCancelled | Self::RunFailed | Self::StateFile => Exit::Failed,
            Self::Other(exit) => exit,
        }
    }

    /// The request field at fault, as the API and MCP spell it (`task`,
    /// `timeout`, `olderThan`, ...), when one is.
    pub fn field(self) -> Option<&'static str> {
        match self {
            Self::MissingTask | Self::TaskTwice => Some("task"),
            Self::BadTaskFile => Some("taskFile"),
            Self::BadDuration(field) => Some(field.name()),
            Self::BadSpec => Some("spec"),
            Self::UnknownAgent => Some("agent"),
            Self::UnsafeId => Some("id"),
            Self::BadName => Some("name"),
            Self::NoSuchStep => Some("step"),
            _ => None,
        }
    }
}

/// The request fields that hold a duration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DurationField {
    /// `timeout` (`--timeout`) of `run`, `resume` and `wait`.
    Timeout,
    /// `olderThan` (`--older-than`) of `prune`.
    OlderThan,
    /// `idleTimeout` (`--idle-timeout`) of `run`.
    IdleTimeout,
}

impl DurationField {
    /// The field's name in the API and MCP requests.
    pub fn name(self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::OlderThan => "olderThan",
            Self::IdleTimeout => "idleTimeout",
        }
    }

    /// The command line's flag.
    pub fn flag(self) -> &'static str {
        match self {
            Self::Timeout => "--timeout",
            Self::OlderThan => "--older-than",
            Self::IdleTimeout => "--idle-timeout",
        }
    }
}

/// The cause of an error, kept for [`std::error::Error::source`].
pub type Source = Box<dyn std::error::Error + Send + Sync>;

/// A failure: what went wrong (its kind, which decides the exit code), a
/// one-line message, the cause, optional structured detail.
///
/// A struct over a kind rather than one enum of messages: every kind has
/// the same message, hint, notes and detail, which both front-ends print
/// the same way, and the generic constructors other code uses keep working.
#[derive(Debug)]
pub struct Error {
    /// What went wrong; decides the exit code.
    pub kind: ErrorKind,
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
    /// The underlying error, returned by [`std::error::Error::source`]
    /// (public so that `Error { notes, ..Error::of(..) }` still builds one).
    pub source: Option<Source>,
}

impl Error {
    /// An error of `kind`.
    pub fn of(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            detail: None,
            quiet: false,
            notes: Vec::new(),
            hint: None,
            source: None,
        }
    }

    /// An error with exit code `exit` and no more specific kind.
    pub fn new(exit: Exit, message: impl Into<String>) -> Self {
        Self::of(ErrorKind::Other(exit), message)
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
        Self::quiet(ErrorKind::Other(exit))
    }

    /// An error of `kind` with nothing more to print.
    pub fn quiet(kind: ErrorKind) -> Self {
        Self {
            quiet: true,
            ..Self::of(kind, "")
        }
    }

    /// A malformed duration in `field` (exit 2).
    pub fn bad_duration(field: DurationField, cause: impl std::fmt::Display) -> Self {
        Self::of(
            ErrorKind::BadDuration(field),
            format!("failed to parse {}: {cause}", field.flag()),
        )
    }

    /// A task file that cannot be read (exit 2).
    pub fn bad_task_file(path: &std::path::Path, cause: std::io::Error) -> Self {
        Self::of(
            ErrorKind::BadTaskFile,
            format!("failed to read task file '{}': {cause}", path.display()),
        )
        .with_source(cause)
    }

    /// The exit code (from the kind).
    pub fn exit(&self) -> Exit {
        self.kind.exit()
    }

    /// Keeps `source` as the cause.
    pub fn with_source(mut self, source: impl Into<Source>) -> Self {
        self.source = Some(source.into());
        self
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
        let exit = self.exit();
        let mut value = json!({"error": {
            "code": exit.name(),
            "exitCode": exit.code(),
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

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl From<status::Error> for Error {
    fn from(e: status::Error) -> Self {
        Self::of(ErrorKind::StateFile, e.to_string()).with_source(e)
    }
}

impl From<atomic_file::Error> for Error {
    fn from(e: atomic_file::Error) -> Self {
        Self::of(ErrorKind::StateFile, e.to_string()).with_source(e)
    }
}

/// Result of the launcher's operations (`E` defaults to [`Error`]).
pub type Result<T = (), E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kind, listed by a match with no wildcard: a new kind does not
    /// compile until it is listed here with its exit code.
    fn expected_exit(kind: ErrorKind) -> i32 {
        match kind {
            ErrorKind::Parse
            | ErrorKind::MissingTask
            | ErrorKind::TaskTwice
            | ErrorKind::BadTaskFile
            | ErrorKind::BadDuration(_)
            | ErrorKind::BadCombination
            | ErrorKind::BadSpec
            | ErrorKind::UnknownAgent
            | ErrorKind::UnsafeId
            | ErrorKind::BadName
            | ErrorKind::NoSuchStep
            | ErrorKind::NoRunNamed => 2,
            ErrorKind::UnknownRun | ErrorKind::AmbiguousPrefix | ErrorKind::NoStatus => 4,
            ErrorKind::CapacityFull | ErrorKind::FanoutRefused | ErrorKind::BudgetRefused => 3,
            ErrorKind::WaitTimedOut => 124,
            ErrorKind::WaitCancelled | ErrorKind::RunFailed | ErrorKind::StateFile => 1,
            ErrorKind::Other(exit) => exit.code(),
        }
    }

    const KINDS: &[ErrorKind] = &[
        ErrorKind::Parse,
        ErrorKind::MissingTask,
        ErrorKind::TaskTwice,
        ErrorKind::BadTaskFile,
        ErrorKind::BadDuration(DurationField::Timeout),
        ErrorKind::BadDuration(DurationField::OlderThan),
        ErrorKind::BadCombination,
        ErrorKind::BadSpec,
        ErrorKind::UnknownAgent,
        ErrorKind::UnsafeId,
        ErrorKind::BadName,
        ErrorKind::NoSuchStep,
        ErrorKind::NoRunNamed,
        ErrorKind::UnknownRun,
        ErrorKind::AmbiguousPrefix,
        ErrorKind::NoStatus,
        ErrorKind::CapacityFull,
        ErrorKind::FanoutRefused,
        ErrorKind::BudgetRefused,
        ErrorKind::WaitTimedOut,
        ErrorKind::WaitCancelled,
        ErrorKind::RunFailed,
        ErrorKind::StateFile,
        ErrorKind::Other(Exit::Failed),
        ErrorKind::Other(Exit::Usage),
        ErrorKind::Other(Exit::Limit),
        ErrorKind::Other(Exit::NotFound),
        ErrorKind::Other(Exit::Timeout),
    ];

    #[test]
    fn every_kind_maps_to_its_exit_code() {
        for &kind in KINDS {
            assert_eq!(kind.exit().code(), expected_exit(kind), "{kind:?}");
            let error = Error::of(kind, "x");
            assert_eq!(error.to_json()["error"]["exitCode"], expected_exit(kind));
        }
    }

    #[test]
    fn every_usage_kind_but_the_generic_ones_names_a_field_or_is_plain() {
        // A usage kind's field, when it has one, is a request field name
        // (camelCase, no flag dashes): the MCP edge shows it as is.
        for &kind in KINDS {
            if let Some(field) = kind.field() {
                assert_eq!(kind.exit(), Exit::Usage, "{kind:?}");
                assert!(!field.starts_with('-') && !field.contains(' '), "{field}");
            }
        }
    }

    #[test]
    fn the_generic_constructors_keep_their_exit_codes() {
        assert_eq!(Error::usage("x").exit(), Exit::Usage);
        assert_eq!(Error::failed("x").exit(), Exit::Failed);
        assert_eq!(Error::new(Exit::Limit, "x").exit(), Exit::Limit);
        assert!(Error::silent(Exit::Timeout).quiet);
        assert_eq!(Error::silent(Exit::Timeout).exit(), Exit::Timeout);
    }

    #[test]
    fn a_state_file_error_keeps_its_cause() {
        use std::error::Error as _;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("status.json");
        std::fs::write(&file, "{not json").unwrap();
        let cause = status::model::read_status(dir.path()).unwrap_err();
        let shown = cause.to_string();
        let error = Error::from(cause);
        assert_eq!(error.kind, ErrorKind::StateFile);
        assert_eq!(error.message, shown, "the printed text is unchanged");
        let source = error.source().expect("the cause is kept");
        assert_eq!(source.to_string(), shown);
        assert!(source.downcast_ref::<status::Error>().is_some());
    }

    #[test]
    fn an_atomic_file_error_keeps_its_cause() {
        use std::error::Error as _;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("file"), "x").unwrap();
        let cause = atomic_file::ensure_private_dir(&dir.path().join("file/x")).unwrap_err();
        let error = Error::from(cause);
        assert_eq!(error.exit(), Exit::Failed);
        assert!(
            error
                .source()
                .unwrap()
                .downcast_ref::<atomic_file::Error>()
                .is_some()
        );
    }
}
