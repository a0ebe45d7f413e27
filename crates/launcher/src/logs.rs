//! `subagents logs`: a run's output.
//!
//! A single run shows its output file once it is over (else COMMAND's
//! stdout), with COMMAND's stderr on stderr. A composite run shows every
//! step's stdout under `=== <agent> (step N) ===` (numbered as `status`
//! numbers steps; a named agent's ended step: its output file, the answer),
//! each step's stderr on stderr under the same header.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::Duration;

use listing::format::step_number;
use listing::list::RunSummary;
use status::Layout;
use status::layout::files;

use crate::api::{LogFile, LogsOutcome, LogsRequest};
use crate::error::{Error, ErrorKind, Result};
use crate::runs::load;
use crate::wait::watch_dirs;

/// Which files of a run to show.
#[derive(Debug, Clone, Copy, Default)]
struct LogsOptions {
    /// Only this step (1-based, as `status` numbers them).
    step: Option<usize>,
    /// Only stderr.
    stderr_only: bool,
}

impl From<&LogsRequest> for LogsOptions {
    fn from(request: &LogsRequest) -> Self {
        Self {
            step: request.step,
            stderr_only: request.stderr,
        }
    }
}

/// Where one file's bytes go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stream {
    Out,
    Err,
}

/// One file `logs` shows.
#[derive(Debug, Clone)]
struct Source {
    name: String,
    path: PathBuf,
    stream: Stream,
    /// Printed once before the file's first bytes (composite runs).
    header: Option<String>,
}

/// Loads the run and checks the asked-for step exists (exit 2 if not).
fn load_for(
    layout: &Layout,
    request: &LogsRequest,
    warnings: &mut Vec<String>,
) -> Result<RunSummary> {
    let run = load(layout, &request.run, warnings)?;
    let steps = run.status.steps().len();
    if let Some(n) = request.step
        && (n == 0 || n > steps.max(1))
    {
        return Err(Error::of(
            ErrorKind::NoSuchStep,
            format!("run '{}' has no step {n} (it has {})", run.id, steps.max(1)),
        ));
    }
    Ok(run)
}

/// The stream a chunk of `logs` output belongs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogStream {
    /// Standard output: the run's output, COMMAND's stdout.
    Stdout,
    /// Standard error: COMMAND's stderr and its headers.
    Stderr,
}

/// Bytes of `logs` output, in the order they are to be written.
#[derive(Debug, Clone, Copy)]
pub struct LogChunk<'a> {
    /// Where they go.
    pub stream: LogStream,
    /// Headers and file content, as read.
    pub bytes: &'a [u8],
}

/// Where [`stream`] sends its chunks (the caller writes them).
pub type LogSink<'a> = dyn FnMut(LogChunk<'_>) -> std::io::Result<()> + 'a;

/// What [`stream`] says besides the chunks.
#[derive(Debug, Clone, Default)]
pub struct Streamed {
    /// The run shown (what `last` or a prefix resolved to).
    pub run_id: String,
    /// A run (or step) that shows no output: why (e.g. it never started,
    /// or it has written nothing yet).
    pub silence: Option<String>,
    /// Repairs that could not be written, one line each.
    pub warnings: Vec<String>,
}

/// `subagents logs` as text: stdout files to [`LogStream::Stdout`], stderr
/// files to [`LogStream::Stderr`]; with `follow`, new bytes as they come
/// until the run is over.
pub fn stream(
    layout: &Layout,
    request: &LogsRequest,
    follow_run: bool,
    sink: &mut LogSink<'_>,
) -> Result<Streamed> {
    let mut streamed = Streamed::default();
    let run = load_for(layout, request, &mut streamed.warnings)?;
    let options = LogsOptions::from(request);
    streamed.run_id = run.id.clone();
    if follow_run {
        follow(layout, &run.id, options, sink, &mut streamed.warnings)?;
        return Ok(streamed);
    }
    let mut shown = false;
    for source in sources(&run, options) {
        shown |= print_source(&source, request.tail, sink)?;
    }
    if !shown {
        streamed.silence = if run.status.state.is_active() {
            Some(no_output_yet(&run, request.step))
        } else {
            silence(&run)
        };
    }
    Ok(streamed)
}

/// `run X has no output yet (running step 1/2)`: an active run (or one
/// step of it) that has written nothing so far.
fn no_output_yet(run: &RunSummary, step: Option<usize>) -> String {
    let total = run.status.steps().len().max(1);
    let at = run
        .status
        .current_step
        .map(|c| format!(" step {}", step_number(c, total)))
        .unwrap_or_default();
    let what = match step {
        Some(n) => format!(
            "run {} step {}",
            run.id,
            step_number(n.saturating_sub(1), total)
        ),
        None => format!("run {}", run.id),
    };
    format!("{what} has no output yet ({}{at})", run.status.state)
}

/// Why a run that ended shows no output, when it did not simply complete.
fn silence(run: &RunSummary) -> Option<String> {
    let line = crate::wait::outcome_line(run);
    (run.status.error.is_some() || run.status.state != status::RunState::Complete)
        .then(|| format!("no output; {line}"))
}

