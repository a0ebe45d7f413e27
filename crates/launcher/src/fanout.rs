//! The run fan-out budget at launch: creating or inheriting the budget,
//! claiming a launch's static batch, and handing each child its descriptor.

use fanout_budget::Descriptor;

/// The live `{used, limit, remaining}` of a run's persisted budget, for
/// listings; an invalid persisted descriptor is an error naming the file.
pub fn live_snapshot(
    root: &std::path::Path,
    run_dir: &std::path::Path,
) -> Result<Option<serde_json::Value>, String> {
    let Some(budget) = fanout_budget::read_persisted(run_dir, root).map_err(|e| e.to_string())?
    else {
        return Ok(None);
    };
    let snapshot = budget.snapshot().map_err(|e| e.to_string())?;
    Ok(serde_json::to_value(snapshot).ok())
}

/// `subagents budget create|show|claim`.
pub fn budget_command(
    layout: &status::Layout,
    action: crate::cli::BudgetAction,
) -> crate::error::CliResult {
    use crate::cli::BudgetAction;
    use crate::error::CliError;
    let root = layout.fanout_budgets_dir();
    atomic_file::ensure_private_dir(&root)?;
    let fail = |e: fanout_budget::Error| {
        CliError::failed(format!("failed to use run fan-out budget: {e}"))
    };
    match action {
        BudgetAction::Create { root_run_id, limit } => {
            let env = fanout_budget::limit_env_value();
            let limit =
                limit.unwrap_or_else(|| fanout_budget::resolve_limit(env.as_deref(), None).limit);
            let budget = fanout_budget::create_budget(&root, &root_run_id, limit).map_err(fail)?;
            println!("{}", budget.descriptor().to_json());
        }
        BudgetAction::Show { run, descriptor } => {
            let budget = match (run, descriptor) {
                (_, Some(file)) => open_file(&root, &file)?,
                (Some(run), None) => {
                    let id = crate::commands::resolve(layout, &run)?;
                    fanout_budget::read_persisted(&layout.run_dir(&id), &root)
                        .map_err(fail)?
                        .ok_or_else(|| {
                            CliError::failed(format!(
                                "failed to show budget: run '{id}' has no run-fanout-budget.json"
                            ))
                        })?
                }
                (None, None) => {
                    return Err(CliError::failed(
                        "failed to show budget: give RUN or --descriptor",
                    ));
                }
            };
            println!(
                "{}",
                serde_json::to_string(&budget.snapshot().map_err(fail)?).unwrap_or_default()
            );
        }
        BudgetAction::Claim {
            descriptor, paths, ..
        } => {
            let budget = match descriptor {
                Some(file) => open_file(&root, &file)?,
                None => fanout_budget::inherited_from_env(&root)
                    .map_err(fail)?
                    .ok_or_else(|| {
                        CliError::failed(format!(
                            "failed to claim: no --descriptor and ${} is not set",
                            fanout_budget::BUDGET_ENV
                        ))
                    })?,
            };
            match budget.claim(&paths) {
                Ok(snapshot) => {
                    println!("{}", serde_json::to_string(&snapshot).unwrap_or_default())
                }
                Err(e) => {
                    let Some(rejection) = e.rejection() else {
                        return Err(fail(e));
                    };
                    // With --json: the error object plus the rejection's own
                    // fields at the top level (cli.md "budget" and "Exit codes").
                    return Err(CliError {
                        detail: serde_json::to_value(rejection).ok().map(Box::new),
                        ..CliError::new(crate::error::Exit::Limit, rejection.to_string())
                    });
                }
            }
        }
    }
    Ok(())
}

fn open_file(
    root: &std::path::Path,
    file: &std::path::Path,
) -> crate::error::CliResult<fanout_budget::OpenBudget> {
    use crate::error::CliError;
    let text = atomic_file::read::read_input_file(file)
        .map_err(|e| CliError::failed(format!("failed to read descriptor: {e}")))
        .and_then(|bytes| {
            String::from_utf8(bytes).map_err(|e| {
                CliError::failed(format!(
                    "failed to read descriptor '{}': {e}",
                    atomic_file::escape_path(file)
                ))
            })
        })?;
    let descriptor = Descriptor::from_json(&text)
        .map_err(|e| CliError::failed(format!("invalid descriptor '{}': {e}", file.display())))?;
    fanout_budget::OpenBudget::open(root, &descriptor)
        .map_err(|e| CliError::failed(format!("invalid descriptor '{}': {e}", file.display())))
}

/// The live check of a recovery descriptor's `runFanoutBudget`: the budget
/// must open under `root` and agree with its manifest; returns it normalised.
pub fn live_check(
    root: &std::path::Path,
) -> impl Fn(&recovery::RunFanoutBudget) -> Result<recovery::RunFanoutBudget, String> + '_ {
    move |budget| {
        let descriptor: Descriptor = serde_json::to_value(budget)
            .and_then(serde_json::from_value)
            .map_err(|_| "Run fan-out budget descriptor is invalid.".to_owned())?;
        let open = fanout_budget::OpenBudget::open(root, &descriptor).map_err(|e| e.to_string())?;
        serde_json::to_value(open.descriptor())
            .and_then(serde_json::from_value)
            .map_err(|e| e.to_string())
    }
}
