//! `subagents run --spec FILE`: the composite-run spec file.
//!
//! ```json
//! {"mode": "parallel", "tasks": [STEP, ...], "concurrency": 2, "failFast": true, "queue": true}
//! {"mode": "chain", "steps": [STEP | {"parallel": [STEP, ...], "concurrency": 2, "failFast": false}, ...], "queue": false}
//! STEP = {"agent": "name", "command": ["argv", ...], "name": "label", "task": "text" | "taskFile": "path",
//!         "cwd": "dir", "timeout": "10m", "idleTimeout": "2m"}
//! ```
//!
//! A step without `command` runs the named agent `agent` (its definition
//! renders the command, as `run --agent NAME` does); the launcher resolves
//! it, this module only parses. Both forms also take `idleTimeout` at the
//! top (the default of every step). In a chain step's task, `{previous}`
//! stands for the output of the step (or parallel group) before it; the
//! runner puts it in when the step starts.
//!
//! Parsing is strict: unknown fields, wrong types and empty lists are
//! refused with the file and the JSON path of the offending field.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::root::parse_duration;
use supervisor::config::GroupConfig;

/// Parallel groups run this many children at once unless the spec says otherwise.
pub const DEFAULT_CONCURRENCY: usize = 4;

/// One step as written in a spec file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct StepSpec {
    /// Agent label; without `command`, the named agent to run.
    pub agent: String,
    /// argv; empty for a named agent's step (the launcher renders it).
    #[serde(default)]
    pub command: Vec<String>,
    /// The step's label in listings (see [`check_name`]).
    #[serde(default)]
    pub name: Option<String>,
    /// The command's short form, when the agent label is only its file
    /// name (a plain `run -- COMMAND`); never in a spec file.
    #[serde(skip)]
    pub command_label: Option<String>,
    /// Task text.
    #[serde(default)]
    pub task: Option<String>,
    /// A file holding the task text (relative to the launcher's directory,
    /// as `--task-file`); read by the launcher.
    #[serde(default)]
    pub task_file: Option<PathBuf>,
    /// Working directory (relative to `--cwd`, default the current directory).
    #[serde(default)]
    pub cwd: Option<PathBuf>,
    /// Step timeout (`30m`, `90s`).
    #[serde(default)]
    pub timeout: Option<String>,
    /// How long the step may print nothing before it is ended (`0`: off).
    #[serde(default)]
    pub idle_timeout: Option<String>,
}

impl StepSpec {
    /// Whether the step runs a named agent (no `command` of its own).
    pub fn is_named_agent(&self) -> bool {
        self.command.is_empty()
    }
}

/// The placeholder a chain step's task may hold for the previous step's output.
pub const PREVIOUS_PLACEHOLDER: &str = supervisor::runner::STEP_PREVIOUS;

/// A step ready to launch.
#[derive(Debug, Clone)]
pub struct PlannedStep {
    /// The spec step.
    pub spec: StepSpec,
    /// Step timeout in ms.
    pub timeout_ms: Option<u64>,
    /// Fan-out claim path (`tasks[j]`, `chain[i]`, `chain[i].parallel[j]`).
    pub claim_path: String,
    /// The JSON path of the step in the spec (`tasks[0]`,
    /// `steps[1].parallel[0]`), for errors found after parsing.
    pub at: String,
    /// The step's idle limit in ms as the spec sets it (its own, else the
    /// spec's top-level one); `Some(0)` turns it off. The launcher then
    /// settles it (request, definition, default): `None` or the limit.
    pub idle_timeout_ms: Option<u64>,
    /// A named agent's rendered environment (set by the launcher).
    pub env: std::collections::BTreeMap<String, String>,
    /// The task holds [`PREVIOUS_PLACEHOLDER`] for the runner to replace.
    pub previous_in_task: bool,
}

