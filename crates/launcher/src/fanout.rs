//! The run fan-out budget at launch: creating or inheriting the budget,
//! claiming a launch's static batch, and handing each child its descriptor.

use fanout_budget::{Descriptor, LIMIT_ENV, LIMIT_ENV_ALIAS, MAX_LIMIT, RunFanoutLimitError};
use serde::Serialize;
use serde_json::json;

/// The environment variable that names the run a process runs inside.
pub const RUN_ID_ENV: &str = "SUBAGENTS_RUN_ID";

/// True when this process runs inside a run: its environment carries a run
/// id or an inherited fan-out budget. Such a launch is nested: it claims from
/// the inherited budget and takes no active-run capacity slot (the reference
/// passes a capacity handle only to top-level launches).
pub fn is_nested() -> bool {
    [
        RUN_ID_ENV,
        fanout_budget::BUDGET_ENV,
        fanout_budget::BUDGET_ENV_ALIAS,
    ]
    .iter()
    .any(|name| std::env::var_os(name).is_some_and(|v| !v.is_empty()))
}

/// A setting that was present but did not decide the limit.
#[derive(Debug, Clone, Serialize)]
pub struct Ignored {
    /// The environment variable.
    pub name: &'static str,
    /// Its value.
    pub value: String,
    /// Why it was not used.
    pub reason: String,
}

/// The limit a new root run gets, and where it came from.
#[derive(Debug, Clone, Serialize)]
pub struct NewRootLimit {
    /// The limit.
    pub limit: u64,
    /// `flag`, `env`, `alias` or `default`.
    pub source: &'static str,
    /// The variable that gave it (`env` and `alias`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub variable: Option<&'static str>,
    /// Settings present but not used.
    pub ignored: Vec<Ignored>,
}

impl NewRootLimit {
    /// `--fanout-limit`, `$SUBAGENTS_MAX_SPAWNS_PER_RUN=12`, `the default`.
    pub fn origin(&self) -> String {
        match (self.source, self.variable) {
            ("flag", _) => "--fanout-limit".to_owned(),
            (_, Some(name)) => format!("${name}"),
            _ => "the default".to_owned(),
        }
    }
}

