//! The owner record of one slot (`slot-<N>/owner.json`, docs/protocol/capacity.md §3).

use process_identity::ProcessIdentity;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// What kind of run holds a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A single / parallel / chain runner process.
    Runner,
    /// An async workflow script (its slot covers its children).
    Workflow,
}

/// The record in `owner.json`, as the reference reads and writes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OwnerRecord {
    /// Always 1.
    pub version: u32,
    /// Random UUID chosen at acquisition; kept across transfers.
    pub reservation_token: String,
    /// The parent session id owning the pool.
    pub owner_session_id: String,
    /// Lowercase hex SHA-256 of `owner_session_id`.
    pub owner_session_key: String,
    /// N of `slot-<N>`.
    pub slot: u64,
    /// The run currently holding the slot.
    pub run_id: String,
    /// The run this slot was transferred from, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_run_id: Option<String>,
    /// 0 at acquisition, +1 at every transfer.
    pub generation: u64,
    /// Kind of the holding run.
    pub kind: Kind,
    /// Run directory of `run_id`.
    pub async_dir: String,
    /// Milliseconds since the epoch of acquisition or the latest transfer.
    pub reserved_at: u64,
    /// Set by `mark_started`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_process_instance_id: Option<String>,
    /// Set by `mark_started` / `mark_workflow_started`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_started_at: Option<u64>,
    /// Extension of the Rust version: the process that made the reservation
    /// (acquire or latest transfer), so a holder that died before the runner
    /// was bound can be proven dead. The reference ignores it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved_by_process: Option<ProcessIdentity>,
    /// Keys this version does not know, kept on rewrite as the reference does.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl OwnerRecord {
    /// Parses an owner file; anything that breaks a rule of docs/protocol/capacity.md §3 reads as "no owner".
    pub fn parse(bytes: &[u8]) -> Option<Self> {
        let owner: Self = serde_json::from_slice(bytes).ok()?;
        owner.is_valid().then_some(owner)
    }

    fn is_valid(&self) -> bool {
        self.version == 1
            && !self.reservation_token.is_empty()
            && !self.owner_session_id.is_empty()
            && !self.owner_session_key.is_empty()
            && !self.run_id.is_empty()
            && !self.async_dir.is_empty()
            && self.runner_process_instance_id.as_deref() != Some("")
    }

    /// Same reservation token, run id and generation.
    pub fn identity_matches(&self, other: &Self) -> bool {
        self.reservation_token == other.reservation_token
            && self.run_id == other.run_id
            && self.generation == other.generation
    }

    /// True once a runner was bound or the workflow was marked started.
    pub fn is_started(&self) -> bool {
        self.runner_process_instance_id.is_some() || self.runner_started_at.is_some_and(|t| t != 0)
    }
}

