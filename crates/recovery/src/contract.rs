//! The launch contract (`launch-contract.json`, our extension): what the
//! launcher needs to start a run again, bound to the descriptor by the
//! descriptor's `launchContractDigest` (SHA-256 of the file's exact bytes).
//!
//! Neither the contract nor the descriptor holds the task text: the command
//! keeps its `{task_file}` placeholder and `task.md` stays the only copy.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::descriptor::{
    DescriptorError, FanoutBudgetCheck, check_fanout_budget, descriptor_path, encode_descriptor,
    parse_descriptor,
};
use crate::json::{integer, non_empty_str};
use crate::seal::{KeyError, RootKey, SEAL_FILE, parse_seal};
use crate::types::RecoveryDescriptor;

/// File name of the launch contract inside a run directory.
pub const LAUNCH_CONTRACT_FILE: &str = "launch-contract.json";

const FIELDS: [&str; 8] = [
    "version",
    "runId",
    "agent",
    "cwd",
    "command",
    "env",
    "timeoutMs",
    "sessionId",
];

/// Task texts shorter than this are only matched as whole values: a short
/// phrase such as "fix" may legitimately occur inside a path or a name.
const MIN_TASK_SUBSTRING: usize = 16;

/// What is needed to re-launch a run; stored next to its descriptor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LaunchContract {
    /// Schema version, always 1.
    pub version: u32,
    /// Run id the contract was written for.
    pub run_id: String,
    /// Agent label.
    pub agent: String,
    /// Working directory of the command.
    pub cwd: String,
    /// Command and arguments, placeholders (`{task_file}`) unexpanded.
    pub command: Vec<String>,
    /// Environment variables passed explicitly at launch.
    pub env: BTreeMap<String, String>,
    /// Wall-clock timeout of the run, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Owner session of the run (active-run capacity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
}

