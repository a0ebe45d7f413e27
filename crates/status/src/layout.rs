//! Where things live under a state root.

use std::path::{Path, PathBuf};

/// Paths under one state root; the layout mirrors the reference's temp root.
#[derive(Debug, Clone)]
pub struct Layout {
    root: PathBuf,
}

/// File names inside one run directory.
pub mod files {
    /// The run's status.
    pub const STATUS: &str = "status.json";
    /// Advisory lock serialising read-modify-write of `status.json`.
    pub(crate) const STATUS_LOCK: &str = ".status.lock";
    /// Lifecycle events.
    pub const EVENTS: &str = "events.jsonl";
    /// Runner-written terminal candidate.
    pub const CANDIDATE: &str = "process-terminal-candidate.json";
    /// Observer-written terminal proof.
    pub const PROOF: &str = "process-terminal.json";
    /// The task text, the only file that holds it.
    pub const TASK: &str = "task.md";
    /// Runner stdout log.
    pub const RUNNER_STDOUT: &str = "runner.stdout.log";
    /// Runner stderr log.
    pub const RUNNER_STDERR: &str = "runner.stderr.log";
    /// The run's persisted fan-out budget descriptor.
    pub const RUN_FANOUT_BUDGET: &str = "run-fanout-budget.json";
}

impl Layout {
    /// A layout rooted at `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The state root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `<root>/async-subagent-runs`.
    pub fn runs_dir(&self) -> PathBuf {
        self.root.join("async-subagent-runs")
    }

    /// `<root>/async-subagent-runs/<id>`.
    pub fn run_dir(&self, id: &str) -> PathBuf {
        self.runs_dir().join(id)
    }

    /// `<root>/async-subagent-runs/.active-runs`.
    pub fn active_index_dir(&self) -> PathBuf {
        self.runs_dir().join(crate::index::INDEX_DIR)
    }

    /// `<root>/run-fanout-budgets`.
    pub fn fanout_budgets_dir(&self) -> PathBuf {
        self.root.join("run-fanout-budgets")
    }

    /// `<root>/session-active-async-capacity`.
    pub fn capacity_dir(&self) -> PathBuf {
        self.root.join("session-active-async-capacity")
    }

    /// `<root>/session-leases`.
    pub fn session_leases_dir(&self) -> PathBuf {
        self.root.join("session-leases")
    }
}

/// True when `id` is a safe single file name for a run directory.
pub fn is_safe_run_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id != "."
        && id != ".."
        && !id.starts_with('.')
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// The run directory of `id` when it is a real (non-symlink) directory inside the root.
pub fn exact_run_dir(layout: &Layout, id: &str) -> Option<PathBuf> {
    layout.runs_dir().canonicalize().ok()?;
    run_dir_under(layout, id).map(|(dir, _)| dir)
}

/// [`exact_run_dir`] for many ids: the runs root is resolved once, here
/// (`None` when it does not resolve), not once per id.
pub fn exact_run_dirs(layout: &Layout) -> Option<impl Fn(&str) -> Option<PathBuf> + '_> {
    layout.runs_dir().canonicalize().ok()?;
    Some(move |id: &str| run_dir_under(layout, id).map(|(dir, _)| dir))
}

/// [`exact_run_dir`] once the runs root is known to resolve (listings check
/// it once, not once per run), with the directory's metadata.
pub fn run_dir_under(layout: &Layout, id: &str) -> Option<(PathBuf, std::fs::Metadata)> {
    if !is_safe_run_id(id) {
        return None;
    }
    // A safe id is one plain path component, and a directory that is not a
    // symlink resolves to `<real root>/<id>`: inside the root without
    // resolving it again.
    let dir = layout.run_dir(id);
    let meta = std::fs::symlink_metadata(&dir).ok()?;
    meta.is_dir().then_some((dir, meta))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safe_ids() {
        assert!(is_safe_run_id("k3f9a2"));
        assert!(is_safe_run_id("run_1.a-b"));
        for bad in ["", ".", "..", ".active-runs", "a/b", "a b", "../x", "é"] {
            assert!(!is_safe_run_id(bad), "{bad}");
        }
    }
}
