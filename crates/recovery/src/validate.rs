//! Structural validation of a parsed descriptor in the reference's order
//! (docs/protocol/recovery.md §3), with the normalisations the reader applies.
//!
//! Works on `serde_json::Value` first so that the first failing rule, and its
//! exact message, match the reference; the typed struct is read afterwards.

use serde_json::{Map, Value};

use crate::json::{canonical_integer, integer, is_string_list, non_empty_str, object};
use crate::{acceptance, ceiling};

/// The 41 top-level fields of a version-1 descriptor (docs/protocol/recovery.md §2.1).
pub const ALLOWED_FIELDS: [&str; 41] = [
    "version",
    "launchContractDigest",
    "sourceRunId",
    "agentContract",
    "agent",
    "sessionFile",
    "cwd",
    "model",
    "fallbackModels",
    "thinking",
    "tools",
    "extensions",
    "subagentOnlyExtensions",
    "mcpDirectTools",
    "systemPrompt",
    "systemPromptMode",
    "inheritProjectContext",
    "inheritSkills",
    "skills",
    "skillPath",
    "agentFilePath",
    "completionGuard",
    "memory",
    "outputPath",
    "outputMode",
    "structuredOutputSchema",
    "acceptance",
    "sessionDir",
    "artifactConfig",
    "artifactsDir",
    "maxOutput",
    "controlConfig",
    "intercomBridge",
    "absoluteDeadlineAt",
    "initialTurnBudget",
    "initialToolBudget",
    "maxSubagentDepth",
    "share",
    "capabilityCeiling",
    "launchResolvedExtensions",
    "runFanoutBudget",
];

/// The first rule a descriptor breaks.
#[derive(Debug)]
pub(crate) struct Violation {
    /// The offending top-level field (empty for the whole object).
    pub field: String,
    /// The detail after the common prefix, or the complete message when
    /// `complete` is set (capability ceiling).
    pub detail: String,
    /// `detail` already is the whole message.
    pub complete: bool,
}

type Checked<T = ()> = Result<T, Violation>;

fn fail(field: &str, detail: impl Into<String>) -> Violation {
    Violation {
        field: field.into(),
        detail: detail.into(),
        complete: false,
    }
}

const RUNTIME_TURN_KEYS: [&str; 5] = [
    "outcome",
    "turnCount",
    "wrapUpRequestedAtTurn",
    "terminationDeferredAtTurn",
    "exceededAtTurn",
];

/// Validates `value` and returns the normalised object (docs/protocol/recovery.md §3).
pub(crate) fn descriptor(value: Value, file: &str) -> Checked<Map<String, Value>> {
    let Value::Object(mut map) = value else {
        return Err(fail("", "expected an object."));
    };
    if let Some(key) = map
        .keys()
        .find(|key| !ALLOWED_FIELDS.contains(&key.as_str()))
    {
        return Err(fail(key, format!("unknown field '{key}'.")));
    }
    for field in [
        "sourceRunId",
        "agent",
        "cwd",
        "systemPromptMode",
        "outputMode",
    ] {
        required_string(&map, field)?;
    }
    if map.get("version").and_then(Value::as_f64) != Some(1.0) {
        return Err(fail("version", "version must be 1."));
    }
    map.insert("version".into(), Value::from(1));
    let budget = fanout_shape(map.get("runFanoutBudget"))?;
    map.insert("runFanoutBudget".into(), budget);
    if let Some(value) = map.get("capabilityCeiling") {
        let normalised = ceiling::parse(value, file).map_err(|message| Violation {
            field: "capabilityCeiling".into(),
            detail: message,
            complete: true,
        })?;
        map.insert("capabilityCeiling".into(), normalised);
    }
    agent_contract(&map)?;
    enumerated(&map, "systemPromptMode", &["append", "replace"])?;
    enumerated(&map, "outputMode", &["inline", "file-only"])?;
    for field in ["inheritProjectContext", "inheritSkills", "share"] {
        if !map.get(field).is_some_and(Value::is_boolean) {
            return Err(fail(field, format!("{field} must be a boolean.")));
        }
    }
    if map
        .get("maxSubagentDepth")
        .and_then(integer)
        .is_none_or(|d| d < 0)
    {
        return Err(fail(
            "maxSubagentDepth",
            "maxSubagentDepth must be a non-negative integer.",
        ));
    }
    canonical_integer(&mut map, "maxSubagentDepth");
    scalar_fields(&map)?;
    nested_fields(&mut map)?;
    Ok(map)
}

