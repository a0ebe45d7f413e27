//! The end-to-end tests of the `subagents` binary: one test binary, a
//! module per area. Shared helpers are in `common` (the `subagents-test-support`
//! crate, bound to this package's binary).

mod common;

mod agents;
mod answers;
mod cli;
mod compat;
mod compat_fixtures;
mod composite;
mod costs;
mod crash_matrix;
mod damaged;
mod disk_full;
mod everyday;
mod handles;
mod hostile;
mod json;
mod leftovers;
mod list_index;
mod mcp;
mod names;
mod nested;
mod observer;
mod processes;
mod prune;
mod resume;
mod snapshots;
mod surface;
mod tidy;
mod top;
mod truthful;
