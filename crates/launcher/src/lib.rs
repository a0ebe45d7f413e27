#![doc = include_str!("../README.md")]
//!
//! ## Modules
//!
//! [`service::Launcher`] is the API, over the requests and outcomes of
//! [`api`]; errors are [`error::Error`]. Below it, one module per concern
//! ([`launch`], [`prepare`], [`revive`], [`wait`], [`logs`], [`budget`],
//! [`admission`], ...); the processes of a run (monitor, runner, observer)
//! live in the `supervisor` crate. The `tidy` tests (`crates/subagents/tests/it/tidy.rs`)
//! keep the modules free of import cycles and the crate free of front-end
//! dependencies.
#![warn(missing_docs)]

pub mod admission;
pub use supervisor::{config, procs, transitions};
pub mod api;
pub mod budget;
pub mod damaged;
pub mod error;
pub mod fanout;
pub mod launch;
pub mod leftovers;
pub mod listing;
pub mod logs;
pub mod prepare;
pub mod presets;
pub mod prune;
pub mod revive;
pub mod root;
pub mod runs;
pub mod service;
pub mod settings;
pub mod spec;
pub mod validate;
pub mod wait;

pub use api::*;
pub use error::{Error, Exit};
pub use service::Launcher;
