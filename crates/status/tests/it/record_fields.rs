//! The optional fields of `run-processes.json` (`sessionId`, and each
//! identity's `bootId`, `machineId`, `host`) and of the `queuedForSlot` key
//! of `status.json`, one table row each: absent, `null`, of the wrong type,
//! empty. Absent and `null` are not set, an empty string is kept as
//! written, a wrong type is one line naming the file and the field; every
//! required field absent, `null` or of the wrong type is refused the same
//! way. `queuedForSlot` is no wait unless it is an object with a `since`.

use serde_json::{Value, json};
use status::processes::{FILE, RunProcesses, read};
use status::slot_wait::{QUEUED_FOR_SLOT_KEY, SLOT_WAIT_KEY, end_wait, queued_for_slot};
use status::{RunState, RunStatus};

/// Every field set; no two numbers or strings alike.
fn full() -> Value {
    json!({
        "version": 1,
        "runId": "run-a",
        "sessionId": "session-b",
        "runnerProcessInstanceId": "instance-c",
        "monitor": {"pid": 11, "startTime": 12, "bootId": "boot-d", "machineId": "machine-e", "host": "host-f"},
        "runner": {"pid": 21, "startTime": 22, "bootId": "boot-g", "machineId": "machine-h", "host": "host-i"},
    })
}

enum Change {
    Absent,
    To(Value),
}

/// Applies `change` at `path` (`a.b`) of the full record and reads it.
fn read_with(path: &str, change: &Change) -> Result<RunProcesses, String> {
    let mut value = full();
    let (parent, key) = match path.split_once('.') {
        Some((object, key)) => (&mut value[object], key),
        None => (&mut value, path),
    };
    match change {
        Change::Absent => {
            parent.as_object_mut().unwrap().remove(key);
        }
        Change::To(v) => parent[key] = v.clone(),
    }
    let dir = tempfile::tempdir().unwrap();
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

/// The optional fields as read, by path.
fn optionals(r: &RunProcesses) -> Vec<(String, Option<String>)> {
    let mut out = vec![("sessionId".to_owned(), r.session_id.clone())];
    for (name, id) in [("monitor", &r.monitor), ("runner", &r.runner)] {
        out.push((format!("{name}.bootId"), id.boot_id.clone()));
        out.push((format!("{name}.machineId"), id.machine_id.clone()));
        out.push((format!("{name}.host"), id.host.clone()));
    }
    out
}

fn full_value(path: &str) -> Option<String> {
    let value = full();
    let v = match path.split_once('.') {
        Some((object, key)) => &value[object][key],
        None => &value[path],
    };
    v.as_str().map(str::to_owned)
}

#[test]
fn every_optional_field_of_run_processes_absent_null_wrong_or_empty() {
    let full_record = read_with("sessionId", &Change::To(json!("session-b"))).unwrap();
    for (path, value) in optionals(&full_record) {
        assert_eq!(value, full_value(&path), "{path} read into its own field");
    }
    for (path, _) in optionals(&full_record) {
        for (case, change, want) in [
            ("absent", Change::Absent, None),
            ("null", Change::To(Value::Null), None),
            ("empty", Change::To(json!("")), Some(String::new())),
        ] {
            let record = read_with(&path, &change).unwrap_or_else(|e| panic!("{path} {case}: {e}"));
            for (other, value) in optionals(&record) {
                let expected = if other == path {
                    want.clone()
                } else {
                    full_value(&other)
                };
                assert_eq!(value, expected, "{path} {case}: {other}");
            }
        }
        for wrong in [json!(7), json!(false), json!(["x"]), json!({})] {
            let e = read_with(&path, &Change::To(wrong.clone())).unwrap_err();
            assert!(
                e.contains(&path),
                "{path} = {wrong}: the error names it: {e}"
            );
        }
    }
}

#[test]
fn every_required_field_of_run_processes_absent_null_or_wrong_is_refused_by_name() {
    let cases: [(&str, Value); 8] = [
        ("version", json!("1")),
        ("runId", json!(5)),
        ("runnerProcessInstanceId", json!(true)),
        ("monitor", json!("11")),
        ("runner", json!([21])),
        ("monitor.pid", json!("11")),
        ("monitor.startTime", json!(-12)),
        ("runner.pid", json!(2.5)),
    ];
    for (path, wrong) in cases {
        for change in [Change::Absent, Change::To(Value::Null), Change::To(wrong)] {
            let e = read_with(path, &change).unwrap_err();
            let key = path.rsplit('.').next().unwrap();
            assert!(e.contains(key), "{path}: the error names it: {e}");
        }
    }
    let e = read_with("version", &Change::To(json!(2))).unwrap_err();
    assert!(e.contains("version"), "{e}");
}

fn queued(value: Option<Value>) -> RunStatus {
    let mut status = RunStatus::new("r", RunState::Queued);
    if let Some(value) = value {
        status.extra.insert(QUEUED_FOR_SLOT_KEY.into(), value);
    }
    status
}

#[test]
fn queued_for_slot_is_a_wait_only_as_an_object_with_a_since() {
    let full = json!({"since": 1_767_225_600_111u64});
    assert_eq!(
        queued_for_slot(&queued(Some(full))).map(|w| w.since),
        Some(1_767_225_600_111)
    );
    for (case, value) in [
        ("absent", None),
        ("null", Some(Value::Null)),
        ("wrong type", Some(json!("1767225600111"))),
        ("empty", Some(json!({}))),
        ("since null", Some(json!({"since": null}))),
        ("since wrong type", Some(json!({"since": "1767225600111"}))),
        ("since negative", Some(json!({"since": -1}))),
    ] {
        assert_eq!(queued_for_slot(&queued(value)), None, "{case}");
    }
    // `position` is never written, but one found on disk is read as such;
    // of the wrong type it spoils the wait like any other bad field.
    let with = |position: Value| queued(Some(json!({"since": 7, "position": position})));
    assert_eq!(
        queued_for_slot(&with(json!(3))).and_then(|w| w.position),
        Some(3)
    );
    assert_eq!(
        queued_for_slot(&with(Value::Null)).map(|w| w.position),
        Some(None)
    );
    assert_eq!(queued_for_slot(&with(json!("3"))), None);
    // Only a queued run waits.
    let mut running = queued(Some(json!({"since": 7})));
    running.state = RunState::Running;
    assert_eq!(queued_for_slot(&running), None);
}

#[test]
fn the_end_of_a_wait_keeps_the_join_time_apart_from_the_admission_time() {
    let mut status = queued(Some(json!({"since": 1_767_225_600_111u64, "position": 2})));
    end_wait(&mut status, 1_767_225_699_999);
    assert!(!status.extra.contains_key(QUEUED_FOR_SLOT_KEY));
    assert_eq!(
        status.extra[SLOT_WAIT_KEY],
        json!({"since": 1_767_225_600_111u64, "admittedAt": 1_767_225_699_999u64})
    );
    // No wait, no record of one.
    let mut never = queued(None);
    end_wait(&mut never, 5);
    assert!(!never.extra.contains_key(SLOT_WAIT_KEY));
}
