//! Named agents end to end: `run --agent NAME` through the pi, claude and
//! codex presets against fake CLIs (`crates/test-support/fakes/`, first on PATH) that
//! record their argv, stdin and environment and print the real CLIs' event
//! shapes; `resume` continuing each CLI's own session; a `command` agent's
//! follow-up; bad definition files.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::*;
use serde_json::{Value, json};

const TASK: &str = "review the diff; don't trust \"quotes\" or $HOME";
const FOLLOW_UP: &str = "now list only the\nblocking problems";

pub(crate) struct Fixture {
    pub(crate) env: Env,
    pub(crate) project: tempfile::TempDir,
    pub(crate) home: tempfile::TempDir,
    pub(crate) record: tempfile::TempDir,
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

impl Fixture {
    pub(crate) fn new() -> Self {
        let fixture = Self {
            env: Env::new(),
            project: tempfile::tempdir().unwrap(),
            home: tempfile::tempdir().unwrap(),
            record: tempfile::tempdir().unwrap(),
        };
        let agents = fixture.project.path().join(".subagents/agents");
        std::fs::create_dir_all(&agents).unwrap();
        for entry in std::fs::read_dir(repo().join("examples/agents")).unwrap() {
            let path = entry.unwrap().path();
            std::fs::copy(&path, agents.join(path.file_name().unwrap())).unwrap();
        }
        fixture
    }

