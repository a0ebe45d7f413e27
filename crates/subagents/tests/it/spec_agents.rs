//! Named agents inside composite specs (`{"agent": NAME, "task": ...}`
//! without `command`) against the fake CLIs, `{previous}` in a chain, mixed
//! specs, and `--idle-timeout` stall detection with real processes.

use crate::agents::Fixture;
use crate::common;

use std::path::Path;
use std::time::Duration;

use common::*;
use serde_json::{Value, json};

fn write_spec(f: &Fixture, name: &str, spec: &Value) -> String {
    let path = f.project.path().join(name);
    std::fs::write(&path, spec.to_string()).unwrap();
    path.display().to_string()
}

fn steps(status: &Value) -> &Vec<Value> {
    status["steps"].as_array().unwrap()
}

/// Every file of the run but its task files, as text.
fn files_but_tasks(dir: &Path) -> String {
    let mut text = String::new();
    for path in walk(dir) {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        // The agents' own output: the fakes answer by quoting their task.
        let output = ["output-", "external-", "answer"];
        if name.starts_with("task") || output.iter().any(|o| name.starts_with(o)) {
            continue;
        }
        text.push_str(&String::from_utf8_lossy(
            &std::fs::read(&path).unwrap_or_default(),
        ));
    }
    text
}

#[test]
fn a_parallel_spec_of_three_named_agents_is_one_run_with_a_session_per_step() {
    let f = Fixture::new();
    let spec = json!({"mode": "parallel", "tasks": [
        {"agent": "reviewer", "task": "review the parser"},
        {"agent": "scout", "task": "map the parser"},
        {"agent": "fixer", "task": "fix the parser"}
    ]});
    let file = write_spec(&f, "three.json", &spec);
    let (id, status) = f.launch(&["run", "--spec", &file, "--json"]);
    assert_eq!(status["state"], "complete", "{status}");
    assert_eq!(status["mode"], "parallel");
    let runners = ["claude", "pi", "codex"];
    let mut sessions = Vec::new();
    for (step, cli) in steps(&status).iter().zip(runners) {
        assert_eq!(step["status"], "complete", "{step}");
        assert_eq!(step["agentRunner"], cli, "{step}");
        let session = step["agentSessionId"].as_str().unwrap().to_owned();
        let file = step["sessionFile"].as_str().unwrap();
        assert!(file.starts_with(f.home.path().to_str().unwrap()), "{file}");
        assert!(file.ends_with(&format!("{session}.jsonl")), "{file}");
        sessions.push(session);
    }
    sessions.sort();
    sessions.dedup();
    assert_eq!(sessions.len(), 3, "one session per step: {sessions:?}");
    // A composite run's sessions are its steps': none is the run's.
    assert!(status.get("agentSessionId").is_none(), "{status}");
    // Each CLI ran once, its task on stdin, rendered by its preset.
    for (cli, task) in [
        ("claude", "review the parser"),
        ("pi", "map the parser"),
        ("codex", "fix the parser"),
    ] {
        let (argv, stdin, env) = f.call(cli, 0);
        assert_eq!(stdin, format!("{task}\n"));
        assert!(!argv.contains(task), "{argv}");
        assert!(
            env.contains(&format!("SUBAGENTS_AGENT_RUNNER={cli}")),
            "{env}"
        );
        assert!(!f.record.path().join(format!("{cli}.1.argv")).exists());
    }
    // The answers are the steps' outputs; the tasks stay in task*.md.
    let logs = f.ok(&["logs", &id]);
    assert!(logs.contains("claude turn 1: review the parser"), "{logs}");
    assert!(logs.contains("codex turn 1: fix the parser"), "{logs}");
    assert!(
        !logs.contains("\"type\""),
        "the event streams stay out: {logs}"
    );
    let rest = files_but_tasks(&f.run_dir(&id));
    assert!(!rest.contains("the parser"), "task text outside task*.md");
}

