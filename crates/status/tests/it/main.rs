//! The `status` crate's integration tests, one binary (`fault_hook.rs` is
//! its own: the hook it installs is process-wide and set once).
extern crate subagents_status as status;

mod edges;
mod files;
mod model_rules;
mod optional_fields;
mod proof_rules;
mod reconcile_rules;
mod record_fields;
mod reference_rules;
mod roundtrip;