/// A parsed spec: mode, flat steps, groups.
#[derive(Debug, Clone)]
pub struct Plan {
    /// `parallel` or `chain`.
    pub mode: String,
    /// Flat steps.
    pub steps: Vec<PlannedStep>,
    /// Execution groups.
    pub groups: Vec<GroupConfig>,
    /// The spec's `queue`: wait for a capacity slot instead of being refused.
    pub queue: Option<bool>,
}

impl Plan {
    /// Whether flat step `i` runs after another group (a chain step after
    /// the first), so that `{previous}` has something to stand for.
    pub fn has_previous(&self, i: usize) -> bool {
        self.mode == "chain" && self.groups.first().is_some_and(|g| i >= g.start + g.count)
    }
}

impl Plan {
    /// A single run of one step (claim path `single`).
    pub fn single(spec: StepSpec) -> Self {
        Self {
            mode: "single".into(),
            steps: vec![PlannedStep {
                spec,
                timeout_ms: None,
                claim_path: "single".into(),
                at: String::new(),
                idle_timeout_ms: None,
                env: Default::default(),
                previous_in_task: false,
            }],
            groups: vec![GroupConfig {
                start: 0,
                count: 1,
                concurrency: 1,
                fail_fast: false,
                parallel: false,
            }],
            queue: None,
        }
    }
}

/// The longest name a run or a step may have, in characters.
pub const MAX_NAME_CHARS: usize = 64;

/// A run's or a step's name: 1 to [`MAX_NAME_CHARS`] characters, none a
/// control character (a name is one cell of a listing's row).
pub fn check_name(name: &str) -> Result<(), String> {
    if name.trim().is_empty() {
        return Err("must not be empty".into());
    }
    if name.chars().count() > MAX_NAME_CHARS {
        return Err(format!("must be at most {MAX_NAME_CHARS} characters"));
    }
    if name.chars().any(char::is_control) {
        return Err("must not hold control characters".into());
    }
    Ok(())
}

/// Reads and validates a spec file.
pub fn read_plan(path: &Path) -> Result<Plan, String> {
    let bytes = atomic_file::read::read_input_file(path)
        .map_err(|e| format!("failed to read spec file: {e}"))?;
    let text = String::from_utf8(bytes)
        .map_err(|e| format!("invalid spec file '{}': {e}", path.display()))?;
    parse_plan_text(&text).map_err(|e| format!("invalid spec file '{}': {e}", path.display()))
}

/// Parses and validates spec text. Touches no file (fuzzing entry point).
pub fn parse_plan_text(text: &str) -> Result<Plan, String> {
    let value: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    parse_plan(&value)
}

/// Validates a spec value.
pub fn parse_plan(value: &Value) -> Result<Plan, String> {
    let obj = value.as_object().ok_or("the spec must be a JSON object")?;
    match obj.get("mode").and_then(Value::as_str) {
        Some("parallel") => parse_parallel(obj),
        Some("chain") => parse_chain(obj),
        Some(other) => Err(format!(
            "mode: expected \"parallel\" or \"chain\", found \"{other}\""
        )),
        None => Err("mode: expected \"parallel\" or \"chain\"".into()),
    }
}

fn parse_parallel(obj: &Map<String, Value>) -> Result<Plan, String> {
    only_keys(
        obj,
        &[
            "mode",
            "tasks",
            "concurrency",
            "failFast",
            "idleTimeout",
            "queue",
        ],
        "",
    )?;
    let idle = top_idle_timeout(obj)?;
    let tasks = non_empty_array(obj.get("tasks"), "tasks")?;
    let mut plan = Plan {
        mode: "parallel".into(),
        steps: Vec::new(),
        groups: Vec::new(),
        queue: queue_field(obj)?,
    };
    for (j, task) in tasks.iter().enumerate() {
        plan.steps.push(step(task, &format!("tasks[{j}]"), idle)?);
    }
    plan.groups.push(group(obj, 0, tasks.len(), "")?);
    Ok(plan)
}

