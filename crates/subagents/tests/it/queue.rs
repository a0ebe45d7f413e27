//! `run --queue`: a launch over `--max-active` waits in its session's queue
//! for a slot (first in, first out) instead of being refused; the queued
//! run's own monitor takes the slot and starts the runner.

use crate::common;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use common::*;
use serde_json::Value;

/// A run that holds its slot until `stop`.
fn blocker(env: &Env, limit: &str) -> String {
    let out = env.ok(&["run", "--max-active", limit, "--", "sleep", "60"]);
    out.trim().to_owned()
}

fn queued(env: &Env, limit: &str, command: &[&str]) -> String {
    let mut args = vec!["run", "--max-active", limit, "--queue", "--"];
    args.extend_from_slice(command);
    env.ok(&args).trim().to_owned()
}

fn queue_dir_entries(env: &Env) -> Vec<String> {
    places_in_line(env.root())
}

/// The names in the queue directories of the root's capacity pools.
pub fn places_in_line(root: &Path) -> Vec<String> {
    let pools = root.join("session-active-async-capacity");
    let mut names = Vec::new();
    for pool in std::fs::read_dir(&pools).into_iter().flatten().flatten() {
        for entry in std::fs::read_dir(pool.path().join("queue"))
            .into_iter()
            .flatten()
            .flatten()
        {
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    names
}

fn position(status: &Value) -> Option<u64> {
    status["queuedForSlot"]["position"].as_u64()
}

/// `start <ns>` and `end <ns>` lines of each run's own file.
fn intervals(dir: &Path, n: usize) -> Vec<(u128, u128)> {
    (0..n)
        .map(|i| {
            let text = std::fs::read_to_string(dir.join(format!("run-{i}.log"))).unwrap();
            let field = |what: &str| -> u128 {
                text.lines()
                    .find_map(|l| l.strip_prefix(what))
                    .unwrap_or_else(|| panic!("run {i} has no {what}: {text}"))
                    .trim()
                    .parse()
                    .unwrap()
            };
            (field("start "), field("end "))
        })
        .collect()
}

/// The most intervals that hold one instant.
fn most_at_once(intervals: &[(u128, u128)]) -> usize {
    intervals
        .iter()
        .map(|(start, _)| {
            intervals
                .iter()
                .filter(|(s, e)| s <= start && start < e)
                .count()
        })
        .max()
        .unwrap_or(0)
}

#[test]
fn ten_queued_runs_behind_a_limit_of_two_all_complete_never_more_than_two_at_once() {
    let env = Env::new();
    let work = Path::new(env.work());
    let mut ids = Vec::new();
    for i in 0..10 {
        let log = work.join(format!("run-{i}.log"));
        // The work itself takes a moment, so runs that may overlap do.
        let script = format!(
            "echo start $(date +%s%N) >> {log}; sleep 0.2; echo end $(date +%s%N) >> {log}",
            log = log.display()
        );
        ids.push(queued(&env, "2", &["sh", "-c", &script]));
    }
    let listed: Vec<Value> = serde_json::from_str(&env.ok(&["list", "--json"])).unwrap();
    let waiting = listed.iter().filter(|r| position(r).is_some()).count();
    assert!(waiting >= 1, "some runs wait in line: {listed:?}");
    let mut args = vec!["wait"];
    args.extend(ids.iter().map(String::as_str));
    let out = env.run_within(&args, Duration::from_secs(120));
    assert!(out.status.success(), "{out:?}");
    for id in &ids {
        let status = env.settled(id);
        assert_eq!(status["state"], "complete", "{status}");
        assert!(status.get("queuedForSlot").is_none(), "{status}");
    }
    let spans = intervals(work, 10);
    assert!(most_at_once(&spans) <= 2, "{spans:?}");
    assert!(queue_dir_entries(&env).is_empty(), "the line is empty");
    let capacity: Value = serde_json::from_str(&env.ok(&["capacity", "--json"])).unwrap();
    assert_eq!(capacity["used"], 0, "{capacity}");
}

#[test]
fn queued_runs_start_first_in_first_out() {
    let env = Env::new();
    let gate = blocker(&env, "1");
    let order = Path::new(env.work()).join("order.log");
    let mut ids = Vec::new();
    for i in 0..4 {
        let script = format!("echo {i} >> {}", order.display());
        ids.push(queued(&env, "1", &["sh", "-c", &script]));
    }
    let positions: Vec<Option<u64>> = ids
        .iter()
        .map(|id| position(&env.status_json(id)))
        .collect();
    assert_eq!(positions, [Some(1), Some(2), Some(3), Some(4)]);
    let table = env.ok(&["list", "--short", "--color", "never"]);
    assert!(table.contains("queued #2"), "{table}");
    let text = env.ok(&["status", &ids[1]]);
    assert!(text.contains("Queue: queue position 2"), "{text}");
    let long = env.ok(&["list", "--long"]);
    assert!(
        long.contains(&format!("- {} | queued | queue position 3 |", ids[2])),
        "{long}"
    );
    env.ok(&["stop", &gate]);
    let mut args = vec!["wait"];
    args.extend(ids.iter().map(String::as_str));
    let out = env.run_within(&args, Duration::from_secs(60));
    assert!(out.status.success(), "{out:?}");
    assert_eq!(std::fs::read_to_string(&order).unwrap(), "0\n1\n2\n3\n");
}

#[test]
fn stop_of_a_queued_run_ends_it_stopped_without_starting_it_and_frees_its_place() {
    let env = Env::new();
    let gate = blocker(&env, "1");
    let marker = Path::new(env.work()).join("started");
    let script = format!("touch {}", marker.display());
    let first = queued(&env, "1", &["sh", "-c", &script]);
    let second = queued(&env, "1", &["true"]);
    assert_eq!(position(&env.status_json(&second)), Some(2));
    let out = env.ok(&["stop", &first]);
    assert!(out.contains(&first), "{out}");
    let stopped = env.settled(&first);
    assert_eq!(stopped["state"], "stopped", "{stopped}");
    assert_eq!(
        stopped["processTerminal"]["state"], "not-started",
        "{stopped}"
    );
    // Taken out of the line under the pool lock, not stopped as a started run.
    assert!(
        stopped["error"]
            .as_str()
            .is_some_and(|e| e.ends_with("(stopped while waiting for a capacity slot)")),
        "{stopped}"
    );
    assert!(!env.marker(&first).exists());
    // Its monitor saw it leave the line and exited.
    let dir = env.run_dir(&first);
    poll(Duration::from_secs(30), || processes_in(&[&dir]).is_empty());
    assert_eq!(position(&env.status_json(&second)), Some(1));
    env.ok(&["stop", &gate]);
    let out = env.run_within(&["wait", &second], Duration::from_secs(60));
    assert!(out.status.success(), "{out:?}");
    assert!(
        !marker.exists(),
        "the stopped run never started its command"
    );
    assert_eq!(env.settled(&first)["state"], "stopped");
}

/// A run queued behind a blocker (`--max-active 1`) whose monitor was
/// SIGKILLed (it is ours: the run's status names it); returns the
/// blocker, the queued run and its dead monitor's pid.
fn queued_with_its_monitor_killed(env: &Env) -> (String, String, u32) {
    let gate = blocker(env, "1");
    let id = queued(env, "1", &["true"]);
    let monitor = env.status_json(&id)["monitorIdentity"]["pid"]
        .as_u64()
        .expect("the monitor registered") as u32;
    kill(monitor, libc::SIGKILL);
    poll(Duration::from_secs(30), || !alive(monitor));
    (gate, id, monitor)
}

#[test]
fn a_queued_run_whose_monitor_was_killed_has_its_wait_restarted_by_reconcile() {
    let env = Env::new();
    let (gate, id, monitor) = queued_with_its_monitor_killed(&env);
    let report = env.ok(&["reconcile"]);
    assert!(
        report.contains("waiting for a capacity slot again"),
        "{report}"
    );
    let status = env.status_json(&id);
    assert_eq!(status["state"], "queued", "{status}");
    assert_eq!(position(&status), Some(1), "it kept its place: {status}");
    let again = status["monitorIdentity"]["pid"].as_u64().unwrap() as u32;
    assert_ne!(again, monitor);
    assert!(alive(again));
    env.ok(&["stop", &gate]);
    let out = env.run_within(&["wait", &id], Duration::from_secs(60));
    assert!(out.status.success(), "{out:?}");
    assert_eq!(env.settled(&id)["state"], "complete");
}

#[test]
fn a_queued_run_whose_kept_launch_is_damaged_fails_naming_the_file_and_field() {
    let env = Env::new();
    let (gate, id, _) = queued_with_its_monitor_killed(&env);
    let kept = env
        .root()
        .join("async-subagent-runs")
        .join(&id)
        .join("queued-launch.json");
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&kept).unwrap()).unwrap();
    config["queue"]["limit"] = Value::from("one");
    std::fs::write(&kept, config.to_string()).unwrap();
    env.ok(&["reconcile"]);
    let status = env.settled(&id);
    assert_eq!(status["state"], "failed", "{status}");
    let error = status["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("queued-launch.json") && error.contains("queue.limit"),
        "the reason names neither the file nor the field: {status}"
    );
    env.ok(&["stop", &gate]);
}

