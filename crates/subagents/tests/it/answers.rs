//! What an agent run reports back: its final answer (`answer.md`, `answer`
//! in `status --json` / `run --wait --json`, a preview in `list --json`),
//! the reason of a failure in the CLI's own words on `run --wait`'s one
//! line, no answer from a stream cut before its final event, and the CLI's
//! session id and latest activity while the step still runs. Against the
//! fake CLIs of `crates/test-support/fakes/` (their `FAKE_SCENARIO`s print
//! the real event shapes), and against the real CLIs when they are
//! installed (`$SUBAGENTS_REAL_CLIS`, a directory holding `claude`, `codex`
//! and `pi`; else `PATH`), offline and without a login.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use common::*;
use serde_json::Value;

const TASK: &str = "inspect the parser; the-task-text-9931";

struct Fixture {
    env: Env,
    project: tempfile::TempDir,
    home: tempfile::TempDir,
    record: tempfile::TempDir,
    /// Where the agent CLIs are found first.
    clis: PathBuf,
}

impl Fixture {
    fn new() -> Self {
        Self::with_clis(fakes_dir().canonicalize().unwrap())
    }

    fn with_clis(clis: PathBuf) -> Self {
        Self {
            env: Env::new(),
            project: tempfile::tempdir().unwrap(),
            home: tempfile::tempdir().unwrap(),
            record: tempfile::tempdir().unwrap(),
            clis,
        }
    }

    /// An agent `name` of `runner` whose CLI plays `scenario`.
    fn agent(&self, name: &str, runner: &str, scenario: &str, gate: Option<&Path>) {
        let dir = self.project.path().join(".subagents/agents");
        std::fs::create_dir_all(&dir).unwrap();
        let mut env = format!("  FAKE_SCENARIO: \"{scenario}\"\n");
        if let Some(gate) = gate {
            env.push_str(&format!("  FAKE_GATE: \"{}\"\n", gate.display()));
        }
        let text = format!("---\nrunner: {runner}\nenv:\n{env}---\nYou help.\n");
        std::fs::write(dir.join(format!("{name}.md")), text).unwrap();
    }

    fn command(&self, args: &[&str]) -> Command {
        let path = format!(
            "{}:{}",
            self.clis.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut command = self.env.command(args);
        command
            .current_dir(self.project.path())
            .env("PATH", path)
            .env("HOME", self.home.path())
            .env("XDG_CONFIG_HOME", self.home.path().join(".config"))
            .env("FAKE_RECORD_DIR", self.record.path());
        for name in [
            "CLAUDE_CONFIG_DIR",
            "CODEX_HOME",
            "PI_CODING_AGENT_DIR",
            "ANTHROPIC_API_KEY",
            "OPENAI_API_KEY",
            "CODEX_API_KEY",
            "GEMINI_API_KEY",
        ] {
            command.env_remove(name);
        }
        command
    }

    fn run(&self, args: &[&str]) -> Output {
        output_within(self.command(args), Duration::from_secs(180))
    }

    fn json(&self, args: &[&str]) -> Value {
        let out = self.run(args);
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("subagents {args:?}: {e}: {out:?}"))
    }

    /// `run --agent NAME --task TASK --wait`: its exit code and stderr.
    fn run_wait(&self, name: &str, extra: &[&str]) -> (Option<i32>, String, String) {
        let mut args = vec!["run", "--agent", name, "--task", TASK, "--wait"];
        args.extend(extra);
        let out = self.run(&args);
        let stdout = String::from_utf8(out.stdout).unwrap();
        let id = stdout.lines().next().unwrap_or_default().to_owned();
        (
            out.status.code(),
            id,
            String::from_utf8(out.stderr).unwrap(),
        )
    }
}

/// No file of the run but its task file holds the task text.
fn assert_task_only_in_task_file(env: &Env, id: &str) {
    for entry in std::fs::read_dir(env.run_dir(id)).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        // The fake CLIs record their stdin in their session store, not here;
        // COMMAND logs are the CLI's own words.
        if name == "task.md" || name.starts_with("external-") {
            continue;
        }
        let text = String::from_utf8_lossy(&std::fs::read(&path).unwrap()).into_owned();
        assert!(!text.contains("the-task-text-9931"), "{name}: {text}");
    }
}

