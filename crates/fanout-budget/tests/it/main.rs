//! The integration tests of `subagents-fanout-budget`: one test binary, a
//! module per area; `processes` re-executes it as claim workers.

mod budget;
mod formats;
mod limit_env;
mod manifest_fields;
mod processes;
mod reference_lock;
mod roundtrip;
mod syncs;