fn required_string(map: &Map<String, Value>, field: &str) -> Checked {
    match map.get(field).and_then(non_empty_str) {
        Some(_) => Ok(()),
        None => Err(fail(field, format!("{field} must be a non-empty string."))),
    }
}

fn enumerated(map: &Map<String, Value>, field: &str, allowed: &[&str]) -> Checked {
    match map.get(field).and_then(Value::as_str) {
        Some(value) if allowed.contains(&value) => Ok(()),
        _ => Err(fail(field, format!("{field} is invalid."))),
    }
}

/// Step 12 of docs/protocol/recovery.md §3: string lists, `systemPrompt`, optional strings.
fn scalar_fields(map: &Map<String, Value>) -> Checked {
    for field in [
        "fallbackModels",
        "tools",
        "extensions",
        "subagentOnlyExtensions",
        "mcpDirectTools",
        "skills",
        "skillPath",
    ] {
        if map.get(field).is_some_and(|v| !is_string_list(v)) {
            return Err(fail(
                field,
                format!("{field} must contain non-empty strings."),
            ));
        }
    }
    if map.get("systemPrompt").is_some_and(|v| !v.is_string()) {
        return Err(fail("systemPrompt", "systemPrompt must be a string."));
    }
    for field in [
        "launchContractDigest",
        "sessionFile",
        "model",
        "thinking",
        "agentFilePath",
        "outputPath",
        "sessionDir",
        "artifactsDir",
    ] {
        if map.contains_key(field) {
            required_string(map, field)?;
        }
    }
    Ok(())
}

/// Step 13 of docs/protocol/recovery.md §3, in the reference's order.
fn nested_fields(map: &mut Map<String, Value>) -> Checked {
    if map.get("completionGuard").is_some_and(|v| !v.is_boolean()) {
        return Err(fail(
            "completionGuard",
            "completionGuard must be a boolean.",
        ));
    }
    if map
        .get("structuredOutputSchema")
        .is_some_and(|v| object(v).is_none())
    {
        return Err(fail(
            "structuredOutputSchema",
            "structuredOutputSchema must be an object.",
        ));
    }
    if let Some(value) = map.get("memory") {
        memory(value)?;
    }
    if let Some(value) = map.get("absoluteDeadlineAt")
        && !value.as_f64().is_some_and(|t| t.is_finite() && t > 0.0)
    {
        return Err(fail(
            "absoluteDeadlineAt",
            "absoluteDeadlineAt must be a positive timestamp.",
        ));
    }
    if let Some(value) = map.get("initialTurnBudget") {
        let budget = turn_budget(value)?;
        map.insert("initialTurnBudget".into(), budget);
    }
    type Rule = fn(&mut Map<String, Value>) -> Checked;
    let rules: [(&str, Rule); 5] = [
        ("initialToolBudget", tool_budget),
        ("maxOutput", max_output),
        ("artifactConfig", artifact_config),
        ("intercomBridge", intercom_bridge),
        ("controlConfig", control_config),
    ];
    for (field, rule) in rules {
        if let Some(value) = map.get_mut(field) {
            match value {
                Value::Object(inner) => rule(inner)?,
                _ => return Err(fail(field, not_object_message(field))),
            }
        }
    }
    if let Some(value) = map.remove("acceptance")
        && let Some(stripped) = acceptance::strip_legacy(value)
    {
        let errors = acceptance::validate(&stripped, "recoveryDescriptor.acceptance");
        if !errors.is_empty() {
            return Err(fail("acceptance", errors.join(" ")));
        }
        map.insert("acceptance".into(), stripped);
    }
    Ok(())
}

fn not_object_message(field: &str) -> String {
    match field {
        "initialToolBudget" => "recoveryDescriptor.initialToolBudget must be an object with hard and optional soft/block.".into(),
        _ => format!("{field} must be an object."),
    }
}