#[test]
fn each_cli_answer_is_kept_whole_in_answer_md_and_returned_by_status_and_wait() {
    let f = Fixture::new();
    let expected: String = (1..=5000)
        .map(|i| format!("line {i} of the long answer"))
        .collect::<Vec<_>>()
        .join("\n");
    for runner in ["claude", "codex", "pi"] {
        let name = format!("long-{runner}");
        f.agent(&name, runner, "long", None);
        let waited = f.json(&["run", "--agent", &name, "--task", TASK, "--wait", "--json"]);
        assert_eq!(waited["state"], "complete", "{waited}");
        let id = waited["id"].as_str().unwrap().to_owned();
        let path = f.env.run_dir(&id).join("answer.md");
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            expected,
            "{runner}"
        );
        assert_eq!(mode(&path) & 0o777, 0o600);
        assert_eq!(waited["answer"], expected.as_str(), "{runner}");
        assert_eq!(waited["answerTruncated"], false);
        assert_eq!(waited["answerPath"], path.display().to_string());
        assert_eq!(waited["steps"][0]["answer"], expected.as_str());
        assert!(waited.get("reason").is_none(), "{waited}");

        let status = f.json(&["status", &id, "--json"]);
        assert_eq!(status["answer"], expected.as_str(), "{runner}");
        let listed = f.json(&["list", "--all", "--json"]);
        let row = listed
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == id.as_str())
            .unwrap();
        let preview = row["answerPreview"].as_str().unwrap();
        assert!(expected.starts_with(preview) && preview.chars().count() == 240);
        assert!(row.get("answer").is_none(), "list carries the preview only");
        assert_task_only_in_task_file(&f.env, &id);
    }
}

#[test]
fn each_cli_failure_shows_its_own_words_on_the_wait_line() {
    let f = Fixture::new();
    let cases = [
        ("claude", "error", "claude ended with error_max_turns"),
        (
            "claude",
            "not-logged-in",
            "Not logged in · Please run /login",
        ),
        (
            "codex",
            "error",
            "unexpected status 401 Unauthorized: Missing bearer authentication",
        ),
        ("pi", "error", "429 Too Many Requests: rate limit reached"),
    ];
    for (runner, scenario, words) in cases {
        let name = format!("{scenario}-{runner}");
        f.agent(&name, runner, scenario, None);
        let (code, id, stderr) = f.run_wait(&name, &[]);
        assert_eq!(code, Some(1), "{stderr}");
        assert_eq!(stderr.trim_end(), format!("{id} failed: {words} (exit 1)"));
        let status = f.env.status_json(&id);
        assert_eq!(status["reason"], words, "{status}");
        assert_eq!(status["steps"][0]["reason"], words, "{status}");
        assert!(status.get("answerPath").is_none(), "{status}");
        assert!(!f.env.run_dir(&id).join("answer.md").exists());
        let text = String::from_utf8(f.run(&["status", &id]).stdout).unwrap();
        assert!(text.contains(&format!("  Reason: {words}")), "{text}");
        let table = String::from_utf8(f.run(&["list", "--all", "--short"]).stdout).unwrap();
        let row = table
            .lines()
            .find(|l| l.starts_with(&id))
            .unwrap_or_else(|| panic!("{table}"));
        assert!(row.ends_with(words), "{table}");
    }
}

#[test]
fn a_stream_cut_mid_line_gives_no_answer_and_says_it_ended_early() {
    let f = Fixture::new();
    for runner in ["claude", "codex", "pi"] {
        let name = format!("cut-{runner}");
        f.agent(&name, runner, "cut", None);
        let (code, id, stderr) = f.run_wait(&name, &[]);
        assert_eq!(code, Some(1), "{stderr}");
        let status = f.env.status_json(&id);
        let reason = status["steps"][0]["reason"].as_str().unwrap();
        assert!(
            reason.contains("the stream ended before its final message")
                && reason.ends_with("(signal SIGKILL)"),
            "{runner}: {reason}"
        );
        assert!(stderr.contains(reason), "{stderr}");
        assert!(status.get("answer").is_none(), "{status}");
        assert!(!f.env.run_dir(&id).join("answer.md").exists());
        let waited = f.json(&["wait", &id, "--json"]);
        assert!(waited[0].get("answer").is_none(), "{waited}");
        // The interim text stays in the logs.
        let stream = std::fs::read_to_string(f.env.run_dir(&id).join("external-0.stdout.log"));
        assert!(stream.unwrap().contains("interim text"));
    }
}