/// Resolves the limit of a new root budget: `--fanout-limit`, else the first
/// non-empty of `$SUBAGENTS_MAX_SPAWNS_PER_RUN` and its alias
/// `$PI_SUBAGENT_MAX_SPAWNS_PER_RUN` when it is an integer in
/// `1..=1000000`, else 64. An invalid value falls to the default (it does
/// not fall through to the alias), as [`fanout_budget::limit_env_value`].
pub fn new_root_limit(flag: Option<u64>) -> NewRootLimit {
    let set: Vec<(&'static str, String)> = [LIMIT_ENV, LIMIT_ENV_ALIAS]
        .into_iter()
        .filter_map(|name| std::env::var(name).ok().map(|v| (name, v)))
        .filter(|(_, v)| !v.is_empty())
        .collect();
    let mut resolved = NewRootLimit {
        limit: fanout_budget::DEFAULT_LIMIT,
        source: "default",
        variable: None,
        ignored: Vec::new(),
    };
    if let Some(limit) = flag {
        resolved.limit = limit;
        resolved.source = "flag";
    }
    for (i, (name, value)) in set.into_iter().enumerate() {
        let normalized = fanout_budget::normalize_limit_str(&value);
        let reason = if flag.is_some() {
            "--fanout-limit takes precedence".to_owned()
        } else if i > 0 {
            format!("${LIMIT_ENV} is set and takes precedence")
        } else if let Some(limit) = normalized {
            resolved.limit = limit;
            resolved.source = if name == LIMIT_ENV { "env" } else { "alias" };
            resolved.variable = Some(name);
            continue;
        } else {
            format!("not an integer in 1..={MAX_LIMIT}; the default applies")
        };
        resolved.ignored.push(Ignored {
            name,
            value,
            reason,
        });
    }
    resolved
}

/// What the user can change when a fan-out claim is refused: a root run's
/// own launch can be retried with a higher limit; a nested launch claims
/// from its root's budget, whose limit is fixed.
pub fn rejection_hint(
    rejection: &RunFanoutLimitError,
    root_run_id: &str,
    own: Option<&NewRootLimit>,
) -> String {
    let knobs = format!("--fanout-limit N or ${LIMIT_ENV} (at most {MAX_LIMIT})");
    let fixed = match own {
        Some(limit) => format!(
            "this run's limit is {} (from {}); retry with a higher {knobs}",
            rejection.rejection.limit,
            limit.origin()
        ),
        None => format!(
            "this launch claims from the budget of root run '{root_run_id}' (limit {}), which cannot be raised; start the root run with a higher {knobs}",
            rejection.rejection.limit
        ),
    };
    format!("{fixed}. Claims are never released; see `subagents budget`.")
}

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

/// `subagents budget [doctor]|create|show|claim`.
pub fn budget_command(
    layout: &status::Layout,
    doctor_args: &crate::cli::DoctorArgs,
    action: Option<crate::cli::BudgetAction>,
) -> crate::error::CliResult {
    use crate::cli::BudgetAction;
    use crate::error::CliError;
    let root = layout.fanout_budgets_dir();
    let action = match action {
        None => return doctor(&root, doctor_args),
        Some(BudgetAction::Doctor(args)) => return doctor(&root, &args),
        Some(action) => action,
    };
    atomic_file::ensure_private_dir(&root)?;
    let fail = |e: fanout_budget::Error| {
        CliError::failed(format!("failed to use run fan-out budget: {e}"))
    };
    match action {
        BudgetAction::Doctor(args) => return doctor(&root, &args),
        BudgetAction::Create {
            root_run_id, limit, ..
        } => {
            let limit = new_root_limit(limit).limit;
            let budget = fanout_budget::create_budget(&root, &root_run_id, limit).map_err(fail)?;
            println!("{}", budget.descriptor().to_json());
        }
        BudgetAction::Show {
            run, descriptor, ..
        } => {
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
                    let root_run_id = &budget.descriptor().root_run_id;
                    return Err(CliError {
                        detail: serde_json::to_value(rejection).ok().map(Box::new),
                        hint: Some(rejection_hint(rejection, root_run_id, None)),
                        ..CliError::new(crate::error::Exit::Limit, rejection.to_string())
                    });
                }
            }
        }
    }
    Ok(())
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
    snapshot: fanout_budget::Snapshot,
}

/// `subagents budget` / `budget doctor`: the limit a new root run gets and
/// why, the inherited budget inside a run, and the never-released rule.
/// Exit 1 (after the report) when the inherited budget cannot be opened.
fn doctor(root: &std::path::Path, args: &crate::cli::DoctorArgs) -> crate::error::CliResult {
    use crate::error::{CliError, Exit};
    let new_root = new_root_limit(args.fanout_limit);
    let run_id = std::env::var(RUN_ID_ENV).ok().filter(|v| !v.is_empty());
    let inherited = fanout_budget::inherited_from_env(root).and_then(|budget| {
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
    let report = json!({
        "newRootRun": new_root,
        "insideRun": run_id,
        "nested": nested,
        "inherited": match &inherited {
            Ok(budget) => json!(budget),
            Err(e) => json!({"error": e.to_string()}),
        },
        "claimsReleased": false,
        "nestedRunsTakeCapacity": false,
    });
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).unwrap_or_default()
        );
    } else {
        println!(
            "{}",
            doctor_text(&new_root, run_id.as_deref(), nested, &inherited)
        );
    }
    match inherited {
        Ok(_) => Ok(()),
        Err(_) if args.json => Err(CliError::silent(Exit::Failed)),
        Err(e) => Err(CliError::failed(format!(
            "failed to open the inherited run fan-out budget: {e}"
        ))),
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