fn parse_chain(obj: &Map<String, Value>) -> Result<Plan, String> {
    only_keys(obj, &["mode", "steps", "idleTimeout", "queue"], "")?;
    let idle = top_idle_timeout(obj)?;
    let items = non_empty_array(obj.get("steps"), "steps")?;
    let mut plan = Plan {
        mode: "chain".into(),
        steps: Vec::new(),
        groups: Vec::new(),
        queue: queue_field(obj)?,
    };
    for (i, item) in items.iter().enumerate() {
        let start = plan.steps.len();
        let at = format!("steps[{i}]");
        match item.as_object().filter(|o| o.contains_key("parallel")) {
            Some(inner) => {
                only_keys(inner, &["parallel", "concurrency", "failFast"], &at)?;
                let tasks = non_empty_array(inner.get("parallel"), &format!("{at}.parallel"))?;
                for (j, task) in tasks.iter().enumerate() {
                    let mut planned = step(task, &format!("{at}.parallel[{j}]"), idle)?;
                    planned.claim_path = format!("chain[{i}].parallel[{j}]");
                    plan.steps.push(planned);
                }
                plan.groups.push(group(inner, start, tasks.len(), &at)?);
            }
            None => {
                let mut planned = step(item, &at, idle)?;
                planned.claim_path = format!("chain[{i}]");
                plan.steps.push(planned);
                plan.groups.push(GroupConfig {
                    start,
                    count: 1,
                    concurrency: 1,
                    fail_fast: false,
                    parallel: false,
                });
            }
        }
    }
    Ok(plan)
}

fn step(value: &Value, at: &str, idle: Option<u64>) -> Result<PlannedStep, String> {
    let spec: StepSpec = serde_json::from_value(value.clone()).map_err(|e| format!("{at}: {e}"))?;
    if let Some(name) = &spec.name {
        check_name(name).map_err(|why| format!("{at}.name: {why}"))?;
    }
    if spec.agent.trim().is_empty() {
        return Err(format!("{at}.agent: must not be empty"));
    }
    // Absent, the step is the named agent's; present, it must be a command.
    let has_command = value.get("command").is_some();
    if has_command && spec.command.first().is_none_or(|c| c.is_empty()) {
        return Err(format!(
            "{at}.command: expected a non-empty array of strings"
        ));
    }
    if spec.task.is_some() && spec.task_file.is_some() {
        return Err(format!("{at}.taskFile: give task or taskFile, not both"));
    }
    if spec
        .task_file
        .as_ref()
        .is_some_and(|p| p.as_os_str().is_empty())
    {
        return Err(format!("{at}.taskFile: must not be empty"));
    }
    let timeout_ms = match &spec.timeout {
        Some(t) => {
            let d = parse_duration(t).map_err(|e| format!("{at}.timeout: {e}"))?;
            (!d.is_zero()).then_some(d.as_millis() as u64)
        }
        None => None,
    };
    let idle_timeout_ms = match &spec.idle_timeout {
        Some(t) => Some(duration_ms(t).map_err(|e| format!("{at}.idleTimeout: {e}"))?),
        None => idle,
    };
    Ok(PlannedStep {
        spec,
        timeout_ms,
        claim_path: at.to_owned(),
        at: at.to_owned(),
        idle_timeout_ms,
        env: Default::default(),
        previous_in_task: false,
    })
}

/// A duration in ms (`0` for off), with the one duration syntax.
pub fn duration_ms(text: &str) -> Result<u64, String> {
    parse_duration(text).map(|d| d.as_millis() as u64)
}

/// The spec's top-level `idleTimeout`, the default of its steps.
fn top_idle_timeout(obj: &Map<String, Value>) -> Result<Option<u64>, String> {
    match obj.get("idleTimeout") {
        None => Ok(None),
        Some(Value::String(text)) => duration_ms(text)
            .map(Some)
            .map_err(|e| format!("idleTimeout: {e}")),
        Some(_) => Err("idleTimeout: expected a duration string such as \"2m\"".into()),
    }
}

