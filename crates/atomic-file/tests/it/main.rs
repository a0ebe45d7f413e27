//! The integration tests of `subagents-atomic-file`: one test binary, a
//! module per area. Tests that change what is process-wide (a resource
//! limit, the current directory, the foreign-owner setting) run their body
//! alone in a re-execution of this binary (`test_support::reexec`).

mod another_user;
mod batch_open_files;
mod errors;
mod foreign_owner;
mod proc_files;
mod relative;
mod short_append;
mod syncs;
mod writes;
