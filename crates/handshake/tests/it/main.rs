//! The integration tests of `subagents-handshake`: one test binary, a
//! module per area; `handshake` re-executes it as the fake runner.

mod failure_record;
mod handshake;
