//! What the MCP server tells a client about its tools: each tool's title,
//! annotations, input schema (the request type's, without `null` unions)
//! and output schema (the outcome type's, the same type `--json` prints),
//! and the MCP shapes of the outcomes (lists wrapped in an object, compact
//! run summaries unless `detail: "full"`).

use std::borrow::Cow;
use std::path::PathBuf;
use std::sync::Arc;

use launcher::api::{
    AgentsOutcome, BudgetOutcome, CapacityOutcome, ConfigOutcome, DismissOutcome, Launched,
    ListQuery, LogsOutcome, PruneOutcome, ReconcileOutcome, Resumed, RunRef, RunRequest,
    ValidateOutcome, WaitRequest,
};
use launcher::brief::RunBrief;
use launcher::error::{Error, Result};
use launcher::{RunSummary, UnreadableRun};
use rmcp::handler::server::common::{schema_for_input, schema_for_output};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::{JsonObject, ToolAnnotations};
use schemars::JsonSchema;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// How much of each run summary a tool returns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Detail {
    /// [`RunBrief`]: id, label, state, step, timings, outcome, output paths.
    #[default]
    Compact,
    /// Every field of the run's `status.json` (what `status --json` prints).
    Full,
}

/// The `detail` argument of the tools that return run summaries.
const DETAIL_FIELD: &str = "detail";

/// Takes `detail` out of the arguments (the rest is the request type's).
pub fn take_detail(args: &mut JsonObject) -> Result<Detail> {
    match args.remove(DETAIL_FIELD) {
        None | Some(Value::Null) => Ok(Detail::Compact),
        Some(Value::String(s)) if s == "compact" => Ok(Detail::Compact),
        Some(Value::String(s)) if s == "full" => Ok(Detail::Full),
        Some(other) => Err(Error::usage(format!(
            "failed to read the request: `detail` is \"compact\" or \"full\", not {other}"
        ))
        .with_hint("leave `detail` out for compact summaries, or give \"full\"")),
    }
}

/// The request type `T` from a tool's arguments; a mismatch is a usage
/// error (exit 2) naming the field, as every other error is shaped.
pub fn parse<T: DeserializeOwned>(args: JsonObject) -> Result<T> {
    serde_path_to_error::deserialize(Value::Object(args)).map_err(|e| {
        let path = e.path().to_string();
        let cause = plain(&e.inner().to_string());
        if path.is_empty() || path == "." {
            Error::usage(format!("failed to read the request: {cause}"))
                .with_hint("check the request against the tool's input schema")
        } else {
            Error::usage(format!("failed to read the request: `{path}`: {cause}"))
                .with_hint(format!("check `{path}` against the tool's input schema"))
        }
    })
}

/// serde's words for JSON types, as JSON names them.
fn plain(cause: &str) -> String {
    const WORDS: &[(&str, &str)] = &[
        ("expected usize", "expected a non-negative integer"),
        ("expected u64", "expected a non-negative integer"),
        ("expected u32", "expected a non-negative integer"),
        ("expected i64", "expected an integer"),
        ("expected a sequence", "expected an array"),
        ("expected a map", "expected an object"),
        ("invalid type: sequence", "invalid type: array"),
        ("invalid type: map", "invalid type: object"),
    ];
    let mut text = cause.to_owned();
    for (from, to) in WORDS {
        text = text.replace(from, to);
    }
    if let Some(at) = text.find("expected struct ") {
        text.replace_range(at.., "expected an object");
    }
    text
}

/// The command line's flags that are request fields here, as MCP names them.
const FLAGS: &[(&str, &str)] = &[
    ("--task-file", "`taskFile`"),
    ("--task", "`task`"),
    ("--timeout", "`timeout`"),
    ("--older-than", "`olderThan`"),
    ("--dry-run", "`dryRun`"),
    ("--id", "`id`"),
    ("--name", "`name`"),
    ("--spec", "`spec`"),
    ("--step", "`step`"),
    ("--tail", "`tail`"),
    ("--descriptor", "`descriptor`"),
    ("--force", "`force`"),
    ("--all", "`all`"),
];

