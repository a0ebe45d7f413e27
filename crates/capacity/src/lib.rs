//! The per-session active-run capacity.
//!
//! This crate will own `session-active-async-capacity/<sha256(session)>/slot-N/owner.json`
//! and the slot life cycle (acquire, mark started, roll back, transfer,
//! reconcile) specified in `shared/spec/capacity.md`. It is filled by the
//! capacity issue.
#![warn(missing_docs)]
