//! `subagents validate --kind KIND FILE`: one artifact, read exactly as the
//! launcher's readers read it (the same functions, no second validator).

use std::path::Path;

use serde_json::Value;
use status::Layout;

use crate::api::{ValidateOutcome, ValidateRequest};
use crate::error::{Error, Result};

/// The artifact kinds `validate` knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `recovery-descriptor.json` (strict v1 rules + the live fan-out budget).
    Recovery,
    /// `launch-contract.json` (strict; the digest is checked by `resume`).
    LaunchContract,
    /// `run-fanout-budget.json` or any fan-out descriptor (checked against its manifest).
    FanoutDescriptor,
    /// A budget's `manifest.json`.
    FanoutManifest,
    /// `process-terminal.json`.
    ProcessTerminal,
    /// `process-terminal-candidate.json`.
    TerminalCandidate,
    /// `status.json`.
    Status,
    /// `runner-startup.json`, `runner-startup-ack.json` or `runner-startup-proceed.json`.
    Startup,
    /// A capacity slot's `owner.json`.
    CapacityOwner,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 9] = [
        Kind::Recovery,
        Kind::LaunchContract,
        Kind::FanoutDescriptor,
        Kind::FanoutManifest,
        Kind::ProcessTerminal,
        Kind::TerminalCandidate,
        Kind::Status,
        Kind::Startup,
        Kind::CapacityOwner,
    ];

    /// The name `--kind` takes.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Recovery => "recovery",
            Kind::LaunchContract => "launch-contract",
            Kind::FanoutDescriptor => "fanout-descriptor",
            Kind::FanoutManifest => "fanout-manifest",
            Kind::ProcessTerminal => "process-terminal",
            Kind::TerminalCandidate => "terminal-candidate",
            Kind::Status => "status",
            Kind::Startup => "startup",
            Kind::CapacityOwner => "capacity-owner",
        }
    }
}

/// Validates `file` as `kind`: `Ok(())` or the reader's error naming the field.
pub fn check(layout: &Layout, kind: Kind, file: &Path) -> Result<(), String> {
    let bytes = atomic_file::read::read_input_file(file).map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&bytes);
    let label = file.display().to_string();
    let json = || {
        serde_json::from_slice::<Value>(&bytes)
            .map_err(|e| format!("failed to parse '{label}': {e}"))
    };
    match kind {
        Kind::Recovery => {
            let mut descriptor =
                recovery::parse_descriptor(&bytes, file).map_err(|e| e.to_string())?;
            let root = layout.fanout_budgets_dir();
            let check = crate::fanout::live_check(&root);
            recovery::check_fanout_budget(&mut descriptor, file, &check).map_err(|e| e.to_string())
        }
        Kind::LaunchContract => recovery::parse_launch_contract(&bytes, file)
            .map(drop)
            .map_err(|e| e.to_string()),
        Kind::FanoutDescriptor => {
            let descriptor = fanout_budget::Descriptor::from_json(&text)
                .map_err(|e| format!("Invalid persisted run fan-out budget '{label}': {e}"))?;
            fanout_budget::OpenBudget::open(&layout.fanout_budgets_dir(), &descriptor)
                .map(drop)
                .map_err(|e| format!("Invalid persisted run fan-out budget '{label}': {e}"))
        }
        Kind::FanoutManifest => {
            let dir = file.parent().unwrap_or(Path::new("."));
            fanout_budget::Manifest::parse(&text, dir)
                .map(drop)
                .map_err(|e| e.to_string())
        }
        Kind::ProcessTerminal => {
            status::proof::validate_proof(&json()?, &label, &status::proof::Fallback::default())
                .map(drop)
        }
        Kind::TerminalCandidate => {
            let invalid = format!("Invalid process-terminal candidate in '{label}'.");
            let value = json()?;
            status::proof::validate_candidate(&value, &invalid)?;
            serde_json::from_value::<status::proof::Candidate>(value)
                .map(drop)
                .map_err(|e| format!("{invalid} {e}"))
        }
        Kind::Status => status::model::parse_status(file, &text)
            .map(drop)
            .map_err(|e| e.to_string()),
        Kind::Startup => handshake::validate_record(&json()?)
            .map_err(|e| format!("invalid startup record '{label}': {e}")),
        Kind::CapacityOwner => {
            let value = json()?;
            serde_path_to_error::deserialize::<_, capacity::OwnerRecord>(value).map_err(|e| {
                format!(
                    "invalid capacity owner '{label}': {}: {}",
                    e.path(),
                    e.inner()
                )
            })?;
            capacity::OwnerRecord::parse(&bytes)
                .map(drop)
                .ok_or_else(|| format!("invalid capacity owner '{label}': version must be 1 and reservationToken, ownerSessionId, ownerSessionKey, runId, asyncDir must be non-empty"))
        }
    }
}

/// Validates the request's file as its kind; an invalid file is a verdict
/// (`valid: false`), an unknown kind a usage error.
pub fn validate(layout: &Layout, request: &ValidateRequest) -> Result<ValidateOutcome> {
    let kind = Kind::ALL
        .into_iter()
        .find(|k| k.name() == request.kind)
        .ok_or_else(|| {
            let names: Vec<&str> = Kind::ALL.iter().map(|k| k.name()).collect();
            Error::usage(format!(
                "failed to validate: unknown kind '{}' (one of {})",
                request.kind,
                names.join(", ")
            ))
        })?;
    let error = check(layout, kind, &request.file).err();
    Ok(ValidateOutcome {
        valid: error.is_none(),
        error,
    })
}
