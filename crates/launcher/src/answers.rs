//! A run's answers in its summary: `status` and `wait` (and so the MCP
//! tools) read the answer files the runner recorded (`answerPath`, on the
//! run and on each step) and return their text as `answer`, at most
//! [`ANSWER_CAP`] bytes, with `answerTruncated` when the file is longer.
//! Listings show `answerPreview`, the start of the file: the status holds
//! no text of the answer, which may quote the task.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use serde_json::{Map, Value, json};

use crate::RunSummary;

/// Most bytes of an answer a summary carries; the whole text stays in the
/// file named by `answerPath`.
pub const ANSWER_CAP: usize = 256 * 1024;

/// Longest `answerPreview` of a listing, in characters.
pub const PREVIEW_CHARS: usize = 240;

/// Adds `answer` and `answerTruncated` next to every `answerPath` of `run`.
pub fn attach(run: &mut RunSummary) {
    each_answer(run, &mut |dir, fields| fill(dir, fields, ANSWER_CAP, None));
}

/// Adds `answerPreview` (the first [`PREVIEW_CHARS`] characters) next to
/// every `answerPath` of `run`: what listings show of an answer.
pub fn attach_preview(run: &mut RunSummary) {
    // Four bytes a character at most.
    let head = PREVIEW_CHARS * 4;
    let mut tasks: Option<Vec<String>> = None;
    each_answer(run, &mut |dir, fields| {
        fill(dir, fields, head, Some(PREVIEW_CHARS));
        if let Some(Value::String(preview)) = fields.get_mut("answerPreview") {
            let tasks = tasks.get_or_insert_with(|| task_texts(dir));
            *preview = without_tasks(preview, tasks);
        }
    });
}

/// The run's task texts (`task.md`, `task-<i>.md`), trimmed, long enough
/// to be told from ordinary words.
fn task_texts(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.starts_with("task") && name.ends_with(".md")
        })
        .filter_map(|e| read_answer_file(&e.path(), 64 * 1024))
        .map(|(text, _)| text.trim().to_owned())
        .filter(|t| t.len() >= 8)
        .collect()
}

/// A listing's preview never shows the task: a command that echoes its
/// task has it in its output. Whole copies are redacted, and a preview
/// that ends inside one is cut before it.
fn without_tasks(preview: &str, tasks: &[String]) -> String {
    let mut text = preview.to_owned();
    for task in tasks {
        text = text.replace(task.as_str(), status::PROMPT_REDACTED);
        let cut = (8..=task.len().min(text.len()))
            .rev()
            .filter(|n| task.is_char_boundary(*n))
            .find(|n| text.ends_with(&task[..*n]));
        if let Some(n) = cut {
            text.truncate(text.len() - n);
            text.push_str(status::PROMPT_REDACTED);
        }
    }
    text
}

fn each_answer(run: &mut RunSummary, fill: &mut dyn FnMut(&Path, &mut Map<String, Value>)) {
    let dir = run.async_dir.clone();
    fill(&dir, &mut run.status.extra);
    if let Some(steps) = run.status.steps.as_mut() {
        for step in steps {
            fill(&dir, &mut step.extra);
        }
    }
}

fn fill(dir: &Path, fields: &mut Map<String, Value>, cap: usize, preview: Option<usize>) {
    let Some(path) = fields.get("answerPath").and_then(Value::as_str) else {
        return;
    };
    let Some((text, truncated)) = read_answer(dir, Path::new(path), cap) else {
        return;
    };
    match preview {
        Some(chars) => {
            let cut: String = text.chars().take(chars).collect();
            fields.insert("answerPreview".into(), json!(cut));
        }
        None => {
            fields.insert("answer".into(), json!(text));
            fields.insert("answerTruncated".into(), json!(truncated));
        }
    }
}

/// The first `cap` bytes of an answer file of the run directory `dir` (cut
/// at a character boundary), and whether there was more. Only
/// `answer.md`, `answer-<i>.md` and `output-<i>.log` directly in `dir` are
/// read, never through a symbolic link or from anything but a regular file.
fn read_answer(dir: &Path, path: &Path, cap: usize) -> Option<(String, bool)> {
    let name = path.file_name()?.to_str()?;
    if path.parent()? != dir || !is_answer_name(name) {
        return None;
    }
    read_answer_file(path, cap)
}

