//! The public acceptance-input rules (docs/protocol/recovery.md §5), as the reference's
//! `validateAcceptanceInput` applies them: every message is collected, in
//! the reference's order, and the caller joins them with one space.

use serde_json::{Map, Value};

const LEVELS: [&str; 5] = ["auto", "none", "attested", "checked", "verified"];
const EVIDENCE_KINDS: [&str; 9] = [
    "changed-files",
    "tests-added",
    "commands-run",
    "validation-output",
    "residual-risks",
    "no-staged-files",
    "diff-summary",
    "review-findings",
    "manual-notes",
];
const CONFIG_KEYS: [&str; 7] = [
    "level",
    "criteria",
    "evidence",
    "verify",
    "review",
    "stopRules",
    "reason",
];
const GATE_KEYS: [&str; 4] = ["id", "must", "evidence", "severity"];
const VERIFY_KEYS: [&str; 6] = ["id", "command", "timeoutMs", "cwd", "env", "allowFailure"];
const REVIEW_KEYS: [&str; 3] = ["agent", "focus", "required"];
const REVIEWED: &str = "is an achieved status, not a requestable acceptance level. For a read-only reviewer call, omit acceptance. To require independent review of a writer result, use acceptance.review.required and orchestrate the reviewer separately.";
const OBJECT_EXAMPLE: &str =
    "Example: { level: \"checked\", evidence: [\"commands-run\", \"changed-files\"] }.";

/// Strips the legacy resolved-acceptance keys; `None` when the field must be
/// dropped (`explicit: false`).
pub(crate) fn strip_legacy(value: Value) -> Option<Value> {
    let Value::Object(mut map) = value else {
        return Some(value);
    };
    if !map.contains_key("explicit") && !map.contains_key("inferredReason") {
        return Some(Value::Object(map));
    }
    let explicit = map.remove("explicit");
    map.remove("inferredReason");
    (explicit != Some(Value::Bool(false))).then_some(Value::Object(map))
}

/// All rule violations of `value`, labelled with `label`.
pub(crate) fn validate(value: &Value, label: &str) -> Vec<String> {
    match value {
        Value::Bool(false) => Vec::new(),
        Value::String(level) => validate_level_string(level, label),
        Value::Object(map) => validate_object(map, label),
        _ => vec![format!(
            "{label} must be a string level, false, or an object. {OBJECT_EXAMPLE}"
        )],
    }
}

fn validate_level_string(level: &str, label: &str) -> Vec<String> {
    let message = match level {
        "reviewed" => format!("{label} {REVIEWED}"),
        "none" => format!(
            "{label} level \"none\" requires a reason; use {{ level: \"none\", reason: \"...\" }}."
        ),
        "verified" => format!(
            "{label} level \"verified\" requires object form with at least one runtime verify command. Use level \"checked\" or provide a non-empty acceptance.verify array."
        ),
        _ if LEVELS.contains(&level) => return Vec::new(),
        _ => format!("{label} has invalid level '{level}'."),
    };
    vec![message]
}

fn validate_object(map: &Map<String, Value>, label: &str) -> Vec<String> {
    let mut errors = unsupported_keys(map, &CONFIG_KEYS, label);
    let level = map.get("level");
    match level {
        Some(Value::String(l)) if l == "reviewed" => {
            errors.push(format!("{label}.level {REVIEWED}"));
        }
        Some(Value::String(l)) if LEVELS.contains(&l.as_str()) => {}
        None => {}
        Some(_) => errors.push(format!(
            "{label}.level must be one of auto, none, attested, checked, verified."
        )),
    }
    let reason = map.get("reason");
    if level.and_then(Value::as_str) == Some("none")
        && reason
            .and_then(Value::as_str)
            .is_none_or(|r| r.trim().is_empty())
    {
        errors.push(format!("{label}.reason is required when level is none."));
    }
    if reason.is_some_and(|r| !r.is_string()) {
        errors.push(format!("{label}.reason must be a string."));
    }
    validate_criteria(map.get("criteria"), label, &mut errors);
    validate_evidence(map.get("evidence"), label, &mut errors);
    validate_verify(map, label, &mut errors);
    validate_review(map.get("review"), label, &mut errors);
    validate_stop_rules(map.get("stopRules"), label, &mut errors);
    errors
}

