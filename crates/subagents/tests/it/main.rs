//! The end-to-end tests of the `subagents` binary: one test binary, a
//! module per area. Shared helpers are in `common` (the `subagents-test-support`
//! crate, bound to this package's binary).

mod common;

mod agents;
mod answers;
mod cli;
mod compat;
mod compat_fixtures;
mod completions;
mod composite;
mod costs;
mod crash_matrix;
mod damaged;
mod disk_full;
mod everyday;
mod flags;
mod handles;
mod hostile;
mod json;
mod leftovers;
mod list_index;
mod mcp;
mod mcp_clients;
mod names;
mod nested;
mod observer;
mod processes;
mod prune;
mod queue;
mod resume;
mod slurm;
mod snapshots;
mod spec_agents;
mod surface;
mod tidy;
mod top;
mod truthful;