    pub(crate) fn command(&self, args: &[&str]) -> Command {
        let fakes = fakes_dir().canonicalize().unwrap();
        let path = format!(
            "{}:{}",
            fakes.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut command = self.env.command(args);
        command
            .current_dir(self.project.path())
            .env("PATH", path)
            .env("HOME", self.home.path())
            .env("XDG_CONFIG_HOME", self.home.path().join(".config"))
            .env("FAKE_RECORD_DIR", self.record.path())
            .env_remove("CLAUDE_CONFIG_DIR")
            .env_remove("CODEX_HOME")
            .env_remove("PI_CODING_AGENT_DIR");
        command
    }

    pub(crate) fn run(&self, args: &[&str]) -> Output {
        output_within(self.command(args), Duration::from_secs(180))
    }

    pub(crate) fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(out.status.success(), "subagents {args:?} failed: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    }

    pub(crate) fn run_dir(&self, id: &str) -> PathBuf {
        self.env.root().join("async-subagent-runs").join(id)
    }

    fn output(&self, id: &str) -> String {
        std::fs::read_to_string(self.run_dir(id).join("output-0.log")).unwrap()
    }

    fn json(&self, id: &str, file: &str) -> Value {
        serde_json::from_slice(&std::fs::read(self.run_dir(id).join(file)).unwrap()).unwrap()
    }

    /// The recorded (argv lines, stdin, env) of call `n` of fake `cli`.
    pub(crate) fn call(&self, cli: &str, n: usize) -> (String, String, String) {
        let read = |ext: &str| {
            std::fs::read_to_string(self.record.path().join(format!("{cli}.{n}.{ext}"))).unwrap()
        };
        (read("argv"), read("stdin"), read("env"))
    }

    /// Resumes `source` with `task` and returns the revival's id once its
    /// (fake) claude runs; that claude holds on until `hold` is written.
    pub(crate) fn resume_held(&self, source: &str, task: &str, hold: &Path) -> String {
        let mut resume = self.command(&["resume", source, "--task", task, "--json"]);
        let out = resume
            .env("FAKE_HOLD_RESUME", hold)
            .stdout(Stdio::piped())
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let revived: Value = serde_json::from_slice(&out.stdout).unwrap();
        let argv = self.record.path().join("claude.1.argv");
        poll(Duration::from_secs(60), || argv.exists());
        revived["runId"].as_str().unwrap().to_owned()
    }

    /// Starts `args`, waits for the run, returns its id and settled status.
    pub(crate) fn launch(&self, args: &[&str]) -> (String, Value) {
        let out: Value = serde_json::from_str(&self.ok(args)).unwrap();
        let id = out["runId"].as_str().unwrap().to_owned();
        // `wait` exits 1 for a failed run; the status says which.
        self.run(&["wait", &id]);
        let status = self.env.settled(&id);
        (id, status)
    }
}

/// One preset end to end: run, capture, native resume with the follow-up verbatim.
fn run_and_resume(name: &str, cli: &str, resume_flag: &str, fields: Value) {
    let f = Fixture::new();
    let (id, status) = f.launch(&["run", "--agent", name, "--task", TASK, "--json"]);
    assert_eq!(status["state"], "complete", "{status}");
    assert_eq!(status["agentRunner"], cli);
    let session_id = status["agentSessionId"].as_str().unwrap().to_owned();
    let session_file = PathBuf::from(status["sessionFile"].as_str().unwrap());
    assert!(
        session_file.starts_with(f.home.path()),
        "{}",
        session_file.display()
    );
    assert!(
        session_file
            .to_string_lossy()
            .ends_with(&format!("{session_id}.jsonl"))
    );
    assert_eq!(status["steps"][0]["agentSessionId"], session_id.as_str());

    // output-0.log is the answer; the event stream stays in the stdout log.
    assert_eq!(f.output(&id), format!("{cli} turn 1: {TASK}\n"));
    let stream = std::fs::read_to_string(f.run_dir(&id).join("external-0.stdout.log")).unwrap();
    assert!(
        stream.lines().count() >= 3 && stream.contains(&session_id),
        "{stream}"
    );
    assert!(
        f.ok(&["logs", &id])
            .contains(&format!("{cli} turn 1: {TASK}"))
    );

    // The task went to stdin, and never onto an argv.
    let (argv, stdin, env) = f.call(cli, 0);
    assert_eq!(stdin, format!("{TASK}\n"), "the task, newline-terminated");
    assert!(!argv.contains("review the diff"), "{argv}");
    assert!(
        env.contains(&format!("SUBAGENTS_AGENT_RUNNER={cli}")),
        "{env}"
    );

    let events = f.env.events(&id);
    let started = events
        .iter()
        .find(|e| e["type"] == "subagent.run.started")
        .unwrap();
    assert_eq!(started["agentRunner"], cli);
    let captured = events
        .iter()
        .find(|e| e["type"] == "subagent.session.captured")
        .unwrap();
    assert_eq!(captured["agentSessionId"], session_id.as_str());

    let descriptor = f.json(&id, "recovery-descriptor.json");
    for (key, value) in fields.as_object().unwrap() {
        assert_eq!(&descriptor[key], value, "descriptor {key}: {descriptor}");
    }
    // Not known at launch: the CLI prints its session id.
    assert!(descriptor.get("sessionFile").is_none(), "{descriptor}");
    let agent_file = f
        .project
        .path()
        .join(format!(".subagents/agents/{name}.md"));
    assert_eq!(
        PathBuf::from(descriptor["agentFilePath"].as_str().unwrap()).file_name(),
        agent_file.file_name()
    );
    let status_file = f.run_dir(&id).join("status.json");
    f.ok(&[
        "validate",
        "--kind",
        "status",
        status_file.to_str().unwrap(),
    ]);
    f.ok(&[
        "validate",
        "--kind",
        "recovery",
        f.run_dir(&id)
            .join("recovery-descriptor.json")
            .to_str()
            .unwrap(),
    ]);

    // Resume: the same CLI session, the follow-up verbatim as the new turn.
    let (revived, status) = f.launch(&["resume", &id, "--task", FOLLOW_UP, "--json"]);
    assert_eq!(status["state"], "complete", "{status}");
    assert_eq!(status["resumedFrom"], id.as_str());
    assert_eq!(status["agentSessionId"], session_id.as_str());
    assert_eq!(status["sessionFile"], session_file.to_str().unwrap());
    assert_eq!(f.output(&revived), format!("{cli} turn 2: {FOLLOW_UP}\n"));
    let (argv, stdin, env) = f.call(cli, 1);
    assert_eq!(
        stdin,
        format!("{FOLLOW_UP}\n"),
        "the follow-up arrives verbatim"
    );
    assert!(!argv.contains("blocking problems"), "{argv}");
    let args: Vec<&str> = argv.lines().collect();
    let at = args
        .iter()
        .position(|a| *a == resume_flag)
        .unwrap_or_else(|| panic!("{argv}"));
    let target = args[at + 1..].iter().any(|a| a.contains(&session_id));
    assert!(target, "{resume_flag} names the session: {argv}");
    assert!(
        env.contains(&format!("SUBAGENTS_AGENT_SESSION_ID={session_id}")),
        "{env}"
    );
    let text = f.ok(&["status", &revived]);
    assert!(
        text.contains(&format!("resumed from {id} (agent session {session_id})")),
        "{text}"
    );
    let descriptor = f.json(&revived, "recovery-descriptor.json");
    assert_eq!(descriptor["sessionFile"], session_file.to_str().unwrap());
    for (key, value) in fields.as_object().unwrap() {
        assert_eq!(
            &descriptor[key], value,
            "revival descriptor {key}: {descriptor}"
        );
    }

    // And once more: the lineage keeps the session.
    let (again, _) = f.launch(&["resume", &revived, "--task", "third", "--json"]);
    assert_eq!(f.output(&again), format!("{cli} turn 3: third\n"));
}

#[test]
fn claude_preset_runs_and_resumes_its_session() {
    let fields = json!({"model": "sonnet", "thinking": "high", "tools": ["Read", "Grep", "Glob"], "systemPromptMode": "replace"});
    run_and_resume("reviewer", "claude", "--resume", fields);
}

#[test]
fn codex_preset_runs_and_resumes_its_session() {
    let fields = json!({"model": "gpt-5-codex", "thinking": "medium", "tools": null, "systemPromptMode": "replace"});
    run_and_resume("fixer", "codex", "resume", fields);
}

#[test]
fn pi_preset_runs_and_resumes_its_session() {
    let fields = json!({"model": null, "thinking": "low", "tools": ["read", "grep", "find", "ls"], "systemPromptMode": "append"});
    run_and_resume("scout", "pi", "--session", fields);
}

#[test]
fn a_command_agent_gets_its_follow_up_as_given_unless_it_asks_for_the_revival_prompt() {
    let f = Fixture::new();
    let plain = f.project.path().join(".subagents/agents/echo.md");
    std::fs::write(
        &plain,
        "---\nrunner: command\ncommand: [sh, -c, 'echo \"got: $(cat)\"']\n---\n",
    )
    .unwrap();
    let (id, status) = f.launch(&["run", "--agent", "echo", "--task", TASK, "--json"]);
    assert_eq!(status["state"], "complete", "{status}");
    assert_eq!(f.output(&id), format!("got: {TASK}\n"));
    let (revived, _) = f.launch(&["resume", &id, "--task", FOLLOW_UP, "--json"]);
    assert_eq!(f.output(&revived), format!("got: {FOLLOW_UP}\n"));

    // `summarize` sets `resumePrompt: revival`.
    let (id, _) = f.launch(&["run", "--agent", "summarize", "--task", "first", "--json"]);
    assert_eq!(f.output(&id), "summary of: first\n");
    let (revived, _) = f.launch(&["resume", &id, "--task", "second", "--json"]);
    let output = f.output(&revived);
    assert!(
        output.contains("You are reviving a previous subagent conversation."),
        "{output}"
    );
    assert!(output.contains(&format!("Original run: {id}")), "{output}");
    assert!(output.ends_with("Follow-up:\nsecond\n"), "{output}");
}

#[test]
fn a_bad_definition_is_reported_with_its_line_and_hides_nothing() {
    let f = Fixture::new();
    let bad = f.project.path().join(".subagents/agents/broken.md");
    std::fs::write(&bad, "---\nname: broken\nrunner: gemini\n---\nprompt\n").unwrap();
    let out = f.run(&["agents", "list"]);
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    for name in ["reviewer", "fixer", "scout", "summarize"] {
        assert!(stdout.contains(name), "{stdout}");
    }
    assert!(
        stderr.contains(&format!(
            "{}:3: runner 'gemini' is not one of",
            bad.display()
        )),
        "{stderr}"
    );
    let listed: Value = serde_json::from_str(&f.ok(&["agents", "list", "--json"])).unwrap();
    assert_eq!(listed["agents"].as_array().unwrap().len(), 4);
    assert_eq!(listed["errors"][0]["line"], 3);
    assert_eq!(listed["errors"][0]["path"], bad.to_str().unwrap());
    // Running the broken agent fails with the same line, before anything is created.
    let out = f.run(&["run", "--agent", "broken", "--task", "x"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "an unknown agent is a usage mistake"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no agent named 'broken'") && stderr.contains("broken.md:3:"),
        "{stderr}"
    );
    assert_eq!(f.env.run_count(), 0);
}

#[test]
fn the_project_wins_over_the_user_and_show_and_prompt_describe_agents() {
    let f = Fixture::new();
    let user = f.home.path().join(".config/subagents/agents");
    std::fs::create_dir_all(&user).unwrap();
    std::fs::write(user.join("reviewer.md"), "---\nrunner: pi\n---\n").unwrap();
    std::fs::write(
        user.join("mine.md"),
        "---\ndescription: only mine\nrunner: codex\n---\n",
    )
    .unwrap();
    let shown = f.ok(&["agents", "show", "reviewer"]);
    assert!(shown.contains("runner: claude"), "{shown}");
    assert!(
        shown.contains("command: claude -p --output-format stream-json --verbose"),
        "{shown}"
    );
    let mine: Value = serde_json::from_str(&f.ok(&["agents", "show", "mine", "--json"])).unwrap();
    assert_eq!(mine["scope"], "user");
    assert_eq!(mine["argv"][0], "codex");
    let snippet = f.ok(&["agents", "prompt"]);
    assert!(
        snippet.contains("subagents run --agent NAME --task"),
        "{snippet}"
    );
    assert!(snippet.contains("- `mine` (codex): only mine"), "{snippet}");
}

#[test]
fn an_agent_that_fails_before_its_session_leaves_its_error_and_cannot_be_resumed() {
    let f = Fixture::new();
    let def = f.project.path().join(".subagents/agents/offline.md");
    std::fs::write(
        &def,
        "---\nrunner: codex\nenv:\n  FAKE_FAIL: not logged in\n---\nYou fix things.\n",
    )
    .unwrap();
    let (id, status) = f.launch(&["run", "--agent", "offline", "--task", TASK, "--json"]);
    assert_eq!(status["state"], "failed", "{status}");
    assert!(status.get("agentSessionId").is_none(), "{status}");
    // The definition's env reached the CLI; its error is the run's output.
    assert!(
        f.call("codex", 0)
            .2
            .contains("SUBAGENTS_AGENT_RUNNER=codex")
    );
    assert_eq!(f.output(&id), "Error: not logged in\n");
    let out = f.run(&["resume", &id, "--task", FOLLOW_UP]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("recorded no codex session id to resume"),
        "{stderr}"
    );
    assert!(
        !f.record.path().join("codex.1.argv").exists(),
        "nothing was started"
    );
}

#[test]
fn an_agent_run_needs_a_task() {
    let f = Fixture::new();
    let out = f.run(&["run", "--agent", "reviewer"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "a missing task is a usage mistake"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("an agent run needs a task"), "{stderr}");
    assert_eq!(f.env.run_count(), 0);
}

#[test]
fn two_resumes_of_one_agent_session_cannot_run_at_once() {
    let f = Fixture::new();
    let (id, _) = f.launch(&["run", "--agent", "reviewer", "--task", TASK, "--json"]);
    let hold = f.env.fifo("hold");
    // The first revival's claude is running (it holds the session) ...
    let revived = f.resume_held(&id, "first follow-up", &hold);
    // ... so a second revival of the same session is refused by the lease.
    let out = f.run(&["resume", &id, "--task", "second follow-up"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("is already owned by run"), "{stderr}");
    assert!(!f.record.path().join("claude.2.argv").exists());
    std::fs::write(&hold, "go").unwrap();
    f.run(&["wait", &revived]);
    assert_eq!(f.output(&revived), "claude turn 2: first follow-up\n");
    // Once it is over, the session can be resumed again.
    let (again, _) = f.launch(&["resume", &id, "--task", "second follow-up", "--json"]);
    assert_eq!(f.output(&again), "claude turn 3: second follow-up\n");
}