fn unsupported_keys(map: &Map<String, Value>, allowed: &[&str], label: &str) -> Vec<String> {
    map.keys()
        .filter(|key| !allowed.contains(&key.as_str()))
        .map(|key| format!("{label}.{key} is not supported."))
        .collect()
}

fn evidence_help() -> String {
    format!(
        "Supported evidence kinds: {}. {OBJECT_EXAMPLE}",
        EVIDENCE_KINDS.join(", ")
    )
}

fn evidence_items(items: &[Value], label: &str, errors: &mut Vec<String>) {
    for (index, item) in items.iter().enumerate() {
        if item.as_str().is_some_and(|s| EVIDENCE_KINDS.contains(&s)) {
            continue;
        }
        let shown = item
            .as_str()
            .map(|s| format!(" \"{s}\""))
            .unwrap_or_default();
        errors.push(format!(
            "{label}[{index}]{shown} is not a supported evidence kind. {}",
            evidence_help()
        ));
    }
}

fn validate_evidence(value: Option<&Value>, label: &str, errors: &mut Vec<String>) {
    match value {
        None => {}
        Some(Value::Array(items)) => evidence_items(items, &format!("{label}.evidence"), errors),
        Some(_) => errors.push(format!(
            "{label}.evidence must be an array. {}",
            evidence_help()
        )),
    }
}

fn validate_criteria(value: Option<&Value>, label: &str, errors: &mut Vec<String>) {
    let items = match value {
        None => return,
        Some(Value::Array(items)) => items,
        Some(_) => return errors.push(format!("{label}.criteria must be an array.")),
    };
    let mut ids: Vec<String> = Vec::new();
    for (index, criterion) in items.iter().enumerate() {
        let path = format!("{label}.criteria[{index}]");
        match criterion {
            Value::String(_) => {}
            Value::Object(gate) => validate_gate(gate, &path, &mut ids, errors),
            _ => errors.push(format!("{path} must be a string or an object.")),
        }
    }
}

fn validate_gate(
    gate: &Map<String, Value>,
    path: &str,
    ids: &mut Vec<String>,
    errors: &mut Vec<String>,
) {
    errors.extend(unsupported_keys(gate, &GATE_KEYS, path));
    match gate
        .get("id")
        .and_then(Value::as_str)
        .filter(|id| !id.trim().is_empty())
    {
        None => errors.push(format!("{path}.id is required.")),
        Some(id) => {
            let normalised = normalized_token(id);
            if ids.contains(&normalised) {
                errors.push(format!(
                    "{path}.id duplicates normalized criterion id '{normalised}'."
                ));
            }
            ids.push(normalised);
        }
    }
    if gate
        .get("must")
        .and_then(Value::as_str)
        .is_none_or(|m| m.trim().is_empty())
    {
        errors.push(format!("{path}.must is required."));
    }
    match gate.get("evidence") {
        None => {}
        Some(Value::Array(items)) => evidence_items(items, &format!("{path}.evidence"), errors),
        Some(_) => errors.push(format!(
            "{path}.evidence must be an array. {}",
            evidence_help()
        )),
    }
    if let Some(severity) = gate.get("severity")
        && severity != "required"
        && severity != "recommended"
    {
        errors.push(format!("{path}.severity must be required or recommended."));
    }
}

fn validate_verify(map: &Map<String, Value>, label: &str, errors: &mut Vec<String>) {
    let verify = map.get("verify");
    let non_empty = verify
        .and_then(Value::as_array)
        .is_some_and(|items| !items.is_empty());
    if map.get("level").and_then(Value::as_str) == Some("verified") && !non_empty {
        errors.push(format!(
            "{label}.verify must contain at least one runtime command when level is verified. Use level \"checked\" or provide a non-empty acceptance.verify array."
        ));
    } else if verify.is_some_and(|v| !v.is_array()) {
        errors.push(format!("{label}.verify must be an array."));
    }
    let Some(items) = verify.and_then(Value::as_array) else {
        return;
    };
    for (index, command) in items.iter().enumerate() {
        let path = format!("{label}.verify[{index}]");
        match command {
            Value::Object(cmd) => validate_command(cmd, &path, errors),
            _ => errors.push(format!("{path} must be an object.")),
        }
    }
}

