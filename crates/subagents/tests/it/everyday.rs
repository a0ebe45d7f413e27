//! Everyday use with the real binary: failures that explain themselves,
//! composite runs in `logs` and `status`, usage errors, lifecycle details.

use crate::common;

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::Stdio;

use common::*;
use serde_json::{Value, json};

fn write_spec(env: &Env, name: &str, spec: &Value) -> String {
    let path = Path::new(env.work()).join(name);
    std::fs::write(&path, spec.to_string()).unwrap();
    path.display().to_string()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn first_line(out: &std::process::Output) -> String {
    text(&out.stdout)
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn a_missing_program_fails_with_127_and_every_view_says_why() {
    let env = Env::new();
    let out = env.run(&["run", "--wait", "--", "no-such-agent-cli", "-p", "hi"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let id = first_line(&out);
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "{id} failed: failed to start command 'no-such-agent-cli'"
        )) && stderr.contains("(exit 127)"),
        "{stderr}"
    );
    let status = env.settled(&id);
    assert_eq!(status["steps"][0]["exitCode"], 127, "{status}");

    let logs = env.run(&["logs", &id]);
    assert_eq!(logs.status.code(), Some(0));
    assert!(logs.stdout.is_empty(), "{logs:?}");
    assert!(
        text(&logs.stderr).contains("no output; ") && text(&logs.stderr).contains("No such file"),
        "{logs:?}"
    );

    let wait = env.run(&["wait", &id]);
    assert_eq!(wait.status.code(), Some(1));
    assert!(first_line(&wait).contains("(exit 127)"), "{wait:?}");
    let shown = env.ok(&["status", &id]);
    assert!(shown.contains("Exit code: 127"), "{shown}");
    assert!(
        shown.contains("Failed step: 1/1 no-such-agent-cli"),
        "{shown}"
    );
}

#[test]
fn run_wait_json_and_wait_json_return_the_final_summary() {
    let env = Env::new();
    let out = env.run(&["run", "--wait", "--json", "--", "sh", "-c", "exit 3"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let lines: Vec<&str> = std::str::from_utf8(&out.stdout).unwrap().lines().collect();
    assert_eq!(lines.len(), 1, "{out:?}");
    let summary: Value = serde_json::from_str(lines[0]).unwrap();
    assert_eq!(summary["state"], "failed");
    assert_eq!(summary["steps"][0]["exitCode"], 3);
    let id = summary["runId"].as_str().unwrap();
    let waited: Value = serde_json::from_slice(&env.run(&["wait", id, "--json"]).stdout).unwrap();
    assert_eq!(waited[0]["state"], "failed");
    assert_eq!(
        first_line(&env.run(&["wait", id])),
        format!("{id} failed: command ended with exit code 3")
    );
}

#[test]
fn logs_of_a_parallel_run_show_every_step_with_stderr_apart() {
    let env = Env::new();
    let spec = json!({"mode": "parallel", "concurrency": 1, "tasks": [
        {"agent": "a", "command": ["sh", "-c", "echo from a; echo a1; echo a2"]},
        {"agent": "b", "command": ["sh", "-c", "echo only stderr >&2"]}
    ]});
    let file = write_spec(&env, "p.json", &spec);
    let id = env
        .ok(&["run", "--spec", &file, "--wait"])
        .trim()
        .to_owned();
    let out = env.run(&["logs", &id]);
    assert_eq!(text(&out.stdout), "=== a (step 1) ===\nfrom a\na1\na2\n");
    assert_eq!(
        text(&out.stderr),
        "=== b (step 2) === stderr\nonly stderr\n"
    );

    let step2 = env.run(&["logs", &id, "--step", "2"]);
    assert!(step2.stdout.is_empty());
    assert_eq!(
        text(&step2.stderr),
        "=== b (step 2) === stderr\nonly stderr\n"
    );
    assert_eq!(
        env.ok(&["logs", &id, "--step", "1", "--tail", "2"]),
        "=== a (step 1) ===\na1\na2\n"
    );
    let only_err = env.run(&["logs", &id, "--stderr"]);
    assert!(only_err.stdout.is_empty());
    assert_eq!(
        env.run(&["logs", &id, "--step", "3"]).status.code(),
        Some(2)
    );

    // `status` numbers the steps as the headers do.
    let shown = env.ok(&["status", &id]);
    assert!(shown.contains("  1. a | complete"), "{shown}");
    assert!(shown.contains("  2. b | complete"), "{shown}");
}

#[test]
fn a_chain_failing_at_step_two_shows_the_step_its_error_and_its_code() {
    let env = Env::new();
    let spec = json!({"mode": "chain", "steps": [
        {"agent": "first", "command": ["sh", "-c", "echo ok"]},
        {"agent": "second", "command": ["sh", "-c", "echo broke >&2; exit 4"]},
        {"agent": "third", "command": ["sh", "-c", "echo never"]}
    ]});
    let file = write_spec(&env, "c.json", &spec);
    let out = env.run(&["run", "--spec", &file, "--wait"]);
    assert_eq!(out.status.code(), Some(1));
    let id = first_line(&out);
    assert!(text(&out.stderr).contains("(step 2 exit 4)"), "{out:?}");
    env.settled(&id);
    let shown = env.ok(&["status", &id]);
    assert!(shown.contains("Failed step: 2/3 second"), "{shown}");
    assert!(shown.contains("Exit code: 4"), "{shown}");
    assert!(!shown.contains("Exit code: 0"), "{shown}");
    assert!(shown.contains("  3. third | skipped"), "{shown}");
}

#[test]
fn a_running_chain_has_no_exit_code_and_a_timed_out_run_says_so() {
    let env = Env::new();
    let spec = json!({"mode": "chain", "steps": [
        {"agent": "first", "command": ["sh", "-c", "echo ok"]},
        {"agent": "slow", "command": ["sleep", "300"]}
    ]});
    let file = write_spec(&env, "c.json", &spec);
    let id = env.ok(&["run", "--spec", &file]).trim().to_owned();
    poll(std::time::Duration::from_secs(20), || {
        env.status_json(&id)["steps"][1]["status"] == "running"
    });
    let shown = env.ok(&["status", &id]);
    assert!(!shown.contains("Exit code"), "{shown}");
    assert!(shown.contains("2. slow | running"), "{shown}");
    env.ok(&["stop", &id]);

    let out = env.run(&["run", "--wait", "--timeout", "1s", "--", "sleep", "300"]);
    assert_eq!(out.status.code(), Some(1));
    let id = first_line(&out);
    env.settled(&id);
    let shown = env.ok(&["status", &id]);
    assert!(shown.contains("Timed out after 1s"), "{shown}");
    assert!(shown.contains("Signal: SIGTERM"), "{shown}");
}

#[test]
fn a_chain_stopped_in_its_first_step_ends_the_steps_it_never_started() {
    let env = Env::new();
    let spec = json!({"mode": "chain", "steps": [
        {"agent": "slow", "command": ["sleep", "300"]},
        {"agent": "never", "command": ["sh", "-c", "echo ran"]}
    ]});
    let file = write_spec(&env, "c.json", &spec);
    let id = env.ok(&["run", "--spec", &file]).trim().to_owned();
    poll(std::time::Duration::from_secs(20), || {
        env.status_json(&id)["steps"][0]["status"] == "running"
    });
    env.ok(&["stop", &id]);
    let status = env.settled(&id);
    assert_eq!(status["state"], "stopped", "{status}");
    assert_eq!(status["steps"][1]["status"], "skipped", "{status}");
    assert!(status["steps"][1]["externalProcess"].is_null(), "{status}");
    // The record keeps the reference's state; every view says `skipped`.
    assert_eq!(recorded_step_state(&env, &id, 1), "stopped");
}

/// A step's state as `status.json` records it.
fn recorded_step_state(env: &Env, id: &str, step: usize) -> String {
    let file = env.run_dir(id).join("status.json");
    let status: Value = serde_json::from_slice(&std::fs::read(file).unwrap()).unwrap();
    status["steps"][step]["status"].as_str().unwrap().to_owned()
}

/// Steps that never ran are `skipped` in `status`, `list` and `--json`
/// alike; steps are numbered one way (1-based of all steps) and durations
/// spelled one way.
#[test]
fn a_stopped_chain_with_a_group_is_shown_one_way_everywhere() {
    let env = Env::new();
    let spec = json!({"mode": "chain", "steps": [
        {"agent": "first", "command": ["sh", "-c", "echo ok"]},
        {"parallel": [
            {"agent": "left", "command": ["sh", "-c", "exit 3"]},
            {"agent": "right", "command": ["sleep", "300"]}
        ]},
        {"agent": "never", "command": ["sh", "-c", "echo ran"]}
    ]});
    let file = write_spec(&env, "g.json", &spec);
    let id = env
        .ok(&["run", "--spec", &file, "--timeout", "90m"])
        .trim()
        .to_owned();
    poll(std::time::Duration::from_secs(20), || {
        env.status_json(&id)["steps"][1]["status"] == "failed"
    });
    env.ok(&["stop", &id]);
    let status = env.settled(&id);
    let states: Vec<&str> = status["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["status"].as_str().unwrap())
        .collect();
    assert_eq!(states[3], "skipped", "{status}");
    assert_ne!(recorded_step_state(&env, &id, 3), "skipped");
    let shown = env.ok(&["status", &id]);
    assert!(shown.contains("  4. never | skipped"), "{shown}");
    assert!(!shown.contains("never | skipped | exit"), "{shown}");
    // The header's step and the failed step count the same four steps.
    let header = shown.lines().next().unwrap();
    assert!(
        header.contains(" | step ") && header.contains("/4 | "),
        "{shown}"
    );
    assert!(shown.contains("Failed step: 2/4 left"), "{shown}");
    let listed = env.ok(&["list", "--all", "--long"]);
    assert!(listed.contains("  4. never | skipped"), "{listed}");
    let json: Value = serde_json::from_str(&env.ok(&["list", "--all", "--json"])).unwrap();
    assert_eq!(json[0]["steps"][3]["status"], "skipped", "{json}");
    // One spelling of a timeout: the run's error, its step's and the
    // `Timed out` line.
    let out = env.run(&["run", "--wait", "--timeout", "1s", "--", "sleep", "300"]);
    let timed = first_line(&out);
    env.settled(&timed);
    let shown = env.ok(&["status", &timed]);
    assert!(shown.contains("  Error: timed out after 1s"), "{shown}");
    assert!(shown.contains("  Timed out after 1s"), "{shown}");
    assert!(shown.contains("| timed out after 1s"), "{shown}");
    assert!(!shown.contains("ms."), "{shown}");
}

#[test]
fn fail_fast_siblings_show_as_skipped() {
    let env = Env::new();
    let spec = json!({"mode": "parallel", "concurrency": 1, "failFast": true, "tasks": [
        {"agent": "bad", "command": ["sh", "-c", "exit 2"]},
        {"agent": "later", "command": ["sh", "-c", "echo never"]}
    ]});
    let file = write_spec(&env, "ff.json", &spec);
    let out = env.run(&["run", "--spec", &file, "--wait"]);
    let id = first_line(&out);
    let status = env.settled(&id);
    // Recorded as the reference records it, not left pending; shown as
    // what it was.
    assert_eq!(recorded_step_state(&env, &id, 1), "failed");
    assert_eq!(status["steps"][1]["status"], "skipped", "{status}");
    assert_eq!(
        status["steps"][1]["error"],
        "skipped: a sibling failed (failFast)"
    );
    let shown = env.ok(&["status", &id]);
    assert!(shown.contains("  2. later | skipped"), "{shown}");
    // A step that never ran has no exit code to show.
    assert!(!shown.contains("later | skipped | exit"), "{shown}");
    assert!(shown.contains("Failed step: 1/2 bad"), "{shown}");
}

#[test]
fn a_chain_whose_second_program_is_missing_is_at_step_two() {
    let env = Env::new();
    let spec = json!({"mode": "chain", "steps": [
        {"agent": "first", "command": ["sh", "-c", "echo ok"]},
        {"agent": "typo", "command": ["no-such-agent-cli-for-this-test"]},
        {"agent": "third", "command": ["sh", "-c", "echo never"]}
    ]});
    let file = write_spec(&env, "c.json", &spec);
    let out = env.run(&["run", "--spec", &file, "--wait"]);
    assert_eq!(out.status.code(), Some(1));
    let id = first_line(&out);
    env.settled(&id);
    assert_eq!(env.status_json(&id)["currentStep"], 1);
    let shown = env.ok(&["status", &id]);
    assert!(shown.contains("| chain | step 2/3 |"), "{shown}");
    assert!(shown.contains("  2. typo | failed"), "{shown}");
    assert!(shown.contains("exit 127"), "{shown}");
}

#[test]
fn logs_follow_takes_in_each_step_as_it_starts() {
    let env = Env::new();
    let fifo = env.fifo("go.fifo");
    let spec = json!({"mode": "chain", "steps": [
        {"agent": "one", "command": ["sh", "-c", format!("echo first; read line < '{}'", fifo.display())]},
        {"agent": "two", "command": ["sh", "-c", "echo second"]}
    ]});
    let file = write_spec(&env, "f.json", &spec);
    let id = env.ok(&["run", "--spec", &file]).trim().to_owned();
    let mut follower = env
        .command(&["logs", &id, "--follow"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(follower.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "=== one (step 1) ===");
    assert_eq!(lines.next().unwrap().unwrap(), "first");
    std::fs::write(&fifo, "go\n").unwrap();
    assert_eq!(lines.next().unwrap().unwrap(), "=== two (step 2) ===");
    assert_eq!(lines.next().unwrap().unwrap(), "second");
    assert!(lines.next().is_none(), "follow ends with the run");
    assert!(follower.wait().unwrap().success());
}

#[test]
fn usage_mistakes_exit_2_on_one_line() {
    let env = Env::new();
    let finished = env.ok(&["run", "--wait", "--", "true"]).trim().to_owned();
    for args in [
        vec!["run", "--timeout", "abc", "--", "true"],
        vec!["run", "--timeout", "10", "--", "true"],
        vec!["run", "--id", "../evil", "--", "true"],
        vec!["resume", finished.as_str()],
        vec![
            "resume",
            finished.as_str(),
            "--task",
            "more",
            "--timeout",
            "abc",
        ],
        vec!["wait", finished.as_str(), "--timeout", "soon"],
        vec!["status"],
        vec!["run", "--no-such-flag"],
    ] {
        let out = env.run(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        let stderr = text(&out.stderr);
        let first = stderr.lines().next().unwrap_or_default();
        assert!(first.starts_with("subagents: "), "{args:?}: {stderr}");
        assert!(
            stderr.lines().skip(1).all(|l| l.starts_with("  hint: ")),
            "{args:?}: {stderr}"
        );
    }
}

#[test]
fn stop_of_a_finished_run_says_it_was_already_over() {
    let env = Env::new();
    let id = env.ok(&["run", "--wait", "--", "true"]).trim().to_owned();
    env.settled(&id);
    assert_eq!(
        env.ok(&["stop", &id]).trim(),
        format!("{id} was already over (complete); nothing to stop")
    );
}

#[test]
fn dismiss_refuses_an_active_run_unless_forced_and_list_can_show_dismissed() {
    let env = Env::new();
    let id = env.ok(&["run", "--", "sleep", "300"]).trim().to_owned();
    let out = env.run(&["dismiss", &id]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(text(&out.stderr).contains("is still running"), "{out:?}");
    assert!(env.ok(&["list"]).contains(&id));
    env.ok(&["dismiss", &id, "--force"]);
    assert!(!env.ok(&["list"]).contains(&id));
    assert!(env.ok(&["list", "--all", "--dismissed"]).contains(&id));
    env.ok(&["stop", &id]);
}

#[test]
fn list_of_dismissed_runs_keeps_to_the_session_asked_for() {
    let env = Env::new();
    let mut ids = Vec::new();
    for session in ["first", "second"] {
        let args = ["run", "--session", session, "--wait", "--", "true"];
        let id = env.ok(&args).trim().to_owned();
        env.settled(&id);
        env.ok(&["dismiss", &id]);
        ids.push(id);
    }
    let listed = env.ok(&["list", "--all", "--dismissed", "--session", "first"]);
    assert!(listed.contains(&ids[0]), "{listed}");
    assert!(!listed.contains(&ids[1]), "{listed}");
    let both = env.ok(&["list", "--all", "--dismissed"]);
    assert!(ids.iter().all(|id| both.contains(id.as_str())), "{both}");
}

/// The blocks of a detailed listing after its heading, one per run, each
/// checked line by line: `- ID | state ...`, its step, its fan-out, its
/// output; one blank line between blocks and a single newline at the end.
fn listed_blocks(text: &str, heading: &str) -> Vec<String> {
    assert!(
        text.ends_with("output-0.log\n") && !text.ends_with("\n\n"),
        "{text:?}"
    );
    let mut parts = text.trim_end_matches('\n').split("\n\n");
    assert_eq!(parts.next(), Some(heading), "{text:?}");
    let blocks: Vec<String> = parts.map(str::to_owned).collect();
    for block in &blocks {
        let lines: Vec<&str> = block.lines().collect();
        assert_eq!(lines.len(), 4, "{block:?}");
        assert!(lines[0].starts_with("- "), "{block:?}");
        assert!(lines[1].starts_with("  1. "), "{block:?}");
        assert!(lines[2].starts_with("  Run fan-out: "), "{block:?}");
        assert!(lines[3].starts_with("  output: "), "{block:?}");
    }
    blocks
}

#[test]
fn the_detailed_listing_is_one_block_per_run() {
    let env = Env::new();
    for command in [["true"], ["pwd"]] {
        let id = env.ok(&[&["run", "--wait", "--"][..], &command[..]].concat());
        env.settled(id.trim());
    }
    let active = env.ok(&["run", "--", "sleep", "300"]).trim().to_owned();
    let listed = env.ok(&["list", "--long"]);
    let blocks = listed_blocks(&listed, "Active async runs: 1");
    assert_eq!(blocks.len(), 1);
    assert!(
        blocks[0].starts_with(&format!("- {active} | running |")),
        "{listed}"
    );
    let all = env.ok(&["list", "--all", "--long"]);
    assert_eq!(listed_blocks(&all, "Async runs: 3").len(), 3);
    env.ok(&["stop", &active]);
}

#[test]
fn ps_shows_the_run_id_of_monitor_and_runner() {
    let env = Env::new();
    let id = env.ok(&["run", "--", "sleep", "300"]).trim().to_owned();
    let status = env.wait_for_child_pid(&id);
    for who in ["runnerIdentity", "monitorIdentity"] {
        let pid = status[who]["pid"].as_u64().unwrap();
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        assert_eq!(args.get(2), Some(&id), "{who}: {args:?}");
    }
    env.ok(&["stop", &id]);
}

#[test]
fn a_pipe_on_stdin_or_task_file_dash_is_the_task_and_stdin_ends_with_a_newline() {
    use std::io::Write;
    let env = Env::new();
    for extra in [&[][..], &["--task-file", "-"][..]] {
        let mut args = vec!["run", "--wait"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "sh", "-c", "cat; echo end"]);
        let mut child = env
            .command(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(b"from the pipe")
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{extra:?}: {out:?}");
        let id = first_line(&out);
        // The task file ends with a newline, and stdin is that file.
        let task = env
            .root()
            .join("async-subagent-runs")
            .join(&id)
            .join("task.md");
        assert_eq!(std::fs::read_to_string(task).unwrap(), "from the pipe\n");
        assert_eq!(env.ok(&["logs", &id]), "from the pipe\nend\n", "{extra:?}");
    }
}

#[test]
fn wait_prints_each_run_as_it_ends() {
    let env = Env::new();
    let fifo = env.fifo("slow.fifo");
    let slow = env
        .ok(&[
            "run",
            "--",
            "sh",
            "-c",
            &format!("read line < '{}'", fifo.display()),
        ])
        .trim()
        .to_owned();
    let quick = env.ok(&["run", "--", "true"]).trim().to_owned();
    let mut waiter = env
        .command(&["wait", &slow, &quick])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(waiter.stdout.take().unwrap()).lines();
    // An early end of `wait` says why: its exit status and its stderr.
    let mut next_line = |waiter: &mut std::process::Child| match lines.next() {
        Some(line) => line.unwrap(),
        None => {
            let status = waiter.wait().unwrap();
            let mut stderr = String::new();
            let _ = waiter.stderr.take().unwrap().read_to_string(&mut stderr);
            panic!("wait ended early ({status}): {stderr}");
        }
    };
    // The quick run's line comes while the slow one is still running.
    assert_eq!(next_line(&mut waiter), format!("{quick} complete"));
    assert_eq!(env.status_json(&slow)["state"], "running");
    std::fs::write(&fifo, "go\n").unwrap();
    assert_eq!(next_line(&mut waiter), format!("{slow} complete"));
    assert!(waiter.wait().unwrap().success());
}

#[test]
fn ctrl_c_on_run_wait_says_the_run_goes_on_and_how_to_stop_it() {
    let env = Env::new();
    let mut child = env
        .command(&["run", "--wait", "--", "sleep", "300"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut id = String::new();
    stdout.read_line(&mut id).unwrap();
    let id = id.trim().to_owned();
    env.wait_for_child_pid(&id);
    kill(child.id(), libc::SIGINT);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{out:?}");
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!("run {id} goes on in the background"))
            && stderr.contains(&format!("subagents stop {id}")),
        "{stderr}"
    );
    assert_eq!(env.status_json(&id)["state"], "running");
    env.ok(&["stop", &id]);
}

#[test]
fn the_recursive_example_says_when_it_cannot_find_the_binary() {
    let env = Env::new();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/recursive-agent.sh");
    let out = env
        .command(&["run", "--wait", "--", script.to_str().unwrap()])
        .env_remove("SUBAGENTS_BIN")
        .env("PATH", "/usr/bin:/bin")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let id = first_line(&out);
    assert!(text(&out.stderr).contains("(exit 127)"), "{out:?}");
    let logs = env.run(&["logs", &id]);
    assert!(
        text(&logs.stderr).contains("subagents is not on PATH; set SUBAGENTS_BIN"),
        "{logs:?}"
    );
}

#[test]
fn list_short_is_one_line_per_run_and_sort_started_is_newest_first() {
    let env = Env::new();
    let first = env.ok(&["run", "--wait", "--", "true"]).trim().to_owned();
    let second = first_line(&env.run(&["run", "--wait", "--", "false"]));
    let live = env.ok(&["run", "--", "sleep", "300"]).trim().to_owned();
    env.wait_for_child_pid(&live);

    let table = env.ok(&["list", "--all", "--short", "--sort", "started"]);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 4, "{table}");
    assert!(
        lines[0].starts_with("ID") && lines[0].contains("STARTED"),
        "{table}"
    );
    let order: Vec<&str> = lines[1..]
        .iter()
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(order, [live.as_str(), second.as_str(), first.as_str()]);
    assert!(
        lines[1].contains("running") && lines[1].contains("0/1"),
        "{table}"
    );
    assert!(lines[2].contains("failed"), "{table}");
    assert!(!table.contains('\x1b'), "no colour off a terminal: {table}");

    let coloured = env.ok(&["list", "--short", "--color", "always"]);
    assert!(coloured.contains("\x1b[32mrunning\x1b[0m"), "{coloured}");
    // Off a terminal the detailed listing stays the default (scripts read it).
    assert!(env.ok(&["list"]).contains(&format!("- {live} | running")));
    assert!(
        env.ok(&["list", "--long"])
            .contains(&format!("- {live} | running"))
    );
    env.ok(&["stop", &live]);
}

/// A config home holding `subagents/config.toml` with `text`.
fn config_file(text: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let config = tempfile::tempdir().unwrap();
    std::fs::create_dir(config.path().join("subagents")).unwrap();
    let file = config.path().join("subagents/config.toml");
    std::fs::write(&file, text).unwrap();
    (config, file)
}

#[test]
fn the_config_file_supplies_defaults_below_the_environment() {
    let env = Env::new();
    let (config, file) = config_file("# mine\nmax_active = 1\nsession = \"from-config\"\n");
    let run = |args: &[&str], extra: &[(&str, &str)]| {
        let mut command = env.command(args);
        command
            .env("XDG_CONFIG_HOME", config.path())
            .env_remove("SUBAGENTS_MAX_ACTIVE");
        for (k, v) in extra {
            command.env(k, v);
        }
        command.output().unwrap()
    };
    let shown: Value = serde_json::from_slice(&run(&["config", "--json"], &[]).stdout).unwrap();
    assert_eq!(shown["exists"], true);
    assert_eq!(shown["keys"][2]["key"], "max_active");
    assert_eq!(shown["keys"][2]["value"], "1");
    assert_eq!(shown["keys"][2]["source"], "config");
    let over: Value = serde_json::from_slice(
        &run(&["config", "--json"], &[("SUBAGENTS_MAX_ACTIVE", "5")]).stdout,
    )
    .unwrap();
    assert_eq!(over["keys"][2]["value"], "5");
    assert_eq!(over["keys"][2]["source"], "environment");

    // The limit and the session come from the file.
    let first = run(&["run", "--", "sleep", "300"], &[]);
    assert!(first.status.success(), "{first:?}");
    let id = first_line(&first);
    assert_eq!(env.status_json(&id)["sessionId"], "from-config");
    let second = run(&["run", "--", "true"], &[]);
    assert_eq!(second.status.code(), Some(3), "{second:?}");
    env.ok(&["stop", &id]);

    std::fs::write(&file, "max_active = lots\n").unwrap();
    let broken = run(&["list"], &[]);
    assert_eq!(broken.status.code(), Some(1));
    let stderr = text(&broken.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("config.toml': line 1: max_active must be a whole number"),
        "{stderr}"
    );
}

#[test]
fn the_config_file_sets_the_default_timeout_and_colour() {
    let env = Env::new();
    let (config, file) = config_file("timeout = \"1s\"\ncolor = \"always\"\n");
    let run = |args: &[&str]| {
        let mut command = env.command(args);
        command
            .env("XDG_CONFIG_HOME", config.path())
            .env_remove("SUBAGENTS_TIMEOUT")
            .env_remove("SUBAGENTS_COLOR")
            .env_remove("NO_COLOR");
        command.output().unwrap()
    };
    // The run ends at the configured deadline, not the built-in 30 minutes.
    let out = run(&["run", "--wait", "--", "sleep", "300"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let id = first_line(&out);
    env.settled(&id);
    assert_eq!(env.status_json(&id)["timeoutMs"], 1000);
    assert!(env.ok(&["status", &id]).contains("Timed out after 1s"));
    // `color = "always"` colours the table even through a pipe.
    let table = run(&["list", "--all", "--short"]);
    assert!(text(&table.stdout).contains("\u{1b}["), "{table:?}");

    std::fs::write(&file, "color = \"sometimes\"\n").unwrap();
    let broken = run(&["list"]);
    assert_eq!(broken.status.code(), Some(1));
    assert!(
        text(&broken.stderr).contains("line 1: color must be"),
        "{broken:?}"
    );
}

#[test]
fn max_active_counts_the_session_runs_launched_without_a_limit() {
    let env = Env::new();
    let free = env
        .ok(&["run", "--session", "s", "--", "sleep", "300"])
        .trim()
        .to_owned();
    let limited = env.run(&["run", "--session", "s", "--max-active", "1", "--", "true"]);
    assert_eq!(limited.status.code(), Some(3), "{limited:?}");
    // Another session is not affected.
    env.ok(&[
        "run",
        "--session",
        "t",
        "--max-active",
        "1",
        "--wait",
        "--",
        "true",
    ]);
    env.ok(&["stop", &free]);
    env.settled(&free);
    // Once the run is over (and its exit observed) its slot is free again.
    env.ok(&[
        "run",
        "--session",
        "s",
        "--max-active",
        "1",
        "--wait",
        "--",
        "true",
    ]);
}

#[test]
fn config_prints_each_effective_value_and_its_source() {
    let env = Env::new();
    let (config, file) = config_file("max_active = 2\n");
    let run = |args: &[&str], extra: &[(&str, &str)]| {
        let mut command = env.command(args);
        command
            .env("XDG_CONFIG_HOME", config.path())
            .env_remove("SUBAGENTS_MAX_ACTIVE")
            .env_remove("SUBAGENTS_MAX_SPAWNS_PER_RUN")
            .env_remove("PI_SUBAGENT_MAX_SPAWNS_PER_RUN");
        for (k, v) in extra {
            command.env(k, v);
        }
        let out = command.output().unwrap();
        assert!(out.status.success(), "{out:?}");
        text(&out.stdout)
    };
    let shown = run(&["config"], &[("SUBAGENTS_TIMEOUT", "45m")]);
    let root = env.root().canonicalize().unwrap();
    let line = |key: &str| {
        shown
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{key} = ")))
            .unwrap_or_else(|| panic!("no {key} in {shown}"))
            .trim()
            .to_owned()
    };
    assert_eq!(
        line("root"),
        format!("root = {}  [flag --root]", root.display())
    );
    assert_eq!(line("timeout"), "timeout = 45m  [env SUBAGENTS_TIMEOUT]");
    assert_eq!(line("fanout_limit"), "fanout_limit = 64  [default]");
    assert_eq!(
        line("max_active"),
        format!("max_active = 2  [config file {}]", file.display())
    );
    assert_eq!(line("color"), "color = auto  [default]");
    let json: Value = serde_json::from_str(&run(&["config", "--json"], &[])).unwrap();
    let key = |name: &str| {
        json["keys"]
            .as_array()
            .unwrap()
            .iter()
            .find(|k| k["key"] == name)
            .cloned()
            .unwrap()
    };
    assert_eq!(key("timeout")["value"], "30m", "{json}");
    assert_eq!(key("timeout")["source"], "default", "{json}");
    assert_eq!(key("root")["source"], "flag", "{json}");
    assert_eq!(key("fanout_limit")["value"], "64", "{json}");
}

#[test]
fn the_detailed_listing_shortens_paths_under_home_to_a_tilde() {
    let env = Env::new();
    let root = env.root();
    let home = root.parent().unwrap();
    let name = root.file_name().unwrap().to_string_lossy().into_owned();
    let id = env.ok(&["run", "--wait", "--", "true"]).trim().to_owned();
    env.settled(&id);
    let listed = |home: &std::ffi::OsStr| {
        let out = env
            .command(&["list", "--all", "--long"])
            .env("HOME", home)
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap()
    };
    let output = format!("async-subagent-runs/{id}/output-0.log");
    let text = listed(home.as_os_str());
    assert!(
        text.contains(&format!("output: ~/{name}/{output}")),
        "{text}"
    );
    // An empty HOME is no home: paths stay whole.
    let text = listed("".as_ref());
    let whole = format!("output: {}/{output}", root.display());
    assert!(text.contains(&whole), "{text}");
}

/// `logs` of an ended run: its output and nothing else when it wrote some,
/// even when it failed; "no output; …" only for a run that failed silent,
/// never for one that completed silent; `--tail 0` shows no line.
#[test]
fn logs_names_the_silence_only_of_a_run_that_failed_without_output() {
    let env = Env::new();
    let ended = |script: &str| {
        let out = env.run(&["run", "--wait", "--", "sh", "-c", script]);
        let id = first_line(&out);
        env.settled(&id);
        id
    };
    let loud = ended("echo one; echo two; exit 3");
    let logs = env.run(&["logs", &loud]);
    assert_eq!(logs.status.code(), Some(0), "{logs:?}");
    assert_eq!(text(&logs.stdout), "one\ntwo\n", "{logs:?}");
    assert!(logs.stderr.is_empty(), "{logs:?}");
    let tail = env.run(&["logs", "--tail", "0", &loud]);
    assert!(tail.stdout.is_empty(), "{tail:?}");

    let quiet = ended("true");
    let logs = env.run(&["logs", &quiet]);
    assert_eq!(logs.status.code(), Some(0), "{logs:?}");
    assert!(logs.stdout.is_empty() && logs.stderr.is_empty(), "{logs:?}");

    let failed = ended("exit 4");
    let logs = env.run(&["logs", &failed]);
    assert!(logs.stdout.is_empty(), "{logs:?}");
    assert!(text(&logs.stderr).contains("no output; "), "{logs:?}");
    assert!(
        text(&logs.stderr).contains("failed: command ended with exit code 4"),
        "{logs:?}"
    );
}
