#![doc = include_str!("../README.md")]
//!
//! Listings of background runs, over the files of the `status` crate.
//!
//! * [`list`]: run summaries; a run by id or prefix, the active runs from
//!   the `.active-runs/` index (stale runs repaired, markers of runs whose
//!   proof is observed released), every run with `all`; one unreadable run
//!   never hides the others;
//! * [`format`](mod@format): the reference's list text of those summaries;
//! * [`list_index`]: the index of finished runs' rendered rows that spares
//!   `list --all` a read of every finished run.
//!
//! Errors are the `status` crate's [`status::Error`]: a listing fails only
//! where reading or repairing a run's files fails.
#![warn(missing_docs)]

pub mod format;
pub mod list;
pub mod list_index;

fn io_err(op: &'static str, path: &std::path::Path, source: std::io::Error) -> status::Error {
    status::Error::Io(atomic_file::Error {
        op,
        path: path.to_path_buf(),
        source,
    })
}
