//! Every optional field of `status.json` (the run's, a step's and a step's
//! `externalProcess`), one by one: absent, `null`, of the wrong type and
//! empty. Absent and `null` read as not set and are not written back; a
//! wrong type is an error naming the field; an empty string is kept as
//! written. An optional boolean keeps `false` apart from absent.
//! Both readers (the full one and a listing's) agree on each case.

use std::path::Path;

use serde_json::{Value, json};
use status::model::{parse_listed_status, parse_status};

/// A status with every optional field set (distinct values throughout).
fn full() -> Value {
    serde_json::from_str(
        r#"{
        "lifecycleArtifactVersion": 3, "runId": "r", "sessionId": "s", "mode": "chain",
        "state": "failed", "displayDismissedAt": 4, "error": "boom", "lastActivityAt": 5,
        "startedAt": 6, "endedAt": 7, "lastUpdate": 8, "timeoutMs": 9, "deadlineAt": 10,
        "timedOut": true, "stopped": true, "pid": 11, "cwd": "/w", "currentStep": 0,
        "chainStepCount": 1, "processTerminal": {"state": "pending"},
        "runFanoutBudget": {"used": 1, "limit": 2, "remaining": 1},
        "outputFile": "out.log", "sessionFile": "/s.jsonl",
        "runnerIdentity": {"pid": 12, "startTime": 13},
        "monitorIdentity": {"pid": 14, "startTime": 15},
        "launcherIdentity": {"pid": 16, "startTime": 17},
        "runnerProcessInstanceId": "rid", "stopReason": "user",
        "steps": [{
            "agent": "a", "status": "failed", "description": "[prompt redacted]",
            "startedAt": 21, "endedAt": 22, "durationMs": 23, "exitCode": 24, "error": "e",
            "timedOut": true, "stopped": true, "processTerminal": {"state": "pending"},
            "externalProcess": {
                "pid": 31, "startedAt": 32, "endedAt": 33, "durationMs": 34, "exitCode": 35,
                "processSignal": "SIGTERM", "identity": {"pid": 31, "startTime": 36},
                "stdoutPath": "o", "stderrPath": "e"
            }
        }]
    }"#,
    )
    .unwrap()
}

/// What kind of value a field holds, so the table can pick a wrong one.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Number,
    Text,
    Flag,
    Object,
    List,
}

const RUN: &[(&str, Kind)] = &[
    ("lifecycleArtifactVersion", Kind::Number),
    ("sessionId", Kind::Text),
    ("mode", Kind::Text),
    ("displayDismissedAt", Kind::Number),
    ("error", Kind::Text),
    ("lastActivityAt", Kind::Number),
    ("startedAt", Kind::Number),
    ("endedAt", Kind::Number),
    ("lastUpdate", Kind::Number),
    ("timeoutMs", Kind::Number),
    ("deadlineAt", Kind::Number),
    ("timedOut", Kind::Flag),
    ("stopped", Kind::Flag),
    ("pid", Kind::Number),
    ("cwd", Kind::Text),
    ("currentStep", Kind::Number),
    ("chainStepCount", Kind::Number),
    ("outputFile", Kind::Text),
    ("sessionFile", Kind::Text),
    ("runnerIdentity", Kind::Object),
    ("monitorIdentity", Kind::Object),
    ("launcherIdentity", Kind::Object),
    ("runnerProcessInstanceId", Kind::Text),
    ("stopReason", Kind::Text),
    ("steps", Kind::List),
];

const STEP: &[(&str, Kind)] = &[
    ("description", Kind::Text),
    ("startedAt", Kind::Number),
    ("endedAt", Kind::Number),
    ("durationMs", Kind::Number),
    ("exitCode", Kind::Number),
    ("error", Kind::Text),
    ("timedOut", Kind::Flag),
    ("stopped", Kind::Flag),
    ("externalProcess", Kind::Object),
];

const PROCESS: &[(&str, Kind)] = &[
    ("pid", Kind::Number),
    ("endedAt", Kind::Number),
    ("durationMs", Kind::Number),
    ("exitCode", Kind::Number),
    ("processSignal", Kind::Text),
    ("identity", Kind::Object),
];

/// A value of another JSON type than `kind`.
fn wrong(kind: Kind) -> Value {
    match kind {
        Kind::Number | Kind::Flag | Kind::Object | Kind::List => json!("7"),
        Kind::Text => json!(7),
    }
}

/// Where a field lives: the run, its step 0 or that step's process.
#[derive(Clone, Copy)]
enum Place {
    Run,
    Step,
    Process,
}

