//! Errors of the fan-out budget, with the reference's texts (docs/protocol/fanout-budget.md §3.3, §4.3).

use std::io;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::Snapshot;

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A caller's commit failure, carried through a claim unchanged.
pub type CommitError = Box<dyn std::error::Error + Send + Sync>;

/// Everything that can go wrong with a fan-out budget.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The descriptor is not a JSON object.
    #[error("Run fan-out budget descriptor is missing or invalid.")]
    DescriptorMissing,
    /// A descriptor field breaks its rule (version, rootRunId, directory, limit, parentPath).
    #[error("Run fan-out budget descriptor is invalid.")]
    DescriptorInvalid,
    /// The budget directory or the managed root cannot be resolved or opened.
    #[error("Run fan-out budget directory is unavailable: {0}")]
    DirectoryUnavailable(#[source] io::Error),
    /// The budget directory's real path is not inside the managed root.
    #[error("Run fan-out budget directory resolves outside the managed budget root.")]
    OutsideRoot,
    /// `manifest.json` cannot be read or is not JSON.
    #[error("Run fan-out budget manifest is unreadable at '{}': {cause}", dir.display())]
    ManifestUnreadable {
        /// Real path of the budget directory.
        dir: PathBuf,
        /// The underlying error message.
        cause: String,
    },
    /// `manifest.json` is JSON but breaks a field rule.
    #[error("Run fan-out budget manifest is invalid at '{}': {field}.", dir.display())]
    ManifestInvalid {
        /// Real path of the budget directory.
        dir: PathBuf,
        /// The rule that failed, naming the field.
        field: &'static str,
    },
    /// The descriptor's rootRunId or limit differs from the manifest.
    #[error("Run fan-out budget descriptor does not match its manifest.")]
    ManifestMismatch,
    /// `claims/` cannot be listed (for example it is a regular file).
    #[error("Run fan-out claims directory is unreadable at '{}': {source}", path.display())]
    ClaimsUnreadable {
        /// Path of the claims directory.
        path: PathBuf,
        /// The underlying cause.
        #[source]
        source: io::Error,
    },
    /// The batch does not fit in what remains of the budget.
    #[error(transparent)]
    LimitReached(#[from] RunFanoutLimitError),
    /// A budget was requested with a limit of zero.
    #[error("Run fan-out limit must be a positive integer.")]
    LimitNotPositive,
    /// A budget was requested with a limit whose slot numbers do not fit six digits.
    #[error("failed to create run fan-out budget: limit {0} exceeds the maximum of {max}", max = crate::MAX_LIMIT)]
    LimitTooLarge(u64),
    /// A budget was requested for an empty root run id.
    #[error("failed to create run fan-out budget: the root run id is empty")]
    EmptyRootRunId,
    /// The admission lock stayed held for the whole bounded wait.
    #[error("Timed out acquiring run fan-out admission lock at '{}'.", dir.display())]
    LockTimeout {
        /// Real path of the budget directory.
        dir: PathBuf,
    },
    /// Every slot number below the limit is taken although the count said otherwise.
    #[error(
        "failed to claim run fan-out slot for '{path}': every slot number below the limit {limit} is taken"
    )]
    NoFreeSlot {
        /// The qualified claim path that found no slot.
        path: String,
        /// The budget limit.
        limit: u64,
    },
    /// `run-fanout-budget.json` exists but cannot be read or validated.
    #[error("Invalid persisted run fan-out budget '{}': {message}", file.display())]
    PersistedInvalid {
        /// Path of the persisted descriptor.
        file: PathBuf,
        /// The inner error message.
        message: String,
    },
    /// The descriptor inherited through the environment cannot be decoded or validated.
    #[error("Invalid inherited run fan-out budget: {0}")]
    InheritedInvalid(String),
    /// A file operation of ours failed.
    #[error("failed to {op} '{}': {source}", path.display())]
    Io {
        /// The operation, as a verb phrase.
        op: &'static str,
        /// The path the operation was applied to.
        path: PathBuf,
        /// The underlying cause.
        #[source]
        source: io::Error,
    },
    /// A write through `atomic-file` failed.
    #[error(transparent)]
    Write(#[from] atomic_file::Error),
    /// The caller's commit function failed; the batch was rolled back.
    #[error(transparent)]
    Commit(CommitError),
}

impl Error {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        Self::Io {
            op,
            path: path.into(),
            source,
        }
    }

    /// The rejection when this error is a refused admission.
    pub fn rejection(&self) -> Option<&RunFanoutLimitError> {
        match self {
            Self::LimitReached(e) => Some(e),
            _ => None,
        }
    }
}

/// The constant `code` of a rejection object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum RejectionCode {
    /// `"RUN_FANOUT_LIMIT"`.
    #[serde(rename = "RUN_FANOUT_LIMIT")]
    RunFanoutLimit,
}

/// The rejection object, serialised exactly as the reference:
/// `{"code":"RUN_FANOUT_LIMIT","path":..,"requested":..,"used":..,"limit":..,"remaining":..}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rejection {
    /// Always [`RejectionCode::RunFanoutLimit`].
    pub code: RejectionCode,
    /// The first qualified path that does not fit (`qualified[remaining]`).
    pub path: String,
    /// Number of paths in the batch.
    pub requested: u64,
    /// Used slots before the batch.
    pub used: u64,
    /// The budget limit.
    pub limit: u64,
    /// Remaining slots before the batch.
    pub remaining: u64,
}

/// A refused admission: nothing of the batch was claimed.
///
/// Serialises to the rejection object; its message is the reference's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "Run fan-out limit reached at {} ({}/{} used; {} requested, {} remaining). No children from this admission group were started. Start a new top-level run or raise config.maxSubagentSpawnsPerRun.",
    rejection.path, rejection.used, rejection.limit, rejection.requested, rejection.remaining
)]
pub struct RunFanoutLimitError {
    /// The rejection object.
    pub rejection: Rejection,
    /// The usage seen before the batch.
    pub snapshot: Snapshot,
}

impl RunFanoutLimitError {
    pub(crate) fn new(qualified: &[String], before: Snapshot) -> Self {
        let index = usize::try_from(before.remaining).unwrap_or(usize::MAX);
        Self {
            rejection: Rejection {
                code: RejectionCode::RunFanoutLimit,
                path: qualified.get(index).cloned().unwrap_or_default(),
                requested: qualified.len() as u64,
                used: before.used,
                limit: before.limit,
                remaining: before.remaining,
            },
            snapshot: before,
        }
    }
}

impl Serialize for RunFanoutLimitError {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.rejection.serialize(serializer)
    }
}
