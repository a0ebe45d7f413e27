//! Reading a recorded snapshot back, and the crate reader each kind must pass.
//!
//! Until `subagents validate` exists this calls the crates' own readers; a
//! kind whose crate has no public reader is checked against the fields its
//! consumers rely on, and says so.

use std::path::Path;

use anyhow::Context;
use base64::Engine;
use serde_json::Value;

use super::{Kind, info_bool, info_str};

/// The kind and the exact recorded bytes of a `.snap` file.
pub fn read_snapshot(path: &Path) -> anyhow::Result<(Kind, String)> {
    let snapshot = insta::Snapshot::from_file(path)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(|| format!("read snapshot '{}'", path.display()))?;
    let info = snapshot
        .metadata()
        .private_info()
        .with_context(|| format!("'{}' has no info", path.display()))?;
    let kind = info_str(info, "kind")
        .and_then(Kind::from_name)
        .with_context(|| format!("'{}' records no known info.kind", path.display()))?;
    let mut text = match snapshot.contents() {
        insta::internals::SnapshotContents::Text(text) => text.to_string(),
        _ => anyhow::bail!("'{}' is not a text snapshot", path.display()),
    };
    if info_bool(info, "endsWithNewline") == Some(true) {
        text.push('\n');
    }
    Ok((kind, text))
}

/// Runs the reader of `kind` over `text`; the error says what it refused.
pub fn validate(kind: Kind, text: &str) -> Result<(), String> {
    let label = Path::new("<snapshot>");
    match kind {
        Kind::Status => status::model::parse_status(label, text)
            .map(drop)
            .map_err(|e| e.to_string()),
        Kind::Events => events(text),
        Kind::Candidate => status::proof::validate_candidate(&json(text)?, "invalid candidate"),
        Kind::Proof => {
            status::proof::validate_proof(&json(text)?, "<snapshot>", &Default::default()).map(drop)
        }
        Kind::Manifest => fanout_budget::Manifest::parse(text, label)
            .map(drop)
            .map_err(|e| e.to_string()),
        Kind::Claim => claim(&json(text)?),
        Kind::Descriptor | Kind::PersistedDescriptor => {
            fanout_budget::Descriptor::from_json(text).map(drop)
        }
        Kind::EnvEncoding => {
            let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(text.trim_end())
                .map_err(|e| format!("not base64url without padding: {e}"))?;
            let decoded = String::from_utf8(bytes).map_err(|e| e.to_string())?;
            fanout_budget::Descriptor::from_json(&decoded).map(drop)
        }
        Kind::Rejection => serde_json::from_str::<fanout_budget::Rejection>(text)
            .map(drop)
            .map_err(|e| e.to_string()),
        Kind::Startup => handshake_record(&json(text)?, &["ready", "acknowledged", "error"]),
        Kind::StartupAck => handshake_record(&json(text)?, &["ack"]),
        Kind::StartupProceed => handshake_record(&json(text)?, &["proceed"]),
        Kind::CapacityOwner => capacity::OwnerRecord::parse(text.as_bytes())
            .map(drop)
            .ok_or_else(|| "capacity::OwnerRecord::parse refused it".to_owned()),
        Kind::CapacityRunName => {
            serde_json::from_str::<Option<process_identity::ProcessIdentity>>(text)
                .map(drop)
                .map_err(|e| format!("reserving process refused: {e}"))
        }
        Kind::RunProcesses => status::processes::parse(label, text.as_bytes())
            .map(drop)
            .map_err(|e| e.to_string()),
        Kind::Recovery => recovery::parse_descriptor(text.as_bytes(), label)
            .map(drop)
            .map_err(|e| e.to_string()),
        Kind::LaunchContract => recovery::parse_launch_contract(text.as_bytes(), label)
            .map(drop)
            .map_err(|e| e.to_string()),
        Kind::LeaseOwner => serde_json::from_str::<recovery::lease::OwnerRecord>(text)
            .map(drop)
            .map_err(|e| format!("lease owner refused: {e}")),
        Kind::RecoverySeal => recovery::seal::parse_seal(text.as_bytes())
            .map(drop)
            .map_err(|(field, detail)| format!("seal refused: {field} {detail}")),
        Kind::ListHuman => list_human(text),
        Kind::ListJson => list_json(text),
        Kind::ListIndex => list_index(text),
        Kind::Dispatch => dispatch::parse(label, text.as_bytes())
            .map(drop)
            .map_err(|e| e.to_string()),
    }
}

