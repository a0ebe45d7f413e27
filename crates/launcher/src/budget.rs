//! The run fan-out budget as the `budget` command and the MCP `budget` tool
//! show it: a run's snapshot, the doctor's report, creating a budget and
//! claiming from one.

use std::path::Path;

use fanout_budget::{Descriptor, LIMIT_ENV, LIMIT_ENV_ALIAS, MAX_LIMIT, OpenBudget, Snapshot};
use serde::Serialize;
use serde_json::json;
use status::Layout;

use crate::api::{BudgetOutcome, BudgetQuery, DoctorReport, Settings};
use crate::error::{Detail, Error, ErrorKind, Result};
use crate::fanout::{NewRootLimit, RUN_ID_ENV, is_nested, new_root_limit, rejection_hint};

fn fail(e: fanout_budget::Error) -> Error {
    Error::failed(format!("failed to use run fan-out budget: {e}"))
}

/// The MCP `budget` tool: a run's snapshot, else the doctor's report.
pub fn budget(layout: &Layout, query: &BudgetQuery, settings: &Settings) -> Result<BudgetOutcome> {
    match (&query.run, &query.descriptor) {
        (None, None) => Ok(BudgetOutcome::Doctor(doctor(layout, settings.fanout_limit))),
        (run, descriptor) => {
            show(layout, run.as_deref(), descriptor.as_deref()).map(BudgetOutcome::Snapshot)
        }
    }
}

/// `budget create`: a new budget's descriptor.
pub fn create(layout: &Layout, root_run_id: &str, limit: Option<u64>) -> Result<Descriptor> {
    let root = layout.fanout_budgets_dir();
    atomic_file::ensure_private_dir(&root)?;
    let limit = new_root_limit(limit).limit;
    let budget = fanout_budget::create_budget(&root, root_run_id, limit).map_err(fail)?;
    Ok(budget.descriptor().clone())
}

/// `budget show`: `{used, limit, remaining}` of a run's budget or of a
/// descriptor file.
pub fn show(layout: &Layout, run: Option<&str>, descriptor: Option<&Path>) -> Result<Snapshot> {
    let root = layout.fanout_budgets_dir();
    atomic_file::ensure_private_dir(&root)?;
    let budget = match (run, descriptor) {
        (_, Some(file)) => open_file(&root, file)?,
        (Some(run), None) => {
            let id = crate::runs::resolve(layout, run)?;
            fanout_budget::read_persisted(&layout.run_dir(&id), &root)
                .map_err(fail)?
                .ok_or_else(|| {
                    Error::failed(format!(
                        "failed to show budget: run '{id}' has no run-fanout-budget.json"
                    ))
                })?
        }
        (None, None) => {
            return Err(Error::of(
                ErrorKind::NoRunNamed,
                "failed to show budget: give RUN or --descriptor",
            ));
        }
    };
    budget.snapshot().map_err(fail)
}

/// `budget claim`: claims `paths` all-or-nothing; over the limit exit 3
/// with the rejection.
pub fn claim(layout: &Layout, descriptor: Option<&Path>, paths: &[String]) -> Result<Snapshot> {
    let root = layout.fanout_budgets_dir();
    atomic_file::ensure_private_dir(&root)?;
    let budget = match descriptor {
        Some(file) => open_file(&root, file)?,
        None => fanout_budget::inherited_from_env(&root)
            .map_err(fail)?
            .ok_or_else(|| {
                Error::failed(format!(
                    "failed to claim: no --descriptor and ${} is not set",
                    fanout_budget::BUDGET_ENV
                ))
            })?,
    };
    budget.claim(paths).map_err(|e| {
        let Some(rejection) = e.rejection() else {
            return fail(e);
        };
        let root_run_id = &budget.descriptor().root_run_id;
        Error::of(ErrorKind::BudgetRefused, rejection.to_string())
            .with_detail(Detail::BudgetClaim(rejection.clone()))
            .with_hint(rejection_hint(rejection, root_run_id, None))
    })
}

/// The budget of the run this process runs inside, as the doctor shows it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Inherited {
    root_run_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    parent_path: Option<String>,
    directory: std::path::PathBuf,
    #[serde(flatten)]
    snapshot: Snapshot,
}

