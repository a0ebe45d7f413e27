//! The descriptor naming a budget: its JSON shape, the environment encoding
//! and the persisted copy `run-fanout-budget.json`.

use std::fs;
use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::DecodePaddingMode;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, URL_SAFE_NO_PAD};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::{
    BUDGET_ENV, BUDGET_ENV_ALIAS, BudgetsRoot, Error, MAX_LIMIT, OpenBudget, PERSISTED_FILE, Result,
};

/// A budget descriptor: `{version, rootRunId, directory, limit, parentPath?}`.
///
/// Deserialising checks the field rules only (steps 1–2 of the reference's
/// validation); [`OpenBudget::open`] checks the directory and the manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", try_from = "Value")]
pub struct Descriptor {
    /// Always 1.
    pub version: u32,
    /// Id of the top-level run that created the budget.
    pub root_run_id: String,
    /// The budget directory (its real path once validated).
    pub directory: PathBuf,
    /// The limit, equal to the manifest's.
    pub limit: u64,
    /// Claim path of the launch holding this descriptor; claims are qualified with it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent_path: Option<String>,
}

impl TryFrom<Value> for Descriptor {
    type Error = Error;

    fn try_from(value: Value) -> Result<Self> {
        let Value::Object(map) = value else {
            return Err(Error::DescriptorMissing);
        };
        Self::from_map(&map).ok_or(Error::DescriptorInvalid)
    }
}

impl Descriptor {
    fn from_map(map: &Map<String, Value>) -> Option<Self> {
        let version = map
            .get("version")
            .and_then(json_integer)
            .filter(|v| *v == 1)?;
        let parent_path = match map.get("parentPath") {
            None => None,
            Some(Value::String(p)) => Some(p.clone()).filter(|p| !p.is_empty()),
            Some(_) => return None,
        };
        Some(Self {
            version: version as u32,
            root_run_id: non_empty_string(map.get("rootRunId"))?,
            directory: PathBuf::from(non_empty_string(map.get("directory"))?),
            limit: map.get("limit").and_then(json_limit)?,
            parent_path,
        })
    }

    /// Parses descriptor JSON text and checks its field rules.
    pub fn from_json(text: &str) -> Result<Self, String> {
        let value: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
        Self::try_from(value).map_err(|e| e.to_string())
    }

    /// The descriptor as compact JSON (the reference's `JSON.stringify`).
    pub fn to_json(&self) -> String {
        let mut map = Map::new();
        map.insert("version".into(), self.version.into());
        map.insert("rootRunId".into(), self.root_run_id.clone().into());
        map.insert(
            "directory".into(),
            self.directory.to_string_lossy().into_owned().into(),
        );
        map.insert("limit".into(), self.limit.into());
        if let Some(p) = &self.parent_path {
            map.insert("parentPath".into(), p.clone().into());
        }
        Value::Object(map).to_string()
    }

    /// Qualifies a local claim path with the trimmed `parentPath`:
    /// `<parentPath>/<local>`, or `local` when there is no parent path.
    pub fn qualify(&self, local: &str) -> String {
        match self.parent_path.as_deref().map(str::trim) {
            Some(p) if !p.is_empty() => format!("{p}/{local}"),
            _ => local.to_string(),
        }
    }

    /// A copy whose `parentPath` is `path` (an empty path removes it).
    pub fn with_parent_path(&self, path: &str) -> Self {
        Self {
            parent_path: Some(path.to_string()).filter(|p| !p.is_empty()),
            ..self.clone()
        }
    }

    /// The descriptor handed to a child launched for `local`: its
    /// `parentPath` is the child's qualified claim path.
    pub fn child(&self, local: &str) -> Self {
        self.with_parent_path(&self.qualify(local))
    }

    /// The environment value: base64url (no padding) of the compact JSON.
    pub fn to_env_value(&self) -> String {
        URL_SAFE_NO_PAD.encode(self.to_json())
    }
}