/// Why a launch contract could not be read, verified or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ContractError {
    /// The file could not be read.
    #[error("failed to read launch contract '{}': {source}", path.display())]
    Read {
        /// The contract file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The file is not JSON or breaks a rule.
    #[error("Invalid launch contract '{}': {detail}", path.display())]
    Invalid {
        /// The contract file.
        path: PathBuf,
        /// The offending field (empty for the whole value).
        field: String,
        /// What is wrong.
        detail: String,
    },
    /// The descriptor names no contract digest.
    #[error("failed to verify launch contract '{}': the recovery descriptor has no launchContractDigest", path.display())]
    DigestMissing {
        /// The contract file.
        path: PathBuf,
    },
    /// The bytes on disk are not the ones the descriptor was written for.
    #[error("failed to verify launch contract '{}': its sha256 {actual} does not match launchContractDigest {expected}", path.display())]
    DigestMismatch {
        /// The contract file.
        path: PathBuf,
        /// Digest recorded in the descriptor.
        expected: String,
        /// Digest of the file.
        actual: String,
    },
    /// Writing would have stored the task text.
    #[error("failed to write '{}': it would contain the task text", path.display())]
    TaskText {
        /// The file that was not written.
        path: PathBuf,
    },
    /// A field disagrees with the other recovery file or with the run
    /// directory it sits in.
    #[error("failed to verify '{}': {field} {detail}", path.display())]
    Mismatch {
        /// The file holding the offending field.
        path: PathBuf,
        /// The offending field.
        field: &'static str,
        /// What it disagrees with.
        detail: String,
    },
    /// The run has no seal (written before seals existed, or cut short).
    #[error("failed to verify '{}': the run has no recovery seal (written by an older version or interrupted at launch); it cannot be resumed safely, start a new run instead", path.display())]
    SealMissing {
        /// The missing seal file.
        path: PathBuf,
    },
    /// The seal file is malformed.
    #[error("failed to verify '{}': {field} {detail}", path.display())]
    SealInvalid {
        /// The seal file.
        path: PathBuf,
        /// The offending field (empty for the whole value).
        field: String,
        /// What is wrong.
        detail: String,
    },
    /// The MAC does not cover these bytes under this root's key.
    #[error("failed to verify '{}': the launch contract or the recovery descriptor was changed after launch ({reason}); refusing to resume", path.display())]
    SealMismatch {
        /// The seal file.
        path: PathBuf,
        /// Which check failed.
        reason: String,
    },
    /// The root's key could not be created or trusted.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// The descriptor was refused or could not be written.
    #[error(transparent)]
    Descriptor(#[from] DescriptorError),
    /// The contract, the descriptor or the seal could not be stored (the
    /// cause names the file).
    #[error("failed to write recovery files: {0}")]
    Write(#[from] atomic_file::Error),
}

/// Path of the contract inside `run_dir`.
pub fn launch_contract_path(run_dir: &Path) -> PathBuf {
    run_dir.join(LAUNCH_CONTRACT_FILE)
}

/// Lowercase hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Parses contract bytes strictly: unknown fields, wrong JSON types and
/// empty required strings are refused, naming the field.
pub fn parse_launch_contract(bytes: &[u8], path: &Path) -> Result<LaunchContract, ContractError> {
    let invalid = |field: &str, detail: String| ContractError::Invalid {
        path: path.to_path_buf(),
        field: field.into(),
        detail,
    };
    let value: Value = serde_json::from_slice(bytes).map_err(|e| invalid("", e.to_string()))?;
    let Value::Object(map) = value else {
        return Err(invalid("", "expected an object.".into()));
    };
    check_fields(&map).map_err(|(field, detail)| invalid(field, detail))?;
    serde_json::from_value(Value::Object(map)).map_err(|e| invalid("", format!("{e}.")))
}

fn check_fields(map: &Map<String, Value>) -> Result<(), (&str, String)> {
    if let Some(key) = map.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err((key, format!("unknown field '{key}'.")));
    }
    if map.get("version").and_then(integer) != Some(1) {
        return Err(("version", "version must be 1.".into()));
    }
    for field in ["runId", "agent", "cwd"] {
        if map.get(field).and_then(non_empty_str).is_none() {
            return Err((field, format!("{field} must be a non-empty string.")));
        }
    }
    let command_ok = map
        .get("command")
        .and_then(Value::as_array)
        .is_some_and(|argv| {
            argv.first().and_then(non_empty_str).is_some() && argv.iter().all(Value::is_string)
        });
    if !command_ok {
        return Err((
            "command",
            "command must be an array of strings with a non-empty program.".into(),
        ));
    }
    let env_ok = map
        .get("env")
        .and_then(Value::as_object)
        .is_some_and(|env| {
            env.iter()
                .all(|(k, v)| !k.is_empty() && !k.contains(['=', '\0']) && v.is_string())
        });
    if !env_ok {
        return Err((
            "env",
            "env must map variable names (no '=') to strings.".into(),
        ));
    }
    if map
        .get("timeoutMs")
        .is_some_and(|t| integer(t).is_none_or(|t| t < 1))
    {
        return Err(("timeoutMs", "timeoutMs must be a positive integer.".into()));
    }
    if map
        .get("sessionId")
        .is_some_and(|s| non_empty_str(s).is_none())
    {
        return Err(("sessionId", "sessionId must be a non-empty string.".into()));
    }
    Ok(())
}

/// Reads `<run_dir>/launch-contract.json` and checks that its bytes hash to
/// the descriptor's `launchContractDigest`; a tampered file is refused.
pub fn read_launch_contract(
    run_dir: &Path,
    descriptor: &RecoveryDescriptor,
) -> Result<LaunchContract, ContractError> {
    let path = launch_contract_path(run_dir);
    let Some(expected) = descriptor.launch_contract_digest.as_deref() else {
        return Err(ContractError::DigestMissing { path });
    };
    let bytes = atomic_file::read::read_file(&path).map_err(|e| ContractError::Read {
        path: path.clone(),
        source: e.into_io(),
    })?;
    verify_digest(&bytes, expected, &path)
}

/// Checks contract bytes against the descriptor's digest, then parses them.
fn verify_digest(
    bytes: &[u8],
    expected: &str,
    path: &Path,
) -> Result<LaunchContract, ContractError> {
    let path = path.to_path_buf();
    let actual = sha256_hex(bytes);
    if actual != expected {
        return Err(ContractError::DigestMismatch {
            path,
            expected: expected.to_owned(),
            actual,
        });
    }
    parse_launch_contract(bytes, &path)
}

/// A run's recovery files, read and verified together.
#[derive(Debug, Clone, PartialEq)]
pub struct Recovery {
    /// The validated descriptor (budget normalised when a check was given).
    pub descriptor: RecoveryDescriptor,
    /// The launch contract whose digest the descriptor records.
    pub contract: LaunchContract,
}

/// Everything `subagents resume` needs from a run directory, trusting
/// nothing it did not verify: the descriptor (structural rules, then the
/// live fan-out check when `budget` is given), the contract (digest), the
/// fields the two share and the run directory's id (by name), and last the
/// seal, a MAC under `key` over the exact bytes of both files. Each file is
/// read once; the bytes checked are the bytes used. `Ok(None)` when the run
/// has no descriptor, i.e. is not revivable.
pub fn load_recovery(
    run_dir: &Path,
    budget: Option<&dyn FanoutBudgetCheck>,
    key: &RootKey,
) -> Result<Option<Recovery>, ContractError> {
    let path = descriptor_path(run_dir);
    let Some(descriptor_bytes) = read_optional(&path).map_err(|source| {
        ContractError::Descriptor(DescriptorError::Read {
            path: path.clone(),
            source,
        })
    })?
    else {
        return Ok(None);
    };
    let mut descriptor = parse_descriptor(&descriptor_bytes, &path)?;
    if let Some(check) = budget {
        check_fanout_budget(&mut descriptor, &path, check)?;
    }
    let contract_path = launch_contract_path(run_dir);
    let Some(expected) = descriptor.launch_contract_digest.as_deref() else {
        return Err(ContractError::DigestMissing {
            path: contract_path,
        });
    };
    let contract_bytes =
        atomic_file::read::read_file(&contract_path).map_err(|e| ContractError::Read {
            path: contract_path.clone(),
            source: e.into_io(),
        })?;
    let contract = verify_digest(&contract_bytes, expected, &contract_path)?;
    check_binding(run_dir, &descriptor, &contract)?;
    verify_seal(run_dir, key, &contract_bytes, &descriptor_bytes)?;
    Ok(Some(Recovery {
        descriptor,
        contract,
    }))
}

fn read_optional(path: &Path) -> io::Result<Option<Vec<u8>>> {
    atomic_file::read::read_optional(path).map_err(atomic_file::read::ReadError::into_io)
}

/// The run id a run directory stands for: its last path component.
fn run_id_of(run_dir: &Path) -> String {
    run_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Fields the descriptor and the contract both record must agree with each
/// other and with the directory they sit in; the first disagreement is
/// reported naming its file and field.
pub fn check_binding(
    run_dir: &Path,
    descriptor: &RecoveryDescriptor,
    contract: &LaunchContract,
) -> Result<(), ContractError> {
    let id = run_id_of(run_dir);
    let in_descriptor = |field, detail| ContractError::Mismatch {
        path: descriptor_path(run_dir),
        field,
        detail,
    };
    let in_contract = |field, detail| ContractError::Mismatch {
        path: launch_contract_path(run_dir),
        field,
        detail,
    };
    if descriptor.source_run_id != id {
        let detail = format!("'{}' is not this run's id '{id}'", descriptor.source_run_id);
        return Err(in_descriptor("sourceRunId", detail));
    }
    if contract.run_id != id {
        let detail = format!("'{}' is not this run's id '{id}'", contract.run_id);
        return Err(in_contract("runId", detail));
    }
    if descriptor.agent != contract.agent {
        let detail = format!(
            "'{}' differs from the launch contract's agent '{}'",
            descriptor.agent, contract.agent
        );
        return Err(in_descriptor("agent", detail));
    }
    if descriptor.cwd != contract.cwd {
        let detail = format!(
            "'{}' differs from the launch contract's cwd '{}'",
            descriptor.cwd, contract.cwd
        );
        return Err(in_descriptor("cwd", detail));
    }
    Ok(())
}

/// Checks `<run_dir>/recovery-seal.json` against the exact file bytes.
fn verify_seal(
    run_dir: &Path,
    key: &RootKey,
    contract: &[u8],
    descriptor: &[u8],
) -> Result<(), ContractError> {
    let path = run_dir.join(SEAL_FILE);
    let Some(bytes) = read_optional(&path).map_err(|source| ContractError::Read {
        path: path.clone(),
        source,
    })?
    else {
        return Err(ContractError::SealMissing { path });
    };
    let seal = parse_seal(&bytes).map_err(|(field, detail)| ContractError::SealInvalid {
        path: path.clone(),
        field,
        detail,
    })?;
    if key.verify(&seal, contract, descriptor) {
        return Ok(());
    }
    let reason = if seal.key_id == key.id() {
        "its mac does not match the files".to_owned()
    } else {
        format!(
            "sealed under key '{}', this root's key is '{}'",
            seal.key_id,
            key.id()
        )
    };
    Err(ContractError::SealMismatch { path, reason })
}

/// Files written by [`persist_recovery`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PersistedRecovery {
    /// `<run_dir>/launch-contract.json`.
    pub contract_path: PathBuf,
    /// `<run_dir>/recovery-descriptor.json`.
    pub descriptor_path: PathBuf,
    /// SHA-256 of the contract, now the descriptor's `launchContractDigest`.
    pub digest: String,
    /// `<run_dir>/recovery-seal.json`.
    pub seal_path: PathBuf,
}

/// Writes the launch contract, then the descriptor bound to it by digest,
/// then the seal (a MAC under `key` over both files' bytes), each atomic
/// and 0600. `descriptor.launch_contract_digest` is set here.
///
/// Nothing is written if either file would be refused by its reader or
/// would contain `task_text`. The seal goes last: a crash before it leaves
/// files that [`load_recovery`] refuses, which makes nothing revivable.
pub fn persist_recovery(
    run_dir: &Path,
    contract: &LaunchContract,
    descriptor: &mut RecoveryDescriptor,
    task_text: &str,
    key: &RootKey,
) -> Result<PersistedRecovery, ContractError> {
    let mut batch = atomic_file::Batch::new();
    let persisted = stage_recovery(run_dir, contract, descriptor, task_text, key, &mut batch)?;
    batch.commit()?;
    Ok(persisted)
}

/// [`persist_recovery`] that adds the three files to `batch` (contract,
/// descriptor, seal, in that order: the batch renames them so) instead of
/// writing them. Nothing is added when [`persist_recovery`] would write
/// nothing; nothing is on disk until the caller commits the batch.
pub fn stage_recovery(
    run_dir: &Path,
    contract: &LaunchContract,
    descriptor: &mut RecoveryDescriptor,
    task_text: &str,
    key: &RootKey,
    batch: &mut atomic_file::Batch,
) -> Result<PersistedRecovery, ContractError> {
    let contract_path = launch_contract_path(run_dir);
    let contract_bytes = atomic_file::to_pretty_json(contract);
    parse_launch_contract(&contract_bytes, &contract_path)?;
    refuse_task_text(&contract_bytes, task_text, &contract_path)?;
    let digest = sha256_hex(&contract_bytes);
    descriptor.launch_contract_digest = Some(digest.clone());
    let descriptor_path = descriptor_path(run_dir);
    let descriptor_bytes = encode_descriptor(descriptor, &descriptor_path)?;
    refuse_task_text(&descriptor_bytes, task_text, &descriptor_path)?;
    let seal_path = run_dir.join(SEAL_FILE);
    let seal = key.seal(&contract_bytes, &descriptor_bytes);
    batch
        .add(&contract_path, contract_bytes)
        .add(&descriptor_path, descriptor_bytes)
        .add_json(&seal_path, &seal);
    Ok(PersistedRecovery {
        contract_path,
        descriptor_path,
        digest,
        seal_path,
    })
}

/// Refuses JSON whose keys or string values carry the task text. Values are
/// compared decoded, so escaping in the JSON text cannot hide a match.
fn refuse_task_text(json: &[u8], task_text: &str, path: &Path) -> Result<(), ContractError> {
    let task = task_text.trim();
    if task.is_empty() {
        return Ok(());
    }
    let value: Value = serde_json::from_slice(json).unwrap_or(Value::Null);
    if holds_text(&value, task) {
        return Err(ContractError::TaskText {
            path: path.to_path_buf(),
        });
    }
    Ok(())
}

fn holds_text(value: &Value, task: &str) -> bool {
    let matches =
        |s: &str| s.trim() == task || (task.len() >= MIN_TASK_SUBSTRING && s.contains(task));
    match value {
        Value::String(s) => matches(s),
        Value::Array(items) => items.iter().any(|v| holds_text(v, task)),
        Value::Object(map) => map.iter().any(|(k, v)| matches(k) || holds_text(v, task)),
        _ => false,
    }
}