#[test]
fn run_wait_waits_through_the_queue() {
    let env = Env::new();
    let gate = blocker(&env, "1");
    let args = [
        "run",
        "--max-active",
        "1",
        "--queue",
        "--wait",
        "--",
        "sh",
        "-c",
        "exit 0",
    ];
    let mut waiting = env.command(&args);
    waiting.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = waiting.spawn().unwrap();
    // The run is in line while the launcher waits.
    let mut id = None;
    poll(Duration::from_secs(30), || {
        let listed: Vec<Value> = serde_json::from_str(&env.ok(&["list", "--json"])).unwrap();
        id = listed
            .iter()
            .find(|r| position(r) == Some(1))
            .map(|r| r["id"].as_str().unwrap().to_owned());
        id.is_some()
    });
    assert!(child.try_wait().unwrap().is_none(), "still waiting");
    env.ok(&["stop", &gate]);
    let out = output_within_child(child);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), id.unwrap());
}

fn output_within_child(child: std::process::Child) -> std::process::Output {
    // The launcher's own wait ends with the run; the suite's 60 s bound
    // applies as for any command.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    rx.recv_timeout(Duration::from_secs(60))
        .expect("run --wait ended")
        .unwrap()
}

#[test]
fn without_queue_a_full_session_still_refuses_with_exit_3() {
    let env = Env::new();
    let gate = blocker(&env, "1");
    let out = env.run(&["run", "--max-active", "1", "--", "true"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("capacity exhausted: 1/1 used"), "{stderr}");
    assert_eq!(env.run_count(), 1, "nothing was made of it");
    // The config default asks for the queue; --no-queue refuses still.
    let mut cmd = env.command(&["run", "--max-active", "1", "--no-queue", "--", "true"]);
    cmd.env("SUBAGENTS_QUEUE", "true");
    let out = output_within(cmd, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let mut cmd = env.command(&["run", "--max-active", "1", "--", "true"]);
    cmd.env("SUBAGENTS_QUEUE", "true");
    let out = output_within(cmd, Duration::from_secs(60));
    assert!(out.status.success(), "{out:?}");
    let id = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert_eq!(position(&env.status_json(&id)), Some(1));
    env.ok(&["stop", &id]);
    env.ok(&["stop", &gate]);
}

#[test]
fn a_spec_asks_for_the_queue_and_bad_values_are_one_line_errors() {
    let env = Env::new();
    let gate = blocker(&env, "1");
    let spec = Path::new(env.work()).join("spec.json");
    let write = |queue: &str| {
        let text = format!(
            r#"{{"mode": "chain", "steps": [{{"agent": "a", "command": ["true"]}}], "queue": {queue}}}"#
        );
        std::fs::write(&spec, text).unwrap();
    };
    let spec_arg = spec.to_str().unwrap();
    write("true");
    let id = env
        .ok(&["run", "--max-active", "1", "--spec", spec_arg])
        .trim()
        .to_owned();
    assert_eq!(position(&env.status_json(&id)), Some(1));
    write("\"yes\"");
    let out = env.run(&["run", "--max-active", "1", "--spec", spec_arg]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("queue: expected a boolean"), "{stderr}");
    assert!(
        stderr.lines().next().unwrap().contains("spec.json"),
        "{stderr}"
    );
    let mut cmd = env.command(&["run", "--max-active", "1", "--", "true"]);
    cmd.env("SUBAGENTS_QUEUE", "maybe");
    let out = output_within(cmd, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "$SUBAGENTS_QUEUE (the `queue` config key) must be true or false, not 'maybe'"
        ),
        "{stderr}"
    );
    let config = Path::new(env.work()).join("no-config/subagents");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("config.toml"), "queue = yes\n").unwrap();
    let out = env.run(&["run", "--max-active", "1", "--", "true"]);
    assert_ne!(out.status.code(), Some(0), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let first = stderr.lines().next().unwrap_or_default();
    assert!(first.contains("config.toml"), "{stderr}");
    assert!(
        first.contains("line 1: queue must be true or false, not 'yes'"),
        "{stderr}"
    );
    std::fs::write(config.join("config.toml"), "queue = true\n").unwrap();
    let second = env
        .ok(&["run", "--max-active", "1", "--", "true"])
        .trim()
        .to_owned();
    assert_eq!(position(&env.status_json(&second)), Some(2));
    for run in [&id, &second, &gate] {
        env.ok(&["stop", run]);
    }
}

#[test]
fn queued_statuses_and_pools_read_both_ways() {
    let env = Env::new();
    let gate = blocker(&env, "1");
    let id = queued(&env, "1", &["true"]);
    let file = env.run_dir(&id).join("status.json");
    // New writer, reader without the key: a queued run of the reference's
    // states; the key is kept through a read and a write.
    let text = std::fs::read_to_string(&file).unwrap();
    let parsed = status::model::parse_status(&file, &text).unwrap();
    assert_eq!(parsed.state, status::RunState::Queued);
    assert!(parsed.state.is_active());
    let again: Value = serde_json::to_value(&parsed).unwrap();
    assert!(again["queuedForSlot"]["since"].is_u64(), "{again}");
    let out = env.run(&["validate", "--kind", "status", file.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    // The pool's readers count slot directories only: the line is not a slot.
    let capacity: Value = serde_json::from_str(&env.ok(&["capacity", "--json"])).unwrap();
    assert_eq!(capacity["used"], 1, "{capacity}");
    assert_eq!(queue_dir_entries(&env).len(), 1);

    // Old writer, new reader: a queued status without the key is no wait,
    // so its dead monitor's run is given up as before, not restarted.
    let monitor = parsed.monitor_identity.as_ref().unwrap().pid;
    kill(monitor, libc::SIGKILL);
    poll(Duration::from_secs(30), || !alive(monitor));
    let mut old: Value = serde_json::from_str(&text).unwrap();
    old.as_object_mut().unwrap().remove("queuedForSlot");
    std::fs::write(&file, serde_json::to_vec(&old).unwrap()).unwrap();
    // `status` observes it: given up, not restarted.
    let status = env.settled(&id);
    assert_eq!(status["state"], "failed", "{status}");
    assert_eq!(position(&status), None);
    let error = status["error"].as_str().unwrap_or_default();
    assert!(error.contains("never started a runner"), "{status}");
    env.ok(&["stop", &gate]);
}

/// `status.json` read from disk: unlike `status`, reading it observes
/// nothing, so only the queued run's own monitor can make it move.
fn status_file(env: &Env, id: &str) -> Value {
    let text = std::fs::read_to_string(env.run_dir(id).join("status.json")).unwrap_or_default();
    serde_json::from_str(&text).unwrap_or(Value::Null)
}

/// The `owner.json` of the slot that `id` holds, if any.
fn slot_of(env: &Env, id: &str) -> Option<Value> {
    let pools = env.root().join("session-active-async-capacity");
    let slots = std::fs::read_dir(&pools).into_iter().flatten().flatten();
    let slots = slots.flat_map(|pool| {
        std::fs::read_dir(pool.path())
            .into_iter()
            .flatten()
            .flatten()
    });
    slots
        .filter_map(|slot| std::fs::read_to_string(slot.path().join("owner.json")).ok())
        .filter_map(|text| serde_json::from_str::<Value>(&text).ok())
        .find(|owner| owner["runId"] == id)
}

/// SIGKILLs a run's monitor and runner (ours: their working directory is
/// the run's directory) and the runner's group, which holds its step.
fn kill_all_in(dir: &Path) {
    let holders = processes_in(&[dir]);
    assert!(!holders.is_empty(), "the run's monitor and runner run");
    for &pid in &holders {
        kill_group(pid, libc::SIGKILL);
        kill(pid, libc::SIGKILL);
    }
    poll(Duration::from_secs(30), || processes_in(&[dir]).is_empty());
}

#[test]
fn a_queued_run_starts_on_its_own_when_the_slot_holder_was_killed_with_its_monitor() {
    let env = Env::new();
    let gate = blocker(&env, "1");
    let id = queued(&env, "1", &["true"]);
    kill_all_in(&env.run_dir(&gate));
    // No command runs meanwhile: the waiting monitor itself has the dead
    // holder's run finalized, which frees the slot it waits for.
    poll(Duration::from_secs(60), || {
        status_file(&env, &id)["state"] == "complete"
    });
    assert_eq!(env.settled(&gate)["state"], "failed");
}

#[test]
fn a_queued_runs_slot_is_bound_to_its_runner_once_it_starts() {
    let env = Env::new();
    let gate = blocker(&env, "1");
    let id = queued(&env, "1", &["sleep", "60"]);
    env.ok(&["stop", &gate]);
    poll(Duration::from_secs(30), || {
        status_file(&env, &id)["state"] == "running"
    });
    let runner = status_file(&env, &id)["runnerProcessInstanceId"].clone();
    assert!(runner.is_string(), "the run names its runner");
    let mut owner = Value::Null;
    poll(Duration::from_secs(30), || {
        owner = slot_of(&env, &id).unwrap_or(Value::Null);
        owner["runnerProcessInstanceId"] == runner
    });
    assert!(owner["runnerStartedAt"].is_u64(), "{owner}");
    env.ok(&["stop", &id]);
    env.settled(&id);
    assert!(slot_of(&env, &id).is_none(), "the slot went with the run");
}

#[test]
fn a_queued_run_whose_place_in_line_went_without_a_stop_fails_not_started() {
    let env = Env::new();
    let gate = blocker(&env, "1");
    let marker = Path::new(env.work()).join("started");
    let script = format!("touch {}", marker.display());
    let id = queued(&env, "1", &["sh", "-c", &script]);
    let pools = env.root().join("session-active-async-capacity");
    let entry = std::fs::read_dir(&pools)
        .unwrap()
        .flatten()
        .flat_map(|pool| {
            std::fs::read_dir(pool.path().join("queue"))
                .unwrap()
                .flatten()
        })
        .find(|e| e.file_name().to_string_lossy().contains(&id))
        .expect("the run's entry in its line");
    std::fs::remove_file(entry.path()).unwrap();
    poll(Duration::from_secs(30), || {
        status_file(&env, &id)["state"] == "failed"
    });
    let status = env.settled(&id);
    assert_eq!(
        status["processTerminal"]["state"], "not-started",
        "{status}"
    );
    let error = status["error"].as_str().unwrap_or_default();
    assert!(error.contains("never started a runner"), "{status}");
    assert!(!env.marker(&id).exists(), "its active marker was released");
    assert!(!marker.exists(), "its command never ran");
    env.ok(&["stop", &gate]);
}

#[test]
fn a_waiter_whose_monitor_died_holds_up_nobody_behind_it() {
    let env = Env::new();
    let (gate, asleep, _) = queued_with_its_monitor_killed(&env);
    let id = queued(&env, "1", &["true"]);
    // Killed, the slot's holder frees it with no change in the pool: no
    // event wakes the live waiter, only its own looks find the slot over
    // and the entry ahead asleep.
    kill_all_in(&env.run_dir(&gate));
    poll(Duration::from_secs(30), || {
        status_file(&env, &id)["state"] == "complete"
    });
    assert_eq!(status_file(&env, &asleep)["state"], "queued");
    env.ok(&["stop", &asleep]);
}

/// Clock ticks of CPU `pid` has used (`utime` + `stime`).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

#[test]
fn a_waiting_monitor_sleeps_between_its_looks() {
    let env = Env::new();
    let gate = blocker(&env, "1");
    let id = queued(&env, "1", &["true"]);
    let monitor = status_file(&env, &id)["monitorIdentity"]["pid"]
        .as_u64()
        .expect("the monitor registered") as u32;
    let before = cpu_ticks(monitor);
    // A window of measurement, not a wait for an event: the monitor's
    // own reads of its line must not wake it (it would spin).
    std::thread::sleep(Duration::from_secs(2));
    let used = cpu_ticks(monitor) - before;
    assert!(used < 50, "{used} ticks of CPU in 2 s of waiting");
    env.ok(&["stop", &gate]);
    env.ok(&["stop", &id]);
}