/// `runFanoutBudget` shape (docs/protocol/fanout-budget.md §4.3 steps 1–2) and its
/// normalisation; the filesystem part is [`crate::FanoutBudgetCheck`]'s.
fn fanout_shape(value: Option<&Value>) -> Checked<Value> {
    const FIELD: &str = "runFanoutBudget";
    let Some(map) = value.and_then(object) else {
        return Err(fail(
            FIELD,
            "Run fan-out budget descriptor is missing or invalid.",
        ));
    };
    let root = map
        .get("rootRunId")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty());
    let directory = map
        .get("directory")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty());
    let limit = map.get("limit").and_then(integer).filter(|l| *l > 0);
    let parent = map.get("parentPath");
    let valid = map.get("version").and_then(Value::as_f64) == Some(1.0)
        && root.is_some()
        && directory.is_some()
        && limit.is_some()
        && parent.is_none_or(Value::is_string);
    let (Some(root), Some(directory), Some(limit), true) = (root, directory, limit, valid) else {
        return Err(fail(FIELD, "Run fan-out budget descriptor is invalid."));
    };
    let mut normalised = Map::new();
    normalised.insert("version".into(), Value::from(1));
    normalised.insert("rootRunId".into(), Value::from(root));
    normalised.insert("directory".into(), Value::from(directory));
    normalised.insert("limit".into(), Value::from(limit));
    if let Some(parent) = parent.and_then(Value::as_str).filter(|p| !p.is_empty()) {
        normalised.insert("parentPath".into(), Value::from(parent));
    }
    Ok(Value::Object(normalised))
}

fn agent_contract(map: &Map<String, Value>) -> Checked {
    const FIELD: &str = "agentContract";
    let Some(value) = map.get(FIELD) else {
        return Ok(());
    };
    let Some(contract) = object(value) else {
        return Err(fail(FIELD, "agentContract must be an object."));
    };
    let exact = contract.len() == 1 && contract.get("version").and_then(Value::as_f64) == Some(1.0);
    if !exact {
        return Err(fail(FIELD, "agentContract must be { version: 1 }."));
    }
    Ok(())
}

fn memory(value: &Value) -> Checked {
    let Some(memory) = object(value) else {
        return Err(fail("memory", "memory must be an object."));
    };
    let scope_ok = matches!(
        memory.get("scope").and_then(Value::as_str),
        Some("project" | "user")
    );
    if !scope_ok || memory.get("path").and_then(non_empty_str).is_none() {
        return Err(fail("memory", "memory is invalid."));
    }
    Ok(())
}

fn turn_budget(value: &Value) -> Checked<Value> {
    const FIELD: &str = "initialTurnBudget";
    const LABEL: &str = "recoveryDescriptor.initialTurnBudget";
    let Some(budget) = object(value) else {
        return Err(fail(
            FIELD,
            format!("{LABEL} must be an object with maxTurns and optional graceTurns."),
        ));
    };
    let remaining = budget
        .keys()
        .filter(|key| !RUNTIME_TURN_KEYS.contains(&key.as_str()));
    for key in remaining {
        if key != "maxTurns" && key != "graceTurns" {
            return Err(fail(FIELD, format!("{LABEL}.{key} is not supported.")));
        }
    }
    let Some(max_turns) = budget.get("maxTurns").and_then(integer).filter(|m| *m >= 1) else {
        return Err(fail(
            FIELD,
            format!("{LABEL}.maxTurns must be an integer >= 1."),
        ));
    };
    // `graceTurns ?? 1` in the reference: null reads as the default too.
    let grace_turns = match budget.get("graceTurns") {
        None | Some(Value::Null) => 1,
        Some(grace) => integer(grace).filter(|g| *g >= 0).ok_or_else(|| {
            fail(
                FIELD,
                format!("{LABEL}.graceTurns must be an integer >= 0."),
            )
        })?,
    };
    Ok(serde_json::json!({"maxTurns": max_turns, "graceTurns": grace_turns}))
}

fn tool_budget(budget: &mut Map<String, Value>) -> Checked {
    const FIELD: &str = "initialToolBudget";
    const LABEL: &str = "recoveryDescriptor.initialToolBudget";
    let Some(hard) = budget.get("hard").and_then(integer).filter(|h| *h >= 1) else {
        return Err(fail(
            FIELD,
            format!("{LABEL}.hard must be an integer >= 1."),
        ));
    };
    if let Some(soft) = budget.get("soft") {
        let Some(soft) = integer(soft).filter(|s| *s >= 1) else {
            return Err(fail(
                FIELD,
                format!("{LABEL}.soft must be an integer >= 1 when provided."),
            ));
        };
        if soft > hard {
            return Err(fail(
                FIELD,
                format!("{LABEL}.soft must be <= {LABEL}.hard."),
            ));
        }
    }
    match budget.get("block") {
        None => {}
        Some(Value::String(s)) if s == "*" => {}
        Some(Value::Array(items)) if items.is_empty() => {
            return Err(fail(
                FIELD,
                format!("{LABEL}.block must contain at least one tool name."),
            ));
        }
        Some(Value::Array(items)) if items.iter().any(|i| non_empty_str(i).is_none()) => {
            return Err(fail(
                FIELD,
                format!("{LABEL}.block must contain non-empty tool names."),
            ));
        }
        Some(Value::Array(_)) => {}
        Some(_) => {
            return Err(fail(
                FIELD,
                format!("{LABEL}.block must be \"*\" or an array of tool names."),
            ));
        }
    }
    canonical_integer(budget, "hard");
    canonical_integer(budget, "soft");
    Ok(())
}

