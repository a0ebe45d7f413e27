//! Finding and loading runs: id prefixes, the observer, summaries.

use std::path::Path;

use listing::list::{Hooks, Resolved, RunSummary};
use status::Layout;
use status::now_ms;
use supervisor::observer;

use crate::error::{Error, ErrorKind, Result};

/// The run handle that names the newest run of the caller's session
/// (resolved by `Launcher`, which knows the session); an explicit run id may
/// not be it.
pub const LAST: &str = "last";

/// Resolves a run id or prefix, exit 4 when unknown or ambiguous.
pub fn resolve(layout: &Layout, id: &str) -> Result<String> {
    match listing::list::resolve(layout, id)? {
        Resolved::Run(id) => Ok(id),
        Resolved::NotFound => Err(Error::of(
            ErrorKind::UnknownRun,
            format!("no such run: '{id}'"),
        )),
        Resolved::Ambiguous(ids) => Err(Error::of(
            ErrorKind::AmbiguousPrefix,
            format!("run id prefix '{id}' is ambiguous: {}", ids.join(", ")),
        )),
    }
}

/// The observer's options for this state root.
pub fn observer_options(layout: &Layout) -> observer::Options {
    observer::Options::new(layout.root())
}

/// Observes one run: a run whose monitor is gone is finalized here
/// (see `supervisor::observer`); a run with a live monitor is left to it.
pub fn observe(layout: &Layout, id: &str) -> observer::Observation {
    match status::layout::exact_run_dir(layout, id) {
        Some(dir) => observer::observe(&dir, &observer_options(layout)),
        None => observer::Observation::NoStatus,
    }
}

/// Loads a run (observing and reconciling it), exit 4 when it has no status;
/// a repair that could not be written adds a line to `warnings`.
pub fn load(layout: &Layout, id: &str, warnings: &mut Vec<String>) -> Result<RunSummary> {
    load_observed(layout, id, warnings).map(|(run, _)| run)
}

/// [`load`], also returning what the observer found.
pub fn load_observed(
    layout: &Layout,
    id: &str,
    warnings: &mut Vec<String>,
) -> Result<(RunSummary, observer::Observation)> {
    let id = resolve(layout, id)?;
    let observation = observe(layout, &id);
    let budgets = fanout_budget::BudgetsRoot::resolve(&layout.fanout_budgets_dir());
    let fanout = |dir: &Path| crate::fanout::live_snapshot(&budgets, dir);
    let hooks = Hooks {
        fanout: Some(&fanout),
        on_repaired: Some(&supervisor::procs::kill_step_groups),
        observe: None,
    };
    let mut skipped = Vec::new();
    let run = listing::list::load_noting(layout, &id, true, now_ms(), &hooks, &mut skipped);
    note_skipped(warnings, skipped);
    let mut run = run?.ok_or_else(|| no_status(&id))?;
    crate::queue::show_positions(layout, [&mut run]);
    Ok((run, observation))
}

/// Adds each repair a read-only command could not write to `warnings`,
/// once.
pub fn note_skipped(warnings: &mut Vec<String>, skipped: impl IntoIterator<Item = String>) {
    for line in skipped {
        if !warnings.contains(&line) {
            warnings.push(line);
        }
    }
}

/// A run directory without `status.json` (exit 4).
pub fn no_status(id: &str) -> Error {
    Error::of(
        ErrorKind::NoStatus,
        format!("run '{id}' has no status.json"),
    )
}
