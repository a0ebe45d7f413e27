//! The runner startup handshake (ready → ack → acknowledged → proceed).
//!
//! This crate will own both sides of the revival startup handshake specified
//! in `shared/spec/handshake.md`: the runner side that writes
//! `runner-startup.json`, and the launcher side that acknowledges, authorises
//! and, on failure before proceed, persists the failure and terminates the
//! runner. It is filled by the recovery/resume issue.
#![warn(missing_docs)]