impl Place {
    fn object(self, doc: &mut Value) -> &mut serde_json::Map<String, Value> {
        let value = match self {
            Place::Run => doc,
            Place::Step => &mut doc["steps"][0],
            Place::Process => &mut doc["steps"][0]["externalProcess"],
        };
        value.as_object_mut().unwrap()
    }

    /// The JSON path a reader's error names for `field`.
    fn path(self, field: &str) -> String {
        match self {
            Place::Run => field.to_owned(),
            Place::Step => format!("steps[0].{field}"),
            Place::Process => format!("steps[0].externalProcess.{field}"),
        }
    }
}

/// `doc` with `field` of `place` replaced (`None`: removed).
fn with(place: Place, field: &str, value: Option<Value>) -> Value {
    let mut doc = full();
    let object = place.object(&mut doc);
    match value {
        Some(v) => object.insert(field.to_owned(), v),
        None => object.remove(field),
    };
    doc
}

/// Both readers' results, which must agree on success; the full reader's
/// document written back, or its error.
fn read(doc: &Value) -> Result<Value, String> {
    let text = doc.to_string();
    let path = Path::new("/r/status.json");
    let full = parse_status(path, &text);
    let listed = parse_listed_status(path, &text);
    assert_eq!(
        full.is_ok(),
        listed.is_ok(),
        "the readers disagree on {text}: {:?} / {:?}",
        full.as_ref().err(),
        listed.as_ref().err()
    );
    full.map(|s| serde_json::to_value(&s).unwrap())
        .map_err(|e| e.to_string())
}

fn every_field() -> impl Iterator<Item = (Place, &'static str, Kind)> {
    let run = RUN.iter().map(|(f, k)| (Place::Run, *f, *k));
    let step = STEP.iter().map(|(f, k)| (Place::Step, *f, *k));
    let process = PROCESS.iter().map(|(f, k)| (Place::Process, *f, *k));
    run.chain(step).chain(process)
}

#[test]
fn the_full_fixture_reads_back_unchanged() {
    assert_eq!(read(&full()).unwrap(), full());
}

#[test]
fn an_absent_optional_field_reads_as_unset_and_is_not_written() {
    for (place, field, _) in every_field() {
        let doc = with(place, field, None);
        let back = read(&doc).unwrap_or_else(|e| panic!("{}: {e}", place.path(field)));
        assert_eq!(back, doc, "{}", place.path(field));
    }
}

#[test]
fn a_null_optional_field_reads_as_unset_but_a_null_session_id_is_refused() {
    for (place, field, _) in every_field() {
        let doc = with(place, field, Some(Value::Null));
        let got = read(&doc);
        if matches!(place, Place::Run) && field == "sessionId" {
            let err = got.unwrap_err();
            assert!(err.contains("sessionId must be a string"), "{err}");
            continue;
        }
        let back = got.unwrap_or_else(|e| panic!("{}: {e}", place.path(field)));
        assert_eq!(back, with(place, field, None), "{}", place.path(field));
    }
}

#[test]
fn a_wrong_type_is_an_error_naming_the_file_and_the_field() {
    for (place, field, kind) in every_field() {
        let doc = with(place, field, Some(wrong(kind)));
        let err = read(&doc).expect_err(&place.path(field));
        assert!(
            err.starts_with("failed to parse async status file '/r/status.json'"),
            "{err}"
        );
        assert!(
            err.contains(&place.path(field)),
            "{}: {err}",
            place.path(field)
        );
    }
}

#[test]
fn an_empty_string_or_list_is_kept_as_written() {
    for (place, field, kind) in every_field() {
        let empty = match kind {
            Kind::Text => json!(""),
            Kind::List => json!([]),
            _ => continue,
        };
        let doc = with(place, field, Some(empty));
        let back = read(&doc).unwrap_or_else(|e| panic!("{}: {e}", place.path(field)));
        assert_eq!(back, doc, "{}", place.path(field));
    }
}

#[test]
fn an_optional_flag_keeps_false_apart_from_absent() {
    for (place, field, kind) in every_field() {
        if !matches!(kind, Kind::Flag) {
            continue;
        }
        let off = with(place, field, Some(json!(false)));
        let back = read(&off).unwrap();
        assert_eq!(back, off, "{}: false stays false", place.path(field));
        let absent = with(place, field, None);
        assert_ne!(read(&absent).unwrap(), back, "{}", place.path(field));
    }
}
