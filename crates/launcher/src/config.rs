//! The launch config the launcher hands to the monitor and the monitor to the
//! runner, over stdin: never a file, and never the task text (only its path).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Environment variable naming the inherited ready-pipe descriptor.
pub const READY_FD_ENV: &str = "SUBAGENTS_READY_FD";

/// Everything a runner needs to run one single-step run.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LaunchConfig {
    /// Run id.
    pub run_id: String,
    /// State root.
    pub root: PathBuf,
    /// Run directory.
    pub run_dir: PathBuf,
    /// Runner instance id (UUID v4).
    pub runner_process_instance_id: String,
    /// Agent label.
    pub agent: String,
    /// COMMAND and its arguments, placeholders not yet replaced.
    pub command: Vec<String>,
    /// Working directory of COMMAND.
    pub cwd: PathBuf,
    /// `task.md`, when there is a task.
    pub task_file: Option<PathBuf>,
    /// Wall-clock limit; `None` for none.
    pub timeout_ms: Option<u64>,
    /// Owner session.
    pub session_id: Option<String>,
    /// Extra environment for COMMAND.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}
