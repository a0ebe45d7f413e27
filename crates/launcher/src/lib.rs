//! The `subagents` launcher: composes the protocol crates into a command
//! and an MCP server over one typed API.
//!
//! * [`service::Launcher`] is the API: `run`, `status`, `list`, `wait`,
//!   `stop`, `resume`, `logs`, `budget`, `capacity`, taking the requests and
//!   returning the outcomes of [`api`]; errors are [`error::Error`], carrying
//!   the exit code of the command and structured detail.
//! * [`cli`] (the only module that knows clap) turns arguments into requests;
//!   [`commands`] prints the outcomes as text or `--json`.
//! * [`mcp`] serves the same API as MCP tools on stdio.
//!
//! Below the API, one module per concern ([`launch`], [`prepare`],
//! [`revive`], [`wait`], [`logs`], [`budget`], [`admission`], ...); the two
//! hidden subcommands are the processes of a run, which live in the
//! `supervisor` crate. `tests/tidy.rs` keeps the modules free of import
//! cycles and of clap outside `cli`.
#![warn(missing_docs)]

pub mod admission;
pub use supervisor::{config, procs, transitions};
pub mod api;
pub mod budget;
pub mod cli;
pub mod commands;
pub mod damaged;
pub mod error;
pub mod fanout;
pub mod launch;
pub mod leftovers;
pub mod listing;
pub mod logs;
pub mod mcp;
pub mod prepare;
pub mod presets;
pub mod prune;
pub mod revive;
pub mod root;
pub mod runs;
pub mod service;
pub mod settings;
pub mod spec;
pub mod table;
pub mod top;
pub mod validate;
pub mod wait;

pub use api::*;
pub use error::{Error, Exit};
pub use service::Launcher;

/// Parses the command line, runs the command, prints errors; returns the exit code.
pub fn main() -> i32 {
    cli::main()
}
