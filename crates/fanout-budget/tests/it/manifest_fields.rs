//! `manifest.json` has no optional field: each of its four fields absent,
//! `null`, of the wrong type or empty refuses the manifest with the rule
//! that names that field (docs/protocol/fanout-budget.md §2), and nothing
//! else; the full manifest reads each value into its own field.

extern crate subagents_fanout_budget as fanout_budget;
use std::path::Path;

use fanout_budget::{Error, Manifest};
use serde_json::{Value, json};

/// Every field set, no two values alike.
fn full() -> Value {
    json!({"version": 1, "rootRunId": "run-7", "limit": 5, "createdAt": 1_767_225_600_123u64})
}

fn parse(value: &Value) -> Result<Manifest, Error> {
    Manifest::parse(&value.to_string(), Path::new("/budgets/run-7-u"))
}

#[test]
fn the_full_manifest_reads_each_value_into_its_own_field() {
    let m = parse(&full()).unwrap();
    assert_eq!(
        (m.version, m.root_run_id.as_str(), m.limit, m.created_at),
        (1, "run-7", 5, 1_767_225_600_123.0)
    );
    // Unknown keys are the reference's business, not an error.
    let mut more = full();
    more["note"] = json!("x");
    assert_eq!(parse(&more).unwrap(), m);
}

#[test]
fn each_field_absent_null_wrong_or_empty_is_refused_by_its_rule() {
    let cases: [(&str, Vec<Value>); 4] = [
        ("version", vec![json!("1"), json!(2), json!(0)]),
        ("rootRunId", vec![json!(7), json!(""), json!(["run-7"])]),
        (
            "limit",
            vec![json!("5"), json!(0), json!(-5), json!(5.5), json!({})],
        ),
        (
            "createdAt",
            vec![json!("1767225600123"), json!({}), json!(false)],
        ),
    ];
    for (field, wrongs) in cases {
        let mut changes = vec![None, Some(Value::Null)];
        changes.extend(wrongs.into_iter().map(Some));
        for change in changes {
            let mut value = full();
            match &change {
                None => {
                    value.as_object_mut().unwrap().remove(field);
                }
                Some(v) => value[field] = v.clone(),
            }
            match parse(&value) {
                Err(Error::ManifestInvalid { field: rule, .. }) => {
                    assert!(rule.starts_with(field), "{field} = {change:?}: {rule}");
                }
                other => panic!("{field} = {change:?}: {other:?}"),
            }
        }
    }
    for text in ["", "[]", "{", "null"] {
        assert!(
            Manifest::parse(text, Path::new("/b")).is_err(),
            "{text:?} is no manifest"
        );
    }
}