fn is_composite(run: &RunSummary) -> bool {
    run.status.steps().len() > 1
}

fn sources(run: &RunSummary, options: LogsOptions) -> Vec<Source> {
    let mut all = if is_composite(run) {
        step_sources(run, options.step)
    } else {
        single_sources(run)
    };
    if options.stderr_only {
        all.retain(|s| s.stream == Stream::Err);
    }
    all
}

fn step_sources(run: &RunSummary, only: Option<usize>) -> Vec<Source> {
    let dir = &run.async_dir;
    let mut out = Vec::new();
    for (i, step) in run.status.steps().iter().enumerate() {
        if only.is_some_and(|n| n != i + 1) {
            continue;
        }
        let header = format!(
            "=== {} (step {}) ===",
            atomic_file::escape(&step.agent),
            i + 1
        );
        for (stream, kind) in [("stdout", Stream::Out), ("stderr", Stream::Err)] {
            let mut path = dir.join(format!("external-{i}.{stream}.log"));
            // A named agent's stdout is its CLI's event stream; once the
            // step is over its output file holds the answer read from it.
            let answer = dir.join(format!("output-{i}.log"));
            if stream == "stdout" && is_agent_step_over(step) && has_bytes(&answer) {
                path = answer;
            }
            out.push(Source {
                name: format!("step {} {stream}", i + 1),
                path,
                stream: kind,
                header: Some(header.clone()),
            });
        }
    }
    out
}

/// A step of a named agent (its runner recorded with its session) that ended.
fn is_agent_step_over(step: &status::model::Step) -> bool {
    step.extra.contains_key("agentRunner") && !matches!(step.status.as_str(), "running" | "pending")
}

/// A finished run's output file and COMMAND's stderr; otherwise COMMAND's
/// stdout and stderr and the runner's stderr. An empty output file counts
/// as none: the runner fills it from COMMAND's stdout at the step's end, a
/// copy that a full or read-only root can keep from happening.
fn single_sources(run: &RunSummary) -> Vec<Source> {
    let dir = &run.async_dir;
    let output = run
        .status
        .output_file
        .as_ref()
        .map(|o| rebased_output(dir, o));
    let terminal = !run.status.state.is_active();
    let source = |name: &str, path: PathBuf, stream| Source {
        name: name.to_owned(),
        path,
        stream,
        header: None,
    };
    let stderr = source("stderr", dir.join("external-0.stderr.log"), Stream::Err);
    match output.filter(|o| terminal && has_bytes(o)) {
        Some(output) => vec![source("output", output, Stream::Out), stderr],
        None => vec![
            source("stdout", dir.join("external-0.stdout.log"), Stream::Out),
            stderr,
            source("runner stderr", dir.join(files::RUNNER_STDERR), Stream::Err),
        ],
    }
}

fn has_bytes(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.len() > 0)
}

/// The output file of a run whose root was moved or copied: the status still
/// records the old absolute path inside the old run directory; the file now
/// lives in `dir`. Other absolute paths stay as recorded.
fn rebased_output(dir: &Path, recorded: &str) -> PathBuf {
    let path = dir.join(recorded);
    if path.starts_with(dir) {
        return path;
    }
    let same_run = path.parent().and_then(Path::file_name) == dir.file_name();
    match path.file_name().map(|name| dir.join(name)) {
        Some(moved) if same_run && moved.exists() => moved,
        _ => path,
    }
}

/// A FIFO or symlink in place of a log is skipped, never waited on.
fn read_all(path: &Path) -> Option<Vec<u8>> {
    let mut file = atomic_file::read::open_regular(path).ok()?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).ok()?;
    (!bytes.is_empty()).then_some(bytes)
}

/// The last `n` lines of `bytes`.
fn tail_of(bytes: &[u8], n: usize) -> &[u8] {
    let body = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    let mut newlines = body.iter().enumerate().rev().filter(|(_, b)| **b == b'\n');
    match n.checked_sub(1).and_then(|k| newlines.nth(k)) {
        Some((at, _)) => &bytes[at + 1..],
        None if n == 0 => &[],
        None => bytes,
    }
}

fn print_source(source: &Source, tail: Option<usize>, sink: &mut LogSink<'_>) -> Result<bool> {
    let Some(bytes) = read_all(&source.path) else {
        return Ok(false);
    };
    let bytes = tail.map_or(&bytes[..], |n| tail_of(&bytes, n));
    write_chunk(source, bytes, true, sink)?;
    Ok(true)
}

/// Sends `bytes` to the source's stream; `announce` first sends its header
/// (a composite step's, or `==> name (path) <==` for a single run's stderr).
fn write_chunk(source: &Source, bytes: &[u8], announce: bool, sink: &mut LogSink<'_>) -> Result {
    let failed = |e: std::io::Error| Error::failed(format!("failed to write logs: {e}"));
    let header = announce.then_some(source.header.as_deref()).flatten();
    let (stream, header) = match source.stream {
        Stream::Out => (LogStream::Stdout, header.map(|h| format!("{h}\n"))),
        Stream::Err => (
            LogStream::Stderr,
            match (header, announce && source.header.is_none()) {
                (Some(h), _) => Some(format!("{h} stderr\n")),
                (None, true) => Some(format!(
                    "==> {} ({}) <==\n",
                    source.name,
                    atomic_file::escape_path(&source.path)
                )),
                _ => None,
            },
        ),
    };
    if let Some(header) = header {
        sink(LogChunk {
            stream,
            bytes: header.as_bytes(),
        })
        .map_err(failed)?;
    }
    sink(LogChunk { stream, bytes }).map_err(failed)
}