/// [`read_answer`] of any regular file, not through a symbolic link.
fn read_answer_file(path: &Path, cap: usize) -> Option<(String, bool)> {
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
    file.take(cap as u64 + 1).read_to_end(&mut bytes).ok()?;
    let truncated = bytes.len() > cap;
    bytes.truncate(cap);
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
            read_answer(dir, &dir.join("answer.md"), ANSWER_CAP),
            Some(("the answer".into(), false))
        );
        assert_eq!(read_answer(dir, &dir.join("status.json"), ANSWER_CAP), None);
        assert_eq!(
            read_answer(dir, &dir.join("answer-1.md"), ANSWER_CAP),
            None,
            "a symlink"
        );
        assert_eq!(
            read_answer(dir, Path::new("/etc/answer.md"), ANSWER_CAP),
            None
        );
        assert_eq!(
            read_answer(dir, &dir.parent().unwrap().join("answer.md"), ANSWER_CAP),
            None
        );
        assert!(is_answer_name("output-12.log") && !is_answer_name("output-.log"));
    }

    #[test]
    fn a_preview_never_shows_the_task() {
        let tasks = vec!["review the secret plan".to_owned()];
        assert_eq!(
            without_tasks("echo: review the secret plan!", &tasks),
            "echo: [prompt redacted]!"
        );
        assert_eq!(
            without_tasks("echo: review the sec", &tasks),
            "echo: [prompt redacted]"
        );
        assert_eq!(without_tasks("a review", &tasks), "a review");
    }

    #[test]
    fn a_long_answer_is_cut_at_the_cap_on_a_character_boundary() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("answer.md");
        let text = format!("{}é{}", "a".repeat(ANSWER_CAP - 1), "b".repeat(10));
        std::fs::write(&path, &text).unwrap();
        let (read, truncated) = read_answer(tmp.path(), &path, ANSWER_CAP).unwrap();
        assert!(truncated);
        assert_eq!(read, "a".repeat(ANSWER_CAP - 1));
        std::fs::write(&path, "a".repeat(ANSWER_CAP)).unwrap();
        assert!(!read_answer(tmp.path(), &path, ANSWER_CAP).unwrap().1);
    }
}

/// `answerPath`, the one answer field a status records (on the run and on
/// each step), absent, `null`, of the wrong type and empty: only a string
/// naming an answer file of the run directory gives `answer` and
/// `answerTruncated` (`false` written out, not left absent); anything else
/// leaves the summary without them. The run's and the step's files hold
/// different texts, so reading one for the other shows.
#[cfg(test)]
mod optional_fields {
    use serde_json::{Value, json};

    use super::*;
    use status::{RunState, RunStatus, Step};

    fn summary(dir: &Path, run: Option<Value>, step: Option<Value>) -> RunSummary {
        let mut status = RunStatus::new("r", RunState::Complete);
        let mut first = Step {
            agent: "a".into(),
            status: "complete".into(),
            ..Step::default()
        };
        if let Some(v) = run {
            status.extra.insert("answerPath".into(), v);
        }
        if let Some(v) = step {
            first.extra.insert("answerPath".into(), v);
        }
        status.steps = Some(vec![first]);
        RunSummary {
            id: "r".into(),
            async_dir: dir.to_owned(),
            status,
        }
    }

    fn answers(s: &RunSummary) -> [(Option<Value>, Option<Value>); 2] {
        let step = &s.status.steps.as_ref().unwrap()[0].extra;
        let run = &s.status.extra;
        let pair =
            |m: &Map<String, Value>| (m.get("answer").cloned(), m.get("answerTruncated").cloned());
        [pair(run), pair(step)]
    }

    #[test]
    fn answer_path_absent_null_wrong_or_empty_gives_no_answer() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        std::fs::write(dir.join("answer.md"), "the run's answer").unwrap();
        std::fs::write(dir.join("answer-0.md"), "the step's answer").unwrap();
        let run_path = json!(dir.join("answer.md"));
        let step_path = json!(dir.join("answer-0.md"));
        let mut full = summary(dir, Some(run_path.clone()), Some(step_path.clone()));
        attach(&mut full);
        let run_answer = (Some(json!("the run's answer")), Some(json!(false)));
        let step_answer = (Some(json!("the step's answer")), Some(json!(false)));
        assert_eq!(answers(&full), [run_answer.clone(), step_answer.clone()]);
        for (case, value) in [
            ("absent", None),
            ("null", Some(Value::Null)),
            ("wrong type", Some(json!(7))),
            ("empty", Some(json!(""))),
            ("relative", Some(json!("answer.md"))),
        ] {
            let mut run_only = summary(dir, Some(run_path.clone()), value.clone());
            attach(&mut run_only);
            assert_eq!(
                answers(&run_only),
                [run_answer.clone(), (None, None)],
                "step {case}"
            );
            let mut step_only = summary(dir, value, Some(step_path.clone()));
            attach(&mut step_only);
            assert_eq!(
                answers(&step_only),
                [(None, None), step_answer.clone()],
                "run {case}"
            );
        }
    }
}