/// `text` with every flag of [`FLAGS`] (a whole flag, not the start of a
/// longer one) replaced by its request field. The server's own flags
/// (`--max-active`, `--session`, ...) stay: only the user can change them.
pub fn unflag(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    'scan: while let Some(at) = rest.find("--") {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        for (flag, field) in FLAGS {
            let whole = tail.strip_prefix(flag).is_some_and(|after| {
                !after.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '-')
            });
            if whole {
                out.push_str(field);
                rest = &tail[flag.len()..];
                continue 'scan;
            }
        }
        out.push_str("--");
        rest = &tail[2..];
    }
    out.push_str(rest);
    out
}

/// The input schema of request type `T`: no `null` in a type (an optional
/// field is one left out), so clients send the type itself.
pub fn input<T: JsonSchema + 'static>() -> Arc<JsonObject> {
    let schema = schema_for_input::<T>()
        .unwrap_or_else(|e| panic!("the input schema of a tool is an object: {e}"));
    let mut value = Value::Object((*schema).clone());
    without_null(&mut value);
    without_rust_formats(&mut value);
    match value {
        Value::Object(map) => Arc::new(map),
        _ => schema,
    }
}

/// [`input`] of `T` with the `detail` argument.
pub fn input_with_detail<T: JsonSchema + 'static>() -> Arc<JsonObject> {
    let mut schema = (*input::<T>()).clone();
    if let Some(Value::Object(properties)) = schema.get_mut("properties") {
        properties.insert(
            DETAIL_FIELD.to_owned(),
            json!({
                "type": "string",
                "enum": ["compact", "full"],
                "description": "How much of each run summary: `compact` (default: id, label, state, step, timings, exit codes and errors, output paths) or `full` (every field of the run's status.json, as `subagents status --json`)."
            }),
        );
    }
    Arc::new(schema)
}

/// Removes `null` from every type union, `anyOf`/`oneOf` and `enum` of a
/// schema, and `default: null`.
fn without_null(value: &mut Value) {
    strip_null_type(value);
    match value {
        Value::Object(map) => {
            for key in ["anyOf", "oneOf"] {
                let Some(Value::Array(options)) = map.get_mut(key) else {
                    continue;
                };
                options.retain(|o| o.get("type") != Some(&json!("null")));
                if let [Value::Object(_)] = &options[..] {
                    let Some(Value::Object(only)) = options.pop() else {
                        continue;
                    };
                    map.remove(key);
                    for (k, v) in only {
                        map.entry(k).or_insert(v);
                    }
                }
            }
            if let Some(Value::Array(values)) = map.get_mut("enum") {
                values.retain(|v| !v.is_null());
            }
            if map.get("default") == Some(&Value::Null) {
                map.remove("default");
            }
            map.values_mut().for_each(without_null);
        }
        Value::Array(items) => items.iter_mut().for_each(without_null),
        _ => {}
    }
}

/// The output schema of outcome type `T` (what it serialises to): an object
/// at the root, as MCP clients require (a union of objects gets `type`).
/// A field that may be left out is never `null` (it is left out instead),
/// so only the fields always written keep `null` in their type.
pub fn output<T: JsonSchema + 'static>() -> Arc<JsonObject> {
    let mut value = Value::Object((*schema_for_output::<T>()).clone());
    optional_without_null(&mut value);
    without_rust_formats(&mut value);
    let Value::Object(mut schema) = value else {
        unreachable!("a schema object stays an object")
    };
    schema
        .entry("type".to_owned())
        .or_insert_with(|| json!("object"));
    Arc::new(schema)
}