#[test]
fn the_session_and_latest_activity_show_while_the_step_runs() {
    let f = Fixture::new();
    let cases = [
        ("claude", "tool Bash: cargo test --quiet"),
        ("codex", "$ bash -lc ls"),
        ("pi", "tool read: src/lib.rs"),
    ];
    for (runner, activity) in cases {
        let gate = f.home.path().join(format!("gate-{runner}"));
        let name = format!("gate-{runner}");
        f.agent(&name, runner, "gate", Some(&gate));
        let launched = f.json(&["run", "--agent", &name, "--task", TASK, "--json"]);
        let id = launched["runId"].as_str().unwrap().to_owned();
        let mut status = Value::Null;
        poll(Duration::from_secs(60), || {
            status = f.env.status_json(&id);
            status["steps"][0]["lastActivity"] == activity
        });
        assert_eq!(status["state"], "running", "{status}");
        let session = status["steps"][0]["agentSessionId"]
            .as_str()
            .unwrap()
            .to_owned();
        assert_eq!(status["agentSessionId"], session.as_str(), "{status}");
        assert!(
            status["steps"][0]["lastOutputAt"].as_u64().is_some(),
            "{status}"
        );
        let text = String::from_utf8(f.run(&["status", &id]).stdout).unwrap();
        assert!(
            text.contains(&format!("  Agent session: {session}")),
            "{text}"
        );
        assert!(text.contains(&format!("activity: {activity}")), "{text}");
        std::fs::write(&gate, "").unwrap();
        let done = f.json(&["wait", &id, "--json"]);
        assert_eq!(done[0]["state"], "complete", "{done}");
        assert_eq!(done[0]["agentSessionId"], session.as_str());
    }
}

#[test]
fn a_command_answer_is_its_output_file_else_stdout_and_its_reason_the_last_stderr_line() {
    let f = Fixture::new();
    let out = f.json(&[
        "run",
        "--wait",
        "--json",
        "--",
        "sh",
        "-c",
        "echo progress; echo 'the written answer' > \"$SUBAGENTS_OUTPUT_FILE\"",
    ]);
    assert_eq!(out["answer"], "the written answer\n", "{out}");
    let out = f.json(&["run", "--wait", "--json", "--", "echo", "from stdout"]);
    assert_eq!(out["answer"], "from stdout\n", "{out}");
    let path = out["answerPath"].as_str().unwrap();
    assert!(path.ends_with("/output-0.log"), "{path}");

    let script =
        "echo out; echo 'warming up' >&2; echo 'disk quota exceeded' >&2; echo >&2; exit 3";
    let out = f.run(&["run", "--wait", "--", "sh", "-c", script]);
    assert_eq!(out.status.code(), Some(1));
    let id = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(
        stderr.trim_end(),
        format!("{id} failed: disk quota exceeded (exit 3)")
    );
    let status = f.env.status_json(&id);
    assert!(
        status.get("answerPath").is_none(),
        "a failed step has no answer"
    );
    // Nothing on stderr: the exit code is the reason, said once.
    let out = f.run(&["run", "--wait", "--", "sh", "-c", "exit 4"]);
    let id = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(
        stderr.trim_end(),
        format!("{id} failed: command ended with exit code 4")
    );
}

/// The directory of the real CLIs, or why these tests are skipped.
fn real_clis() -> Option<PathBuf> {
    let dirs: Vec<PathBuf> = match std::env::var_os("SUBAGENTS_REAL_CLIS") {
        Some(dir) => vec![PathBuf::from(dir)],
        None => std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()).collect(),
    };
    let found = dirs.into_iter().find(|d| {
        ["claude", "codex", "pi"]
            .iter()
            .all(|c| d.join(c).is_file())
    });
    if found.is_none() {
        eprintln!(
            "skipped: the real claude, codex and pi are not installed \
             (npm install @anthropic-ai/claude-code @openai/codex @mariozechner/pi-coding-agent, \
             then point SUBAGENTS_REAL_CLIS at node_modules/.bin)"
        );
    }
    found
}

