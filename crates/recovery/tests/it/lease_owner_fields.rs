//! The optional fields of a lease's `owner.json` (docs/protocol/recovery.md
//! §6.3: `parentSessionId`, `processStartIdentity`, `bootId`, and a running
//! writer's `writerPid` and `writerProcessStartIdentity`), one table row
//! each: absent, `null`, of the wrong type, empty. Absent is none; `null`
//! and a wrong type break the rules (an unreadable owner, which blocks the
//! session rather than free it); an empty string is kept as written. The
//! writer's fields exist only while its state is `running`.

extern crate subagents_recovery as recovery;
use recovery::lease::{OwnerRecord, WriterState, parse_owner};
use serde_json::{Value, json};

/// A running writer's record with every field set; no two values alike
/// (holder and writer pids and start identities, the two times).
fn full() -> Value {
    json!({
        "version": 1,
        "token": "0b6f3c1e-2d4a-4f5b-8c7d-9e0f1a2b3c4d",
        "canonicalSessionFile": "/home/u/.pi/sessions/s.jsonl",
        "runId": "run-new",
        "sourceRunId": "run-old",
        "parentSessionId": "parent-1",
        "pid": 11,
        "hostname": "host-a",
        "processStartIdentity": "linux:33",
        "bootId": "boot-b",
        "writerState": "running",
        "writerPid": 22,
        "writerProcessStartIdentity": "linux:44",
        "acquiredAt": "2026-01-01T00:00:00.555Z",
        "acquiredAtMs": 1_767_225_600_555u64,
        "updatedAtMs": 1_767_225_600_666u64,
    })
}

fn parse(value: &Value) -> Option<OwnerRecord> {
    parse_owner(&serde_json::to_vec(value).unwrap())
}

fn optionals(r: &OwnerRecord) -> Vec<(&'static str, Option<String>)> {
    vec![
        ("parentSessionId", r.parent_session_id.clone()),
        ("processStartIdentity", r.process_start_identity.clone()),
        ("bootId", r.boot_id.clone()),
        ("writerPid", r.writer_pid.map(|p| p.to_string())),
        (
            "writerProcessStartIdentity",
            r.writer_process_start_identity.clone(),
        ),
    ]
}

fn as_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

#[test]
fn the_full_record_reads_each_value_into_its_own_field() {
    let r = parse(&full()).unwrap();
    assert_eq!((r.pid, r.writer_pid), (11, Some(22)));
    assert_eq!(
        (r.acquired_at_ms, r.updated_at_ms),
        (1_767_225_600_555, 1_767_225_600_666)
    );
    assert_eq!(r.writer_state, WriterState::Running);
    for (field, value) in optionals(&r) {
        assert_eq!(value, as_text(&full()[field]), "{field}");
    }
}

#[test]
fn each_optional_owner_field_absent_null_wrong_or_empty() {
    for field in [
        "parentSessionId",
        "processStartIdentity",
        "bootId",
        "writerPid",
        "writerProcessStartIdentity",
    ] {
        let numeric = field == "writerPid";
        let mut absent = full();
        absent.as_object_mut().unwrap().remove(field);
        match parse(&absent) {
            // A running writer without its pid cannot be judged.
            None => assert!(numeric, "{field} absent is none, not damage"),
            Some(r) => {
                assert!(!numeric, "a running writer needs writerPid");
                for (other, value) in optionals(&r) {
                    let want = (other != field).then(|| as_text(&full()[other])).flatten();
                    assert_eq!(value, want, "{field} absent: {other}");
                }
            }
        }
        let wrong = if numeric { json!("22") } else { json!(7) };
        let empty = if numeric { json!(0) } else { json!("") };
        for bad in [Value::Null, wrong, json!([]), json!({})] {
            let mut broken = full();
            broken[field] = bad.clone();
            assert_eq!(parse(&broken), None, "{field} = {bad}");
        }
        let mut emptied = full();
        emptied[field] = empty.clone();
        match parse(&emptied) {
            None => assert!(numeric, "{field} = {empty}: an empty string is kept"),
            Some(r) => {
                let got = optionals(&r)
                    .into_iter()
                    .find(|(f, _)| *f == field)
                    .unwrap()
                    .1;
                assert_eq!(got.as_deref(), Some(""), "{field} kept empty");
            }
        }
    }
}

#[test]
fn writer_fields_exist_only_while_the_writer_runs() {
    for state in ["none", "spawning"] {
        let mut record = full();
        record["writerState"] = json!(state);
        assert_eq!(parse(&record), None, "{state} with writer fields");
        record.as_object_mut().unwrap().remove("writerPid");
        assert_eq!(parse(&record), None, "{state} with a writer start identity");
        record
            .as_object_mut()
            .unwrap()
            .remove("writerProcessStartIdentity");
        let r = parse(&record).unwrap();
        assert_eq!(
            (r.writer_pid, r.writer_process_start_identity),
            (None, None)
        );
        record["writerPid"] = Value::Null;
        assert_eq!(
            parse(&record),
            None,
            "{state}: a null writerPid is still a key"
        );
    }
}
