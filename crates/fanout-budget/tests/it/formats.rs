//! The encodings of the budget descriptor pinned to fixed values, and its
//! one optional field (`parentPath`) absent, null, of the wrong type and
//! empty, in every place it is read: JSON text, the environment value and
//! the persisted `run-fanout-budget.json`.

extern crate subagents_fanout_budget as fanout_budget;
use std::fs;
use std::path::PathBuf;

use fanout_budget::{
    BUDGET_ROOT_DIR, Descriptor, PERSISTED_FILE, create_budget, decode_env_descriptor,
    read_persisted,
};
use serde_json::{Value, json};

fn fixed() -> Descriptor {
    Descriptor {
        version: 1,
        root_run_id: "run-1".into(),
        directory: PathBuf::from("/state/budgets/run-1"),
        limit: 5,
        parent_path: Some("0/a".into()),
    }
}

/// The compact JSON in the reference's key order, as `JSON.stringify` writes it.
const JSON: &str = r#"{"version":1,"rootRunId":"run-1","directory":"/state/budgets/run-1","limit":5,"parentPath":"0/a"}"#;

/// base64url without padding of [`JSON`] (Python's `base64.urlsafe_b64encode`, `=` stripped).
const ENV: &str = "eyJ2ZXJzaW9uIjoxLCJyb290UnVuSWQiOiJydW4tMSIsImRpcmVjdG9yeSI6Ii9zdGF0ZS9idWRnZXRzL3J1bi0xIiwibGltaXQiOjUsInBhcmVudFBhdGgiOiIwL2EifQ";

#[test]
fn the_descriptor_encodes_to_fixed_json_and_a_fixed_environment_value() {
    assert_eq!(fixed().to_json(), JSON);
    assert_eq!(fixed().to_env_value(), ENV);
    assert_eq!(decode_env_descriptor(ENV).unwrap(), fixed());
    let without = Descriptor {
        parent_path: None,
        ..fixed()
    };
    assert_eq!(
        without.to_json(),
        r#"{"version":1,"rootRunId":"run-1","directory":"/state/budgets/run-1","limit":5}"#
    );
}

/// `parentPath` as read: `Ok(Some(path))`, `Ok(None)` or refused.
fn parent_path_of(value: Option<Value>) -> Result<Option<String>, String> {
    let mut map = serde_json::from_str::<Value>(JSON).unwrap();
    let object = map.as_object_mut().unwrap();
    object.remove("parentPath");
    if let Some(v) = value {
        object.insert("parentPath".into(), v);
    }
    let text = map.to_string();
    let from_text = Descriptor::from_json(&text).map(|d| d.parent_path);
    let from_env = {
        use base64::Engine;
        let value = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&text);
        decode_env_descriptor(&value)
            .map(|d| d.parent_path)
            .map_err(|e| e.to_string())
    };
    assert_eq!(
        from_text.is_ok(),
        from_env.is_ok(),
        "text and environment agree on {text}"
    );
    from_text
}

/// (what, the value given, the parent path read or `Err` for refused).
type Case = (
    &'static str,
    Option<Value>,
    Result<Option<&'static str>, ()>,
);

#[test]
fn parent_path_absent_null_wrong_type_and_empty() {
    let cases: [Case; 8] = [
        ("absent", None, Ok(None)),
        ("empty", Some(json!("")), Ok(None)),
        ("a path", Some(json!("0/a")), Ok(Some("0/a"))),
        (
            "blank is kept, trimmed only when qualifying",
            Some(json!(" ")),
            Ok(Some(" ")),
        ),
        ("null", Some(Value::Null), Err(())),
        ("a number", Some(json!(3)), Err(())),
        ("false", Some(json!(false)), Err(())),
        ("an array", Some(json!(["0/a"])), Err(())),
    ];
    for (what, value, want) in cases {
        let got = parent_path_of(value);
        match want {
            Ok(path) => assert_eq!(
                got.as_ref().ok().cloned().flatten().as_deref(),
                path,
                "{what}: {got:?}"
            ),
            Err(()) => assert!(got.is_err(), "{what}: {got:?}"),
        }
    }
}

#[test]
fn a_persisted_descriptor_with_a_bad_parent_path_is_refused_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("state").join(BUDGET_ROOT_DIR);
    let budget = create_budget(&root, "run-1", 3).unwrap();
    let run_dir = tmp.path().join("run");
    fs::create_dir(&run_dir).unwrap();
    let mut value = serde_json::from_str::<Value>(&budget.descriptor().to_json()).unwrap();
    for (bad, refused) in [
        (json!(null), true),
        (json!(7), true),
        (json!(""), false),
        (json!("0/x"), false),
    ] {
        value["parentPath"] = bad.clone();
        fs::write(run_dir.join(PERSISTED_FILE), format!("{value}\n")).unwrap();
        let read = read_persisted(&run_dir, &root);
        if refused {
            let err = read.err().unwrap_or_else(|| panic!("{bad} accepted"));
            assert!(err.to_string().contains(PERSISTED_FILE), "{bad}: {err}");
        } else {
            let parent = read.unwrap().unwrap().descriptor().parent_path.clone();
            assert_eq!(parent.as_deref(), bad.as_str().filter(|s| !s.is_empty()));
        }
    }
}
