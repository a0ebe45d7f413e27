//! The capability ceiling parser (docs/protocol/recovery.md §4).
//!
//! Messages that carry the label `async recovery descriptor '<file>'
//! capabilityCeiling` are the reference's own. The reference reports the
//! body rules without any file context; here they get the common
//! `Invalid async recovery descriptor '<file>': ` prefix so every error names
//! the file (docs/protocol/recovery.md §4).

use serde_json::{Map, Value};

use crate::json::object;

const MAX_NAMES: usize = 256;
const MAX_TEXT_BYTES: usize = 256;
const MAX_NAME_BYTES: usize = 128;
const TEXT_RULE: &str =
    "expected a non-empty string without control characters (max 256 UTF-8 bytes).";

/// Validates and normalises a ceiling; the error is the complete message.
pub(crate) fn parse(value: &Value, file: &str) -> Result<Value, String> {
    let label = format!("async recovery descriptor '{file}' capabilityCeiling");
    let prefix = format!("Invalid async recovery descriptor '{file}': ");
    let Some(map) = object(value) else {
        return Err(format!("Invalid {label}; expected an object."));
    };
    if map.get("version").and_then(Value::as_f64) != Some(1.0) {
        return Err(format!("Invalid {label} version."));
    }
    let body = parse_body(map).map_err(|detail| format!("{prefix}{detail}"))?;
    let sources = parse_sources(map.get("sources"), &label)?;
    let mut normalised = Map::new();
    normalised.insert("version".into(), Value::from(1));
    normalised.extend(body);
    normalised.insert("sources".into(), names_value(sources));
    Ok(Value::Object(normalised))
}

fn parse_body(map: &Map<String, Value>) -> Result<Map<String, Value>, String> {
    if !["allowedTools", "allowedAgents", "denyExtensions"]
        .iter()
        .any(|key| map.contains_key(*key))
    {
        return Err(
            "Invalid capability ceiling; expected allowedTools, allowedAgents, or denyExtensions."
                .into(),
        );
    }
    let deny = match map.get("denyExtensions") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err("Invalid capability ceiling denyExtensions; expected a boolean.".into());
        }
    };
    let mut body = Map::new();
    for field in ["allowedTools", "allowedAgents"] {
        if let Some(value) = map.get(field) {
            body.insert(field.into(), names_value(parse_names(value, field)?));
        }
    }
    if deny {
        body.insert("denyExtensions".into(), Value::Bool(true));
    }
    Ok(body)
}

fn parse_names(value: &Value, field: &str) -> Result<Vec<String>, String> {
    let Some(items) = value.as_array() else {
        return Err(format!(
            "Invalid capability ceiling {field}; expected an array."
        ));
    };
    if items.len() > MAX_NAMES {
        return Err(format!(
            "Invalid capability ceiling {field}; expected at most 256 names."
        ));
    }
    items
        .iter()
        .map(|item| {
            let name = text(item)
                .ok_or_else(|| format!("Invalid capability ceiling {field} entry; {TEXT_RULE}"))?;
            if !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.:-".contains(&b))
            {
                return Err(format!(
                    "Invalid capability ceiling {field} entry '{name}'."
                ));
            }
            if name.len() > MAX_NAME_BYTES {
                return Err(format!(
                    "Invalid capability ceiling {field} entry '{name}'; max 128 UTF-8 bytes."
                ));
            }
            Ok(name.to_owned())
        })
        .collect()
}

fn parse_sources(value: Option<&Value>, label: &str) -> Result<Vec<String>, String> {
    let items = value
        .and_then(Value::as_array)
        .filter(|items| items.iter().all(Value::is_string))
        .ok_or_else(|| format!("Invalid {label} sources; expected an array of strings."))?;
    items
        .iter()
        .map(|item| {
            text(item)
                .map(str::to_owned)
                .ok_or_else(|| format!("Invalid capability ceiling {label} source; {TEXT_RULE}"))
        })
        .collect()
}