/// [`without_null`] on each property not in its object's `required`.
fn optional_without_null(value: &mut Value) {
    match value {
        Value::Object(map) => {
            let required: Vec<Value> = match map.get("required") {
                Some(Value::Array(names)) => names.clone(),
                _ => Vec::new(),
            };
            if let Some(Value::Object(properties)) = map.get_mut("properties") {
                for (name, property) in properties.iter_mut() {
                    if !required.contains(&json!(name)) {
                        strip_null_type(property);
                    }
                }
            }
            map.values_mut().for_each(optional_without_null);
        }
        Value::Array(items) => items.iter_mut().for_each(optional_without_null),
        _ => {}
    }
}

/// `["T", "null"]` → `"T"` at the top of one schema.
fn strip_null_type(schema: &mut Value) {
    let Some(Value::Array(types)) = schema.get("type") else {
        return;
    };
    let kept: Vec<Value> = types.iter().filter(|t| *t != "null").cloned().collect();
    schema["type"] = match <[Value; 1]>::try_from(kept) {
        Ok([only]) => only,
        Err(kept) => Value::Array(kept),
    };
}

/// Drops the `format`s schemars gives Rust's integer and float types
/// (`uint64`, `int32`, `double`, ...): no JSON Schema validator knows them,
/// and a strict one refuses the schema; `minimum` keeps the sign.
fn without_rust_formats(value: &mut Value) {
    const RUST: &[&str] = &[
        "uint", "uint8", "uint16", "uint32", "uint64", "uint128", "int", "int8", "int16", "int32",
        "int64", "int128", "float", "double",
    ];
    match value {
        Value::Object(map) => {
            if map
                .get("format")
                .and_then(Value::as_str)
                .is_some_and(|f| RUST.contains(&f))
            {
                map.remove("format");
            }
            map.values_mut().for_each(without_rust_formats);
        }
        Value::Array(items) => items.iter_mut().for_each(without_rust_formats),
        _ => {}
    }
}

/// A run summary as a tool returns it: compact, or in full. One schema
/// describes both: every compact field has its full summary's name and type.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum Summary {
    /// The compact view.
    Brief(Box<RunBrief>),
    /// Everything (`detail: "full"`).
    Full(Box<RunSummary>),
}

impl Summary {
    /// `run` at `detail`.
    pub fn of(run: RunSummary, detail: Detail) -> Self {
        match detail {
            Detail::Compact => Self::Brief(Box::new(RunBrief::of(&run))),
            Detail::Full => Self::Full(Box::new(run)),
        }
    }
}

impl JsonSchema for Summary {
    fn schema_name() -> Cow<'static, str> {
        RunBrief::schema_name()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        RunBrief::json_schema(generator)
    }
}

/// `list`: the runs in listing order, the unreadable ones last.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Runs {
    /// The runs.
    pub runs: Vec<ListRow>,
    /// Repairs that could not be written, one line each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// One row of `list`.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum ListRow {
    /// A readable run.
    Run(Summary),
    /// A run whose files could not be read.
    Unreadable(#[schemars(with = "UnreadableSchema")] UnreadableRun),
}

/// The schema of an unreadable run's row.
#[derive(JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
struct UnreadableSchema {
    /// The run directory's name.
    id: String,
    /// Run directory.
    async_dir: PathBuf,
    /// Always `unreadable`.
    state: String,
    /// Why, naming the file.
    error: String,
}

/// `wait`: the final summaries and each run's output tail.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Waited {
    /// The runs, in request order.
    pub runs: Vec<Summary>,
    /// Each run's output tail (as `logs`), in the same order.
    pub logs: Vec<LogsOutcome>,
}

/// `stop` and `dismiss`: one outcome when the call named `run`, `{runs}`
/// when it named `runs`.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum OneOrMany<T> {
    /// The call named `run`.
    One(T),
    /// The call named `runs`.
    Many {
        /// One outcome per run, in request order.
        runs: Vec<T>,
    },
}