fn json(text: &str) -> Result<Value, String> {
    serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))
}

fn string_field<'a>(value: &'a Value, key: &str) -> Result<&'a str, String> {
    value[key]
        .as_str()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| format!("`{key}` is not a non-empty string"))
}

/// `status::events::read_all` skips what it cannot parse, so every line
/// must be an object with `type`, `ts` and `runId` for nothing to be lost.
fn events(text: &str) -> Result<(), String> {
    if !text.ends_with('\n') {
        return Err("events.jsonl must end every line with a newline".into());
    }
    for line in text.lines() {
        let event = json(line)?;
        string_field(&event, "type")?;
        string_field(&event, "runId")?;
        event["ts"].as_u64().ok_or("`ts` is not a timestamp")?;
    }
    Ok(())
}

/// No crate reads a claim's content (usage counts slot names); the
/// reference's fields are checked instead.
fn claim(value: &Value) -> Result<(), String> {
    if value["version"] != 1 {
        return Err("`version` is not 1".into());
    }
    string_field(value, "claimId")?;
    string_field(value, "path")?;
    value["claimedAt"]
        .as_u64()
        .ok_or("`claimedAt` is not a timestamp")?;
    Ok(())
}

/// `handshake::validate_record`, plus the state or action the file name implies.
fn handshake_record(value: &Value, expected: &[&str]) -> Result<(), String> {
    handshake::validate_record(value)?;
    let found = value
        .get("state")
        .or_else(|| value.get("action"))
        .and_then(Value::as_str);
    match found {
        Some(found) if expected.contains(&found) => Ok(()),
        _ => Err(format!("neither state nor action is one of {expected:?}")),
    }
}

/// The text has no reader; it must at least be a heading with the count.
fn list_human(text: &str) -> Result<(), String> {
    let first = text.lines().next().unwrap_or_default();
    let valid = first.starts_with("No ")
        || first
            .rsplit_once(": ")
            .is_some_and(|(_, n)| n.parse::<usize>().is_ok());
    valid
        .then_some(())
        .ok_or_else(|| format!("unexpected heading '{first}'"))
}

/// The listing index's structure (its stamps and checksum are redacted in
/// a snapshot): the version line, the header, each row's JSON line and
/// block of the length it names, the trailer.
fn list_index(text: &str) -> Result<(), String> {
    let body = text
        .strip_prefix(&format!(
            "subagents-listing-index {}\n",
            listing::list_index::VERSION
        ))
        .ok_or("not a listing index of this version")?;
    let (header, mut rest) = body.split_once('\n').ok_or("no header line")?;
    let rows = json(header)?["rows"]
        .as_u64()
        .ok_or("header without `rows`")?;
    for i in 0..rows {
        let (head, after) = rest.split_once('\n').ok_or(format!("row {i}: no line"))?;
        let head = json(head)?;
        string_field(&head, "name")?;
        let len = head["text"].as_u64().ok_or(format!("row {i}: no `text`"))? as usize;
        after.get(..len).ok_or(format!("row {i}: short block"))?;
        if after.as_bytes().get(len) != Some(&b'\n') {
            return Err(format!("row {i}: block not ended by one newline"));
        }
        rest = &after[len + 1..];
    }
    rest.strip_prefix("end ")
        .filter(|r| r.ends_with('\n') && !r[..r.len() - 1].contains('\n'))
        .map(drop)
        .ok_or_else(|| "no `end` trailer after the rows".to_owned())
}

/// Every listed run must read back as a status.
fn list_json(text: &str) -> Result<(), String> {
    let runs = json(text)?;
    let runs = runs.as_array().ok_or("not a JSON array")?;
    for run in runs {
        string_field(run, "id")?;
        string_field(run, "asyncDir")?;
        status::model::parse_status(Path::new("<snapshot>"), &run.to_string())
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}