#[test]
fn a_chain_puts_the_previous_answer_where_its_task_says_previous() {
    let f = Fixture::new();
    let spec = json!({"mode": "chain", "steps": [
        {"agent": "reviewer", "task": "review module q7"},
        {"agent": "fixer", "task": "fix what the review found:\n{previous}\nthen stop"}
    ]});
    let file = write_spec(&f, "chain.json", &spec);
    let (id, status) = f.launch(&["run", "--spec", &file, "--json"]);
    assert_eq!(status["state"], "complete", "{status}");
    let (_, stdin, env) = f.call("codex", 0);
    assert_eq!(
        stdin,
        "fix what the review found:\nclaude turn 1: review module q7\nthen stop\n"
    );
    // $SUBAGENTS_PREVIOUS_OUTPUT is still handed on.
    assert!(env.contains("SUBAGENTS_PREVIOUS_OUTPUT="), "{env}");
    let task = std::fs::read_to_string(f.run_dir(&id).join("task-1.md")).unwrap();
    assert!(task.contains("claude turn 1: review module q7"), "{task}");
    assert_eq!(steps(&status)[1]["agentRunner"], "codex");
    assert_ne!(
        steps(&status)[0]["agentSessionId"],
        steps(&status)[1]["agentSessionId"]
    );
    let rest = files_but_tasks(&f.run_dir(&id));
    assert!(
        !rest.contains("review module q7"),
        "task text outside task*.md"
    );
}

#[test]
fn a_mixed_spec_runs_commands_and_named_agents() {
    let f = Fixture::new();
    let task_file = f.project.path().join("scout-task.md");
    std::fs::write(&task_file, "scout after {previous}").unwrap();
    let spec = json!({"mode": "chain", "steps": [
        {"agent": "lister", "command": ["sh", "-c", "echo files-a-b"]},
        {"parallel": [
            {"agent": "scout", "taskFile": task_file},
            {"agent": "echoer", "command": ["sh", "-c", "echo \"echo saw $(cat \"$SUBAGENTS_PREVIOUS_OUTPUT\")\""]}
        ]},
        {"agent": "summarize", "task": "{previous}"}
    ]});
    let file = write_spec(&f, "mixed.json", &spec);
    let (id, status) = f.launch(&["run", "--spec", &file, "--json"]);
    assert_eq!(status["state"], "complete", "{status}");
    let (_, stdin, _) = f.call("pi", 0);
    assert_eq!(stdin, "scout after files-a-b\n");
    let steps = steps(&status);
    assert_eq!(steps[1]["agentRunner"], "pi");
    assert!(steps[0].get("agentRunner").is_none(), "{}", steps[0]);
    assert!(steps[2].get("agentRunner").is_none(), "{}", steps[2]);
    // The command agent `summarize` got both answers of the group before.
    let summary = std::fs::read_to_string(f.run_dir(&id).join("output-3.log")).unwrap();
    assert!(
        summary.contains("pi turn 1: scout after files-a-b")
            && summary.contains("echo saw files-a-b"),
        "{summary}"
    );
    // One run took one claim per step.
    assert_eq!(status["runFanoutBudget"]["used"], 4, "{status}");
}

#[test]
fn bad_spec_fields_are_one_line_errors_naming_the_field_and_the_file() {
    let f = Fixture::new();
    let cases = [
        (
            json!({"mode": "parallel", "tasks": [{"agent": "reviewer", "task": "a"}, {"agent": "nobody", "task": "b"}]}),
            "tasks[1].agent: no agent named 'nobody'",
        ),
        (
            json!({"mode": "parallel", "tasks": [{"agent": "reviewer", "task": "use {previous}"}]}),
            "tasks[0].task: {previous} stands for the output of the step before",
        ),
        (
            json!({"mode": "chain", "steps": [{"agent": "reviewer", "task": "{previous}"}, {"agent": "scout", "task": "x"}]}),
            "steps[0].task: {previous}",
        ),
        (
            json!({"mode": "parallel", "tasks": [{"agent": "scout"}]}),
            "tasks[0].task: agent 'scout' needs a task",
        ),
        (
            json!({"mode": "parallel", "tasks": [{"agent": "scout", "task": "a", "taskFile": "t.md"}]}),
            "tasks[0].taskFile: give task or taskFile, not both",
        ),
        (
            json!({"mode": "parallel", "tasks": [{"agent": "scout", "taskFile": "missing.md"}]}),
            "tasks[0].taskFile: ",
        ),
        (
            json!({"mode": "chain", "steps": [{"agent": "scout", "task": "a", "idleTimeout": "soon"}]}),
            "steps[0].idleTimeout: invalid duration 'soon'",
        ),
        (
            json!({"mode": "parallel", "idleTimeout": 5, "tasks": [{"agent": "scout", "task": "a"}]}),
            "idleTimeout: expected a duration string",
        ),
    ];
    for (spec, expected) in cases {
        let file = write_spec(&f, "bad.json", &spec);
        let out = f.run(&["run", "--spec", &file]);
        assert_eq!(out.status.code(), Some(2), "{spec}: {out:?}");
        let stderr = String::from_utf8(out.stderr).unwrap();
        let first = stderr.lines().next().unwrap_or_default();
        assert!(
            first.starts_with(&format!(
                "subagents: invalid spec file '{file}': {expected}"
            )),
            "{spec}: {stderr}"
        );
    }
    // Nothing was launched, and no CLI ran.
    assert_eq!(f.env.run_count(), 0);
    assert!(!f.record.path().join("claude.0.argv").exists());
}