/// The pool key of a session: lowercase hex SHA-256 of its id.
pub fn session_key(session_id: &str) -> String {
    Sha256::digest(session_id.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_reference_record_and_keeps_unknown_keys() {
        let text = r#"{
  "version": 1,
  "reservationToken": "t",
  "ownerSessionId": "s",
  "ownerSessionKey": "k",
  "slot": 0,
  "runId": "r",
  "generation": 0,
  "kind": "runner",
  "asyncDir": "/d",
  "reservedAt": 5,
  "future": true
}"#;
        let owner = OwnerRecord::parse(text.as_bytes()).unwrap();
        assert_eq!(owner.kind, Kind::Runner);
        assert!(!owner.is_started());
        let back = serde_json::to_string_pretty(&owner).unwrap();
        assert_eq!(back, text);
    }

    #[test]
    fn broken_rules_read_as_no_owner() {
        assert!(OwnerRecord::parse(b"garbage").is_none());
        let wrong_version = br#"{"version":2,"reservationToken":"t","ownerSessionId":"s","ownerSessionKey":"k","slot":0,"runId":"r","generation":0,"kind":"runner","asyncDir":"/d","reservedAt":5}"#;
        assert!(OwnerRecord::parse(wrong_version).is_none());
        let empty_run = br#"{"version":1,"reservationToken":"t","ownerSessionId":"s","ownerSessionKey":"k","slot":0,"runId":"","generation":0,"kind":"runner","asyncDir":"/d","reservedAt":5}"#;
        assert!(OwnerRecord::parse(empty_run).is_none());
    }

    /// An owner record with every optional field set, distinct times.
    fn full_owner() -> Value {
        serde_json::json!({
            "version": 1, "reservationToken": "t", "ownerSessionId": "s",
            "ownerSessionKey": "k", "slot": 2, "runId": "r", "sourceRunId": "q",
            "generation": 1, "kind": "runner", "asyncDir": "/d", "reservedAt": 5,
            "runnerProcessInstanceId": "rid", "runnerStartedAt": 9,
            "reservedByProcess": {"pid": 11, "startTime": 12}
        })
    }

    fn parse_with(key: &str, value: Option<Value>) -> Option<OwnerRecord> {
        let mut record = full_owner();
        let map = record.as_object_mut().unwrap();
        match value {
            Some(v) => map.insert(key.into(), v),
            None => map.remove(key),
        };
        OwnerRecord::parse(record.to_string().as_bytes())
    }

    /// Every optional field absent, null, of the wrong type and empty: absent
    /// and null are "not set" (and not written back); a wrong type makes the
    /// record unreadable, which reads as no owner; an empty instance id too.
    #[test]
    fn optional_fields_absent_null_wrong_type_and_empty() {
        use serde_json::json;
        let full = OwnerRecord::parse(full_owner().to_string().as_bytes()).unwrap();
        assert!(full.extra.is_empty(), "{:?}", full.extra);
        assert_eq!(serde_json::to_value(&full).unwrap(), full_owner());
        // (field, its empty value, whether that empty value is refused)
        let table = [
            ("sourceRunId", json!(""), false),
            ("runnerProcessInstanceId", json!(""), true),
            ("runnerStartedAt", json!(0), false),
            ("reservedByProcess", json!({}), true),
        ];
        for (key, empty, empty_refused) in table {
            for absent in [None, Some(Value::Null)] {
                let owner = parse_with(key, absent.clone())
                    .unwrap_or_else(|| panic!("{key} {absent:?} refused"));
                let back = serde_json::to_value(&owner).unwrap();
                assert_eq!(back.get(key), None, "{key} {absent:?} written back");
            }
            let wrong = if full_owner()[key].is_string() {
                json!(7)
            } else {
                json!("7")
            };
            assert!(
                parse_with(key, Some(wrong)).is_none(),
                "{key} of the wrong type"
            );
            let read = parse_with(key, Some(empty.clone()));
            assert_eq!(read.is_none(), empty_refused, "{key} empty");
            if let Some(owner) = read {
                assert_eq!(serde_json::to_value(&owner).unwrap()[key], empty, "{key}");
            }
        }
    }

    /// `runnerStartedAt` absent and 0 both mean "not started"; the instance
    /// id alone is enough.
    #[test]
    fn started_is_told_by_either_mark_and_a_zero_time_is_no_mark() {
        let started = |key: &str, value: Option<Value>| {
            let mut owner = parse_with(key, value).unwrap();
            if key == "runnerStartedAt" {
                owner.runner_process_instance_id = None;
            } else {
                owner.runner_started_at = None;
            }
            owner.is_started()
        };
        assert!(started("runnerStartedAt", Some(9.into())));
        assert!(!started("runnerStartedAt", Some(0.into())));
        assert!(!started("runnerStartedAt", None));
        assert!(started("runnerProcessInstanceId", Some("rid".into())));
        assert!(!started("runnerProcessInstanceId", None));
    }

    #[test]
    fn session_key_is_sha256_hex() {
        assert_eq!(
            session_key("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        // Of the id's UTF-8 bytes, as the reference's Node hash takes a
        // string: python3 -c "import hashlib;
        // print(hashlib.sha256('/home/u/.pi/sessions/é 1.jsonl'.encode()).hexdigest())"
        assert_eq!(
            session_key("/home/u/.pi/sessions/é 1.jsonl"),
            "898228ca80b96ba1f78996ff609569213f9399e9b89c00f03fc4161bdb0b143e"
        );
    }
}
