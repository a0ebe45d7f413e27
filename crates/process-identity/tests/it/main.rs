//! The integration tests of `subagents-process-identity`: one test
//! binary, a module per area.

mod children;
mod environ;
mod machine;