/// An optional (`required == false`) or required integer `>= min`.
fn int_field(
    map: &mut Map<String, Value>,
    field: &str,
    key: &str,
    min: i64,
    required: bool,
    message: &str,
) -> Checked {
    match map.get(key) {
        None if !required => Ok(()),
        Some(value) if integer(value).is_some_and(|i| i >= min) => {
            canonical_integer(map, key);
            Ok(())
        }
        _ => Err(fail(field, format!("{field}.{key} {message}"))),
    }
}

fn max_output(map: &mut Map<String, Value>) -> Checked {
    for key in ["bytes", "lines"] {
        int_field(
            map,
            "maxOutput",
            key,
            1,
            false,
            "must be a positive integer.",
        )?;
    }
    Ok(())
}

fn artifact_config(map: &mut Map<String, Value>) -> Checked {
    const FIELD: &str = "artifactConfig";
    for key in [
        "enabled",
        "includeInput",
        "includeOutput",
        "includeJsonl",
        "includeMetadata",
    ] {
        if !map.get(key).is_some_and(Value::is_boolean) {
            return Err(fail(FIELD, format!("{FIELD}.{key} must be a boolean.")));
        }
    }
    if map
        .get("includeTranscript")
        .is_some_and(|v| !v.is_boolean())
    {
        return Err(fail(
            FIELD,
            format!("{FIELD}.includeTranscript must be a boolean."),
        ));
    }
    int_field(
        map,
        FIELD,
        "cleanupDays",
        0,
        true,
        "must be a non-negative integer.",
    )
}

fn intercom_bridge(map: &mut Map<String, Value>) -> Checked {
    const FIELD: &str = "intercomBridge";
    if let Some(key) = map
        .keys()
        .find(|key| !["mode", "instructionFile", "resultDelivery"].contains(&key.as_str()))
    {
        return Err(fail(FIELD, format!("{FIELD}.{key} is not supported.")));
    }
    if map
        .get("mode")
        .is_some_and(|m| !matches!(m.as_str(), Some("off" | "fork-only" | "always")))
    {
        return Err(fail(FIELD, format!("{FIELD}.mode is invalid.")));
    }
    if map.get("instructionFile").is_some_and(|v| !v.is_string()) {
        return Err(fail(
            FIELD,
            format!("{FIELD}.instructionFile must be a string."),
        ));
    }
    if map.get("resultDelivery").is_some_and(|v| !v.is_boolean()) {
        return Err(fail(
            FIELD,
            format!("{FIELD}.resultDelivery must be a boolean."),
        ));
    }
    Ok(())
}

fn control_config(map: &mut Map<String, Value>) -> Checked {
    const FIELD: &str = "controlConfig";
    const POSITIVE: &str = "must be a positive integer.";
    if !map.get("enabled").is_some_and(Value::is_boolean) {
        return Err(fail(FIELD, format!("{FIELD}.enabled must be a boolean.")));
    }
    for key in [
        "needsAttentionAfterMs",
        "activeNoticeAfterMs",
        "failedToolAttemptsBeforeAttention",
    ] {
        int_field(map, FIELD, key, 1, true, POSITIVE)?;
    }
    for key in ["activeNoticeAfterTurns", "activeNoticeAfterTokens"] {
        int_field(map, FIELD, key, 1, false, POSITIVE)?;
    }
    let lists: [(&str, &[&str]); 2] = [
        ("notifyOn", &["active_long_running", "needs_attention"]),
        ("notifyChannels", &["event", "async", "intercom"]),
    ];
    for (key, allowed) in lists {
        let ok = map.get(key).and_then(Value::as_array).is_some_and(|items| {
            items
                .iter()
                .all(|i| i.as_str().is_some_and(|s| allowed.contains(&s)))
        });
        if !ok {
            return Err(fail(FIELD, format!("{FIELD}.{key} is invalid.")));
        }
    }
    Ok(())
}
