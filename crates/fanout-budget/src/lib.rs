#![doc = include_str!("../README.md")]
//!
//! The run fan-out budget: how many children one root run may start in total.
//!
//! A budget is a directory `<managed root>/<safeRootRunId>-<uuid>/` holding
//! `manifest.json` (identity and the authoritative limit) and `claims/` with
//! one slot file `NNNNNN.json` per admitted child; usage is the number of slot
//! files, and claims are never released. A [`Descriptor`] names a budget; it
//! travels through the environment ([`BUDGET_ENV`], base64url JSON) and is
//! persisted next to runs as `run-fanout-budget.json`.
//!
//! [`OpenBudget::open`] validates a descriptor (the directory's real path must
//! stay inside the managed root, the manifest must agree) and keeps the
//! directory open; everything afterwards works relative to that handle.
//! [`OpenBudget::claim`] admits a batch of paths entirely or not at all under
//! an exclusive `flock` on `admission.flock`, which the kernel releases when a
//! holder dies, and, while holding it, the reference's directory lock
//! `admission.lock/` ([`ReferenceLock`]) so that pi-subagents 0.49 claimers
//! on the same budget are excluded too. A batch that does not fit in what
//! `claims/` already shows is refused without either lock (claims are never
//! released), and nothing durable happens under the locks (see
//! `admission.rs`). The behaviour, error texts included, is pi-subagents
//! 0.49.0's.
#![warn(missing_docs)]

mod admission;
mod budget;
mod descriptor;
mod error;
mod limit;
mod reference_env;
mod reference_lock;
mod sources;

use std::time::Duration;

pub use budget::{
    BudgetsRoot, Manifest, OpenBudget, Snapshot, budget_dir_name, budget_dir_name_with,
    create_budget, create_budget_with, read_manifest,
};
pub use descriptor::{
    Descriptor, decode_env, decode_env_descriptor, inherited_from_env, read_persisted,
    read_persisted_in, stage_persisted, write_persisted,
};
pub use error::{CommitError, Error, Rejection, RejectionCode, Result, RunFanoutLimitError};
pub use limit::{
    LimitSource, ResolvedLimit, limit_env_value, normalize_limit, normalize_limit_str,
    resolve_limit,
};
pub use reference_env::{node_tmpdir, reference_accepts, reference_state_root};
pub use reference_lock::{OWNER_FILE, REFERENCE_LOCK_DIR, ReferenceLock, STALE_AFTER};
pub use sources::Sources;

/// Env var carrying the inherited descriptor (base64url JSON, no padding).
pub const BUDGET_ENV: &str = "SUBAGENTS_RUN_FANOUT_BUDGET";
/// The reference's name for [`BUDGET_ENV`], accepted on input.
pub const BUDGET_ENV_ALIAS: &str = "PI_SUBAGENT_RUN_FANOUT_BUDGET";
/// Env var overriding the limit of new budgets.
pub const LIMIT_ENV: &str = "SUBAGENTS_MAX_SPAWNS_PER_RUN";
/// The reference's name for [`LIMIT_ENV`], accepted on input.
pub const LIMIT_ENV_ALIAS: &str = "PI_SUBAGENT_MAX_SPAWNS_PER_RUN";
/// Limit of a new budget when neither env nor config gives one.
pub const DEFAULT_LIMIT: u64 = 64;
/// Largest limit: slot files are named with six digits (`000000`–`999999`).
pub const MAX_LIMIT: u64 = 1_000_000;
/// Name of the managed budget root under the state root.
pub const BUDGET_ROOT_DIR: &str = "run-fanout-budgets";
/// Name of the persisted descriptor in a run directory.
pub const PERSISTED_FILE: &str = "run-fanout-budget.json";
/// Name of the manifest in a budget directory.
pub const MANIFEST_FILE: &str = "manifest.json";
/// Name of the claims directory in a budget directory.
pub const CLAIMS_DIR: &str = "claims";
/// Name of our admission lock file (an `flock` target) in a budget directory.
///
/// Never `admission.lock`: pi-subagents 0.49 `mkdir`s its lock under that
/// name and a regular file there would block every one of its claims.
pub const LOCK_FILE: &str = "admission.flock";
/// How long a claim waits for the admission lock before giving up.
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(8);
