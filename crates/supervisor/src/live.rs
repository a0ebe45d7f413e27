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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::launch_config;
    use std::io::Write;

    /// A watch of step 0 whose look is due now.
    fn due_watch(config: &LaunchConfig) -> Watch {
        let mut watch = Watch::new(config, 0);
        watch.next_look = Instant::now();
        watch
    }

    fn append(path: &std::path::Path, text: &str) {
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap();
        file.write_all(text.as_bytes()).unwrap();
    }

    /// A step run by claude, whose session store is `store`.
    fn claude_config(run_dir: &std::path::Path, store: &std::path::Path) -> LaunchConfig {
        let mut config = launch_config(run_dir);
        let env = &mut config.steps[0].env;
        env.insert(agents::RUNNER_ENV.into(), "claude".into());
        env.insert("CLAUDE_CONFIG_DIR".into(), store.display().to_string());
        config
    }

    #[test]
    fn a_look_before_its_tick_records_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let config = launch_config(tmp.path());
        let mut watch = Watch::new(&config, 0);
        append(&log_path(&config, 0, "stdout"), "early\n");
        assert_eq!(watch.look(&config, 1_000), None, "not due for a tick");
        watch.next_look = Instant::now();
        let seen = watch.look(&config, 2_000).expect("due and grown");
        assert_eq!(seen.last_output_at, Some(2_000));
        // The next look waits a tick again, whatever came meanwhile.
        append(&log_path(&config, 0, "stdout"), "more\n");
        assert_eq!(watch.look(&config, 3_000), None);
        assert!(watch.due() > Instant::now() + TICK / 2);
    }

    #[test]
    fn output_on_either_log_is_recorded_and_silence_is_not() {
        let tmp = tempfile::tempdir().unwrap();
        let config = launch_config(tmp.path());
        let mut watch = due_watch(&config);
        assert_eq!(watch.look(&config, 1_000), None, "no log yet");
        watch.next_look = Instant::now();
        std::fs::write(log_path(&config, 0, "stdout"), "").unwrap();
        std::fs::write(log_path(&config, 0, "stderr"), "").unwrap();
        assert_eq!(watch.look(&config, 1_500), None, "empty logs");

        let at = |watch: &mut Watch, now_ms| {
            watch.next_look = Instant::now();
            watch.look(&config, now_ms).and_then(|l| l.last_output_at)
        };
        append(&log_path(&config, 0, "stdout"), "out\n");
        assert_eq!(at(&mut watch, 2_000), Some(2_000), "stdout alone");
        assert_eq!(at(&mut watch, 2_500), None, "nothing new");
        append(&log_path(&config, 0, "stderr"), "err\n");
        assert_eq!(at(&mut watch, 3_000), Some(3_000), "stderr alone");
        assert_eq!(at(&mut watch, 3_500), None, "nothing new");
        append(&log_path(&config, 0, "stdout"), "out\n");
        append(&log_path(&config, 0, "stderr"), "err\n");
        assert_eq!(at(&mut watch, 4_000), Some(4_000), "both at once");
        assert_eq!(at(&mut watch, 4_500), None, "nothing new");
    }

    #[test]
    fn an_agents_activity_and_session_are_recorded_once_each() {
        let tmp = tempfile::tempdir().unwrap();
        let store = tmp.path().join("claude");
        let config = claude_config(tmp.path(), &store);
        let stdout = log_path(&config, 0, "stdout");
        let mut watch = due_watch(&config);
        append(
            &stdout,
            concat!(
                r#"{"type":"system","subtype":"init","session_id":"sess-1"}"#,
                "\n",
                r#"{"type":"assistant","message":{"role":"assistant","content":[{"type":"text","text":"reading the code"}]},"session_id":"sess-1"}"#,
                "\n"
            ),
        );
        let first = watch.look(&config, 1_000).expect("the stream grew");
        assert_eq!(first.last_output_at, Some(1_000));
        assert_eq!(first.activity.as_deref(), Some("reading the code"));
        assert_eq!(first.session_id.as_deref(), Some("sess-1"));
        assert_eq!(first.session_file, None, "the CLI wrote no file yet");

        // The file appears; it is searched for again only after a while.
        let session = store.join("projects/p/sess-1.jsonl");
        std::fs::create_dir_all(session.parent().unwrap()).unwrap();
        std::fs::write(&session, "{}\n").unwrap();
        append(&log_path(&config, 0, "stderr"), "warning\n");
        watch.next_look = Instant::now();
        let second = watch.look(&config, 2_000).expect("stderr grew");
        assert_eq!(
            second,
            StepLive {
                last_output_at: Some(2_000),
                ..StepLive::default()
            },
            "only what changed: no search yet, activity and session as before"
        );

        watch.next_look = Instant::now();
        watch.next_session_search = Instant::now();
        let third = watch
            .look(&config, 3_000)
            .expect("the session file was found");
        assert_eq!(third.session_file, Some(session.display().to_string()));
        assert_eq!(third.activity, None);
        assert_eq!(third.session_id, None);
        assert_eq!(third.last_output_at, Some(2_000), "no new output");

        // A new activity is recorded alone; the found file is not searched again.
        std::fs::remove_file(&session).unwrap();
        append(
            &stdout,
            concat!(
                r#"{"type":"assistant","message":{"role":"assistant","content":[{"type":"text","text":"writing the fix"}]},"session_id":"sess-1"}"#,
                "\n"
            ),
        );
        watch.next_look = Instant::now();
        watch.next_session_search = Instant::now();
        let fourth = watch.look(&config, 4_000).expect("a new activity");
        assert_eq!(fourth.activity.as_deref(), Some("writing the fix"));
        assert_eq!(fourth.session_file, None);
        assert_eq!(fourth.session_id, None);
    }

    #[test]
    fn a_session_file_already_written_is_found_at_the_first_look() {
        let tmp = tempfile::tempdir().unwrap();
        let store = tmp.path().join("claude");
        let session = store.join("projects/p/sess-2.jsonl");
        std::fs::create_dir_all(session.parent().unwrap()).unwrap();
        std::fs::write(&session, "{}\n").unwrap();
        let config = claude_config(tmp.path(), &store);
        append(
            &log_path(&config, 0, "stdout"),
            concat!(
                r#"{"type":"system","subtype":"init","session_id":"sess-2"}"#,
                "\n"
            ),
        );
        let mut watch = due_watch(&config);
        let first = watch.look(&config, 1_000).expect("the stream grew");
        assert_eq!(first.session_file, Some(session.display().to_string()));
    }

    #[test]
    fn a_long_stream_is_read_8_mib_a_look() {
        let tmp = tempfile::tempdir().unwrap();
        let config = claude_config(tmp.path(), &tmp.path().join("claude"));
        let stdout = log_path(&config, 0, "stdout");
        let line = "{\"type\":\"noise\"}\n";
        let len = READ_PER_TICK + 1024;
        let mut text = line.repeat(usize::try_from(len).unwrap() / line.len() + 1);
        text.truncate(usize::try_from(len).unwrap());
        std::fs::write(&stdout, text).unwrap();
        let mut watch = due_watch(&config);
        assert!(watch.look(&config, 1_000).is_some());
        assert_eq!(watch.read, 8 * 1024 * 1024);
        watch.next_look = Instant::now();
        assert_eq!(
            watch.look(&config, 2_000).and_then(|l| l.last_output_at),
            Some(2_000),
            "the rest, at the next look"
        );
        assert_eq!(watch.read, len);
        watch.next_look = Instant::now();
        assert_eq!(watch.look(&config, 3_000), None, "all read");
    }
}