#[test]
fn the_real_clis_offline_fail_with_their_own_reason_on_the_wait_line() {
    let Some(clis) = real_clis() else { return };
    let f = Fixture::with_clis(clis);
    let dir = f.project.path().join(".subagents/agents");
    std::fs::create_dir_all(&dir).unwrap();
    for runner in ["claude", "codex", "pi"] {
        let text = format!("---\nrunner: {runner}\n---\nYou help.\n");
        std::fs::write(dir.join(format!("real-{runner}.md")), text).unwrap();
    }
    let (code, id, stderr) = f.run_wait("real-claude", &[]);
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(
        stderr.trim_end(),
        format!("{id} failed: Not logged in · Please run /login (exit 1)")
    );
    let (code, id, stderr) = f.run_wait("real-pi", &[]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.starts_with(&format!("{id} failed: No API key found")),
        "{stderr}"
    );
    // Offline, codex retries its connection until the run's deadline; the
    // reason is the timeout with codex's last words (without network, the
    // reconnects; with one but no key, the refusal).
    let (code, id, stderr) = f.run_wait("real-codex", &["--timeout", "25s"]);
    assert_eq!(code, Some(1), "{stderr}");
    let line = stderr.trim_end();
    assert!(line.starts_with(&format!("{id} failed: ")), "{line}");
    assert_eq!(line.lines().count(), 1, "{line}");
    assert!(
        [
            "Reconnecting",
            "Connection failed",
            "stream disconnected",
            "401",
            "Unauthorized"
        ]
        .iter()
        .any(|w| line.contains(w)),
        "{line}"
    );
}

#[test]
fn old_readers_keep_the_new_fields_and_new_readers_take_a_status_without_them() {
    let f = Fixture::new();
    let gate = f.home.path().join("gate-compat");
    f.agent("compat", "codex", "gate", Some(&gate));
    let launched = f.json(&["run", "--agent", "compat", "--task", TASK, "--json"]);
    let id = launched["runId"].as_str().unwrap().to_owned();
    let file = f.env.run_dir(&id).join("status.json");
    poll(Duration::from_secs(60), || {
        f.env.status_json(&id)["steps"][0]["lastActivity"].is_string()
    });
    std::fs::write(&gate, "").unwrap();
    f.run(&["wait", &id]);
    f.env.settled(&id);
    // A reader that types none of the new keys keeps them, and writes them back.
    let text = std::fs::read_to_string(&file).unwrap();
    let parsed = status::model::parse_status(&file, &text).unwrap();
    let step = &parsed.steps()[0].extra;
    for key in ["answerPath", "answerBytes", "lastOutputAt", "lastActivity"] {
        assert!(step.contains_key(key), "{key}: {text}");
    }
    let again = serde_json::to_value(&parsed).unwrap();
    assert_eq!(again["answerPath"], parsed.extra["answerPath"]);
    let out = f.run(&["validate", "--kind", "status", file.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");

    // A status written before answers and reasons: no answer, the error
    // as the reason, nothing else changes.
    let mut old: Value = serde_json::from_str(&text).unwrap();
    let strip = |v: &mut Value| {
        let map = v.as_object_mut().unwrap();
        for key in [
            "answerPath",
            "answerBytes",
            "reason",
            "lastOutputAt",
            "lastActivity",
        ] {
            map.remove(key);
        }
    };
    strip(&mut old);
    strip(&mut old["steps"][0]);
    old["state"] = "failed".into();
    old["error"] = "Step failed: compat".into();
    std::fs::write(&file, serde_json::to_vec(&old).unwrap()).unwrap();
    let status = f.json(&["status", &id, "--json"]);
    assert!(status.get("answer").is_none(), "{status}");
    let out = f.run(&["wait", &id]);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        stdout.starts_with(&format!("{id} failed: Step failed: compat")),
        "{stdout}"
    );
}
