//! `subagents-reuse-check ROOT [RUN]`: lists every run of the state root
//! (`id state steps`), and with RUN claims one fan-out slot from that run's
//! budget, printing the budget's `used/limit` after the claim.
//!
//! It exists to prove that the protocol crates serve a tool that is not the
//! launcher: it depends on `subagents-status`, `subagents-listing` and
//! `subagents-fanout-budget` only (see `tests/reuse.rs`, which runs it on a
//! root the binary made).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use subagents_fanout_budget::read_persisted;
use subagents_listing::list::{ListOptions, list};
use subagents_status::Layout;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (root, run) = match args.as_slice() {
        [root] => (PathBuf::from(root), None),
        [root, run] => (PathBuf::from(root), Some(run.as_str())),
        _ => {
            eprintln!("usage: subagents-reuse-check ROOT [RUN]");
            return ExitCode::from(2);
        }
    };
    match check(&root, run) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("subagents-reuse-check: {e}");
            ExitCode::FAILURE
        }
    }
}

fn check(root: &Path, run: Option<&str>) -> Result<(), Box<dyn std::error::Error>> {
    let layout = Layout::new(root);
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis() as u64;
    let options = ListOptions {
        all: true,
        now,
        ..Default::default()
    };
    let listing = list(&layout, &options)?;
    for summary in &listing.runs {
        let steps = summary.status.steps().len();
        println!("{} {} {steps}", summary.id, summary.status.state);
    }
    for unreadable in &listing.unreadable {
        println!("{} unreadable {}", unreadable.id, unreadable.error);
    }
    if let Some(run) = run {
        let budget = read_persisted(&layout.run_dir(run), &layout.fanout_budgets_dir())?
            .ok_or_else(|| format!("run '{run}' has no fan-out budget"))?;
        let after = budget.claim(&["reuse-check-child"])?;
        println!("claimed {}/{}", after.used, after.limit);
    }
    Ok(())
}