fn group(
    obj: &Map<String, Value>,
    start: usize,
    count: usize,
    at: &str,
) -> Result<GroupConfig, String> {
    let field = |name: &str| {
        if at.is_empty() {
            name.to_owned()
        } else {
            format!("{at}.{name}")
        }
    };
    let concurrency = match obj.get("concurrency") {
        None => DEFAULT_CONCURRENCY,
        Some(v) => v
            .as_u64()
            .filter(|n| *n > 0)
            .ok_or_else(|| format!("{}: expected a positive integer", field("concurrency")))?
            as usize,
    };
    let fail_fast = match obj.get("failFast") {
        None => false,
        Some(v) => v
            .as_bool()
            .ok_or_else(|| format!("{}: expected a boolean", field("failFast")))?,
    };
    Ok(GroupConfig {
        start,
        count,
        concurrency,
        fail_fast,
        parallel: true,
    })
}

/// The spec's top-level `queue`, a boolean when present.
fn queue_field(obj: &Map<String, Value>) -> Result<Option<bool>, String> {
    match obj.get("queue") {
        None => Ok(None),
        Some(v) => v
            .as_bool()
            .map(Some)
            .ok_or_else(|| "queue: expected a boolean (true or false)".to_owned()),
    }
}

fn non_empty_array<'a>(value: Option<&'a Value>, at: &str) -> Result<&'a Vec<Value>, String> {
    value
        .and_then(Value::as_array)
        .filter(|a| !a.is_empty())
        .ok_or_else(|| format!("{at}: expected a non-empty array"))
}