#[test]
fn one_step_of_a_composite_run_cannot_be_resumed() {
    let f = Fixture::new();
    let spec = json!({"mode": "parallel", "tasks": [{"agent": "scout", "task": "a"}]});
    let file = write_spec(&f, "one.json", &spec);
    let (id, _) = f.launch(&["run", "--spec", &file, "--json"]);
    let out = f.run(&["resume", &id, "--task", "more"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("it is a parallel run, and resume continues single runs only"),
        "{stderr}"
    );
    assert!(!f.record.path().join("pi.1.argv").exists());
}

/// Polls the run until it is over, for at most `within`.
fn settled_within(env: &Env, id: &str, within: Duration) -> Value {
    let mut status = Value::Null;
    poll(within, || {
        status = env.status_json(id);
        !matches!(status["state"].as_str(), Some("queued" | "running"))
    });
    env.settled(id)
}

#[test]
fn a_silent_step_ends_after_its_idle_timeout_with_that_reason() {
    let env = Env::new();
    let id = env
        .ok(&["run", "--idle-timeout", "2s", "--", "sleep", "600"])
        .trim()
        .to_owned();
    let status = settled_within(&env, &id, Duration::from_secs(60));
    assert_eq!(status["state"], "failed", "{status}");
    assert_eq!(status["error"], "no output for 2s", "{status}");
    let step = &steps(&status)[0];
    assert_eq!(step["error"], "no output for 2s", "{step}");
    assert_eq!(step["idleTimeoutMs"], 2000, "{step}");
    let stalled: Vec<Value> = env
        .events(&id)
        .into_iter()
        .filter(|e| e["type"] == "subagent.step.stalled")
        .collect();
    assert_eq!(stalled.len(), 1, "{stalled:?}");
    assert_eq!(stalled[0]["idleTimeoutMs"], 2000);
    // The process group is gone, as after a timeout.
    let pid = step["externalProcess"]["pid"].as_u64().unwrap() as u32;
    assert!(!alive(pid));
}

#[test]
fn a_step_that_keeps_printing_is_not_ended_and_records_its_last_output() {
    let env = Env::new();
    let done = Path::new(env.work()).join("done");
    // Prints every 200 ms, for longer than the idle limit and the runner's
    // output check, until the test creates `done`.
    let script = format!(
        "while [ ! -e '{}' ]; do echo tick; sleep 0.2; done",
        done.display()
    );
    let id = env
        .ok(&["run", "--idle-timeout", "1s", "--", "sh", "-c", &script])
        .trim()
        .to_owned();
    let mut last = Value::Null;
    poll(Duration::from_secs(60), || {
        last = env.status_json(&id);
        let step = &steps(&last)[0];
        let started = step["startedAt"].as_u64().unwrap_or(u64::MAX);
        step["lastOutputAt"].as_u64().is_some_and(|at| at > started)
    });
    assert_eq!(last["state"], "running", "{last}");
    let text = env.ok(&["status", &id]);
    assert!(text.contains("last output"), "{text}");
    std::fs::write(&done, "").unwrap();
    let status = settled_within(&env, &id, Duration::from_secs(60));
    assert_eq!(status["state"], "complete", "{status}");
    assert!(
        env.events(&id)
            .iter()
            .all(|e| e["type"] != "subagent.step.stalled")
    );
}

#[test]
fn an_agent_definitions_idle_timeout_wins_over_the_configured_default() {
    let f = Fixture::new();
    std::fs::write(
        f.project.path().join(".subagents/agents/sleeper.md"),
        "---\nrunner: command\ncommand: [sleep, \"600\"]\nidleTimeout: 1s\n---\n",
    )
    .unwrap();
    let mut command = f.command(&["run", "--agent", "sleeper"]);
    command.env("SUBAGENTS_IDLE_TIMEOUT", "1h");
    let out = output_within(command, Duration::from_secs(60));
    assert!(out.status.success(), "{out:?}");
    let id = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let status = settled_within(&f.env, &id, Duration::from_secs(60));
    assert_eq!(status["error"], "no output for 1s", "{status}");

    // The configured default applies to a run that sets nothing else, and
    // a malformed one is refused naming the variable.
    let mut command = f.command(&["run", "--", "sleep", "600"]);
    command.env("SUBAGENTS_IDLE_TIMEOUT", "1s");
    let out = output_within(command, Duration::from_secs(60));
    let id = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let status = settled_within(&f.env, &id, Duration::from_secs(60));
    assert_eq!(status["error"], "no output for 1s", "{status}");
    let mut command = f.command(&["run", "--", "true"]);
    command.env("SUBAGENTS_IDLE_TIMEOUT", "soon");
    let out = output_within(command, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("$SUBAGENTS_IDLE_TIMEOUT: invalid duration"),
        "{out:?}"
    );
}

#[test]
fn a_spec_steps_idle_timeout_ends_only_that_step() {
    let env = Env::new();
    let spec = json!({"mode": "parallel", "idleTimeout": "0", "tasks": [
        {"agent": "quiet", "command": ["sleep", "600"], "idleTimeout": "1s"},
        {"agent": "brief", "command": ["sh", "-c", "sleep 3; echo done"]}
    ]});
    let path = Path::new(env.work()).join("idle.json");
    std::fs::write(&path, spec.to_string()).unwrap();
    let id = env
        .ok(&[
            "run",
            "--spec",
            path.to_str().unwrap(),
            "--idle-timeout",
            "1s",
        ])
        .trim()
        .to_owned();
    let status = settled_within(&env, &id, Duration::from_secs(60));
    let steps = steps(&status);
    assert_eq!(steps[0]["error"], "no output for 1s", "{status}");
    // The spec's top-level `0` wins over --idle-timeout for the other step.
    assert_eq!(steps[1]["status"], "complete", "{status}");
    assert!(steps[1].get("idleTimeoutMs").is_none(), "{status}");
}

#[tokio::test]
async fn the_mcp_run_tool_takes_a_spec_of_named_agents() {
    use rmcp::ServiceExt;
    use rmcp::model::CallToolRequestParams;
    let f = Fixture::new();
    let mut command = tokio::process::Command::from(f.command(&["mcp"]));
    command
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn().unwrap();
    let io = (child.stdout.take().unwrap(), child.stdin.take().unwrap());
    let within = |d| Duration::from_secs(d);
    let client = tokio::time::timeout(within(60), ().serve(io))
        .await
        .unwrap()
        .unwrap();
    let spec = json!({"mode": "parallel", "tasks": [
        {"agent": "reviewer", "task": "review over mcp"},
        {"agent": "fixer", "task": "fix over mcp"}
    ]});
    let arguments = json!({"spec": spec});
    let params =
        CallToolRequestParams::new("run").with_arguments(arguments.as_object().unwrap().clone());
    let result = tokio::time::timeout(within(60), client.call_tool(params))
        .await
        .unwrap()
        .unwrap();
    assert_ne!(result.is_error, Some(true), "{result:?}");
    let launched: Value = match &result.structured_content {
        Some(value) => value.clone(),
        None => serde_json::from_str(&result.content[0].as_text().unwrap().text).unwrap(),
    };
    let id = launched["runId"].as_str().unwrap().to_owned();
    let _ = client.cancel().await;
    f.run(&["wait", &id]);
    let status = f.env.settled(&id);
    assert_eq!(status["state"], "complete", "{status}");
    let steps = steps(&status);
    assert_eq!(steps[0]["agentRunner"], "claude");
    assert_eq!(steps[1]["agentRunner"], "codex");
    assert_ne!(steps[0]["agentSessionId"], steps[1]["agentSessionId"]);
}

#[test]
fn the_new_step_keys_survive_a_reader_and_writer_that_does_not_know_them() {
    // The status crate keeps the keys of a step it has no field for; a
    // writer that knows nothing of `lastOutputAt`, `idleTimeoutMs` or a
    // step's `agentRunner` (the reference, or this crate's older reader)
    // reads such a status and writes it back with them.
    let tmp = tempfile::tempdir().unwrap();
    let text = json!({"runId": "r1", "state": "running", "mode": "parallel", "steps": [
        {"agent": "reviewer", "status": "running", "agentRunner": "claude",
         "agentSessionId": "s-1", "idleTimeoutMs": 120000, "lastOutputAt": 1767225603000u64}
    ]})
    .to_string();
    std::fs::write(tmp.path().join("status.json"), &text).unwrap();
    let status = status::model::read_status(tmp.path()).unwrap().unwrap();
    status::model::write_status(tmp.path(), &status).unwrap();
    let back: Value =
        serde_json::from_slice(&std::fs::read(tmp.path().join("status.json")).unwrap()).unwrap();
    let step = &back["steps"][0];
    assert_eq!(step["agentRunner"], "claude");
    assert_eq!(step["idleTimeoutMs"], 120000);
    assert_eq!(step["lastOutputAt"], 1767225603000u64);
}
