#![doc = include_str!("../README.md")]
//!
//! Recovery of async runs: the version-1 recovery descriptor, the launch
//! contract it points to, and the session revival lease.
//!
//! * [`RecoveryDescriptor`] is `recovery-descriptor.json` of a run directory
//!   (pi-subagents 0.49.0's schema). [`read_descriptor`] / [`validate_descriptor_file`]
//!   apply every structural rule of the reference in its order, with its
//!   messages; [`check_fanout_budget`] adds the live fan-out budget check
//!   through a caller-supplied [`FanoutBudgetCheck`]. [`write_descriptor`]
//!   never stores what its own reader refuses.
//! * [`LaunchContract`] (`launch-contract.json`, our extension) holds what the
//!   launcher needs to re-launch a run; its SHA-256 is the descriptor's
//!   `launchContractDigest`. Neither file ever holds the task text.
//! * [`seal`]: `recovery-seal.json`, an HMAC-SHA256 over both files under a
//!   per-root secret, so a rewritten contract with a recomputed digest (or
//!   an edited descriptor) is refused by [`load_recovery`].
//! * [`lease`] is the session revival lease (as pi-subagents 0.49.0 keeps it):
//!   at most one revival appends to a child session file at a time, and a
//!   dead holder is reclaimed only with proof (pid + start time).
#![warn(missing_docs)]

mod acceptance;
mod ceiling;
mod contract;
mod descriptor;
mod json;
pub mod lease;
pub mod seal;
mod types;
mod validate;

pub use contract::{
    ContractError, LAUNCH_CONTRACT_FILE, LaunchContract, PersistedRecovery, Recovery,
    check_binding, launch_contract_path, load_recovery, parse_launch_contract, persist_recovery,
    read_launch_contract, sha256_hex, stage_recovery,
};
pub use descriptor::{
    DescriptorError, FanoutBudgetCheck, check_fanout_budget, descriptor_path, encode_descriptor,
    parse_descriptor, read_descriptor, validate_descriptor_file, write_descriptor,
};
pub use types::*;
pub use validate::ALLOWED_FIELDS;
