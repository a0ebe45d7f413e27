//! Runs dispatched to a real Slurm cluster (`scripts/slurm-local.sh up`:
//! a controller and two nodes, `n1` and `n2`, on this machine). Without a
//! cluster these tests print why and pass, unless
//! `SUBAGENTS_REQUIRE_SLURM=1` (set by `.ci/run`): then they fail.
//!
//! They share one cluster (and one test restarts its controller), so they
//! run one at a time.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::Duration;

use serde_json::Value;

use crate::common::*;

static CLUSTER: Mutex<()> = Mutex::new(());

const DEFAULT_DIR: &str = "/var/tmp/subagents-slurm";

/// The cluster's `slurm.conf`, when a cluster answers; else `None` after
/// saying why (or a failure when the cluster is required).
fn cluster() -> Option<PathBuf> {
    let conf = std::env::var_os("SLURM_CONF")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(DEFAULT_DIR).join("slurm.conf"));
    // A controller that was just restarted (one test does) takes a moment
    // to hear from its nodes again: they show `unk` until then.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut why = not_ready(&conf);
    while why.is_some() && conf.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        why = not_ready(&conf);
    }
    match why {
        None => Some(conf),
        Some(why) if std::env::var("SUBAGENTS_REQUIRE_SLURM").as_deref() == Ok("1") => {
            panic!("SUBAGENTS_REQUIRE_SLURM=1 but the Slurm cluster is not up: {why}")
        }
        Some(why) => {
            eprintln!("skipped: no Slurm cluster: {why}");
            None
        }
    }
}