fn validate_command(cmd: &Map<String, Value>, path: &str, errors: &mut Vec<String>) {
    errors.extend(unsupported_keys(cmd, &VERIFY_KEYS, path));
    for field in ["id", "command"] {
        if cmd
            .get(field)
            .and_then(Value::as_str)
            .is_none_or(|s| s.trim().is_empty())
        {
            errors.push(format!("{path}.{field} is required."));
        }
    }
    if let Some(timeout) = cmd.get("timeoutMs")
        && crate::json::integer(timeout).is_none_or(|t| t < 1)
    {
        errors.push(format!("{path}.timeoutMs must be an integer >= 1."));
    }
    if cmd.get("cwd").is_some_and(|c| !c.is_string()) {
        errors.push(format!("{path}.cwd must be a string."));
    }
    match cmd.get("env") {
        None => {}
        Some(Value::Object(env)) => {
            for (key, value) in env {
                if !value.is_string() {
                    errors.push(format!("{path}.env.{key} must be a string."));
                }
            }
        }
        Some(_) => errors.push(format!("{path}.env must be an object.")),
    }
    if cmd.get("allowFailure").is_some_and(|a| !a.is_boolean()) {
        errors.push(format!("{path}.allowFailure must be a boolean."));
    }
}

fn validate_review(value: Option<&Value>, label: &str, errors: &mut Vec<String>) {
    let review = match value {
        None | Some(Value::Bool(false)) => return,
        Some(Value::Object(review)) => review,
        Some(_) => return errors.push(format!("{label}.review must be false or an object.")),
    };
    errors.extend(unsupported_keys(
        review,
        &REVIEW_KEYS,
        &format!("{label}.review"),
    ));
    for field in ["agent", "focus"] {
        if review.get(field).is_some_and(|v| !v.is_string()) {
            errors.push(format!("{label}.review.{field} must be a string."));
        }
    }
    if review.get("required").is_some_and(|v| !v.is_boolean()) {
        errors.push(format!("{label}.review.required must be a boolean."));
    }
}

fn validate_stop_rules(value: Option<&Value>, label: &str, errors: &mut Vec<String>) {
    match value {
        None => {}
        Some(Value::Array(items)) => {
            for (index, item) in items.iter().enumerate() {
                if !item.is_string() {
                    errors.push(format!("{label}.stopRules[{index}] must be a string."));
                }
            }
        }
        Some(_) => errors.push(format!("{label}.stopRules must be an array.")),
    }
}

