//! What the `subagents` process is besides a front-end: a run's monitor or
//! runner (the binary re-executes itself as them), a launcher with fault
//! injection, and a reader of a root it may not own.

use std::path::Path;

/// The largest `--fanout-limit`.
pub const MAX_FANOUT_LIMIT: u64 = fanout_budget::MAX_LIMIT;

/// Runs this process as a run's monitor (`__monitor`); its exit code.
pub fn monitor_main() -> i32 {
    supervisor::monitor::main()
}

/// Runs this process as a run's runner (`__runner`); its exit code.
pub fn runner_main() -> i32 {
    supervisor::runner::main()
}

/// Arms the launcher's fault-injection points (test builds' environment).
pub fn init_launcher_faults() {
    supervisor::fault::init(supervisor::fault::Process::Launcher);
}

/// Lets this process fork a run's monitor without `exec`
/// (`supervisor::spawn::SpawnMode::Fork`): only for a front-end that
/// launches from its only thread, as the command line does. The MCP
/// server, multi-threaded, never calls it and keeps `exec`.
pub fn allow_fork() {
    supervisor::spawn::allow_fork();
}

/// Whether the readers accept files and directories other users own.
pub fn set_allow_foreign_owner(allow: bool) {
    atomic_file::read::set_allow_foreign_owner(allow);
}

/// Opens a regular file for reading (no FIFO, no device, no symlink), as
/// the readers do.
pub fn open_regular(path: &Path) -> Option<std::fs::File> {
    atomic_file::read::open_regular(path).ok()
}

/// The pid of a run's monitor, from its status.
pub fn monitor_pid(layout: &status::Layout, run_id: &str) -> Option<u32> {
    let status = status::model::read_status(&layout.run_dir(run_id)).ok()??;
    status.monitor_identity.map(|m| m.pid)
}
