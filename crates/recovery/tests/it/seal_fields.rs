//! Every field of `recovery-seal.json` (docs/protocol/recovery.md §8.1:
//! `version`, `algorithm`, `keyId`, `mac`; none optional) absent, `null`,
//! of the wrong type and empty: each is refused naming that field, but an
//! empty `keyId`, which reads and then fails verification as the seal of
//! another key.

extern crate subagents_recovery as recovery;
use recovery::seal::parse_seal;
use serde_json::{Value, json};

fn full() -> Value {
    json!({
        "version": 1,
        "algorithm": "hmac-sha256",
        "keyId": "key-1",
        "mac": "ab".repeat(32),
    })
}

fn error_of(value: &Value) -> Option<(String, String)> {
    parse_seal(&serde_json::to_vec(value).unwrap()).err()
}

#[test]
fn each_seal_field_absent_null_wrong_or_empty_is_refused_by_name() {
    assert!(error_of(&full()).is_none());
    for field in ["version", "algorithm", "keyId", "mac"] {
        let wrong = if field == "version" {
            json!("1")
        } else {
            json!(1)
        };
        let empty = if field == "version" {
            json!(0)
        } else {
            json!("")
        };
        let mut changes = vec![None, Some(Value::Null), Some(wrong), Some(json!([]))];
        if field != "keyId" {
            changes.push(Some(empty));
        }
        for change in changes {
            let mut value = full();
            match &change {
                None => {
                    value.as_object_mut().unwrap().remove(field);
                }
                Some(v) => value[field] = v.clone(),
            }
            let (named, detail) =
                error_of(&value).unwrap_or_else(|| panic!("{field} = {change:?} read"));
            assert!(
                named == field || detail.contains(&format!("`{field}`")),
                "{field} = {change:?}: the error names it: {named:?} {detail}"
            );
            assert!(!detail.contains('\n'), "{detail}");
        }
    }
    let mut empty_key = full();
    empty_key["keyId"] = json!("");
    assert_eq!(
        parse_seal(&serde_json::to_vec(&empty_key).unwrap())
            .unwrap()
            .key_id,
        ""
    );
}
