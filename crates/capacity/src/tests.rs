//! Tests of the pool with real files and real processes.

/// Pause points inside pool operations, set by worker processes of the
/// crash tests.
pub(crate) mod hooks {
    use std::sync::OnceLock;

    pub(crate) static SLOT_STAGED: OnceLock<fn()> = OnceLock::new();
    pub(crate) static CLAIM_TAKEN: OnceLock<fn()> = OnceLock::new();

    pub(crate) fn slot_staged() {
        if let Some(hook) = SLOT_STAGED.get() {
            hook();
        }
    }

    pub(crate) fn claim_taken() {
        if let Some(hook) = CLAIM_TAKEN.get() {
            hook();
        }
    }
}

mod damaged;
mod edges;
mod pool_files;
mod processes;
mod queue_entry;
mod queue_line;
mod support;
mod verdicts;