/// The schema of a fan-out budget's descriptor (`budget_create`).
#[derive(JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
struct DescriptorSchema {
    /// Always 1.
    version: u32,
    /// The root run the budget was made for.
    root_run_id: String,
    /// The budget's directory.
    directory: PathBuf,
    /// The limit.
    limit: u64,
    /// The claim path of the launch holding it.
    #[serde(skip_serializing_if = "Option::is_none")]
    parent_path: Option<String>,
}

/// The schema of a budget snapshot (`budget_claim`).
#[derive(JsonSchema)]
#[allow(dead_code)]
struct SnapshotSchema {
    /// Claimed slots.
    used: u64,
    /// The limit.
    limit: u64,
    /// `limit - used`.
    remaining: u64,
}

/// The `stop` tool's request: [`launcher::api::StopRequest`] with `runs`.
#[derive(Debug, Clone, Default, serde::Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StopArgs {
    /// Run id, unique prefix or `last` (the newest run of this server's session).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
    /// Several runs (ids, prefixes or `last`); the outcome is then `{runs: [...]}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runs: Option<Vec<String>>,
    /// Why (kept in status.json). Default "Subagent stopped by user.".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The `dismiss` tool's request: [`launcher::api::DismissRequest`] with `runs`.
#[derive(Debug, Clone, Default, serde::Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DismissArgs {
    /// Run id, unique prefix or `last` (the newest run of this server's session).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
    /// Several runs (ids, prefixes or `last`); the outcome is then `{runs: [...]}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runs: Option<Vec<String>>,
    /// Hide it even while it is still active.
    #[serde(default)]
    pub force: bool,
}

/// What a client is told about one tool beyond its description.
struct ToolMeta {
    title: &'static str,
    /// Changes nothing (then the other hints do not apply).
    read_only: bool,
    /// May delete or end something (runs, files).
    destructive: bool,
    /// Calling it again with the same arguments changes nothing more.
    idempotent: bool,
    /// Reaches beyond the state root: runs programs and agents.
    open_world: bool,
    input: fn() -> Arc<JsonObject>,
    output: fn() -> Arc<JsonObject>,
}

/// A read-only tool's metadata.
const fn reader(
    title: &'static str,
    input: fn() -> Arc<JsonObject>,
    output: fn() -> Arc<JsonObject>,
) -> ToolMeta {
    ToolMeta {
        title,
        read_only: true,
        destructive: false,
        idempotent: true,
        open_world: false,
        input,
        output,
    }
}

