//! A run's answers in its summary: `status` and `wait` (and so the MCP
//! tools) read the answer files the runner recorded (`answerPath`, on the
//! run and on each step) and return their text as `answer`, at most
//! [`ANSWER_CAP`] bytes, with `answerTruncated` when the file is longer.
//! `list` shows only the recorded `answerPreview`.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use serde_json::{Map, Value, json};

use crate::RunSummary;

/// Most bytes of an answer a summary carries; the whole text stays in the
/// file named by `answerPath`.
pub const ANSWER_CAP: usize = 256 * 1024;

/// Adds `answer` and `answerTruncated` next to every `answerPath` of `run`.
pub fn attach(run: &mut RunSummary) {
    let dir = run.async_dir.clone();
    fill(&dir, &mut run.status.extra);
    if let Some(steps) = run.status.steps.as_mut() {
        for step in steps {
            fill(&dir, &mut step.extra);
        }
    }
}

fn fill(dir: &Path, fields: &mut Map<String, Value>) {
    let Some(path) = fields.get("answerPath").and_then(Value::as_str) else {
        return;
    };
    let Some((text, truncated)) = read_answer(dir, Path::new(path)) else {
        return;
    };
    fields.insert("answer".into(), json!(text));
    fields.insert("answerTruncated".into(), json!(truncated));
}

/// The first [`ANSWER_CAP`] bytes of an answer file of the run directory
/// `dir` (cut at a character boundary), and whether there was more. Only
/// `answer.md`, `answer-<i>.md` and `output-<i>.log` directly in `dir` are
/// read, never through a symbolic link or from anything but a regular file.
fn read_answer(dir: &Path, path: &Path) -> Option<(String, bool)> {
    let name = path.file_name()?.to_str()?;
    if path.parent()? != dir || !is_answer_name(name) {
        return None;
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .ok()?;
    let meta = file.metadata().ok()?;
    if !meta.is_file() {
        return None;
    }
    let mut bytes = Vec::new();
    file.take(ANSWER_CAP as u64 + 1)
        .read_to_end(&mut bytes)
        .ok()?;
    let truncated = bytes.len() > ANSWER_CAP;
    bytes.truncate(ANSWER_CAP);
    let text = match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => {
            // A cut in the middle of a character loses that character only.
            let valid = e.utf8_error().valid_up_to();
            let mut bytes = e.into_bytes();
            let whole = if truncated && bytes.len() - valid < 4 {
                bytes.truncate(valid);
                true
            } else {
                false
            };
            match whole {
                true => String::from_utf8(bytes).ok()?,
                false => String::from_utf8_lossy(&bytes).into_owned(),
            }
        }
    };
    Some((text, truncated))
}

fn is_answer_name(name: &str) -> bool {
    let numbered = |prefix: &str, suffix: &str| {
        name.strip_prefix(prefix)
            .and_then(|rest| rest.strip_suffix(suffix))
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    name == "answer.md" || numbered("answer-", ".md") || numbered("output-", ".log")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_answer_files_of_the_run_directory_are_read() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        std::fs::write(dir.join("answer.md"), "the answer").unwrap();
        std::fs::write(dir.join("status.json"), "{}").unwrap();
        std::os::unix::fs::symlink(dir.join("answer.md"), dir.join("answer-1.md")).unwrap();
        assert_eq!(
            read_answer(dir, &dir.join("answer.md")),
            Some(("the answer".into(), false))
        );
        assert_eq!(read_answer(dir, &dir.join("status.json")), None);
        assert_eq!(read_answer(dir, &dir.join("answer-1.md")), None, "a symlink");
        assert_eq!(read_answer(dir, Path::new("/etc/answer.md")), None);
        assert_eq!(read_answer(dir, &dir.join("../answer.md")), None);
        assert!(is_answer_name("output-12.log") && !is_answer_name("output-.log"));
    }

    #[test]
    fn a_long_answer_is_cut_at_the_cap_on_a_character_boundary() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("answer.md");
        let text = format!("{}é{}", "a".repeat(ANSWER_CAP - 1), "b".repeat(10));
        std::fs::write(&path, &text).unwrap();
        let (read, truncated) = read_answer(tmp.path(), &path).unwrap();
        assert!(truncated);
        assert_eq!(read, "a".repeat(ANSWER_CAP - 1));
        std::fs::write(&path, "a".repeat(ANSWER_CAP)).unwrap();
        assert_eq!(read_answer(tmp.path(), &path).unwrap().1, false);
    }
}
