//! The recovery descriptor (schema version 1) and the session revival lease.
//!
//! This crate will own `recovery-descriptor.json`, its strict reader, and the
//! launch contract it refers to, as specified in `shared/spec/recovery.md`.
//! It is filled by the recovery/resume issue.
#![warn(missing_docs)]