/// Why the cluster cannot take the tests' jobs now, if it cannot.
fn not_ready(conf: &Path) -> Option<String> {
    if !conf.exists() {
        Some(format!(
            "no {} (run scripts/slurm-local.sh up)",
            conf.display()
        ))
    } else {
        match Command::new("sinfo")
            .args(["-h", "-N", "-o", "%N %t"])
            .env("SLURM_CONF", conf)
            .output()
        {
            Err(e) => Some(format!("sinfo cannot run: {e}")),
            Ok(out) if !out.status.success() => Some(format!(
                "sinfo failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )),
            Ok(out) => {
                let text = String::from_utf8_lossy(&out.stdout).into_owned();
                let idle_or_busy = text
                    .lines()
                    .filter(|l| {
                        l.ends_with(" idle") || l.ends_with(" mix") || l.ends_with(" alloc")
                    })
                    .count();
                (idle_or_busy < 2)
                    .then(|| format!("the cluster has not two usable nodes: {text:?}"))
            }
        }
    }
}

/// One test's cluster and state root.
struct Slurm {
    env: Env,
    conf: PathBuf,
    _serial: std::sync::MutexGuard<'static, ()>,
}

impl Slurm {
    fn new() -> Option<Self> {
        let serial = CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
        let conf = cluster()?;
        Some(Self {
            env: Env::new(),
            conf,
            _serial: serial,
        })
    }

    /// The binary as machine `machine` (its identity), on this cluster.
    fn command(&self, machine: &str, args: &[&str]) -> Command {
        let mut command = self.env.command(args);
        command
            .env("SLURM_CONF", &self.conf)
            .env("SUBAGENTS_MACHINE_ID", machine)
            .env_remove("SUBAGENTS_EXECUTOR");
        command
    }

    fn run(&self, machine: &str, args: &[&str]) -> Output {
        output_within(self.command(machine, args), Duration::from_secs(120))
    }

    fn ok(&self, machine: &str, args: &[&str]) -> String {
        let out = self.run(machine, args);
        assert!(out.status.success(), "subagents {args:?} failed: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    }

    fn status(&self, machine: &str, id: &str) -> Value {
        serde_json::from_str(&self.ok(machine, &["status", id, "--json"])).unwrap()
    }

    /// Submits `script` as run `id` (returns at once: queued with its job).
    fn submit(&self, id: &str, script: &str, extra: &[&str]) -> Value {
        let mut args = vec![
            "run",
            "--executor",
            "slurm",
            "--id",
            id,
            "--timeout",
            "3m",
            "--json",
        ];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "sh", "-c", script]);
        serde_json::from_str(&self.ok("submit-host", &args)).unwrap()
    }

    /// Polls (as `machine`) until `condition` holds of the status.
    fn status_when(&self, machine: &str, id: &str, condition: impl Fn(&Value) -> bool) -> Value {
        let mut last = Value::Null;
        poll(Duration::from_secs(60), || {
            last = self.status(machine, id);
            condition(&last)
        });
        last
    }

    fn work(&self, name: &str) -> PathBuf {
        Path::new(self.env.work()).join(name)
    }
}

fn node_of(status: &Value) -> Option<String> {
    status["dispatch"]["node"].as_str().map(str::to_owned)
}

fn over_and_proven(status: &Value) -> bool {
    !matches!(status["state"].as_str(), Some("queued" | "running"))
        && status["processTerminal"]["state"] == "observed"
}

#[test]
fn a_run_completes_on_a_node_and_reports_the_node() {
    let Some(slurm) = Slurm::new() else { return };
    let out = slurm.run(
        "submit-host",
        &[
            "run",
            "--executor",
            "slurm",
            "--id",
            "on-node",
            "--wait",
            "--timeout",
            "3m",
            "--",
            "sh",
            "-c",
            "echo on $SLURMD_NODENAME",
        ],
    );
    assert!(out.status.success(), "{out:?}");
    let status = slurm.status("submit-host", "on-node");
    assert_eq!(status["state"], "complete", "{status}");
    assert_eq!(status["processTerminal"]["state"], "observed");
    let node = node_of(&status).expect("the node is recorded");
    assert!(["n1", "n2"].contains(&node.as_str()), "{status}");
    assert_eq!(status["dispatch"]["executor"], "slurm");
    assert!(
        status["dispatch"]["jobId"]
            .as_str()
            .is_some_and(|j| !j.is_empty())
    );
    let output =
        std::fs::read_to_string(slurm.env.run_dir("on-node").join("output-0.log")).unwrap();
    assert_eq!(output.trim(), format!("on {node}"));
    let text = slurm.ok("submit-host", &["status", "on-node"]);
    assert!(
        text.contains(&format!(
            "Executor: slurm job {}",
            status["dispatch"]["jobId"].as_str().unwrap()
        )),
        "{text}"
    );
    assert!(text.contains(&format!("on {node}")), "{text}");
    // The config crossed sbatch as a private file; the task never did.
    assert_eq!(
        mode(&slurm.env.run_dir("on-node").join("launch-config.json")),
        0o600
    );
}

#[test]
fn two_runs_land_on_two_nodes() {
    let Some(slurm) = Slurm::new() else { return };
    let go = slurm.work("go");
    // Each job takes a whole node, so two at once need both nodes.
    let script = format!("while [ ! -e '{}' ]; do sleep 0.1; done", go.display());
    for id in ["spread-a", "spread-b"] {
        let launched = slurm.submit(id, &script, &["--slurm-arg=--exclusive"]);
        assert_eq!(launched["executor"], "slurm", "{launched}");
        assert!(launched["jobId"].is_string(), "{launched}");
    }
    let a = slurm.status_when("submit-host", "spread-a", |s| {
        s["state"] == "running" && node_of(s).is_some()
    });
    let b = slurm.status_when("submit-host", "spread-b", |s| {
        s["state"] == "running" && node_of(s).is_some()
    });
    assert_ne!(node_of(&a), node_of(&b), "{a}\n{b}");
    // A third waits in Slurm's queue, and says why.
    slurm.submit("spread-c", &script, &["--slurm-arg=--exclusive"]);
    let c = slurm.status_when("submit-host", "spread-c", |s| {
        s["dispatch"]["slurmReason"] == "Resources"
    });
    assert_eq!(c["state"], "queued", "{c}");
    assert_eq!(c["dispatch"]["slurmState"], "PENDING", "{c}");
    assert_eq!(node_of(&c), None, "{c}");
    let table = slurm.ok("submit-host", &["list"]);
    assert!(table.contains("(PENDING: Resources)"), "{table}");
    // Stopped while it waits: cancelled in the queue, proven from Slurm's record.
    let out = slurm.run("submit-host", &["stop", "spread-c"]);
    assert!(out.status.success(), "{out:?}");
    let c = slurm.status("submit-host", "spread-c");
    assert_eq!(c["state"], "stopped", "{c}");
    assert_eq!(c["processTerminal"]["state"], "observed", "{c}");
    std::fs::write(&go, "").unwrap();
    for id in ["spread-a", "spread-b"] {
        let status = slurm.status_when("submit-host", id, over_and_proven);
        assert_eq!(status["state"], "complete", "{status}");
    }
}

#[test]
fn stop_of_a_running_job_ends_it_stopped_with_nothing_left() {
    let Some(slurm) = Slurm::new() else { return };
    let pid_file = slurm.work("grandchild.pid");
    let script = format!(
        "setsid sh -c 'echo $$ > \"{}\"; exec sleep 300' & sleep 300",
        pid_file.display()
    );
    slurm.submit("stopped", &script, &[]);
    poll(Duration::from_secs(60), || {
        std::fs::read_to_string(&pid_file).is_ok_and(|t| t.trim().parse::<u32>().is_ok())
    });
    let grandchild: u32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(alive(grandchild));
    // From another host: only Slurm can reach the job's processes.
    let out = slurm.run("other-host", &["stop", "stopped"]);
    assert!(out.status.success(), "{out:?}");
    let status = slurm.status("submit-host", "stopped");
    assert_eq!(status["state"], "stopped", "{status}");
    assert_eq!(status["processTerminal"]["state"], "observed", "{status}");
    poll(Duration::from_secs(30), || !alive(grandchild));
    let dir = slurm.env.run_dir("stopped");
    // The runner got the TERM (scancel reaches only the batch script, its
    // monitor, which hands it on) and ended the run itself, gracefully:
    // not a run cancelled after the grace and repaired from Slurm's record.
    let events = std::fs::read_to_string(dir.join("events.jsonl")).unwrap();
    let types: Vec<String> = events
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|e| e["type"].as_str().map(str::to_owned))
        .collect();
    assert!(
        types.iter().any(|t| t == "subagent.run.stopped"),
        "{types:?}"
    );
    assert!(
        !types.iter().any(|t| t == "subagent.run.repaired_stale"),
        "{types:?}"
    );
    poll(Duration::from_secs(30), || processes_in(&[&dir]).is_empty());
}

#[test]
fn a_killed_monitor_is_finalized_from_slurms_record_by_another_host() {
    let Some(slurm) = Slurm::new() else { return };
    let go = slurm.work("never");
    let script = format!("while [ ! -e '{}' ]; do sleep 0.1; done", go.display());
    slurm.submit("orphan", &script, &[]);
    let running = slurm.status_when("submit-host", "orphan", |s| {
        s["state"] == "running" && s["monitorIdentity"]["pid"].is_u64()
    });
    // Another machine reads the run: its job and node, never its processes.
    let seen = slurm.status("other-host", "orphan");
    assert_eq!(seen["state"], "running", "{seen}");
    assert_eq!(seen["dispatch"]["slurmState"], "RUNNING", "{seen}");
    assert_eq!(node_of(&seen), node_of(&running));
    let monitor = running["monitorIdentity"]["pid"].as_u64().unwrap() as u32;
    assert_eq!(
        proc_start_time(monitor),
        running["monitorIdentity"]["startTime"].as_u64().unwrap(),
        "the recorded monitor is the live one"
    );
    kill(monitor, libc::SIGKILL);
    // The batch script is gone: Slurm ends the job and empties its cgroup.
    let mut status = Value::Null;
    poll(Duration::from_secs(60), || {
        slurm.ok("other-host", &["reconcile"]);
        status = slurm.status("other-host", "orphan");
        over_and_proven(&status)
    });
    assert_eq!(status["state"], "failed", "{status}");
    let proof: Value = serde_json::from_str(
        &std::fs::read_to_string(slurm.env.run_dir("orphan").join("process-terminal.json"))
            .unwrap(),
    )
    .unwrap();
    let runner = proof["instances"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["kind"] == "runner")
        .unwrap();
    let evidence = &runner["observer"]["evidence"];
    assert_eq!(evidence["mechanism"], "slurm", "{proof}");
    assert_eq!(evidence["jobId"], running["dispatch"]["jobId"], "{proof}");
    assert!(
        ["FAILED", "CANCELLED"].contains(&evidence["state"].as_str().unwrap_or("")),
        "{proof}"
    );
    assert!(evidence["exitCode"].is_string(), "{proof}");
    assert!(!slurm.env.marker("orphan").exists());
}

/// The controller's pid, from the pid file `slurm-local.sh` configured.
fn slurmctld_pid(conf: &Path) -> u32 {
    let text = std::fs::read_to_string(conf).unwrap();
    let file = text
        .lines()
        .find_map(|l| l.strip_prefix("SlurmctldPidFile="))
        .expect("SlurmctldPidFile in slurm.conf");
    std::fs::read_to_string(file)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn a_run_survives_a_controller_restart_and_is_proven() {
    let Some(slurm) = Slurm::new() else { return };
    let go = slurm.work("go");
    let script = format!(
        "while [ ! -e '{}' ]; do sleep 0.1; done; echo done",
        go.display()
    );
    slurm.submit("restart", &script, &[]);
    slurm.status_when("submit-host", "restart", |s| s["state"] == "running");
    let old = slurmctld_pid(&slurm.conf);
    assert_eq!(
        std::fs::read_to_string(format!("/proc/{old}/comm"))
            .unwrap()
            .trim(),
        "slurmctld"
    );
    kill(old, libc::SIGTERM);
    poll(Duration::from_secs(30), || !alive(old));
    // Without its controller nothing is concluded about the run.
    let out = slurm.run("other-host", &["reconcile"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(slurm.status("other-host", "restart")["state"], "running");
    let started = Command::new("/usr/sbin/slurmctld")
        .arg("-f")
        .arg(&slurm.conf)
        .status()
        .unwrap();
    assert!(started.success());
    std::fs::write(&go, "").unwrap();
    let status = slurm.status_when("submit-host", "restart", over_and_proven);
    assert_eq!(status["state"], "complete", "{status}");
}

#[test]
fn slurm_options_without_the_slurm_executor_are_a_usage_error() {
    let env = Env::new();
    let out = env.run(&["run", "--slurm-partition", "main", "--", "true"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let out = env.run(&["run", "--slurm-arg", "--exclusive", "--", "true"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    // Slurm queues its jobs; our queue is for local runs (docs/cluster.md §6).
    let out = env.run(&["run", "--executor", "slurm", "--queue", "--", "true"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("`queue` does not apply to a Slurm run"),
        "{out:?}"
    );
    assert!(
        std::fs::read_dir(env.root().join("async-subagent-runs"))
            .map(|d| d.count() == 0)
            .unwrap_or(true)
    );
    let out = env.run(&[
        "run",
        "--executor",
        "slurm",
        "--slurm-arg=--output=x",
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not allowed"),
        "{out:?}"
    );
}

/// `PATH` with `bin` first, where `script` stands in for `scontrol`.
fn path_with_scontrol(bin: &Path, script: &str) -> String {
    std::fs::create_dir_all(bin).unwrap();
    let scontrol = bin.join("scontrol");
    std::fs::write(&scontrol, script).unwrap();
    std::fs::set_permissions(
        &scontrol,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

#[test]
fn a_cluster_without_cgroup_tracking_is_refused_at_submit() {
    let env = Env::new();
    // A stand-in for the controller's answer: only `scontrol show config` is asked.
    let path = path_with_scontrol(
        &Path::new(env.work()).join("bin"),
        "#!/bin/sh\necho 'ClusterName             = lab'\necho 'ProctrackType           = proctrack/linuxproc'\n",
    );
    let mut command = env.command(&["run", "--executor", "slurm", "--", "true"]);
    command
        .env("PATH", &path)
        .env_remove("SUBAGENTS_SLURM_ALLOW_LINUXPROC");
    let out = output_within(command, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("proctrack/linuxproc, not proctrack/cgroup"),
        "{stderr}"
    );
    assert_eq!(
        stderr
            .trim()
            .lines()
            .filter(|l| l.contains("proctrack"))
            .count(),
        1,
        "{stderr}"
    );
    assert_eq!(env.run_count(), 0, "nothing is reserved for a refused run");
}

#[test]
fn a_cluster_without_cgroup_tracking_takes_runs_when_explicitly_allowed() {
    let Some(slurm) = Slurm::new() else { return };
    // The real controller, except that its config says linuxproc.
    let real = std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .map(|dir| Path::new(dir).join("scontrol"))
        .find(|p| p.is_file())
        .expect("scontrol is on PATH");
    let path = path_with_scontrol(
        &slurm.work("bin"),
        &format!(
            "#!/bin/sh\nif [ \"$1 $2\" = 'show config' ]; then '{real}' show config | sed 's#^ProctrackType .*#ProctrackType = proctrack/linuxproc#'; else exec '{real}' \"$@\"; fi\n",
            real = real.display()
        ),
    );
    let args = [
        "run",
        "--executor",
        "slurm",
        "--id",
        "linuxproc",
        "--wait",
        "--timeout",
        "3m",
        "--",
        "echo",
        "tracked",
    ];
    let mut refused = slurm.command("submit-host", &args);
    refused
        .env("PATH", &path)
        .env("SUBAGENTS_SLURM_ALLOW_LINUXPROC", "yes");
    let out = output_within(refused, Duration::from_secs(120));
    assert_eq!(out.status.code(), Some(1), "only 1 allows: {out:?}");
    let mut allowed = slurm.command("submit-host", &args);
    allowed
        .env("PATH", &path)
        .env("SUBAGENTS_SLURM_ALLOW_LINUXPROC", "1");
    let out = output_within(allowed, Duration::from_secs(120));
    assert!(out.status.success(), "{out:?}");
    let status = slurm.status("submit-host", "linuxproc");
    assert_eq!(status["state"], "complete", "{status}");
    let output =
        std::fs::read_to_string(slurm.env.run_dir("linuxproc").join("output-0.log")).unwrap();
    assert_eq!(output.trim(), "tracked");
}

#[test]
fn a_nested_run_is_its_own_job_and_counts_in_the_parents_fan_out() {
    let Some(slurm) = Slurm::new() else { return };
    let child = slurm.work("child.json");
    let script = format!(
        "\"$SUBAGENTS_BIN\" run --json --wait --id nested-child -- sh -c 'echo child' > '{}'",
        child.display()
    );
    let mut command = slurm.command(
        "submit-host",
        &[
            "run",
            "--executor",
            "slurm",
            "--id",
            "nested-parent",
            "--wait",
            "--timeout",
            "3m",
            "--fanout-limit",
            "4",
            "--",
            "sh",
            "-c",
            &script,
        ],
    );
    command.env("SUBAGENTS_BIN", env!("CARGO_BIN_EXE_subagents"));
    let out = output_within(command, Duration::from_secs(180));
    assert!(out.status.success(), "{out:?}");
    let parent = slurm.status("submit-host", "nested-parent");
    assert_eq!(parent["state"], "complete", "{parent}");
    let child = slurm.status_when("submit-host", "nested-child", over_and_proven);
    assert_eq!(child["state"], "complete", "{child}");
    let (parent_job, child_job) = (&parent["dispatch"]["jobId"], &child["dispatch"]["jobId"]);
    assert!(child_job.is_string() && parent_job.is_string(), "{child}");
    assert_ne!(parent_job, child_job, "the child is a job of its own");
    // The child's claim is in the parent's budget: 2 of 4 used.
    assert_eq!(parent["runFanoutBudget"]["used"], 2, "{parent}");
}
