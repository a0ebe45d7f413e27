//! What the runner sees of a running step: it reads the step's stdout and
//! stderr logs as they grow (the COMMAND writes them itself, so a dead
//! runner never blocks it), and records in `status.json` when output last
//! came (`lastOutputAt`), the agent's latest activity and, for a preset, the
//! CLI's session id and file as soon as the CLI printed (and wrote) them.
//! At most one status write per [`TICK`] and step, and only on a change.

use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use agents::RunnerKind;
use agents::capture::Stream;

use crate::agent_output;
use crate::config::LaunchConfig;
use crate::transitions::{StepLive, log_path};

/// How often a running step's logs are looked at.
pub const TICK: Duration = Duration::from_secs(1);

/// How often the CLI's session store is searched for the session file.
const SESSION_FILE_EVERY: Duration = Duration::from_secs(5);

/// Most bytes of a log read in one look (the rest waits for the next one).
const READ_PER_TICK: u64 = 8 * 1024 * 1024;

/// One running step's logs, as far as they were read.
pub struct Watch {
    step: usize,
    kind: Option<RunnerKind>,
    stdout: PathBuf,
    stderr: PathBuf,
    read: u64,
    stderr_len: u64,
    stream: Option<Stream>,
    raw_activity: Option<String>,
    recorded: StepLive,
    next_look: Instant,
    next_session_search: Instant,
}

impl Watch {
    /// Watches step `i` of `config` from its start.
    pub fn new(config: &LaunchConfig, i: usize) -> Self {
        let kind = agent_output::step_kind(config, i);
        let now = Instant::now();
        Self {
            step: i,
            kind,
            stdout: log_path(config, i, "stdout"),
            stderr: log_path(config, i, "stderr"),
            read: 0,
            stderr_len: 0,
            stream: kind.map(Stream::new),
            raw_activity: None,
            recorded: StepLive::default(),
            next_look: now + TICK,
            next_session_search: now,
        }
    }

    /// When the next look is due.
    pub fn due(&self) -> Instant {
        self.next_look
    }

    /// Looks at the logs if a look is due; the fields to record when any
    /// changed since the last record.
    pub fn look(&mut self, config: &LaunchConfig, now_ms: u64) -> Option<StepLive> {
        let now = Instant::now();
        if now < self.next_look {
            return None;
        }
        self.next_look = now + TICK;
        let mut next = self.recorded.clone();
        let grew = self.read_stdout() | self.stderr_grew();
        if grew {
            next.last_output_at = Some(now_ms);
        }
        if let Some(stream) = &self.stream {
            let captured = stream.captured();
            if captured.activity != self.raw_activity {
                self.raw_activity = captured.activity.clone();
                next.activity = self
                    .raw_activity
                    .as_deref()
                    .map(|a| agent_output::clean(config, self.step, a));
            }
            if next.session_id.is_none() {
                next.session_id = captured
                    .session_id
                    .clone()
                    .filter(|id| agents::preset::is_plain_session_id(id));
            }
        }
        if next.session_file.is_none() && now >= self.next_session_search {
            self.next_session_search = now + SESSION_FILE_EVERY;
            if let (Some(kind), Some(id)) = (self.kind, &next.session_id) {
                next.session_file = agent_output::live_session_file(config, self.step, kind, id)
                    .map(|f| f.display().to_string());
            }
        }
        if next == self.recorded {
            return None;
        }
        let mut change = next.clone();
        // Only what changed is written again.
        if change.activity == self.recorded.activity {
            change.activity = None;
        }
        if change.session_file == self.recorded.session_file {
            change.session_file = None;
        }
        if change.session_id == self.recorded.session_id {
            change.session_id = None;
        }
        self.recorded = next;
        Some(change)
    }

    /// Reads what stdout gained; true when it grew.
    fn read_stdout(&mut self) -> bool {
        let Ok(mut file) = std::fs::File::open(&self.stdout) else {
            return false;
        };
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        if len <= self.read {
            return false;
        }
        let Some(stream) = self.stream.as_mut() else {
            self.read = len;
            return true;
        };
        let mut bytes = Vec::new();
        let ok = file.seek(SeekFrom::Start(self.read)).is_ok()
            && (&mut file)
                .take(READ_PER_TICK)
                .read_to_end(&mut bytes)
                .is_ok();
        if !ok || bytes.is_empty() {
            return false;
        }
        self.read += bytes.len() as u64;
        stream.feed(&bytes);
        true
    }

    fn stderr_grew(&mut self) -> bool {
        let len = std::fs::metadata(&self.stderr).map_or(0, |m| m.len());
        let grew = len > self.stderr_len;
        self.stderr_len = len;
        grew
    }
}