/// The reference's criterion-id normalisation: trimmed, lowercase, runs of
/// whitespace/underscores and of dashes collapsed to one dash.
fn normalized_token(value: &str) -> String {
    let mut out = String::new();
    for c in value.trim().to_lowercase().chars() {
        let c = if c.is_whitespace() || c == '_' {
            '-'
        } else {
            c
        };
        if !(c == '-' && out.ends_with('-')) {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const L: &str = "recoveryDescriptor.acceptance";

    #[test]
    fn accepts_the_public_forms() {
        for value in [
            json!(false),
            json!("auto"),
            json!("checked"),
            json!({"level": "none", "reason": "read only"}),
            json!({"level": "verified", "verify": [{"id": "t", "command": "cargo test", "timeoutMs": 1000, "env": {"A": "1"}}]}),
            json!({"criteria": ["x", {"id": "A b", "must": "m", "evidence": ["tests-added"], "severity": "recommended"}], "evidence": ["changed-files"], "review": {"agent": "reviewer", "required": true}, "stopRules": ["stop"]}),
        ] {
            assert_eq!(validate(&value, L), Vec::<String>::new(), "{value}");
        }
    }

    #[test]
    fn collects_every_violation() {
        let value = json!({"level": "reviewed", "bogus": 1, "criteria": [{"id": "a_b", "must": "x"}, {"id": "A  B", "must": ""}]});
        assert_eq!(
            validate(&value, L),
            vec![
                format!("{L}.bogus is not supported."),
                format!("{L}.level {REVIEWED}"),
                format!("{L}.criteria[1].id duplicates normalized criterion id 'a-b'."),
                format!("{L}.criteria[1].must is required."),
            ]
        );
        assert_eq!(
            validate(&json!("sometimes"), L),
            vec![format!("{L} has invalid level 'sometimes'.")]
        );
        assert!(validate(&json!(3), L)[0].starts_with(&format!("{L} must be a string level")));
    }

    #[test]
    fn legacy_keys_are_stripped_and_explicit_false_drops_the_field() {
        assert_eq!(
            strip_legacy(json!({"level": "attested", "explicit": true, "inferredReason": []})),
            Some(json!({"level": "attested"}))
        );
        assert_eq!(
            strip_legacy(json!({"level": "reviewed", "explicit": false})),
            None
        );
        assert_eq!(strip_legacy(json!(false)), Some(json!(false)));
        assert_eq!(strip_legacy(json!("checked")), Some(json!("checked")));
        let plain = json!({"level": "checked", "evidence": ["tests-added"]});
        assert_eq!(strip_legacy(plain.clone()), Some(plain));
        assert_eq!(
            strip_legacy(json!({"level": "none", "inferredReason": ["x"]})),
            Some(json!({"level": "none"}))
        );
    }

    /// One case per rule of `validateAcceptanceInput`, each with the exact
    /// messages (and only those) the reference reports for it.
    #[test]
    fn each_rule_reports_its_own_message() {
        let help = evidence_help();
        assert!(help.starts_with("Supported evidence kinds: changed-files, tests-added, "));
        assert!(help.ends_with(&format!("manual-notes. {OBJECT_EXAMPLE}")));
        let cases: Vec<(Value, Vec<String>)> = vec![
            (json!("attested"), vec![]),
            (
                json!({"level": "auto", "verify": [], "review": false}),
                vec![],
            ),
            (json!("reviewed"), vec![format!("{L} {REVIEWED}")]),
            (
                json!("none"),
                vec![format!(
                    "{L} level \"none\" requires a reason; use {{ level: \"none\", reason: \"...\" }}."
                )],
            ),
            (
                json!("verified"),
                vec![format!(
                    "{L} level \"verified\" requires object form with at least one runtime verify command. Use level \"checked\" or provide a non-empty acceptance.verify array."
                )],
            ),
            (
                json!(null),
                vec![format!(
                    "{L} must be a string level, false, or an object. {OBJECT_EXAMPLE}"
                )],
            ),
            (
                json!({"level": "sometimes"}),
                vec![format!(
                    "{L}.level must be one of auto, none, attested, checked, verified."
                )],
            ),
            (
                json!({"level": 3}),
                vec![format!(
                    "{L}.level must be one of auto, none, attested, checked, verified."
                )],
            ),
            (
                json!({"level": "none", "reason": "  "}),
                vec![format!("{L}.reason is required when level is none.")],
            ),
            (
                json!({"level": "none", "reason": 5}),
                vec![
                    format!("{L}.reason is required when level is none."),
                    format!("{L}.reason must be a string."),
                ],
            ),
            (
                json!({"level": "checked", "reason": 5}),
                vec![format!("{L}.reason must be a string.")],
            ),
            (json!({"level": "checked", "reason": "why"}), vec![]),
            (
                json!({"criteria": "x"}),
                vec![format!("{L}.criteria must be an array.")],
            ),
            (
                json!({"criteria": ["a", 1]}),
                vec![format!("{L}.criteria[1] must be a string or an object.")],
            ),
            (
                json!({"criteria": [{"must": "m", "note": 1}, {"id": " ", "must": "m"}]}),
                vec![
                    format!("{L}.criteria[0].note is not supported."),
                    format!("{L}.criteria[0].id is required."),
                    format!("{L}.criteria[1].id is required."),
                ],
            ),
            (
                json!({"criteria": [{"id": "a", "must": "m", "evidence": "tests-added"}]}),
                vec![format!("{L}.criteria[0].evidence must be an array. {help}")],
            ),
            (
                json!({"criteria": [{"id": "a", "must": "m", "evidence": ["tests-added", "bad", 2]}]}),
                vec![
                    format!(
                        "{L}.criteria[0].evidence[1] \"bad\" is not a supported evidence kind. {help}"
                    ),
                    format!("{L}.criteria[0].evidence[2] is not a supported evidence kind. {help}"),
                ],
            ),
            (
                json!({"criteria": [
                    {"id": "a", "must": "m", "severity": "required"},
                    {"id": "b", "must": "m", "severity": "recommended"},
                    {"id": "c", "must": "m", "severity": "optional"}
                ]}),
                vec![format!(
                    "{L}.criteria[2].severity must be required or recommended."
                )],
            ),
            (
                json!({"evidence": "tests-added"}),
                vec![format!("{L}.evidence must be an array. {help}")],
            ),
            (
                json!({"evidence": ["manual-notes", "nope"]}),
                vec![format!(
                    "{L}.evidence[1] \"nope\" is not a supported evidence kind. {help}"
                )],
            ),
            (
                json!({"level": "verified", "verify": []}),
                vec![format!(
                    "{L}.verify must contain at least one runtime command when level is verified. Use level \"checked\" or provide a non-empty acceptance.verify array."
                )],
            ),
            (
                json!({"level": "verified", "verify": {}}),
                vec![format!(
                    "{L}.verify must contain at least one runtime command when level is verified. Use level \"checked\" or provide a non-empty acceptance.verify array."
                )],
            ),
            (
                json!({"level": "checked", "verify": {}}),
                vec![format!("{L}.verify must be an array.")],
            ),
            (
                json!({"verify": [1]}),
                vec![format!("{L}.verify[0] must be an object.")],
            ),
            (
                json!({"verify": [{"id": " ", "command": "", "timeoutMs": 0, "cwd": 1, "env": {"A": "1", "B": 2}, "allowFailure": "no", "shell": "sh"}]}),
                vec![
                    format!("{L}.verify[0].shell is not supported."),
                    format!("{L}.verify[0].id is required."),
                    format!("{L}.verify[0].command is required."),
                    format!("{L}.verify[0].timeoutMs must be an integer >= 1."),
                    format!("{L}.verify[0].cwd must be a string."),
                    format!("{L}.verify[0].env.B must be a string."),
                    format!("{L}.verify[0].allowFailure must be a boolean."),
                ],
            ),
            (
                json!({"verify": [{"id": "t", "command": "c", "timeoutMs": 1, "cwd": "/w", "allowFailure": true}]}),
                vec![],
            ),
            (
                json!({"verify": [{"id": "t", "command": "c", "timeoutMs": 1.5, "env": ["A=1"]}]}),
                vec![
                    format!("{L}.verify[0].timeoutMs must be an integer >= 1."),
                    format!("{L}.verify[0].env must be an object."),
                ],
            ),
            (
                json!({"review": true}),
                vec![format!("{L}.review must be false or an object.")],
            ),
            (
                json!({"review": {"agent": 1, "focus": 2, "required": "yes", "model": "m"}}),
                vec![
                    format!("{L}.review.model is not supported."),
                    format!("{L}.review.agent must be a string."),
                    format!("{L}.review.focus must be a string."),
                    format!("{L}.review.required must be a boolean."),
                ],
            ),
            (
                json!({"review": {"agent": "r", "focus": "f", "required": false}}),
                vec![],
            ),
            (
                json!({"stopRules": "stop"}),
                vec![format!("{L}.stopRules must be an array.")],
            ),
            (
                json!({"stopRules": ["stop", 1]}),
                vec![format!("{L}.stopRules[1] must be a string.")],
            ),
        ];
        for (value, expected) in cases {
            assert_eq!(validate(&value, L), expected, "{value}");
        }
    }

    #[test]
    fn criterion_ids_compare_after_the_reference_normalisation() {
        // Whitespace and underscores become dashes, runs of dashes collapse.
        assert_eq!(normalized_token("  Fix_the  BUG "), "fix-the-bug");
        assert_eq!(normalized_token("a - b"), "a-b");
        assert_eq!(normalized_token("a-b"), "a-b");
        let gates = json!({"criteria": [
            {"id": "A_b", "must": "m"},
            {"id": "a  b", "must": "m"},
            {"id": "a--b", "must": "m"},
            {"id": "ab", "must": "m"},
            {"id": "a-c", "must": "m"}
        ]});
        assert_eq!(
            validate(&gates, L),
            vec![
                format!("{L}.criteria[1].id duplicates normalized criterion id 'a-b'."),
                format!("{L}.criteria[2].id duplicates normalized criterion id 'a-b'."),
            ]
        );
    }
}