/// The trimmed text of a string that passes the shared text rule.
fn text(value: &Value) -> Option<&str> {
    let trimmed = value.as_str()?.trim();
    let ok = !trimmed.is_empty()
        && trimmed.len() <= MAX_TEXT_BYTES
        && !trimmed.chars().any(|c| c <= '\u{1f}' || c == '\u{7f}');
    ok.then_some(trimmed)
}

/// Sorted, de-duplicated names as a JSON array.
fn names_value(mut names: Vec<String>) -> Value {
    names.sort();
    names.dedup();
    Value::from(names)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn normalises_names_and_drops_unknown_keys() {
        let value = json!({
            "version": 1, "allowedTools": [" read", "bash", "read"],
            "denyExtensions": false, "sources": ["b", "a "], "extra": 1
        });
        assert_eq!(
            parse(&value, "f").unwrap(),
            json!({"version": 1, "allowedTools": ["bash", "read"], "sources": ["a", "b"]})
        );
    }

    #[test]
    fn reports_each_rule() {
        let cases = [
            (
                json!([]),
                "Invalid async recovery descriptor 'f' capabilityCeiling; expected an object.",
            ),
            (
                json!({"version": 2}),
                "Invalid async recovery descriptor 'f' capabilityCeiling version.",
            ),
            (
                json!({"version": 1, "sources": []}),
                "Invalid async recovery descriptor 'f': Invalid capability ceiling; expected allowedTools, allowedAgents, or denyExtensions.",
            ),
            (
                json!({"version": 1, "denyExtensions": 1}),
                "Invalid async recovery descriptor 'f': Invalid capability ceiling denyExtensions; expected a boolean.",
            ),
            (
                json!({"version": 1, "allowedAgents": "x"}),
                "Invalid async recovery descriptor 'f': Invalid capability ceiling allowedAgents; expected an array.",
            ),
            (
                json!({"version": 1, "allowedTools": ["a b"]}),
                "Invalid async recovery descriptor 'f': Invalid capability ceiling allowedTools entry 'a b'.",
            ),
            (
                json!({"version": 1, "allowedTools": ["a\u{7}"]}),
                "Invalid async recovery descriptor 'f': Invalid capability ceiling allowedTools entry; expected a non-empty string without control characters (max 256 UTF-8 bytes).",
            ),
            (
                json!({"version": 1, "allowedTools": ["x".repeat(129)]}),
                &format!(
                    "Invalid async recovery descriptor 'f': Invalid capability ceiling allowedTools entry '{}'; max 128 UTF-8 bytes.",
                    "x".repeat(129)
                ),
            ),
            (
                json!({"version": 1, "denyExtensions": true}),
                "Invalid async recovery descriptor 'f' capabilityCeiling sources; expected an array of strings.",
            ),
            (
                json!({"version": 1, "denyExtensions": true, "sources": [""]}),
                "Invalid capability ceiling async recovery descriptor 'f' capabilityCeiling source; expected a non-empty string without control characters (max 256 UTF-8 bytes).",
            ),
        ];
        for (value, message) in cases {
            assert_eq!(parse(&value, "f").unwrap_err(), message, "{value}");
        }
    }

    #[test]
    fn at_most_256_names_of_at_most_128_bytes() {
        let names = |n: usize| (0..n).map(|i| format!("t{i}")).collect::<Vec<_>>();
        let ceiling =
            |tools: Vec<String>| json!({"version": 1, "allowedTools": tools, "sources": []});
        let parsed = parse(&ceiling(names(256)), "f").unwrap();
        assert_eq!(parsed["allowedTools"].as_array().unwrap().len(), 256);
        assert_eq!(
            parse(&ceiling(names(257)), "f").unwrap_err(),
            "Invalid async recovery descriptor 'f': Invalid capability ceiling allowedTools; expected at most 256 names."
        );
        let longest = "x".repeat(128);
        let parsed = parse(&ceiling(vec![longest.clone()]), "f").unwrap();
        assert_eq!(parsed["allowedTools"], json!([longest]));
    }
}
