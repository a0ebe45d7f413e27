#![doc = include_str!("../README.md")]
//!
//! One file per run, `<run dir>/dispatch.json`, written by the launcher when
//! the executor accepted the run (before the job may start: the job is
//! submitted held and released after this write) and once more by the
//! run's monitor when it starts on a node (it adds `node`).
#![warn(missing_docs)]

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The file's name in a run directory.
pub const FILE: &str = "dispatch.json";

/// The one version this crate writes and reads.
pub const VERSION: u32 = 1;

/// Where a run executes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Executor {
    /// A Slurm batch job whose script is the run's monitor.
    Slurm,
}

impl Executor {
    /// The name written in the file.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Slurm => "slurm",
        }
    }
}

/// The content of `dispatch.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Dispatch {
    /// Always [`VERSION`].
    pub version: u32,
    /// The executor that holds the run.
    pub executor: Executor,
    /// The cluster that accepted the job (`sbatch --parsable`'s second
    /// field, else Slurm's `ClusterName`), when known.
    // `deserialize_with` makes each of the three keys required (null is
    // none): the reader refuses a missing key (docs/protocol/dispatch.md §3).
    #[serde(deserialize_with = "Option::deserialize")]
    pub cluster: Option<String>,
    /// The job id (digits).
    pub job_id: String,
    /// The partition asked for, when one was.
    #[serde(deserialize_with = "Option::deserialize")]
    pub partition: Option<String>,
    /// The node the job started on, once the monitor recorded it.
    #[serde(deserialize_with = "Option::deserialize")]
    pub node: Option<String>,
    /// When the executor accepted the run (ms since the epoch).
    pub submitted_at: u64,
}

impl Dispatch {
    /// A Slurm job just accepted (no node yet).
    pub fn slurm(
        job_id: &str,
        partition: Option<String>,
        cluster: Option<String>,
        submitted_at: u64,
    ) -> Self {
        Self {
            version: VERSION,
            executor: Executor::Slurm,
            cluster,
            job_id: job_id.to_owned(),
            partition,
            node: None,
            submitted_at,
        }
    }
}

/// A `dispatch.json` that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file cannot be read (symlink, FIFO, oversize, I/O).
    #[error(transparent)]
    Read(#[from] atomic_file::read::ReadError),
    /// The JSON is malformed or a field is wrong.
    #[error("failed to parse '{}': {field}: {why}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The field at fault (`.` for the whole document).
        field: String,
        /// What is wrong.
        why: String,
    },
    /// The file cannot be written.
    #[error(transparent)]
    Write(#[from] atomic_file::Error),
}

/// The record of `run_dir`, `None` when the run has none (a local run).
pub fn read(run_dir: &Path) -> Result<Option<Dispatch>, Error> {
    let path = run_dir.join(FILE);
    if path.symlink_metadata().is_err() {
        return Ok(None);
    }
    let bytes = atomic_file::read::read_file(&path)?;
    parse(&path, &bytes).map(Some)
}

/// Parses and validates the bytes of `path`.
pub fn parse(path: &Path, bytes: &[u8]) -> Result<Dispatch, Error> {
    let invalid = |field: &str, why: String| Error::Invalid {
        path: path.to_path_buf(),
        field: field.to_owned(),
        why,
    };
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let record: Dispatch = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let field = e.path().to_string();
        invalid(&field, e.into_inner().to_string())
    })?;
    de.end().map_err(|e| invalid(".", e.to_string()))?;
    if record.version != VERSION {
        return Err(invalid(
            "version",
            format!(
                "unsupported version {} (expected {VERSION})",
                record.version
            ),
        ));
    }
    if !is_job_id(&record.job_id) {
        return Err(invalid(
            "jobId",
            format!("not a Slurm job id: {:?}", record.job_id),
        ));
    }
    for (field, value) in [
        ("cluster", &record.cluster),
        ("partition", &record.partition),
        ("node", &record.node),
    ] {
        if let Some(value) = value
            && !is_name(value)
        {
            return Err(invalid(field, format!("not a Slurm name: {value:?}")));
        }
    }
    Ok(record)
}

/// Writes `record` as `run_dir/dispatch.json` (atomically, 0600).
pub fn write(run_dir: &Path, record: &Dispatch) -> Result<(), Error> {
    Ok(atomic_file::write_json(&run_dir.join(FILE), record)?)
}

/// Records the node the job started on, when the file names `job_id`;
/// `Ok(false)` when there is no record or it names another job.
pub fn record_node(run_dir: &Path, job_id: &str, node: &str) -> Result<bool, Error> {
    let Some(mut record) = read(run_dir)? else {
        return Ok(false);
    };
    if record.job_id != job_id || !is_name(node) {
        return Ok(false);
    }
    record.node = Some(node.to_owned());
    write(run_dir, &record)?;
    Ok(true)
}

/// Digits only (an array task `12_3` or a het job `12+1` is not submitted
/// by this tool), at most 20 of them.
pub fn is_job_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 20 && id.bytes().all(|b| b.is_ascii_digit())
}

/// A Slurm node, partition or cluster name as this tool accepts it: 1 to
/// 128 of `[A-Za-z0-9._-]` (never a path, a space or an option).
pub fn is_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}
