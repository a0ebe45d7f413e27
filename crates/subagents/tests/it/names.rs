//! Runs you can tell apart: `--name`, a spec step's `name`, and the label
//! `list`, `status` and `--json` show (name, else the preset's name, else
//! the command's short form, never the task).

use crate::common;

use std::path::Path;

use common::*;
use serde_json::{Value, json};

const SECRET: &str = "the-task-text-that-must-not-show-0815";

fn list_json(env: &Env) -> Vec<Value> {
    serde_json::from_str(&env.ok(&["list", "--all", "--json"])).unwrap()
}

fn label_of(runs: &[Value], id: &str) -> String {
    let run = runs.iter().find(|r| r["id"] == id).expect("listed");
    run["label"].as_str().unwrap_or_default().to_owned()
}

/// The AGENT cell of `id`'s row in `list --short`.
fn agent_cell(env: &Env, id: &str) -> String {
    let table = env.ok(&["list", "--all", "--short", "--color", "never"]);
    let heading = table.lines().next().unwrap();
    let (from, to) = (
        heading.find("AGENT").unwrap(),
        heading.find("STEPS").unwrap(),
    );
    let row = table
        .lines()
        .find(|l| l.starts_with(id))
        .unwrap_or_else(|| panic!("{id} not in {table}"));
    row.chars()
        .skip(from)
        .take(to - from)
        .collect::<String>()
        .trim()
        .to_owned()
}

#[test]
fn a_named_run_shows_its_name_in_list_status_and_json() {
    let env = Env::new();
    let id = env
        .ok(&["run", "--name", "nightly lint", "--", "sleep", "30"])
        .trim()
        .to_owned();
    let status = env.status_json(&id);
    assert_eq!(status["name"], "nightly lint", "{status}");
    assert_eq!(status["label"], "nightly lint", "{status}");
    assert_eq!(label_of(&list_json(&env), &id), "nightly lint");
    assert_eq!(agent_cell(&env, &id), "nightly lint");
    let text = env.ok(&["status", &id]);
    let header = text.lines().next().unwrap();
    assert!(
        header.starts_with(&format!("- {id} (nightly lint) | ")),
        "{text}"
    );
    // The piped listing is the reference's text: its lines are unchanged.
    let long = env.ok(&["list", "--long"]);
    assert!(!long.contains("nightly lint"), "{long}");
    assert!(long.contains(&format!("- {id} | ")), "{long}");
    env.ok(&["stop", &id]);
    // The runner's and the monitor's later writes keep the name.
    let settled = env.settled(&id);
    assert_eq!(settled["name"], "nightly lint", "{settled}");
}

#[test]
fn without_a_name_the_label_is_the_commands_short_form_never_the_task() {
    let env = Env::new();
    let sh = env
        .ok(&["run", "--wait", "--", "sh", "-c", "exit 0"])
        .trim()
        .to_owned();
    let sleep = env
        .ok(&["run", "--wait", "--", "sleep", "0"])
        .trim()
        .to_owned();
    let task = env
        .ok(&[
            "run",
            "--wait",
            "--task",
            SECRET,
            "--",
            "cat",
            "{task_file}",
        ])
        .trim()
        .to_owned();
    let labelled = env
        .ok(&["run", "--wait", "--agent", "lint-bot", "--", "true"])
        .trim()
        .to_owned();
    let runs = list_json(&env);
    assert_eq!(label_of(&runs, &sh), "sh -c");
    assert_eq!(label_of(&runs, &sleep), "sleep 0");
    assert_eq!(label_of(&runs, &task), "cat {task_file}");
    assert_eq!(label_of(&runs, &labelled), "lint-bot");
    assert_eq!(agent_cell(&env, &sh), "sh -c");
    assert_eq!(agent_cell(&env, &sleep), "sleep 0");
    assert_eq!(agent_cell(&env, &labelled), "lint-bot");
    let everything = format!(
        "{}{}{}",
        env.ok(&["list", "--all", "--json"]),
        env.ok(&["list", "--all", "--short"]),
        env.ok(&["status", &task])
    );
    assert!(!everything.contains(SECRET), "{everything}");
    assert!(
        env.ok(&["status", &task])
            .contains(&format!("- {task} (cat {{task_file}}) | "))
    );
}