/// `logs --json` (and the MCP `logs` tool): the same files as the text
/// form, each with its content (its last `tail` lines, its last
/// `max_bytes` bytes).
pub fn logs(layout: &Layout, request: &LogsRequest) -> Result<LogsOutcome> {
    let mut warnings = Vec::new();
    let run = load_for(layout, request, &mut warnings)?;
    let mut outcome = outcome(&run, request);
    outcome.warnings = warnings;
    Ok(outcome)
}

/// The [`LogsOutcome`] of a loaded run.
pub fn outcome(run: &RunSummary, request: &LogsRequest) -> LogsOutcome {
    let logs = sources(run, LogsOptions::from(request))
        .into_iter()
        .filter_map(|source| {
            let bytes = read_all(&source.path)?;
            let bytes = request.tail.map_or(&bytes[..], |n| tail_of(&bytes, n));
            let text = String::from_utf8_lossy(bytes);
            let text = match request.max_bytes {
                Some(max) => last_bytes(&text, max).to_owned(),
                None => text.into_owned(),
            };
            Some(LogFile {
                name: source.name,
                path: source.path.display().to_string(),
                text,
            })
        })
        .collect();
    LogsOutcome {
        run_id: run.id.clone(),
        state: run.status.state.as_str().to_owned(),
        logs,
        warnings: Vec::new(),
    }
}

/// The end of `text`, at most `max` bytes, starting on a character boundary.
fn last_bytes(text: &str, max: usize) -> &str {
    let mut start = text.len().saturating_sub(max);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

/// Prints new bytes of every source as they come, taking in the steps of a
/// composite run as they start, until the run is over.
fn follow(
    layout: &Layout,
    id: &str,
    options: LogsOptions,
    sink: &mut LogSink<'_>,
    warnings: &mut Vec<String>,
) -> Result {
    let dir = layout.run_dir(id);
    let (_watcher, events) = watch_dirs(std::slice::from_ref(&dir));
    let mut offsets: std::collections::HashMap<PathBuf, u64> = Default::default();
    let mut last: Option<String> = None;
    loop {
        let run = load(layout, id, warnings)?;
        let over = !run.status.state.is_active();
        let mut follow_sources = sources(&run, options);
        if !is_composite(&run) {
            // While running, a single run's output is its stdout log.
            follow_sources.retain(|s| s.name != "output");
            if !follow_sources.iter().any(|s| s.name == "stdout") && !options.stderr_only {
                follow_sources.insert(
                    0,
                    Source {
                        name: "stdout".into(),
                        path: dir.join("external-0.stdout.log"),
                        stream: Stream::Out,
                        header: None,
                    },
                );
            }
        }
        for source in &follow_sources {
            let offset = offsets.entry(source.path.clone()).or_insert(0);
            let bytes = new_bytes(&source.path, *offset)?;
            if bytes.is_empty() {
                continue;
            }
            *offset += bytes.len() as u64;
            let key = source.header.clone().unwrap_or_else(|| source.name.clone());
            let switched = last.as_ref() != Some(&key);
            write_chunk(source, &bytes, switched, sink)?;
            last = Some(key);
        }
        if over {
            return Ok(());
        }
        let _ = events.recv_timeout(Duration::from_millis(500));
    }
}

fn new_bytes(path: &Path, offset: u64) -> Result<Vec<u8>> {
    let Ok(mut file) = atomic_file::read::open_regular(path) else {
        return Ok(Vec::new());
    };
    let failed =
        |e: std::io::Error| Error::failed(format!("failed to read '{}': {e}", path.display()));
    file.seek(SeekFrom::Start(offset)).map_err(failed)?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).map_err(failed)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::{last_bytes, tail_of};

    #[test]
    fn last_bytes_cuts_on_a_character_boundary() {
        assert_eq!(last_bytes("abc", 2), "bc");
        assert_eq!(last_bytes("abc", 10), "abc");
        assert_eq!(last_bytes("aé", 1), "");
        assert_eq!(last_bytes("aé", 2), "é");
    }

    #[test]
    fn tail_keeps_the_last_lines_with_or_without_a_final_newline() {
        assert_eq!(tail_of(b"a\nb\nc\n", 2), b"b\nc\n");
        assert_eq!(tail_of(b"a\nb\nc", 2), b"b\nc");
        assert_eq!(tail_of(b"a\nb\n", 5), b"a\nb\n");
        assert_eq!(tail_of(b"a\nb\n", 0), b"");
        assert_eq!(tail_of(b"a\nb\n", 1), b"b\n");
    }
}