fn non_empty_string(value: Option<&Value>) -> Option<String> {
    value
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

/// A JSON number that is an integer (`1` and `1.0` alike, as in JavaScript).
fn json_integer(value: &Value) -> Option<u64> {
    let n = value.as_number()?;
    n.as_u64().or_else(|| {
        let f = n.as_f64()?;
        // Exact for integral values below 2^64; others fail the checks.
        (f.is_finite() && f.fract() == 0.0 && f >= 0.0 && f < u64::MAX as f64).then_some(f as u64)
    })
}

/// A positive integer limit whose slot numbers fit the six-digit names.
pub(crate) fn json_limit(value: &Value) -> Option<u64> {
    json_integer(value).filter(|l| (1..=MAX_LIMIT).contains(l))
}

/// Decodes an inherited environment value and validates the descriptor
/// against the managed `root`. Unset or empty → `None`.
pub fn decode_env(value: Option<&str>, root: &Path) -> Result<Option<OpenBudget>> {
    let Some(value) = value.filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    let descriptor = decode_env_descriptor(value)?;
    let budget =
        OpenBudget::open(root, &descriptor).map_err(|e| Error::InheritedInvalid(e.to_string()))?;
    Ok(Some(budget))
}

/// Decodes an environment value (lenient base64url of the descriptor JSON)
/// into a structurally valid descriptor, without opening its budget.
/// Touches no file (fuzzing entry point).
pub fn decode_env_descriptor(value: &str) -> Result<Descriptor> {
    let inherited = |message: String| Error::InheritedInvalid(message);
    let bytes = lenient_base64url(value).map_err(|e| inherited(e.to_string()))?;
    Descriptor::from_json(&String::from_utf8_lossy(&bytes)).map_err(inherited)
}

/// The inherited descriptor from [`BUDGET_ENV`], else [`BUDGET_ENV_ALIAS`]
/// (the first one set and non-empty), validated against `root`.
pub fn inherited_from_env(root: &Path) -> Result<Option<OpenBudget>> {
    let value = [BUDGET_ENV, BUDGET_ENV_ALIAS]
        .into_iter()
        .filter_map(|name| std::env::var(name).ok())
        .find(|v| !v.is_empty());
    decode_env(value.as_deref(), root)
}

/// Node's lenient base64url: both alphabets, padding and stray characters ignored.
fn lenient_base64url(text: &str) -> Result<Vec<u8>, base64::DecodeError> {
    const LENIENT: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::URL_SAFE,
        GeneralPurposeConfig::new()
            .with_decode_allow_trailing_bits(true)
            .with_decode_padding_mode(DecodePaddingMode::RequireNone),
    );
    let mut clean: String = text
        .chars()
        .filter_map(|c| match c {
            '+' => Some('-'),
            '/' => Some('_'),
            c if c.is_ascii_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect();
    // A lone trailing sextet carries no whole byte; Node drops it.
    if clean.len() % 4 == 1 {
        clean.pop();
    }
    LENIENT.decode(clean)
}

/// Validates `descriptor` against `root` and writes it, normalised, to
/// `<run_dir>/run-fanout-budget.json` (compact JSON + newline, as the
/// reference writes it; written atomically, 0600).
pub fn write_persisted(run_dir: &Path, root: &Path, descriptor: &Descriptor) -> Result<OpenBudget> {
    let mut batch = atomic_file::Batch::new();
    let budget = stage_persisted(run_dir, root, descriptor, &mut batch)?;
    batch.commit()?;
    Ok(budget)
}

/// [`write_persisted`] that adds the file to `batch` instead of writing it:
/// nothing is on disk until the caller commits the batch.
pub fn stage_persisted(
    run_dir: &Path,
    root: &Path,
    descriptor: &Descriptor,
    batch: &mut atomic_file::Batch,
) -> Result<OpenBudget> {
    let budget = OpenBudget::open(root, descriptor)?;
    let text = format!("{}\n", budget.descriptor().to_json());
    batch.add(run_dir.join(PERSISTED_FILE), text);
    Ok(budget)
}

/// Reads `<run_dir>/run-fanout-budget.json` and validates it against `root`.
/// A missing run directory or file is `None`; anything else that fails is
/// `Invalid persisted run fan-out budget '<file>': <message>`.
pub fn read_persisted(run_dir: &Path, root: &Path) -> Result<Option<OpenBudget>> {
    read_persisted_in(run_dir, &BudgetsRoot::resolve(root))
}

/// [`read_persisted`] against a root resolved once, for a caller that reads
/// many runs' budgets.
pub fn read_persisted_in(run_dir: &Path, root: &BudgetsRoot) -> Result<Option<OpenBudget>> {
    let file = run_dir.join(PERSISTED_FILE);
    let text = match atomic_file::read::read_to_string(&file) {
        Err(e) if e.is_not_found() => return Ok(None),
        other => other,
    };
    let invalid = |message: String| Error::PersistedInvalid {
        file: file.clone(),
        message,
    };
    let descriptor =
        Descriptor::from_json(&text.map_err(|e| invalid(e.to_string()))?).map_err(invalid)?;
    let budget = match OpenBudget::open_in(root, &descriptor) {
        Err(e @ (Error::OutsideRoot | Error::DirectoryUnavailable(_))) => {
            match rebased(root.path(), &descriptor) {
                Some(moved) => OpenBudget::open_in(root, &moved),
                None => Err(e),
            }
        }
        opened => opened,
    };
    Ok(Some(budget.map_err(|e| invalid(e.to_string()))?))
}

/// A state root that was moved or copied keeps its budget directories under
/// the new `root`, while its run files still record the old absolute path.
/// When the recorded directory does not open inside `root` but a budget of
/// the same name exists there, that one is tried. [`OpenBudget::open_in`]
/// checks it as any other, so a symlink out of the root stays refused.
fn rebased(root: &Path, descriptor: &Descriptor) -> Option<Descriptor> {
    let recorded = &descriptor.directory;
    let same_layout = recorded.parent().and_then(Path::file_name) == root.file_name();
    let candidate = match recorded.file_name() {
        Some(name) if same_layout => root.join(name),
        _ => return None,
    };
    if candidate == *recorded || fs::symlink_metadata(&candidate).is_err() {
        return None;
    }
    Some(Descriptor {
        directory: candidate,
        ..descriptor.clone()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_integral_float_is_an_integer_only_below_two_to_the_64() {
        assert_eq!(json_integer(&json!(3.0)), Some(3));
        // 2^64 itself does not fit: it must not saturate to u64::MAX.
        let two_to_the_64: Value = serde_json::from_str("18446744073709551616.0").unwrap();
        assert_eq!(json_integer(&two_to_the_64), None);
        assert_eq!(json_integer(&json!(-1.0)), None);
        assert_eq!(json_integer(&json!(1.5)), None);
    }

    fn sample() -> Descriptor {
        Descriptor {
            version: 1,
            root_run_id: "1a2b3c4d".into(),
            directory: "/x/run-fanout-budgets/1a2b3c4d-u".into(),
            limit: 64,
            parent_path: Some("chain[0]".into()),
        }
    }

    #[test]
    fn compact_json_has_reference_key_order() {
        assert_eq!(
            sample().to_json(),
            r#"{"version":1,"rootRunId":"1a2b3c4d","directory":"/x/run-fanout-budgets/1a2b3c4d-u","limit":64,"parentPath":"chain[0]"}"#
        );
        let parsed: Descriptor = serde_json::from_str(&sample().to_json()).unwrap();
        assert_eq!(parsed, sample());
    }

    #[test]
    fn shape_errors_use_reference_texts() {
        let missing = Descriptor::try_from(json!([1])).unwrap_err();
        assert_eq!(
            missing.to_string(),
            "Run fan-out budget descriptor is missing or invalid."
        );
        let base = json!({"version":1,"rootRunId":"r","directory":"/d","limit":2});
        assert!(Descriptor::try_from(base.clone()).is_ok());
        for (key, bad) in [
            ("version", json!(2)),
            ("rootRunId", json!("")),
            ("directory", json!(7)),
            ("limit", json!(0)),
            ("limit", json!(1.5)),
            ("parentPath", json!(null)),
        ] {
            let mut v = base.clone();
            v[key] = bad;
            let err = Descriptor::try_from(v).unwrap_err();
            assert_eq!(
                err.to_string(),
                "Run fan-out budget descriptor is invalid.",
                "{key}"
            );
        }
        let mut empty_parent = base;
        empty_parent["parentPath"] = json!("");
        assert_eq!(
            Descriptor::try_from(empty_parent).unwrap().parent_path,
            None
        );
    }

    #[test]
    fn qualification_and_children() {
        let d = sample();
        assert_eq!(d.qualify("tasks[1]"), "chain[0]/tasks[1]");
        let child = d.child("tasks[1]");
        assert_eq!(child.parent_path.as_deref(), Some("chain[0]/tasks[1]"));
        assert_eq!(child.qualify("single"), "chain[0]/tasks[1]/single");
        let blank = d.with_parent_path("  ");
        assert_eq!(blank.qualify("single"), "single");
        assert_eq!(d.with_parent_path("").parent_path, None);
    }

    #[test]
    fn lenient_decoding_accepts_padding_and_standard_alphabet() {
        let text = "{\"a\":\"??>\"}";
        let padded = base64::engine::general_purpose::STANDARD.encode(text);
        let plain = URL_SAFE_NO_PAD.encode(text);
        assert_eq!(lenient_base64url(&padded).unwrap(), text.as_bytes());
        assert_eq!(
            lenient_base64url(&format!(" {plain}\n")).unwrap(),
            text.as_bytes()
        );
        // '/' of the standard alphabet is '_' of the URL-safe one.
        let slash = "{\"a\":\"???\"}";
        let standard = base64::engine::general_purpose::STANDARD.encode(slash);
        assert!(standard.contains('/'), "{standard}");
        assert_eq!(lenient_base64url(&standard).unwrap(), slash.as_bytes());
    }

    #[test]
    fn a_lone_trailing_sextet_is_dropped_as_node_does() {
        assert_eq!(lenient_base64url("YWJj").unwrap(), b"abc");
        assert_eq!(lenient_base64url("YWJjZ").unwrap(), b"abc");
        assert_eq!(lenient_base64url("YWJjZGVmZ").unwrap(), b"abcdef");
    }
}