#[test]
fn a_preset_run_is_labelled_by_its_agent_and_spec_steps_by_their_names() {
    let env = Env::new();
    let work = Path::new(env.work());
    let agents = work.join(".subagents/agents");
    std::fs::create_dir_all(&agents).unwrap();
    std::fs::write(
        agents.join("echoer.md"),
        "---\nrunner: command\ndescription: says it back\ncommand: [cat]\n---\n",
    )
    .unwrap();
    let out = env
        .command(&["run", "--wait", "--agent", "echoer", "--task", SECRET])
        .current_dir(work)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let preset = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let spec = json!({"mode": "chain", "steps": [
        {"agent": "a", "name": "fetch sources", "command": ["true"]},
        {"agent": "b", "command": ["true"]}
    ]});
    let file = work.join("spec.json");
    std::fs::write(&file, spec.to_string()).unwrap();
    let chain = env
        .ok(&[
            "run",
            "--wait",
            "--name",
            "release",
            "--spec",
            file.to_str().unwrap(),
        ])
        .trim()
        .to_owned();
    let runs = list_json(&env);
    assert_eq!(label_of(&runs, &preset), "echoer");
    assert_eq!(label_of(&runs, &chain), "release");
    let status = env.status_json(&chain);
    assert_eq!(status["steps"][0]["name"], "fetch sources", "{status}");
    assert!(status["steps"][1].get("name").is_none(), "{status}");
    let text = env.ok(&["status", &chain]);
    assert!(text.contains("  1. fetch sources | complete"), "{text}");
    assert!(text.contains("  2. b | complete"), "{text}");

    // A step's name is checked like the run's.
    let bad = json!({"mode": "parallel", "tasks": [
        {"agent": "a", "name": "x\ny", "command": ["true"]}
    ]});
    std::fs::write(&file, bad.to_string()).unwrap();
    let out = env.run(&["run", "--spec", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("tasks[0].name"), "{stderr}");
}

#[test]
fn a_bad_name_is_a_usage_error_that_launches_nothing() {
    let env = Env::new();
    for name in ["", "   ", "a\tb", &"é".repeat(65)] {
        let out = env.run(&["run", "--name", name, "--", "true"]);
        assert_eq!(out.status.code(), Some(2), "{name:?}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("name"), "{stderr}");
        assert!(stderr.contains("hint: --name takes"), "{stderr}");
    }
    // 64 characters (not bytes) is the most.
    let id = env
        .ok(&["run", "--wait", "--name", &"é".repeat(64), "--", "true"])
        .trim()
        .to_owned();
    assert_eq!(env.run_count(), 1);
    assert_eq!(env.status_json(&id)["label"], "é".repeat(64));
}

#[test]
fn old_and_new_statuses_read_both_ways() {
    let env = Env::new();
    let id = env
        .ok(&[
            "run",
            "--wait",
            "--name",
            "new writer",
            "--",
            "sh",
            "-c",
            "exit 0",
        ])
        .trim()
        .to_owned();
    let file = env.run_dir(&id).join("status.json");
    // The status reader keeps the key it does not type, and writes it back.
    let text = std::fs::read_to_string(&file).unwrap();
    let parsed = status::model::parse_status(&file, &text).unwrap();
    assert_eq!(parsed.extra["name"], "new writer");
    assert_eq!(parsed.steps()[0].extra["commandLabel"], "sh -c");
    let again: Value = serde_json::to_value(&parsed).unwrap();
    assert_eq!(again["name"], "new writer");
    let out = env.run(&["validate", "--kind", "status", file.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");

    // A status written before names (no `name`, no `commandLabel`) still
    // lists, labelled by its agent.
    let mut old: Value = serde_json::from_str(&text).unwrap();
    old.as_object_mut().unwrap().remove("name");
    old["steps"][0]
        .as_object_mut()
        .unwrap()
        .remove("commandLabel");
    std::fs::write(&file, serde_json::to_vec(&old).unwrap()).unwrap();
    assert_eq!(label_of(&list_json(&env), &id), "sh");
    assert_eq!(agent_cell(&env, &id), "sh");
}
