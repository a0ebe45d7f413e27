//! The run fan-out budget at launch: creating or inheriting the budget,
//! claiming a launch's static batch, and handing each child its descriptor.

use fanout_budget::{Descriptor, LIMIT_ENV, LIMIT_ENV_ALIAS, MAX_LIMIT, RunFanoutLimitError};
use serde::Serialize;

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
    root: &fanout_budget::BudgetsRoot,
    run_dir: &std::path::Path,
) -> Result<Option<serde_json::Value>, String> {
    let Some(budget) =
        fanout_budget::read_persisted_in(run_dir, root).map_err(|e| e.to_string())?
    else {
        return Ok(None);
    };
    let snapshot = budget.snapshot().map_err(|e| e.to_string())?;
    Ok(serde_json::to_value(snapshot).ok())
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
