//! Reading and writing `recovery-descriptor.json`.

use std::io;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::types::{DESCRIPTOR_FILE, RecoveryDescriptor, RunFanoutBudget};
use crate::validate::{self, Violation};

/// Why a descriptor could not be read, validated or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DescriptorError {
    /// The file could not be read.
    #[error("Failed to parse async recovery descriptor '{}': {source}", path.display())]
    Read {
        /// The descriptor file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The file is not JSON.
    #[error("Failed to parse async recovery descriptor '{}': {source}", path.display())]
    Syntax {
        /// The descriptor file.
        path: PathBuf,
        /// The parser's error.
        #[source]
        source: serde_json::Error,
    },
    /// The JSON breaks a rule; `message` is the reference's complete text.
    #[error("{message}")]
    Invalid {
        /// The descriptor file.
        path: PathBuf,
        /// The offending top-level field (empty when the whole value is wrong).
        field: String,
        /// The complete message, naming the file and the field.
        message: String,
    },
    /// The descriptor could not be stored.
    #[error("failed to write recovery descriptor: {0}")]
    Write(#[from] atomic_file::Error),
}

impl DescriptorError {
    fn invalid(path: &Path, violation: Violation) -> Self {
        let message = if violation.complete {
            violation.detail
        } else {
            format!("{}: {}", prefix(path), violation.detail)
        };
        DescriptorError::Invalid {
            path: path.to_path_buf(),
            field: violation.field,
            message,
        }
    }

    /// The offending field, for `Invalid` errors.
    pub fn field(&self) -> Option<&str> {
        match self {
            DescriptorError::Invalid { field, .. } => Some(field),
            _ => None,
        }
    }
}

fn prefix(path: &Path) -> String {
    format!("Invalid async recovery descriptor '{}'", path.display())
}

/// The live half of the `runFanoutBudget` rule (docs/protocol/fanout-budget.md §4.3 steps
/// 3–6: realpath inside the budget root, manifest readable and matching).
///
/// The fan-out budget crate implements it; this crate checks only the shape,
/// so `subagents validate --kind recovery` works without a budget root.
pub trait FanoutBudgetCheck {
    /// Returns the normalised descriptor (realpath `directory`) or the
    /// reference's fan-out message, e.g.
    /// `Run fan-out budget descriptor does not match its manifest.`
    fn check(&self, budget: &RunFanoutBudget) -> Result<RunFanoutBudget, String>;
}

impl<F> FanoutBudgetCheck for F
where
    F: Fn(&RunFanoutBudget) -> Result<RunFanoutBudget, String>,
{
    fn check(&self, budget: &RunFanoutBudget) -> Result<RunFanoutBudget, String> {
        self(budget)
    }
}

/// Path of the descriptor inside `run_dir`.
pub fn descriptor_path(run_dir: &Path) -> PathBuf {
    run_dir.join(DESCRIPTOR_FILE)
}

/// Validates the descriptor file at `path` (structural rules of
/// docs/protocol/recovery.md §3) and returns it normalised. A missing file is an error here; this is
/// what `subagents validate --kind recovery FILE` calls.
pub fn validate_descriptor_file(path: &Path) -> Result<RecoveryDescriptor, DescriptorError> {
    let bytes = atomic_file::read::read_file(path).map_err(|e| DescriptorError::Read {
        path: path.to_path_buf(),
        source: e.into_io(),
    })?;
    parse_descriptor(&bytes, path)
}

/// Parses and validates descriptor bytes; `path` is only used in messages.
pub fn parse_descriptor(bytes: &[u8], path: &Path) -> Result<RecoveryDescriptor, DescriptorError> {
    let value: Value = serde_json::from_slice(bytes).map_err(|source| DescriptorError::Syntax {
        path: path.to_path_buf(),
        source,
    })?;
    from_value(value, path)
}

fn from_value(value: Value, path: &Path) -> Result<RecoveryDescriptor, DescriptorError> {
    let file = path.display().to_string();
    let map = validate::descriptor(value, &file).map_err(|v| DescriptorError::invalid(path, v))?;
    // Every rule the typed struct encodes was checked above; a failure here
    // means the two disagree, still reported against the file.
    serde_json::from_value(Value::Object(map)).map_err(|e| DescriptorError::Invalid {
        path: path.to_path_buf(),
        field: String::new(),
        message: format!("{}: {e}.", prefix(path)),
    })
}

/// Reads `<run_dir>/recovery-descriptor.json`: `Ok(None)` when the file does
/// not exist (docs/protocol/recovery.md §3 step 1), otherwise the validated descriptor.
pub fn read_descriptor(run_dir: &Path) -> Result<Option<RecoveryDescriptor>, DescriptorError> {
    match validate_descriptor_file(&descriptor_path(run_dir)) {
        Err(DescriptorError::Read { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
            Ok(None)
        }
        other => other.map(Some),
    }
}

/// Applies the live fan-out budget check to a structurally valid descriptor,
/// replacing `runFanoutBudget` with the normalised result. Errors read
/// `Invalid async recovery descriptor '<path>': <fan-out message>`.
pub fn check_fanout_budget(
    descriptor: &mut RecoveryDescriptor,
    path: &Path,
    check: &dyn FanoutBudgetCheck,
) -> Result<(), DescriptorError> {
    let normalised = check
        .check(&descriptor.run_fanout_budget)
        .map_err(|detail| DescriptorError::Invalid {
            path: path.to_path_buf(),
            field: "runFanoutBudget".into(),
            message: format!("{}: {detail}", prefix(path)),
        })?;
    descriptor.run_fanout_budget = normalised;
    Ok(())
}

/// Serialises a descriptor exactly as it is stored (pretty, 2 spaces, no
/// trailing newline) after checking that [`parse_descriptor`] accepts it.
pub fn encode_descriptor(
    descriptor: &RecoveryDescriptor,
    path: &Path,
) -> Result<Vec<u8>, DescriptorError> {
    let bytes = atomic_file::to_pretty_json(descriptor);
    parse_descriptor(&bytes, path)?;
    Ok(bytes)
}

/// Writes `<run_dir>/recovery-descriptor.json` atomically (0600, fsynced).
/// Refuses, writing nothing, a descriptor its own reader would refuse.
pub fn write_descriptor(
    run_dir: &Path,
    descriptor: &RecoveryDescriptor,
) -> Result<PathBuf, DescriptorError> {
    let path = descriptor_path(run_dir);
    let bytes = encode_descriptor(descriptor, &path)?;
    atomic_file::write_private(&path, &bytes)?;
    Ok(path)
}
