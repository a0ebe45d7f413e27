#![doc = include_str!("../README.md")]
//!
//! ## Modules
//!
//! [`service::Launcher`] is the API: one method per operation (the list is
//! [`service::OPERATIONS`]), over the requests and outcomes of [`api`];
//! errors are [`error::Error`]. It prints nothing: warnings come back in
//! the outcomes. Below it, one module per concern (`launch`, [`prepare`],
//! [`revive`], [`wait`], [`logs`], `budget`, [`admission`], ...); the
//! modules public here are those another crate (the binary, xtask, the
//! fuzz targets, the tests) uses. [`format`](mod@format) and [`process`] and the
//! re-exported types below are what the binary needs of the protocol crates,
//! which it never names itself. The processes of a run (monitor, runner,
//! observer) live in the `supervisor` crate. The `tidy` tests
//! (`crates/subagents/tests/it/tidy.rs`) keep the modules free of import
//! cycles, the crate free of front-end dependencies and of prints, and every operation served by a command and a tool.
#![warn(missing_docs)]

pub mod admission;
pub mod answers;
pub mod api;
pub mod brief;
pub(crate) mod budget;
pub(crate) mod damaged;
pub(crate) mod dismiss;
pub mod error;
pub mod executor;
pub mod fanout;
pub(crate) mod launch;
pub(crate) mod leftovers;
pub mod listing;
pub mod logs;
pub mod prepare;
pub mod presets;
pub mod prune;
pub(crate) mod queue;
pub(crate) mod reconcile;
pub mod revive;
pub mod root;
pub(crate) mod runs;
pub mod service;
pub mod settings;
pub mod spec;
pub mod validate;
pub mod wait;

pub mod format;
pub mod process;

pub use ::listing::list::{RunSummary, UnreadableRun};
pub use api::*;
/// The protocol crates' types the front-ends render.
pub use atomic_file::escape;
pub use error::{DurationField, Error, ErrorKind, Exit};
pub use service::Launcher;
pub use status::model::{RunStatus, Step};
pub use status::{Layout, RunState, now_ms};
