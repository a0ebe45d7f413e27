//! A damaged `status.json` on an active run holds nothing forever: `stop`
//! ends it, the observer proves it over, its capacity slot and active
//! marker go, and `prune` may remove it (issue 24, item 2).

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{Env, alive, kill, poll};
use serde_json::Value;

const SESSION: &str = "damaged-session";

/// What can stand in place of a status: each must be survived.
#[derive(Debug, Clone, Copy)]
enum Damage {
    /// Valid JSON of the wrong types.
    WrongTypes,
    /// Cut short.
    Truncated,
    Directory,
    Fifo,
    Symlink,
}

const ALL: [Damage; 5] = [
    Damage::WrongTypes,
    Damage::Truncated,
    Damage::Directory,
    Damage::Fifo,
    Damage::Symlink,
];

fn damage(env: &Env, id: &str, how: Damage) {
    let path = env.run_dir(id).join("status.json");
    let replace = |write: &dyn Fn(&Path)| {
        let tmp = env.run_dir(id).join("damage.tmp");
        write(&tmp);
        std::fs::rename(&tmp, &path).unwrap();
    };
    match how {
        Damage::WrongTypes => replace(&|p| std::fs::write(p, r#"{"state": 5}"#).unwrap()),
        Damage::Truncated => replace(&|p| std::fs::write(p, r#"{"runId": "x", "sta"#).unwrap()),
        Damage::Directory => {
            std::fs::remove_file(&path).unwrap();
            std::fs::create_dir(&path).unwrap();
            std::fs::write(path.join("inside"), "x").unwrap();
        }
        Damage::Fifo => replace(&|p| {
            let made = std::process::Command::new("mkfifo")
                .arg(p)
                .status()
                .unwrap();
            assert!(made.success());
        }),
        Damage::Symlink => replace(&|p| std::os::unix::fs::symlink("/etc/hostname", p).unwrap()),
    }
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// Starts a run whose COMMAND leaves a grandchild behind in its group and
/// waits on `fifo` (or sleeps); returns its id and the status once the
/// COMMAND runs.
fn start(env: &Env, script: &str) -> (String, Value) {
    let id = env
        .ok(&[
            "run",
            "--session",
            SESSION,
            "--max-active",
            "1",
            "--",
            "sh",
            "-c",
            script,
        ])
        .trim()
        .to_owned();
    let status = env.wait_for_child_pid(&id);
    (id, status)
}

fn pid(status: &Value, pointer: &str) -> u32 {
    let pid = status.pointer(pointer).and_then(Value::as_u64);
    pid.unwrap_or_else(|| panic!("no {pointer} in {status}")) as u32
}

/// SIGKILLs the processes at `pointers` of `status`, one at a time, each
/// gone before the next.
pub(crate) fn kill_all(status: &Value, pointers: &[&str]) {
    for key in pointers {
        kill(pid(status, key), libc::SIGKILL);
        poll(Duration::from_secs(20), || !alive(pid(status, key)));
    }
}

/// Processes carrying the run's id in their environment (every COMMAND and
/// its children do).
fn tagged(id: &str) -> Vec<u32> {
    let wanted = format!("SUBAGENTS_RUN_ID={id}");
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let env = std::fs::read(entry.path().join("environ")).unwrap_or_default();
        if env.split(|b| *b == 0).any(|v| v == wanted.as_bytes()) && alive(pid) {
            pids.push(pid);
        }
    }
    pids
}

fn used_slots(env: &Env) -> u64 {
    let out = env.ok(&["capacity", "--session", SESSION, "--json"]);
    let snapshot: Value = serde_json::from_str(&out).unwrap();
    snapshot["used"].as_u64().unwrap()
}

/// Nothing of the run is left or held: no process, an observed proof, no
/// marker, no slot, and the session admits a new run at `--max-active 1`.
fn assert_released(env: &Env, id: &str) {
    poll(Duration::from_secs(10), || tagged(id).is_empty());
    let proof = read_json(&env.run_dir(id).join("process-terminal.json"));
    assert_eq!(proof["state"], "observed", "{proof}");
    assert!(!env.marker(id).exists(), "marker of {id} still present");
    assert_eq!(used_slots(env), 0, "the slot of {id} was not released");
    let next = env.run(&[
        "run",
        "--session",
        SESSION,
        "--max-active",
        "1",
        "--",
        "true",
    ]);
    assert!(next.status.success(), "a new run was refused: {next:?}");
    let next = String::from_utf8(next.stdout).unwrap();
    env.settled(next.trim());
}

fn damaged_copies(dir: &Path) -> Vec<PathBuf> {
    let entries = std::fs::read_dir(dir).unwrap().flatten();
    entries
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().contains("status.json.damaged-"))
        .collect()
}

#[test]
fn stop_ends_a_run_whose_status_is_damaged_and_releases_its_slot_and_marker() {
    for how in ALL {
        let env = Env::new();
        let (id, status) = start(&env, "sleep 60 & sleep 60");
        let command = pid(&status, "/steps/0/externalProcess/pid");
        damage(&env, &id, how);

        let out = env.run_within(&["stop", &id], Duration::from_secs(30));
        assert_eq!(out.status.code(), Some(0), "{how:?}: {out:?}");
        assert!(!alive(command), "{how:?}: the COMMAND runs on");
        // The runner rewrote its status from its last write.
        let status = env.status_json(&id);
        assert_eq!(status["state"], "stopped", "{how:?}: {status}");
        assert_eq!(damaged_copies(&env.run_dir(&id)).len(), 1, "{how:?}");
        assert_released(&env, &id);
    }
}

#[test]
fn a_damaged_status_whose_monitor_and_runner_were_killed_is_proven_over_and_pruned() {
    let env = Env::new();
    let (id, status) = start(&env, "sleep 60 & sleep 60");
    let grandchildren = tagged(&id);
    assert!(grandchildren.len() >= 2, "{grandchildren:?}");
    damage(&env, &id, Damage::WrongTypes);
    kill_all(&status, &["/monitorIdentity/pid", "/runnerIdentity/pid"]);

    env.ok(&["reconcile"]);
    assert!(
        grandchildren.iter().all(|p| !alive(*p)),
        "{grandchildren:?}"
    );
    assert_released(&env, &id);
    let proof = read_json(&env.run_dir(&id).join("process-terminal.json"));
    assert_eq!(
        proof["instances"][0]["observer"]["role"], "reconciler",
        "{proof}"
    );

    // Still unreadable, and said so with its reason and its proof.
    let out = env.run(&["status", &id]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains(&format!("run '{id}' is unreadable: failed to parse"))
            && text.contains("proven gone (process-terminal proof observed)")
            && text.lines().count() == 1,
        "{text}"
    );
    let listed = env.ok(&["list", "--all"]);
    assert!(
        listed.contains(&format!("- {id} | unreadable |")),
        "{listed}"
    );
    // Proven over a moment ago: younger than prune's default age.
    let kept = env.ok(&["prune"]);
    assert!(env.run_dir(&id).exists(), "pruned before its age: {kept}");
    let pruned = env.ok(&["prune", "--older-than", "0s"]);
    assert!(
        pruned.contains(&format!("pruned {id} (unreadable")),
        "{pruned}"
    );
    assert!(!env.run_dir(&id).exists());
}

#[test]
fn a_runner_that_finds_its_status_damaged_rewrites_it_and_completes_the_run() {
    let env = Env::new();
    let fifo = env.fifo("gate.fifo");
    let (id, _) = start(&env, &format!("read line < '{}'", fifo.display()));
    damage(&env, &id, Damage::Directory);
    std::fs::write(&fifo, "go\n").unwrap();

    let status = env.settled(&id);
    assert_eq!(status["state"], "complete", "{status}");
    assert_eq!(status["processTerminal"]["state"], "observed", "{status}");
    let copies = damaged_copies(&env.run_dir(&id));
    assert!(copies.len() == 1 && copies[0].is_dir(), "{copies:?}");
    let log = std::fs::read_to_string(env.run_dir(&id).join("runner.stderr.log")).unwrap();
    assert!(log.contains("runner rewrote its damaged status"), "{log}");
    assert_released(&env, &id);
}

#[test]
fn a_monitor_whose_runner_died_after_its_status_was_damaged_proves_the_run_over() {
    let env = Env::new();
    let (id, status) = start(&env, "sleep 60 & sleep 60");
    let grandchildren = tagged(&id);
    damage(&env, &id, Damage::Truncated);
    let runner = pid(&status, "/runnerIdentity/pid");
    kill(runner, libc::SIGKILL);

    // The monitor reaps the runner, ends what it left and writes the proof
    // from what it witnessed; nobody else acts.
    let proof = env.run_dir(&id).join("process-terminal.json");
    poll(Duration::from_secs(30), || {
        proof.exists() && !env.marker(&id).exists()
    });
    assert!(
        grandchildren.iter().all(|p| !alive(*p)),
        "{grandchildren:?}"
    );
    let proof = read_json(&proof);
    assert_eq!(proof["state"], "observed", "{proof}");
    assert!(proof["instances"][0]["observer"].is_null(), "{proof}");
    assert_released(&env, &id);
}

/// A process of its own session and group that has nothing to do with any
/// run; killed on drop, also when the test fails.
struct Stranger(std::process::Child);

impl Stranger {
    fn start() -> Self {
        use std::os::unix::process::CommandExt;
        let mut command = std::process::Command::new("sleep");
        command.arg("300");
        // SAFETY: setsid(2) is async-signal-safe and touches no memory.
        unsafe {
            command.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
        Self(command.spawn().unwrap())
    }
}

impl Drop for Stranger {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn stop_of_a_damaged_run_whose_processes_are_gone_signals_nobody_who_took_their_pids() {
    let env = Env::new();
    let (id, status) = start(&env, "sleep 60");
    kill_all(
        &status,
        &[
            "/monitorIdentity/pid",
            "/runnerIdentity/pid",
            "/steps/0/externalProcess/pid",
        ],
    );
    damage(&env, &id, Damage::WrongTypes);
    // The recorded pids now name a stranger; the recorded start times are
    // still those of the processes that are gone.
    let stranger = Stranger::start();
    let taken = stranger.0.id();
    let path = env.run_dir(&id).join("run-processes.json");
    let mut record = read_json(&path);
    for key in ["monitor", "runner"] {
        record[key]["pid"] = taken.into();
    }
    let temp = path.with_extension("json.test");
    std::fs::write(&temp, serde_json::to_vec(&record).unwrap()).unwrap();
    std::fs::rename(&temp, &path).unwrap();

    let out = env.run_within(&["stop", &id], Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains(&format!("run '{id}' is unreadable")),
        "{text}"
    );
    assert!(alive(taken), "stop signalled the stranger {taken}");
    assert_released(&env, &id);
}

#[test]
fn stop_of_a_damaged_run_whose_monitor_was_killed_stops_it_and_says_so() {
    let env = Env::new();
    let (id, status) = start(&env, "sleep 60 & sleep 60");
    let command = pid(&status, "/steps/0/externalProcess/pid");
    let monitor = pid(&status, "/monitorIdentity/pid");
    kill(monitor, libc::SIGKILL);
    poll(Duration::from_secs(20), || !alive(monitor));
    damage(&env, &id, Damage::WrongTypes);

    let out = env.run_within(&["stop", &id], Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    // Its runner still ran: it was stopped now, not found over.
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{id} stopped\n")
    );
    assert!(!alive(command), "the COMMAND runs on");
    assert_released(&env, &id);
}

#[test]
fn stop_of_a_damaged_run_whose_runner_does_not_end_on_sigterm_kills_its_group() {
    let env = Env::new();
    let (id, status) = start(&env, "sleep 60 & sleep 60");
    let command = pid(&status, "/steps/0/externalProcess/pid");
    let runner = pid(&status, "/runnerIdentity/pid");
    // A stopped process keeps SIGTERM pending: only SIGKILL ends it.
    kill(runner, libc::SIGSTOP);
    damage(&env, &id, Damage::WrongTypes);

    let out = env.run_within(&["stop", &id], Duration::from_secs(40));
    assert!(!alive(runner), "the runner was left: {out:?}");
    poll(Duration::from_secs(20), || !alive(command));
    // Nobody could rewrite the status: stop says what was proven.
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("its processes were proven gone (process-terminal proof observed)"),
        "{text}"
    );
    assert_released(&env, &id);
}

#[test]
fn a_damaged_run_proven_over_is_kept_while_a_recorded_process_lives_then_pruned() {
    let env = Env::new();
    let (id, status) = start(&env, "sleep 60");
    // A status that is a directory: prune must remove it as one.
    damage(&env, &id, Damage::Directory);
    kill_all(
        &status,
        &[
            "/monitorIdentity/pid",
            "/runnerIdentity/pid",
            "/steps/0/externalProcess/pid",
        ],
    );
    env.ok(&["reconcile"]);
    let proof = read_json(&env.run_dir(&id).join("process-terminal.json"));
    assert_eq!(proof["state"], "observed", "{proof}");

    // The recorded monitor alive again (its pid and start time now a live
    // process's), the runner still gone: the run is kept.
    let path = env.run_dir(&id).join("run-processes.json");
    let original = std::fs::read_to_string(&path).unwrap();
    let stranger = Stranger::start();
    let taken = stranger.0.id();
    let mut record: Value = serde_json::from_str(&original).unwrap();
    record["monitor"]["pid"] = taken.into();
    record["monitor"]["startTime"] = common::proc_start_time(taken).into();
    std::fs::write(&path, record.to_string()).unwrap();
    let kept = env.ok(&["prune", "--older-than", "0s"]);
    assert!(
        kept.contains("its runner or monitor is still alive"),
        "{kept}"
    );
    assert!(env.run_dir(&id).exists());

    std::fs::write(&path, &original).unwrap();
    let pruned = env.ok(&["prune", "--older-than", "0s"]);
    assert!(
        pruned.contains(&format!("pruned {id} (unreadable")),
        "{pruned}"
    );
    assert!(!env.run_dir(&id).exists());
}
