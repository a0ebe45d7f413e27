//! `run-processes.json`: who runs a run, written once, apart from its status.
//!
//! `status.json` has many writers and can be damaged (a torn copy from
//! another tool, a FIFO or a directory in its place). What `stop` and the
//! observer need to end a run and prove it over must survive that: the
//! monitor's and the runner's identities, the run and its session. The
//! monitor writes this record once, after spawning the runner and before
//! handing it its config, so the record exists before the runner writes
//! anything; nobody rewrites it.
//!
//! It is written without any fsync ([`atomic_file::write_json_transient`]):
//! it names processes alive right now, and after a machine crash every one
//! of them is gone (another boot), so a record lost or torn by a crash says
//! nothing a reader needs. Readers treat a missing or unreadable record as
//! "not recorded".

use std::path::Path;

use process_identity::ProcessIdentity;
use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// The file name inside a run directory.
pub const FILE: &str = "run-processes.json";

/// The record (`version` 1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunProcesses {
    /// Always 1.
    pub version: u32,
    /// The run.
    pub run_id: String,
    /// The run's session (its capacity pool).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// The runner instance the run's proof is about.
    pub runner_process_instance_id: String,
    /// The monitor: the runner's waiting parent, a session leader.
    pub monitor: ProcessIdentity,
    /// The runner.
    pub runner: ProcessIdentity,
}

/// Writes the record of `run_dir` (0600, temp file and rename, no fsync).
pub fn write(run_dir: &Path, record: &RunProcesses) -> Result<()> {
    atomic_file::write_json_transient(&run_dir.join(FILE), record)?;
    Ok(())
}

/// Reads the record of `run_dir`; `Ok(None)` when there is none.
pub fn read(run_dir: &Path) -> Result<Option<RunProcesses>> {
    let path = run_dir.join(FILE);
    let bytes = match atomic_file::read::read_file(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    parse(&path, &bytes).map(Some)
}

/// Parses a record; `path` names the file in errors.
pub fn parse(path: &Path, bytes: &[u8]) -> Result<RunProcesses> {
    let invalid = |reason: String| Error::Invalid {
        what: "run processes file",
        path: atomic_file::escape_path(path),
        reason,
    };
    // The error names the JSON path of the field at fault (`monitor.pid: ...`).
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let record: RunProcesses = serde_path_to_error::deserialize(&mut de)
        .map_err(|e| invalid(format!("{}: {}", e.path(), e.inner())))?;
    de.end().map_err(|e| invalid(e.to_string()))?;
    if record.version != 1 {
        return Err(invalid(format!("version {} is not 1", record.version)));
    }
    Ok(record)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> RunProcesses {
        let me = ProcessIdentity::current().unwrap();
        let mut runner = me.clone();
        runner.pid += 1;
        RunProcesses {
            version: 1,
            run_id: "run-a".into(),
            session_id: Some("session-b".into()),
            runner_process_instance_id: "instance-c".into(),
            monitor: me,
            runner,
        }
    }

    #[test]
    fn a_written_record_reads_back_equal_and_private() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        write(tmp.path(), &record()).unwrap();
        assert_eq!(read(tmp.path()).unwrap(), Some(record()));
        let mode = std::fs::metadata(tmp.path().join(FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn missing_is_none_and_damage_names_the_file_and_field() {
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(read(tmp.path()).unwrap(), None);
        std::fs::write(tmp.path().join(FILE), br#"{"version":1,"runId":5}"#).unwrap();
        let e = read(tmp.path()).unwrap_err().to_string();
        assert!(
            e.contains("run-processes.json") && e.contains("invalid type"),
            "{e}"
        );
        let mut other = serde_json::to_value(record()).unwrap();
        other["version"] = 2.into();
        std::fs::write(tmp.path().join(FILE), other.to_string()).unwrap();
        let e = read(tmp.path()).unwrap_err().to_string();
        assert!(e.contains("version 2 is not 1"), "{e}");
    }
}
