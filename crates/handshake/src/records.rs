//! The JSON records of the handshake files and how they are read.

use std::path::Path;

use serde_json::{Value, json};

use crate::Binding;

/// One read of a handshake file.
pub(crate) enum FileRead {
    /// The file does not exist (yet).
    Missing,
    /// The file parsed as JSON.
    Json(Value),
    /// The file exists but could not be read or parsed; the cause's message.
    Broken(String),
}

/// Reads and parses a JSON file. Files are replaced by rename, so a present
/// file is always whole.
pub(crate) fn read_json(path: &Path) -> FileRead {
    match atomic_file::read::read_file(path) {
        Err(e) if e.is_not_found() => FileRead::Missing,
        Err(e) => FileRead::Broken(e.into_io().to_string()),
        Ok(bytes) => match serde_json::from_slice(&bytes) {
            Ok(value) => FileRead::Json(value),
            Err(e) => FileRead::Broken(e.to_string()),
        },
    }
}

/// `{state:"ready", token, pid, owner, runId, runnerProcessInstanceId}`.
pub(crate) fn ready(token: &str, pid: u32, owner: &Value, binding: &Binding) -> Value {
    json!({
        "state": "ready",
        "token": token,
        "pid": pid,
        "owner": owner,
        "runId": binding.run_id,
        "runnerProcessInstanceId": binding.runner_process_instance_id,
    })
}

/// `{state:"acknowledged", token, pid, runId, runnerProcessInstanceId}`.
pub(crate) fn acknowledged(token: &str, pid: u32, binding: &Binding) -> Value {
    json!({
        "state": "acknowledged",
        "token": token,
        "pid": pid,
        "runId": binding.run_id,
        "runnerProcessInstanceId": binding.runner_process_instance_id,
    })
}

/// `{state:"error", pid, error, runId, runnerProcessInstanceId}` (no token).
pub(crate) fn error(pid: u32, message: &str, binding: &Binding) -> Value {
    json!({
        "state": "error",
        "pid": pid,
        "error": message,
        "runId": binding.run_id,
        "runnerProcessInstanceId": binding.runner_process_instance_id,
    })
}

/// `{action, token, runId, runnerProcessInstanceId}` for the ack and proceed files.
pub(crate) fn control(action: &str, token: &str, binding: &Binding) -> Value {
    json!({
        "action": action,
        "token": token,
        "runId": binding.run_id,
        "runnerProcessInstanceId": binding.runner_process_instance_id,
    })
}

/// True when the record names exactly this run and runner instance.
pub(crate) fn binding_matches(record: &Value, binding: &Binding) -> bool {
    record["runId"].as_str() == Some(binding.run_id.as_str())
        && record["runnerProcessInstanceId"].as_str()
            == Some(binding.runner_process_instance_id.as_str())
}

/// True when a field the record carries contradicts the run or the pid.
/// Absent fields are accepted so a reference-format error record still counts.
pub(crate) fn contradicts(record: &Value, binding: &Binding, pid: u32) -> bool {
    let differs = |key: &str, expected: &str| {
        record
            .get(key)
            .is_some_and(|v| v.as_str() != Some(expected))
    };
    differs("runId", &binding.run_id)
        || differs(
            "runnerProcessInstanceId",
            &binding.runner_process_instance_id,
        )
        || record
            .get("pid")
            .is_some_and(|v| v.as_u64() != Some(u64::from(pid)))
}

/// Checks a handshake file's record against the rules its readers apply:
/// `runner-startup.json` (`ready` and `acknowledged` carry a string `token`
/// and an integer `pid`; `error` carries a string `error`), or an ack/proceed
/// control file (`action` `ack`/`proceed` with a string `token`). Binding
/// fields, when present, are non-empty strings. The message names the field.
pub fn validate_record(record: &Value) -> Result<(), String> {
    let obj = record
        .as_object()
        .ok_or("the record must be a JSON object")?;
    for key in ["runId", "runnerProcessInstanceId"] {
        if obj
            .get(key)
            .is_some_and(|v| v.as_str().is_none_or(str::is_empty))
        {
            return Err(format!("{key} must be a non-empty string"));
        }
    }
    let string = |key: &str| match obj.get(key) {
        Some(Value::String(s)) if !s.is_empty() => Ok(()),
        _ => Err(format!("{key} must be a non-empty string")),
    };
    let pid = || match obj.get("pid").and_then(Value::as_u64) {
        Some(p) if p > 0 => Ok(()),
        _ => Err("pid must be a positive integer".to_owned()),
    };
    match (obj.get("state"), obj.get("action")) {
        (Some(state), None) => match state.as_str() {
            Some("ready" | "acknowledged") => string("token").and_then(|()| pid()),
            Some("error") => string("error"),
            _ => Err("state must be \"ready\", \"acknowledged\" or \"error\"".into()),
        },
        (None, Some(action)) => match action.as_str() {
            Some("ack" | "proceed") => string("token"),
            _ => Err("action must be \"ack\" or \"proceed\"".into()),
        },
        _ => Err("the record must have exactly one of state (runner-startup.json) or action (ack/proceed)".into()),
    }
}

#[cfg(test)]
mod validate_tests {
    use super::*;

