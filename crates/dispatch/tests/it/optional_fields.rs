//! Every field of `dispatch.json`, one table row each: absent, `null`, of
//! the wrong type, empty. The optional names (`cluster`, `partition`,
//! `node`) are "string or null" (docs/protocol/dispatch.md §1): `null` is
//! none, a string must be a Slurm name, and a missing key is refused like
//! any other (§3: the writers always write all seven keys).

use serde_json::{Value, json};
use subagents_dispatch::{Dispatch, FILE, read};

/// Every field set, each to a value no other field has.
fn full() -> Value {
    json!({
        "version": 1,
        "executor": "slurm",
        "cluster": "lab",
        "jobId": "4711",
        "partition": "main",
        "node": "n2",
        "submittedAt": 1_767_225_600_500u64,
    })
}

enum Change {
    Absent,
    To(Value),
}

/// `Ok(record)` or the one-line error text.
fn read_with(field: &str, change: &Change) -> Result<Dispatch, String> {
    let dir = tempfile::tempdir().unwrap();
    let mut value = full();
    match change {
        Change::Absent => {
            value.as_object_mut().unwrap().remove(field);
        }
        Change::To(v) => value[field] = v.clone(),
    }
    std::fs::write(dir.path().join(FILE), value.to_string()).unwrap();
    match read(dir.path()) {
        Ok(record) => Ok(record.expect("the file exists")),
        Err(e) => {
            let text = e.to_string();
            assert!(!text.contains('\n'), "one line: {text}");
            assert!(text.contains(FILE), "names the file: {text}");
            Err(text)
        }
    }
}

#[test]
fn the_full_record_reads_with_every_value_in_its_own_field() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(FILE), full().to_string()).unwrap();
    let record = read(dir.path()).unwrap().unwrap();
    assert_eq!(record.cluster.as_deref(), Some("lab"));
    assert_eq!(record.partition.as_deref(), Some("main"));
    assert_eq!(record.node.as_deref(), Some("n2"));
    assert_eq!(record.job_id, "4711");
    assert_eq!(record.submitted_at, 1_767_225_600_500);
}

#[test]
fn each_optional_name_is_null_or_a_name_and_never_missing() {
    for field in ["cluster", "partition", "node"] {
        let null = read_with(field, &Change::To(Value::Null)).unwrap();
        let kept = |r: &Dispatch| {
            [
                ("cluster", r.cluster.clone()),
                ("partition", r.partition.clone()),
                ("node", r.node.clone()),
            ]
        };
        for (name, value) in kept(&null) {
            let want = full()[name].as_str().map(str::to_owned);
            let want = if name == field { None } else { want };
            assert_eq!(value, want, "{field}: null touches only itself ({name})");
        }
        for change in [
            Change::Absent,
            Change::To(json!(7)),
            Change::To(json!(false)),
            Change::To(json!(["lab"])),
            Change::To(json!("")),
        ] {
            let e = read_with(field, &change).unwrap_err();
            assert!(e.contains(field), "{field}: the error names it: {e}");
        }
    }
}

#[test]
fn each_required_field_absent_null_of_the_wrong_type_or_empty_is_refused_by_name() {
    let cases: [(&str, Vec<Value>); 4] = [
        ("version", vec![Value::Null, json!("1"), json!(0)]),
        ("executor", vec![Value::Null, json!(1), json!("")]),
        ("jobId", vec![Value::Null, json!(4711), json!("")]),
        (
            "submittedAt",
            vec![Value::Null, json!("1767225600500"), json!(1.5)],
        ),
    ];
    for (field, values) in cases {
        let e = read_with(field, &Change::Absent).unwrap_err();
        assert!(e.contains(field), "{field} absent: {e}");
        for value in values {
            let e = read_with(field, &Change::To(value.clone())).unwrap_err();
            assert!(e.contains(field), "{field} = {value}: {e}");
        }
    }
}
