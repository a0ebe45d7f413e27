//! Project automation behind `cargo xtask`; a library so the tests under
//! `xtask/tests/` can reuse what the tasks compute.
#![warn(missing_docs)]

pub mod snapshots;
