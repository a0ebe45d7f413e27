//! `events.jsonl`: append-only lifecycle events, one compact JSON object a line.

use std::path::Path;

use serde_json::{Map, Value, json};

use crate::layout::files;

/// Appends `{type, ts, runId, ...fields}` to the run's events file.
///
/// Best effort, as in the reference: a failed append never fails the run, the
/// proof or a repair, so the error is returned only for callers that care.
pub fn append(
    run_dir: &Path,
    kind: &str,
    run_id: &str,
    ts: u64,
    fields: Value,
) -> crate::Result<()> {
    let mut event = Map::new();
    event.insert("type".into(), json!(kind));
    event.insert("ts".into(), json!(ts));
    event.insert("runId".into(), json!(run_id));
    if let Value::Object(extra) = fields {
        event.extend(extra);
    }
    let mut line = serde_json::to_vec(&Value::Object(event)).unwrap_or_default();
    line.push(b'\n');
    atomic_file::append_private(&run_dir.join(files::EVENTS), &line)?;
    Ok(())
}

/// Reads every parseable event of a run (unparseable lines are skipped).
/// Streamed line by line through a safe handle: a FIFO or a symlink reads as
/// no events, and memory stays bounded by the longest line kept.
pub fn read_all(run_dir: &Path) -> Vec<Value> {
    use std::io::{BufRead, Read};
    let Ok(file) = atomic_file::read::open_regular(&run_dir.join(files::EVENTS)) else {
        return Vec::new();
    };
    std::io::BufReader::new(file.take(atomic_file::read::STATE_FILE_LIMIT * 4))
        .split(b'\n')
        .map_while(std::result::Result::ok)
        .filter_map(|l| std::str::from_utf8(&l).ok().and_then(parse_line))
        .collect()
}

/// Parses one `events.jsonl` line; `None` for a line that is not JSON.
/// Touches no file (fuzzing entry point).
pub fn parse_line(line: &str) -> Option<Value> {
    serde_json::from_str(line).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appends_compact_lines_with_type_ts_and_run_id_first() {
        let dir = tempfile::tempdir().unwrap();
        append(
            dir.path(),
            "subagent.run.started",
            "r1",
            5,
            json!({"pid": 9}),
        )
        .unwrap();
        let text = std::fs::read_to_string(dir.path().join("events.jsonl")).unwrap();
        assert_eq!(
            text,
            "{\"type\":\"subagent.run.started\",\"ts\":5,\"runId\":\"r1\",\"pid\":9}\n"
        );
        assert_eq!(read_all(dir.path()).len(), 1);
    }
}
