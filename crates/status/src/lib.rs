#![doc = include_str!("../README.md")]
//!
//! Status and terminal proofs of background runs.
//!
//! One run lives in `<root>/async-subagent-runs/<run-id>/`. This crate owns
//! the files there that say what a run is doing and whether it is over:
//!
//! * [`model`]: `status.json` ([`RunStatus`], [`Step`]), read tolerantly
//!   (unknown keys are kept) and written atomically under a lock;
//! * [`events`]: `events.jsonl`, append-only lifecycle events;
//! * [`proof`]: `process-terminal-candidate.json` (written by the runner) and
//!   `process-terminal.json` (written by the process that waited on the
//!   runner), their validation and the finalizer that decides the proof;
//! * [`processes`]: `run-processes.json`, the monitor's and runner's
//!   identities, written once so a damaged status cannot take them along;
//! * [`index`]: `.active-runs/<run-id>` markers, released only by an
//!   `observed` proof;
//! * [`reconcile`]: stale-run repair, safe against pid reuse;
//! * [`reference`](mod@reference): the reference's own rules for records it wrote
//!   (bare-pid staleness, result-based repair, the failed result file);
//! * [`layout`]: where the files live, and a run's directory found by id
//!   without following a symlink out of the root.
//!
//! Listing runs (summaries, the list text, the index of finished runs'
//! rows) is the `subagents-listing` crate, built on this one.
//!
//! The formats are those of pi-subagents 0.49.0 (see `docs/compat.md`),
//! so the same reader serves runs written by either implementation.
#![warn(missing_docs)]

pub mod events;
pub mod index;
pub mod layout;
pub mod model;
pub mod processes;
pub mod proof;
pub mod reconcile;
pub mod reference;
pub mod slot_wait;

pub use layout::Layout;
pub use model::{RunState, RunStatus, Step};

/// A duration as every message and view of ours spells it (the reference's
/// list text keeps its own): `250ms`, `2.5s`, `45s`, then the two largest
/// units that are not zero, largest first (`1m30s`, `30m`, `1h30m`,
/// `2d3h`), the form duration flags accept.
pub fn spell_duration(ms: u64) -> String {
    match ms {
        0..1_000 => format!("{ms}ms"),
        // Tenths, truncated: `9.99s` must not become `10.0s`.
        1_000..10_000 if ms % 1_000 >= 100 => format!("{}.{}s", ms / 1_000, ms % 1_000 / 100),
        1_000..60_000 => format!("{}s", ms / 1_000),
        _ => {
            let units = [
                (86_400_000, "d"),
                (3_600_000, "h"),
                (60_000, "m"),
                (1_000, "s"),
            ];
            let parts: Vec<String> = units
                .iter()
                .scan(ms, |rest, (size, unit)| {
                    let n = *rest / size;
                    *rest %= size;
                    Some((n, unit))
                })
                .skip_while(|(n, _)| *n == 0)
                .take(2)
                .filter(|(n, _)| *n > 0)
                .map(|(n, unit)| format!("{n}{unit}"))
                .collect();
            parts.concat()
        }
    }
}

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file operation failed.
    #[error(transparent)]
    Io(#[from] atomic_file::Error),
    /// A state file could not be read safely (FIFO, symlink, oversize, ...).
    #[error(transparent)]
    Read(#[from] atomic_file::read::ReadError),
    /// A file exists but its content is not what the reader accepts.
    #[error("failed to parse {what} '{path}': {reason}")]
    Invalid {
        /// Which kind of file.
        what: &'static str,
        /// The file.
        path: String,
        /// What is wrong, naming the field where one is at fault.
        reason: String,
    },
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A host's fault-injection callback (crash tests), called with the name of
/// a point inside this crate's writers. Unset, the points cost one atomic load.
static FAULT_HOOK: std::sync::OnceLock<fn(&str)> = std::sync::OnceLock::new();

/// Registers the fault-injection callback of this process (first call wins).
/// Points: `mid-status-write` (the temp file of
/// `status.json` is written and synced, not yet renamed) and `after-proof`
/// (`process-terminal.json` is written, not yet overlaid on the status).
// The binary's crash tests (`SUBAGENTS_FAULT`) only: not part of the
// crate's stable API.
#[doc(hidden)]
pub fn install_fault_hook(hook: fn(&str)) {
    let _ = FAULT_HOOK.set(hook);
}

pub(crate) fn fault_point(name: &str) {
    if let Some(hook) = FAULT_HOOK.get() {
        hook(name);
    }
}

/// Milliseconds since the Unix epoch, the unit of every timestamp on disk.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The constant that replaces task text wherever a reader could see it.
pub const PROMPT_REDACTED: &str = "[prompt redacted]";

/// The lifecycle artifact version written by runners (reference constant 3).
pub const LIFECYCLE_ARTIFACT_VERSION: u32 = 3;

pub(crate) fn io_err(op: &'static str, path: &std::path::Path, source: std::io::Error) -> Error {
    Error::Io(atomic_file::Error {
        op,
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod spell_tests {
    use super::spell_duration;

    #[test]
    fn durations_are_spelled_in_one_parseable_form() {
        for (ms, text) in [
            (0, "0ms"),
            (250, "250ms"),
            (1_000, "1s"),
            (2_500, "2.5s"),
            (9_999, "9.9s"),
            (45_000, "45s"),
            (60_000, "1m"),
            (90_000, "1m30s"),
            (1_800_000, "30m"),
            (5_400_000, "1h30m"),
            (5_430_000, "1h30m"),
            (86_400_000, "1d"),
            (97_200_000, "1d3h"),
        ] {
            assert_eq!(spell_duration(ms), text, "{ms} ms");
        }
    }
}