    #[test]
    fn records_written_here_validate_and_broken_ones_name_the_field() {
        let binding = Binding {
            run_id: "r".into(),
            runner_process_instance_id: "i".into(),
        };
        for record in [
            ready("t", 7, &json!({}), &binding),
            acknowledged("t", 7, &binding),
            error(7, "boom", &binding),
            control("ack", "t", &binding),
            control("proceed", "t", &binding),
        ] {
            validate_record(&record).unwrap();
        }
        let cases = [
            (json!({"state": "ready", "pid": 1}), "token"),
            (json!({"state": "ready", "token": "t", "pid": "1"}), "pid"),
            (json!({"state": "error", "pid": 1}), "error"),
            (json!({"state": "later"}), "state"),
            (json!({"action": "go", "token": "t"}), "action"),
            (json!({"action": "ack", "token": "t", "runId": 3}), "runId"),
        ];
        for (record, field) in cases {
            let err = validate_record(&record).unwrap_err();
            assert!(err.starts_with(field), "{err}");
        }
    }
}

#[cfg(test)]
mod record_tests {
    use super::*;

    fn binding() -> Binding {
        Binding {
            run_id: "r".into(),
            runner_process_instance_id: "i".into(),
        }
    }

    #[test]
    fn only_a_missing_file_reads_as_missing() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(matches!(
            read_json(&tmp.path().join("none.json")),
            FileRead::Missing
        ));
        // Present but unreadable (a directory): broken, never "not yet written".
        assert!(matches!(read_json(tmp.path()), FileRead::Broken(_)));
        let garbage = tmp.path().join("garbage.json");
        std::fs::write(&garbage, "{not json").unwrap();
        assert!(matches!(read_json(&garbage), FileRead::Broken(_)));
        let good = tmp.path().join("good.json");
        std::fs::write(&good, r#"{"state":"ready"}"#).unwrap();
        assert!(matches!(read_json(&good), FileRead::Json(v) if v["state"] == "ready"));
    }

    #[test]
    fn a_binding_matches_only_when_both_fields_do() {
        let b = binding();
        assert!(binding_matches(
            &json!({"runId": "r", "runnerProcessInstanceId": "i"}),
            &b
        ));
        assert!(!binding_matches(
            &json!({"runId": "r", "runnerProcessInstanceId": "x"}),
            &b
        ));
        assert!(!binding_matches(
            &json!({"runId": "x", "runnerProcessInstanceId": "i"}),
            &b
        ));
        assert!(!binding_matches(&json!({"runId": "r"}), &b));
    }

    /// The optional binding fields (`runId`, `runnerProcessInstanceId`) of
    /// every record, and the optional `pid` of an error record: absent is
    /// accepted by the validator and contradicts nothing; null, the wrong
    /// type and empty are refused by the validator naming the field, and
    /// contradict the run.
    #[test]
    fn optional_fields_absent_null_wrong_type_and_empty() {
        let b = binding();
        let records = [
            ready("t", 7, &json!({}), &b),
            acknowledged("t", 7, &b),
            error(7, "boom", &b),
            control("ack", "t", &b),
            control("proceed", "t", &b),
        ];
        for record in &records {
            for key in ["runId", "runnerProcessInstanceId"] {
                let mut absent = record.clone();
                absent.as_object_mut().unwrap().remove(key);
                validate_record(&absent).unwrap();
                assert!(!contradicts(&absent, &b, 7), "{key} absent: {absent}");
                for bad in [Value::Null, json!(7), json!("")] {
                    let mut broken = record.clone();
                    broken[key] = bad.clone();
                    let err = validate_record(&broken).unwrap_err();
                    assert!(err.starts_with(key), "{key} = {bad}: {err}");
                    assert!(contradicts(&broken, &b, 7), "{key} = {bad}");
                    assert!(!binding_matches(&broken, &b), "{key} = {bad}");
                }
            }
        }
        let mut error_record = error(7, "boom", &b);
        error_record.as_object_mut().unwrap().remove("pid");
        validate_record(&error_record).unwrap();
        assert!(!contradicts(&error_record, &b, 7), "pid absent");
        for bad in [Value::Null, json!("7"), json!(0), json!(8)] {
            error_record["pid"] = bad.clone();
            assert!(contradicts(&error_record, &b, 7), "pid = {bad}");
        }
    }

    #[test]
    fn any_one_contradicting_field_contradicts() {
        let b = binding();
        let whole = json!({"runId": "r", "runnerProcessInstanceId": "i", "pid": 7});
        assert!(!contradicts(&whole, &b, 7));
        assert!(
            !contradicts(&json!({}), &b, 7),
            "absent fields are accepted"
        );
        for (key, value) in [
            ("runId", json!("x")),
            ("runnerProcessInstanceId", json!("x")),
            ("pid", json!(8)),
        ] {
            let mut record = whole.clone();
            record[key] = value;
            assert!(contradicts(&record, &b, 7), "{key}");
        }
    }

    #[test]
    fn empty_tokens_and_non_positive_pids_are_refused() {
        let empty = json!({"state": "ready", "token": "", "pid": 1});
        assert!(validate_record(&empty).unwrap_err().starts_with("token"));
        let zero = json!({"state": "acknowledged", "token": "t", "pid": 0});
        assert!(validate_record(&zero).unwrap_err().starts_with("pid"));
        let one = json!({"state": "acknowledged", "token": "t", "pid": 1});
        validate_record(&one).unwrap();
    }
}