/// `budget` / `budget doctor`: the limit a new root run gets and why, the
/// inherited budget inside a run, and the never-released rule.
pub fn doctor(layout: &Layout, fanout_limit: Option<u64>) -> DoctorReport {
    let root = layout.fanout_budgets_dir();
    let new_root = new_root_limit(fanout_limit);
    let run_id = std::env::var(RUN_ID_ENV).ok().filter(|v| !v.is_empty());
    let inherited = fanout_budget::inherited_from_env(&root).and_then(|budget| {
        budget
            .map(|b| {
                let d = b.descriptor();
                Ok(Inherited {
                    root_run_id: d.root_run_id.clone(),
                    parent_path: d.parent_path.clone(),
                    directory: d.directory.clone(),
                    snapshot: b.snapshot()?,
                })
            })
            .transpose()
    });
    let nested = is_nested();
    let text = doctor_text(&new_root, run_id.as_deref(), nested, &inherited);
    DoctorReport {
        new_root_run: new_root,
        inside_run: run_id,
        nested,
        inherited: match &inherited {
            Ok(budget) => json!(budget),
            Err(e) => json!({"error": e.to_string()}),
        },
        claims_released: false,
        nested_runs_take_capacity: false,
        text,
        inherited_error: inherited.err().map(|e| e.to_string()),
    }
}

fn doctor_text(
    new_root: &NewRootLimit,
    run_id: Option<&str>,
    nested: bool,
    inherited: &fanout_budget::Result<Option<Inherited>>,
) -> String {
    let mut lines = vec!["Run fan-out budget".to_owned()];
    lines.push(format!(
        "  New root run: limit {} (from {})",
        new_root.limit,
        new_root.origin()
    ));
    for ignored in &new_root.ignored {
        lines.push(format!(
            "  Ignored: ${}={:?} ({})",
            ignored.name, ignored.value, ignored.reason
        ));
    }
    lines.push(format!(
        "  Set it with --fanout-limit N or ${LIMIT_ENV} (alias ${LIMIT_ENV_ALIAS}); 1..={MAX_LIMIT}, default {}.",
        fanout_budget::DEFAULT_LIMIT
    ));
    match inherited {
        Ok(Some(b)) => {
            let s = &b.snapshot;
            lines.push(format!(
                "  Inherited budget: root run {}, {}/{} used, {} remaining{}",
                b.root_run_id,
                s.used,
                s.limit,
                s.remaining,
                b.parent_path
                    .as_deref()
                    .map(|p| format!(", parent path {p}"))
                    .unwrap_or_default()
            ));
        }
        Ok(None) => lines.push("  Inherited budget: none (not inside a run)".to_owned()),
        Err(e) => lines.push(format!("  Inherited budget: unavailable ({e})")),
    }
    if let Some(id) = run_id {
        lines.push(format!("  Inside run: {id}"));
    }
    if nested {
        lines.push(
            "  A `subagents run` here is nested: it claims from the inherited budget (its --fanout-limit is ignored) and takes no active-run capacity slot.".to_owned(),
        );
    } else {
        lines.push(
            "  A `subagents run` here is a root run: it creates its own budget and takes a capacity slot when --max-active / $SUBAGENTS_MAX_ACTIVE is set.".to_owned(),
        );
    }
    lines.push(
        "  Claims are never released: a root run's limit counts every run started in its tree, finished or not.".to_owned(),
    );
    lines.join("\n")
}

fn open_file(root: &Path, file: &Path) -> Result<OpenBudget> {
    let text = atomic_file::read::read_input_file(file)
        .map_err(|e| Error::failed(format!("failed to read descriptor: {e}")))
        .and_then(|bytes| {
            String::from_utf8(bytes).map_err(|e| {
                Error::failed(format!(
                    "failed to read descriptor '{}': {e}",
                    atomic_file::escape_path(file)
                ))
            })
        })?;
    let descriptor = Descriptor::from_json(&text)
        .map_err(|e| Error::failed(format!("invalid descriptor '{}': {e}", file.display())))?;
    OpenBudget::open(root, &descriptor)
        .map_err(|e| Error::failed(format!("invalid descriptor '{}': {e}", file.display())))
}