/// The metadata of tool `name`.
fn meta(name: &str) -> Option<ToolMeta> {
    use launcher::api::{
        AgentsRequest, BudgetClaimRequest, BudgetCreateRequest, BudgetQuery, CapacityQuery,
        ConfigRequest, LogsRequest, PruneRequest, ReconcileRequest, ResumeRequest, ValidateRequest,
    };
    let writer = |title, destructive, idempotent, open_world, input, output| ToolMeta {
        title,
        read_only: false,
        destructive,
        idempotent,
        open_world,
        input,
        output,
    };
    Some(match name {
        "run" => writer(
            "Start a background run",
            false,
            false,
            true,
            input::<RunRequest>,
            output::<Launched>,
        ),
        "status" => reader(
            "Show one run",
            input_with_detail::<RunRef>,
            output::<Summary>,
        ),
        "list" => reader("List runs", input_with_detail::<ListQuery>, output::<Runs>),
        "wait" => reader(
            "Wait for runs to finish",
            input_with_detail::<WaitRequest>,
            output::<Waited>,
        ),
        "stop" => writer(
            "Stop runs",
            true,
            true,
            false,
            input_with_detail::<StopArgs>,
            output::<OneOrMany<Summary>>,
        ),
        "resume" => writer(
            "Resume a finished run",
            false,
            false,
            true,
            input::<ResumeRequest>,
            output::<Resumed>,
        ),
        "logs" => reader(
            "Read a run's output",
            input::<LogsRequest>,
            output::<LogsOutcome>,
        ),
        "budget" => reader(
            "Show a fan-out budget",
            input::<BudgetQuery>,
            output::<BudgetOutcome>,
        ),
        "budget_create" => writer(
            "Create a fan-out budget",
            false,
            false,
            false,
            input::<BudgetCreateRequest>,
            output::<DescriptorSchema>,
        ),
        "budget_claim" => writer(
            "Claim fan-out slots",
            false,
            false,
            false,
            input::<BudgetClaimRequest>,
            output::<SnapshotSchema>,
        ),
        "capacity" => reader(
            "Show a session's capacity",
            input::<CapacityQuery>,
            output::<CapacityOutcome>,
        ),
        "reconcile" => writer(
            "Repair stale runs",
            false,
            true,
            false,
            input::<ReconcileRequest>,
            output::<ReconcileOutcome>,
        ),
        "dismiss" => writer(
            "Hide finished runs",
            false,
            true,
            false,
            input::<DismissArgs>,
            output::<OneOrMany<DismissOutcome>>,
        ),
        "prune" => writer(
            "Delete old runs",
            true,
            true,
            false,
            input::<PruneRequest>,
            output::<PruneOutcome>,
        ),
        "validate" => reader(
            "Validate a state file",
            input::<ValidateRequest>,
            output::<ValidateOutcome>,
        ),
        "agents" => reader(
            "List the agents",
            input::<AgentsRequest>,
            output::<AgentsOutcome>,
        ),
        "config" => reader(
            "Show the configuration",
            input::<ConfigRequest>,
            output::<ConfigOutcome>,
        ),
        _ => return None,
    })
}

/// Gives every tool of `router` its title, annotations and schemas. A tool
/// without metadata is a mistake the tests catch (it keeps rmcp's defaults).
pub fn annotate<S>(router: &mut ToolRouter<S>) {
    for (name, route) in router.map.iter_mut() {
        let Some(meta) = meta(name) else {
            continue;
        };
        let tool = &mut route.attr;
        tool.title = Some(meta.title.to_owned());
        tool.annotations = Some(
            ToolAnnotations::with_title(meta.title)
                .read_only(meta.read_only)
                .destructive(meta.destructive)
                .idempotent(meta.idempotent)
                .open_world(meta.open_world),
        );
        tool.input_schema = (meta.input)();
        tool.output_schema = Some((meta.output)());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_become_fields_and_longer_flags_stay() {
        assert_eq!(
            unflag("give --task or --task-file, not both"),
            "give `task` or `taskFile`, not both"
        );
        assert_eq!(
            unflag("--idle-timeout and --timeout; --max-active N"),
            "--idle-timeout and `timeout`; --max-active N"
        );
        assert_eq!(unflag("--id 'x' is --ids"), "`id` 'x' is --ids");
    }

    #[test]
    fn input_schemas_have_no_null_in_a_type() {
        let schema = Value::Object((*input_with_detail::<WaitRequest>()).clone());
        let text = schema.to_string();
        assert!(!text.contains("\"null\""), "{text}");
        assert_eq!(schema["properties"]["tail"]["type"], "integer", "{text}");
        assert_eq!(schema["properties"]["timeout"]["type"], "string", "{text}");
    }

    #[test]
    fn a_mismatched_argument_is_a_usage_error_naming_the_field() {
        let Value::Object(args) = json!({"runs": ["a"], "tail": "1"}) else {
            unreachable!()
        };
        let e = parse::<WaitRequest>(args).unwrap_err();
        assert_eq!(e.exit(), launcher::Exit::Usage);
        assert!(e.message.contains("`tail`"), "{}", e.message);
        assert!(e.message.contains("non-negative integer"), "{}", e.message);
        assert_eq!(
            e.hint.as_deref(),
            Some("check `tail` against the tool's input schema")
        );
    }
}