fn only_keys(obj: &Map<String, Value>, allowed: &[&str], at: &str) -> Result<(), String> {
    // Name the accepted keys: the usual mistake is a chain written with the
    // parallel form's `tasks` (or the reverse), which the key list makes plain.
    let expected = allowed.join(", ");
    match obj.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(key) if at.is_empty() => Err(format!("{key}: unknown field (expected {expected})")),
        Some(key) => Err(format!("{at}.{key}: unknown field (expected {expected})")),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn s(agent: &str) -> Value {
        json!({"agent": agent, "command": ["true"]})
    }

    #[test]
    fn parallel_plan_has_one_group_and_task_paths() {
        let plan = parse_plan(&json!({"mode": "parallel", "tasks": [s("a"), s("b")], "concurrency": 1, "failFast": true})).unwrap();
        assert_eq!(
            plan.steps
                .iter()
                .map(|s| s.claim_path.as_str())
                .collect::<Vec<_>>(),
            ["tasks[0]", "tasks[1]"]
        );
        let g = plan.groups[0];
        assert_eq!(
            (g.start, g.count, g.concurrency, g.fail_fast, g.parallel),
            (0, 2, 1, true, true)
        );
    }

    #[test]
    fn chain_plan_flattens_parallel_groups() {
        let spec =
            json!({"mode": "chain", "steps": [s("a"), {"parallel": [s("b"), s("c")]}, s("d")]});
        let plan = parse_plan(&spec).unwrap();
        let paths: Vec<_> = plan.steps.iter().map(|s| s.claim_path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "chain[0]",
                "chain[1].parallel[0]",
                "chain[1].parallel[1]",
                "chain[2]"
            ]
        );
        assert_eq!(plan.groups.len(), 3);
        assert_eq!((plan.groups[1].start, plan.groups[1].count), (1, 2));
        assert_eq!(plan.groups[2].start, 3);
    }

    #[test]
    fn a_step_without_command_is_a_named_agent_and_idle_limits_cascade() {
        let spec = json!({"mode": "chain", "idleTimeout": "1m", "steps": [
            {"agent": "reviewer", "task": "look"},
            {"parallel": [
                {"agent": "scout", "taskFile": "t.md", "idleTimeout": "0"},
                {"agent": "fixer", "task": "{previous}", "idleTimeout": "90s"}
            ]},
            s("cmd")
        ]});
        let plan = parse_plan(&spec).unwrap();
        let named: Vec<_> = plan.steps.iter().map(|p| p.spec.is_named_agent()).collect();
        assert_eq!(named, [true, true, true, false]);
        let idle: Vec<_> = plan.steps.iter().map(|p| p.idle_timeout_ms).collect();
        assert_eq!(idle, [Some(60_000), Some(0), Some(90_000), Some(60_000)]);
        let at: Vec<_> = plan.steps.iter().map(|p| p.at.as_str()).collect();
        assert_eq!(
            at,
            [
                "steps[0]",
                "steps[1].parallel[0]",
                "steps[1].parallel[1]",
                "steps[2]"
            ]
        );
        let previous: Vec<_> = (0..4).map(|i| plan.has_previous(i)).collect();
        assert_eq!(previous, [false, true, true, true]);
        let parallel = parse_plan(&json!({"mode": "parallel", "tasks": [s("a"), s("b")]})).unwrap();
        assert!(!parallel.has_previous(1));
        assert_eq!(parallel.steps[0].idle_timeout_ms, None);
    }

    #[test]
    fn a_spec_may_ask_for_the_queue() {
        let chain = parse_plan(&json!({"mode": "chain", "steps": [s("a")], "queue": true}));
        assert_eq!(chain.unwrap().queue, Some(true));
        let parallel = parse_plan(&json!({"mode": "parallel", "tasks": [s("a")]}));
        assert_eq!(parallel.unwrap().queue, None);
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (json!({"mode": "serial"}), "mode: expected"),
            (
                json!({"mode": "parallel", "tasks": []}),
                "tasks: expected a non-empty array",
            ),
            (
                json!({"mode": "chain", "tasks": [s("a")]}),
                "tasks: unknown field (expected mode, steps, idleTimeout, queue)",
            ),
            (
                json!({"mode": "parallel", "tasks": [s("a")], "extra": 1}),
                "extra: unknown field",
            ),
            (
                json!({"mode": "parallel", "tasks": [{"agent": "a", "command": "true"}]}),
                "tasks[0]: invalid type",
            ),
            (
                json!({"mode": "parallel", "tasks": [{"agent": "a", "command": []}]}),
                "tasks[0].command",
            ),
            (
                json!({"mode": "parallel", "tasks": [{"agent": "a", "task": "x", "taskFile": "t"}]}),
                "tasks[0].taskFile: give task or taskFile, not both",
            ),
            (
                json!({"mode": "parallel", "tasks": [{"agent": "a", "taskFile": ""}]}),
                "tasks[0].taskFile: must not be empty",
            ),
            (
                json!({"mode": "chain", "steps": [{"agent": "a", "idleTimeout": "2"}]}),
                "steps[0].idleTimeout: invalid duration '2'",
            ),
            (
                json!({"mode": "chain", "idleTimeout": true, "steps": [s("a")]}),
                "idleTimeout: expected a duration string",
            ),
            (
                json!({"mode": "parallel", "tasks": [{"agent": "a", "command": ["x"], "bogus": 1}]}),
                "tasks[0]: unknown field `bogus`",
            ),
            (
                json!({"mode": "chain", "steps": [{"parallel": [s("a")], "concurrency": 0}]}),
                "steps[0].concurrency",
            ),
            (
                json!({"mode": "chain", "steps": [{"parallel": [s("a")], "failFast": "yes"}]}),
                "steps[0].failFast",
            ),
            (
                json!({"mode": "chain", "steps": [{"agent": "a", "command": ["x"], "timeout": "5y"}]}),
                "steps[0].timeout",
            ),
            (
                json!({"mode": "chain", "steps": [s("a")], "queue": "yes"}),
                "queue: expected a boolean",
            ),
            (
                json!({"mode": "parallel", "tasks": [s("a")], "queue": 1}),
                "queue: expected a boolean",
            ),
        ];
        for (spec, expected) in cases {
            let err = parse_plan(&spec).unwrap_err();
            assert!(err.starts_with(expected), "{err} !~ {expected}");
        }
    }
}
