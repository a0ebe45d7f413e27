//! The integration tests of `subagents-recovery`: one test binary, a
//! module per area; `contract` and `lease` re-execute it as workers.

#![recursion_limit = "256"]

mod contract;
mod descriptor;
mod known_answers;
mod lease;
mod lease_owner_fields;
mod optional_fields;
mod roundtrip;
mod seal_fields;
