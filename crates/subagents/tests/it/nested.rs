//! End-to-end tests of nested runs and the limits around them: nested
//! launches are charged to the fan-out budget and never to session capacity,
//! refusals name our flags and env vars, `budget` reports the limits, blank
//! tasks are no task, `sessionRoot`, and listings that survive one run's
//! broken budget. Real binary, real processes.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::*;
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_subagents");

/// Runs `command` to completion with stdin closed.
fn output(mut command: Command) -> Output {
    command.stdin(Stdio::null()).output().unwrap()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A shell script in the work directory, made executable.
fn script(env: &Env, name: &str, body: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    let path = Path::new(env.work()).join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path.display().to_string()
}

fn work_file(env: &Env, name: &str) -> PathBuf {
    Path::new(env.work()).join(name)
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Every claim path of every budget under the root.
fn claim_paths(env: &Env) -> Vec<String> {
    let mut out = Vec::new();
    for budget in std::fs::read_dir(env.root().join("run-fanout-budgets")).unwrap() {
        for claim in std::fs::read_dir(budget.unwrap().path().join("claims")).unwrap() {
            let claim = read_json(&claim.unwrap().path());
            out.push(claim["path"].as_str().unwrap().to_owned());
        }
    }
    out.sort();
    out
}

#[test]
fn nested_runs_are_charged_to_the_budget_and_never_to_session_capacity() {
    let env = Env::new();
    let gate = env.fifo("gate.fifo");
    let ids = work_file(&env, "ids");
    let inner_capacity = work_file(&env, "capacity.json");
    let launched = work_file(&env, "launched");
    // The runner hands SUBAGENTS_SESSION_ID and SUBAGENTS_MAX_ACTIVE on to
    // the command (inherited), so each nested `run` sees the full session.
    let outer = script(
        &env,
        "outer.sh",
        &format!(
            r#"for i in 1 2 3; do "$SUBAGENTS_BIN" run -- true >> '{ids}' || echo "refused $?" >> '{ids}'; done
"$SUBAGENTS_BIN" capacity --json > '{cap}'
touch '{launched}'
read line < '{gate}'"#,
            ids = ids.display(),
            cap = inner_capacity.display(),
            launched = launched.display(),
            gate = gate.display(),
        ),
    );
    let mut command = env.command(&["run", "--max-active", "1", "--", &outer]);
    command
        .env("SUBAGENTS_BIN", BIN)
        .env("SUBAGENTS_SESSION_ID", "s1")
        .env("SUBAGENTS_MAX_ACTIVE", "1");
    let out = output(command);
    assert!(out.status.success(), "{out:?}");
    let outer_id = stdout(&out).trim().to_owned();
    poll(Duration::from_secs(60), || launched.exists());

    let nested: Vec<String> = std::fs::read_to_string(&ids)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(nested.len(), 3, "{nested:?}");
    assert!(
        nested.iter().all(|id| !id.starts_with("refused")),
        "every nested run was admitted: {nested:?}"
    );
    // Seen from inside the run while all four are known: one slot, the outer run's.
    let capacity = read_json(&inner_capacity);
    assert_eq!(capacity["used"], 1, "{capacity}");
    assert_eq!(capacity["slots"][0]["slot"]["runId"], outer_id.as_str());

    // A second top-level run of the same session is still refused.
    let mut second = env.command(&["run", "--session", "s1", "--max-active", "1", "--", "true"]);
    second.env_remove("SUBAGENTS_MAX_ACTIVE");
    let refused = output(second);
    assert_eq!(refused.status.code(), Some(3), "{refused:?}");
    assert!(
        stderr(&refused).contains("Active async run capacity exhausted: 1/1 used."),
        "{refused:?}"
    );

    release_gate(&gate);
    assert_eq!(env.settled(&outer_id)["state"], "complete");
    for id in &nested {
        let status = env.settled(id);
        assert_eq!(status["state"], "complete", "{status}");
        assert_eq!(
            status["sessionId"], "s1",
            "the nested run keeps its session"
        );
    }
    assert_eq!(
        env.status_json(&outer_id)["runFanoutBudget"],
        json!({"used": 4, "limit": 64, "remaining": 60})
    );
    let mut expected: Vec<String> = nested.iter().map(|id| format!("{id}/single")).collect();
    expected.push("single".into());
    expected.sort();
    assert_eq!(
        claim_paths(&env),
        expected,
        "one claim per run, nested ones qualified"
    );
    let capacity: Value =
        serde_json::from_str(&env.ok(&["capacity", "--session", "s1", "--json"])).unwrap();
    assert_eq!(
        capacity["used"], 0,
        "no nested run ever held a slot: {capacity}"
    );
}

fn release_gate(fifo: &Path) {
    std::fs::write(fifo, "go\n").unwrap();
}

fn write_spec(env: &Env, name: &str, tasks: usize) -> String {
    let tasks: Vec<Value> = (0..tasks)
        .map(|i| json!({"agent": format!("a{i}"), "command": ["true"]}))
        .collect();
    let path = work_file(env, name);
    std::fs::write(
        &path,
        json!({"mode": "parallel", "tasks": tasks}).to_string(),
    )
    .unwrap();
    path.display().to_string()
}

#[test]
fn a_root_runs_fanout_refusal_names_the_flag_and_the_env_var_that_set_its_limit() {
    let env = Env::new();
    let spec = write_spec(&env, "three.json", 3);
    let reference = "Run fan-out limit reached at tasks[2] (0/2 used; 3 requested, 2 remaining). No children from this admission group were started. Start a new top-level run or raise config.maxSubagentSpawnsPerRun.";

    let human = env.run(&["run", "--spec", &spec, "--fanout-limit", "2"]);
    assert_eq!(human.status.code(), Some(3), "{human:?}");
    let text = stderr(&human);
    let mut lines = text.lines();
    assert_eq!(
        lines.next().unwrap(),
        format!("subagents: failed to launch run: {reference}"),
        "the reference's sentence is kept byte-exact"
    );
    let hint = lines.next().unwrap();
    assert!(
        hint.starts_with("  hint: this run's limit is 2 (from --fanout-limit)"),
        "{hint}"
    );
    assert!(
        hint.contains("--fanout-limit N or $SUBAGENTS_MAX_SPAWNS_PER_RUN"),
        "{hint}"
    );
    assert!(hint.contains("Claims are never released"), "{hint}");

    let mut command = env.command(&["run", "--spec", &spec, "--json"]);
    command.env("SUBAGENTS_MAX_SPAWNS_PER_RUN", "2");
    let json_out = output(command);
    assert_eq!(json_out.status.code(), Some(3), "{json_out:?}");
    let error: Value = serde_json::from_slice(&json_out.stdout).unwrap();
    assert_eq!(error["error"]["code"], "LIMIT");
    assert_eq!(
        error["error"]["message"],
        format!("failed to launch run: {reference}")
    );
    let hint = error["error"]["hint"].as_str().unwrap();
    assert!(
        hint.starts_with("this run's limit is 2 (from $SUBAGENTS_MAX_SPAWNS_PER_RUN)"),
        "{hint}"
    );
    assert!(hint.contains("--fanout-limit"), "{hint}");
    assert_eq!(error["runFanoutRejection"]["limit"], 2);
    assert_eq!(env.run_count(), 0, "nothing was started");
}

#[test]
fn a_nested_refusal_names_the_root_run_whose_budget_is_spent() {
    let env = Env::new();
    let inner_err = work_file(&env, "inner.err");
    let inner_json = work_file(&env, "inner.json");
    let body = format!(
        r#""$SUBAGENTS_BIN" run -- true 2> '{err}'; echo "exit $?" >> '{err}'
"$SUBAGENTS_BIN" budget claim --json --path extra > '{json}'; true"#,
        err = inner_err.display(),
        json = inner_json.display(),
    );
    let outer = script(&env, "outer.sh", &body);
    let mut command = env.command(&["run", "--wait", "--fanout-limit", "1", "--", &outer]);
    command.env("SUBAGENTS_BIN", BIN);
    let out = output(command);
    assert!(out.status.success(), "{out:?}");
    let root = stdout(&out).trim().to_owned();

    let text = std::fs::read_to_string(&inner_err).unwrap();
    assert!(
        text.contains("raise config.maxSubagentSpawnsPerRun."),
        "the reference's sentence: {text}"
    );
    assert!(
        text.contains(&format!(
            "hint: this launch claims from the budget of root run '{root}' (limit 1), which cannot be raised; start the root run with a higher --fanout-limit N or $SUBAGENTS_MAX_SPAWNS_PER_RUN"
        )),
        "{text}"
    );
    assert!(text.ends_with("exit 3\n"), "{text}");

    let claim = read_json(&inner_json);
    assert_eq!(claim["error"]["code"], "LIMIT", "{claim}");
    assert!(
        claim["error"]["hint"]
            .as_str()
            .unwrap()
            .contains(&format!("root run '{root}'")),
        "{claim}"
    );
    assert_eq!(claim["code"], "RUN_FANOUT_LIMIT");
    assert_eq!(
        claim_paths(&env),
        ["single"],
        "the refusals claimed nothing"
    );
}

#[test]
fn a_capacity_refusal_names_max_active_and_its_env_var() {
    let env = Env::new();
    let gate = env.fifo("gate.fifo");
    let wait = format!("read line < '{}'", gate.display());
    let held = env
        .ok(&[
            "run",
            "--session",
            "s1",
            "--max-active",
            "1",
            "--",
            "sh",
            "-c",
            &wait,
        ])
        .trim()
        .to_owned();
    let human = env.run(&["run", "--session", "s1", "--max-active", "1", "--", "true"]);
    assert_eq!(human.status.code(), Some(3), "{human:?}");
    let text = stderr(&human);
    assert!(
        text.starts_with(
            "subagents: failed to launch run: Active async run capacity exhausted: 1/1 used.\n"
        ),
        "{text}"
    );
    assert!(text.contains(&format!("  slot-0: run {held}\n")), "{text}");
    let hint = text.lines().find(|l| l.starts_with("  hint: ")).unwrap();
    assert!(
        hint.contains("--max-active N or $SUBAGENTS_MAX_ACTIVE"),
        "{hint}"
    );
    assert!(
        hint.contains("Runs started inside a run take no slot."),
        "{hint}"
    );

    let json_out = env.run(&[
        "run",
        "--session",
        "s1",
        "--max-active",
        "1",
        "--json",
        "--",
        "true",
    ]);
    assert_eq!(json_out.status.code(), Some(3));
    let error: Value = serde_json::from_slice(&json_out.stdout).unwrap();
    assert!(
        error["error"]["hint"]
            .as_str()
            .unwrap()
            .contains("$SUBAGENTS_MAX_ACTIVE"),
        "{error}"
    );
    assert_eq!(error["capacity"]["used"], 1);
    release_gate(&gate);
    env.settled(&held);
}

fn doctor(env: &Env, args: &[&str], vars: &[(&str, &str)]) -> Value {
    let mut command = env.command(&[&["budget"][..], args, &["--json"]].concat());
    for name in [
        "SUBAGENTS_MAX_SPAWNS_PER_RUN",
        "PI_SUBAGENT_MAX_SPAWNS_PER_RUN",
        "SUBAGENTS_RUN_ID",
        "SUBAGENTS_RUN_FANOUT_BUDGET",
        "PI_SUBAGENT_RUN_FANOUT_BUDGET",
    ] {
        command.env_remove(name);
    }
    command.envs(vars.iter().copied());
    let out = output(command);
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn budget_reports_the_limit_of_a_new_root_run_and_where_it_comes_from() {
    let env = Env::new();
    let report = doctor(&env, &[], &[]);
    assert_eq!(
        report["newRootRun"],
        json!({"limit": 64, "source": "default", "ignored": []})
    );
    assert_eq!(report["inherited"], Value::Null);
    assert_eq!(report["nested"], false);
    assert_eq!(report["claimsReleased"], false);

    let env_set = doctor(&env, &["doctor"], &[("SUBAGENTS_MAX_SPAWNS_PER_RUN", "12")]);
    assert_eq!(
        env_set["newRootRun"],
        json!({"limit": 12, "source": "env", "variable": "SUBAGENTS_MAX_SPAWNS_PER_RUN", "ignored": []})
    );
    let alias = doctor(&env, &[], &[("PI_SUBAGENT_MAX_SPAWNS_PER_RUN", "7")]);
    assert_eq!(alias["newRootRun"]["limit"], 7);
    assert_eq!(alias["newRootRun"]["source"], "alias");
    let flag = doctor(
        &env,
        &["--fanout-limit", "3"],
        &[("SUBAGENTS_MAX_SPAWNS_PER_RUN", "12")],
    );
    assert_eq!(flag["newRootRun"]["limit"], 3);
    assert_eq!(flag["newRootRun"]["source"], "flag");
    assert_eq!(
        flag["newRootRun"]["ignored"][0]["reason"],
        "--fanout-limit takes precedence"
    );
    let invalid = doctor(
        &env,
        &[],
        &[
            ("SUBAGENTS_MAX_SPAWNS_PER_RUN", "lots"),
            ("PI_SUBAGENT_MAX_SPAWNS_PER_RUN", "5"),
        ],
    );
    assert_eq!(invalid["newRootRun"]["limit"], 64);
    assert_eq!(invalid["newRootRun"]["source"], "default");
    assert_eq!(invalid["newRootRun"]["ignored"][0]["value"], "lots");
    assert_eq!(
        invalid["newRootRun"]["ignored"][1]["name"],
        "PI_SUBAGENT_MAX_SPAWNS_PER_RUN"
    );

    // The limit the doctor reports is the one a root run gets.
    let mut command = env.command(&["run", "--wait", "--", "true"]);
    command.env("PI_SUBAGENT_MAX_SPAWNS_PER_RUN", "7");
    command.env_remove("SUBAGENTS_MAX_SPAWNS_PER_RUN");
    let run = output(command);
    assert!(run.status.success(), "{run:?}");
    let id = stdout(&run).trim().to_owned();
    assert_eq!(env.status_json(&id)["runFanoutBudget"]["limit"], 7);

    let text = env.ok(&["budget"]);
    assert!(text.contains("New root run: limit"), "{text}");
    assert!(
        text.contains("Inherited budget: none (not inside a run)"),
        "{text}"
    );
    assert!(text.contains("Claims are never released"), "{text}");
    let usage = env.run(&["budget", "--fanout-limit", "0"]);
    assert_eq!(usage.status.code(), Some(2), "{usage:?}");
}

#[test]
fn budget_inside_a_run_reports_the_inherited_budget() {
    let env = Env::new();
    let report = work_file(&env, "doctor.json");
    let text = work_file(&env, "doctor.txt");
    let body = format!(
        r#""$SUBAGENTS_BIN" budget --json > '{report}'
"$SUBAGENTS_BIN" budget doctor > '{text}'"#,
        report = report.display(),
        text = text.display(),
    );
    let outer = script(&env, "outer.sh", &body);
    let mut command = env.command(&["run", "--wait", "--fanout-limit", "5", "--", &outer]);
    command.env("SUBAGENTS_BIN", BIN);
    let out = output(command);
    assert!(out.status.success(), "{out:?}");
    let root = stdout(&out).trim().to_owned();
    let report = read_json(&report);
    assert_eq!(report["insideRun"], root.as_str());
    assert_eq!(report["nested"], true);
    let inherited = &report["inherited"];
    assert_eq!(inherited["rootRunId"], root.as_str(), "{report}");
    assert_eq!(
        (
            &inherited["used"],
            &inherited["limit"],
            &inherited["remaining"]
        ),
        (&json!(1), &json!(5), &json!(4)),
        "{report}"
    );
    let text = std::fs::read_to_string(&text).unwrap();
    assert!(
        text.contains(&format!(
            "Inherited budget: root run {root}, 1/5 used, 4 remaining"
        )),
        "{text}"
    );
    assert!(text.contains("takes no active-run capacity slot"), "{text}");

    // A broken inherited descriptor is reported, and the doctor exits 1.
    let mut broken = env.command(&["budget"]);
    broken.env("SUBAGENTS_RUN_FANOUT_BUDGET", "not-a-descriptor");
    let out = output(broken);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        stdout(&out)
            .contains("Inherited budget: unavailable (Invalid inherited run fan-out budget"),
        "{out:?}"
    );
}

#[test]
fn a_blank_task_is_no_task() {
    let env = Env::new();
    let probe = "printf '%s|' \"${SUBAGENTS_TASK_FILE-unset}\"; cat";
    let id = env
        .ok(&[
            "run", "--wait", "--task", "  \n\t ", "--", "sh", "-c", probe,
        ])
        .trim()
        .to_owned();
    let dir = env.root().join("async-subagent-runs").join(&id);
    assert!(!dir.join("task.md").exists(), "no task file");
    assert_eq!(
        env.ok(&["logs", &id]),
        "unset|",
        "nothing on stdin, no task env"
    );
    let status = read_json(&dir.join("status.json"));
    assert!(status["steps"][0].get("description").is_none(), "{status}");
    let started = env
        .events(&id)
        .into_iter()
        .find(|e| e["type"] == "subagent.run.started")
        .unwrap();
    assert!(
        started.get("task").is_none() && started.get("goal").is_none(),
        "{started}"
    );

    let blank_file = work_file(&env, "blank.md");
    std::fs::write(&blank_file, "\n   \n").unwrap();
    let id = env
        .ok(&[
            "run",
            "--wait",
            "--task-file",
            blank_file.to_str().unwrap(),
            "--",
            "true",
        ])
        .trim()
        .to_owned();
    assert!(
        !env.root()
            .join("async-subagent-runs")
            .join(&id)
            .join("task.md")
            .exists()
    );

    // A composite step with a blank task, next to one with a real task.
    let spec = work_file(&env, "spec.json");
    let steps = json!({"mode": "parallel", "tasks": [
        {"agent": "a", "command": ["true"], "task": "   "},
        {"agent": "b", "command": ["true"], "task": "do it"}
    ]});
    std::fs::write(&spec, steps.to_string()).unwrap();
    let id = env
        .ok(&["run", "--wait", "--spec", spec.to_str().unwrap()])
        .trim()
        .to_owned();
    let dir = env.root().join("async-subagent-runs").join(&id);
    assert!(!dir.join("task-0.md").exists());
    assert!(dir.join("task-1.md").exists());
    let status = read_json(&dir.join("status.json"));
    assert!(status["steps"][0].get("description").is_none(), "{status}");
    assert_eq!(status["steps"][1]["description"], "[prompt redacted]");
}

#[test]
fn session_root_is_recorded_when_the_session_has_a_directory() {
    let env = Env::new();
    let sessions = tempfile::tempdir().unwrap();
    let real = sessions.path().canonicalize().unwrap();
    let probe = "printf '%s' \"${SUBAGENTS_SESSION_DIR-unset}\"";
    let mut command = env.command(&["run", "--wait", "--task", "t", "--", "sh", "-c", probe]);
    command.env("SUBAGENTS_SESSION_DIR", sessions.path());
    let out = output(command);
    assert!(out.status.success(), "{out:?}");
    let id = stdout(&out).trim().to_owned();
    let status = env.status_json(&id);
    assert_eq!(status["sessionRoot"], real.to_str().unwrap(), "{status}");
    let started = env
        .events(&id)
        .into_iter()
        .find(|e| e["type"] == "subagent.run.started")
        .unwrap();
    assert_eq!(started["sessionRoot"], real.to_str().unwrap(), "{started}");
    assert_eq!(started["task"], "[prompt redacted]");
    assert_eq!(env.ok(&["logs", &id]), real.to_str().unwrap());
    assert!(
        env.ok(&["status", &id])
            .contains(&format!("  Session root: {}", real.display()))
    );

    // Without a session directory the field is left out everywhere.
    let mut command = env.command(&["run", "--wait", "--", "true"]);
    command.env_remove("SUBAGENTS_SESSION_DIR");
    let out = output(command);
    let id = stdout(&out).trim().to_owned();
    assert!(env.status_json(&id).get("sessionRoot").is_none());
    let started = env
        .events(&id)
        .into_iter()
        .find(|e| e["type"] == "subagent.run.started")
        .unwrap();
    assert!(started.get("sessionRoot").is_none(), "{started}");

    // A session directory that does not exist is refused before anything is made.
    let runs = env.run_count();
    let missing = env.run(&[
        "run",
        "--session-dir",
        "/nonexistent/sessions",
        "--",
        "true",
    ]);
    assert_eq!(missing.status.code(), Some(1), "{missing:?}");
    assert!(
        stderr(&missing)
            .contains("session directory '/nonexistent/sessions' is not an existing directory"),
        "{missing:?}"
    );
    assert_eq!(env.run_count(), runs);
}

#[test]
fn a_run_whose_budget_is_missing_or_corrupt_lists_as_unavailable() {
    let env = Env::new();
    let good = env.ok(&["run", "--wait", "--", "true"]).trim().to_owned();
    let missing = env.ok(&["run", "--wait", "--", "true"]).trim().to_owned();
    let corrupt = env.ok(&["run", "--wait", "--", "true"]).trim().to_owned();
    let runs = env.root().join("async-subagent-runs");
    let descriptor = read_json(&runs.join(&missing).join("run-fanout-budget.json"));
    std::fs::remove_dir_all(descriptor["directory"].as_str().unwrap()).unwrap();
    std::fs::write(
        runs.join(&corrupt).join("run-fanout-budget.json"),
        "{not json",
    )
    .unwrap();

    let text = env.ok(&["list", "--all"]);
    let block = |id: &str| -> String {
        let start = text
            .find(id)
            .unwrap_or_else(|| panic!("{id} not listed: {text}"));
        let rest = &text[start..];
        let end = rest[1..].find("\n- ").map_or(rest.len(), |i| i + 1);
        rest[..end].to_owned()
    };
    assert!(
        block(&good).contains("Run fan-out: 1/64 used, 63 remaining"),
        "{text}"
    );
    let line = block(&missing);
    assert!(
        line.contains("Run fan-out: unavailable (Invalid persisted run fan-out budget"),
        "{line}"
    );
    assert!(
        line.contains("Run fan-out budget directory is unavailable"),
        "{line}"
    );
    let line = block(&corrupt);
    assert!(
        line.contains("Run fan-out: unavailable (Invalid persisted run fan-out budget"),
        "{line}"
    );

    let listed: Vec<Value> = serde_json::from_str(&env.ok(&["list", "--all", "--json"])).unwrap();
    assert_eq!(listed.len(), 3);
    for run in &listed {
        let id = run["id"].as_str().unwrap();
        let unavailable = run.get("runFanoutBudgetUnavailable");
        if id == good {
            assert!(unavailable.is_none(), "{run}");
            assert_eq!(run["runFanoutBudget"]["used"], 1);
        } else {
            assert!(
                unavailable
                    .unwrap()
                    .as_str()
                    .unwrap()
                    .contains("run-fanout-budget.json"),
                "{run}"
            );
            assert!(run.get("runFanoutBudget").is_none(), "{run}");
        }
    }
    // `status` of the broken run works too.
    assert!(
        env.ok(&["status", &missing])
            .contains("Run fan-out: unavailable (")
    );
}

#[test]
fn a_finished_run_without_an_observed_proof_keeps_its_active_marker() {
    // Our own runs are finalized by the monitor or, once it is gone, by the
    // observer; a finished run whose proof nobody can give is one written by
    // pi-subagents 0.49 (no identities recorded) while its runner pid lives.
    let env = Env::new();
    let mut runner = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let id = "ref0finished";
    let dir = env.root().join("async-subagent-runs").join(id);
    std::fs::create_dir_all(&dir).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let status = serde_json::json!({
        "lifecycleArtifactVersion": 3,
        "runId": id,
        "mode": "single",
        "state": "complete",
        "startedAt": now - 2_000,
        "endedAt": now - 1_000,
        "lastUpdate": now - 1_000,
        "pid": runner.id(),
        "cwd": env.work(),
        "processTerminal": {
            "version": 1,
            "state": "pending",
            "runId": id,
            "runnerProcessInstanceId": "reference-runner"
        },
        "steps": [{"agent": "worker", "status": "complete"}]
    });
    std::fs::write(dir.join("status.json"), status.to_string()).unwrap();
    let index = env.root().join("async-subagent-runs").join(".active-runs");
    std::fs::create_dir_all(&index).unwrap();
    std::fs::write(index.join(id), "").unwrap();

    for args in [
        &["list"][..],
        &["reconcile"],
        &["status", id],
        &["list", "--all"],
    ] {
        env.ok(args);
        assert!(env.marker(id).exists(), "`{args:?}` kept the marker");
    }
    let summary = env.status_json(id);
    assert_eq!(summary["state"], "complete");
    assert_ne!(summary["processTerminal"]["state"], "observed", "{summary}");
    let all = env.ok(&["list", "--all"]);
    assert!(all.contains(id), "{all}");
    // Not proven over, it still holds its marker: the active listing shows
    // it as finishing, never hides it.
    let active = env.ok(&["list"]);
    assert!(
        active.contains(&format!("- {id} | finishing (complete) |")),
        "{active}"
    );
    runner.kill().unwrap();
    runner.wait().unwrap();
}
