//! The launch config the launcher hands to the monitor and the monitor to the
//! runner, over stdin: never a file (but [`QUEUED_LAUNCH_FILE`] of a run
//! waiting for a capacity slot), and never task text (only task paths).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Environment variable naming the inherited ready-pipe descriptor.
pub const READY_FD_ENV: &str = "SUBAGENTS_READY_FD";

/// One flat step: a command the runner starts.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepConfig {
    /// Agent label.
    pub agent: String,
    /// COMMAND and its arguments, placeholders not yet replaced.
    pub command: Vec<String>,
    /// Working directory.
    pub cwd: PathBuf,
    /// The step's task file, when it has a task.
    pub task_file: Option<PathBuf>,
    /// The step's own wall-clock limit.
    pub timeout_ms: Option<u64>,
    /// Fan-out claim label handed to the child (`tasks[j]`, `chain[i]`, ...).
    pub fanout_label: Option<String>,
    /// Environment of this step's COMMAND alone, over the run's `env`: a
    /// named agent's preset inside a composite run.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Ends the step after this long without output (stdout, stderr or the
    /// output file growing), as a timeout does; `None`: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_ms: Option<u64>,
    /// The task file holds `{previous}`: the runner replaces it with the
    /// previous group's output when the step starts.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub previous_in_task: bool,
}

/// A run of consecutive flat steps executed together: one sequential chain
/// step, or a parallel group.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupConfig {
    /// First flat step index.
    pub start: usize,
    /// Number of steps.
    pub count: usize,
    /// At most this many children at once.
    pub concurrency: usize,
    /// Stop the siblings when one fails.
    pub fail_fast: bool,
    /// A parallel group (listed in `parallelGroups`).
    pub parallel: bool,
}

/// Everything a runner needs.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LaunchConfig {
    /// Run id.
    pub run_id: String,
    /// State root.
    pub root: PathBuf,
    /// Run directory.
    pub run_dir: PathBuf,
    /// Runner instance id (UUID v4).
    pub runner_process_instance_id: String,
    /// `single`, `parallel` or `chain`.
    pub mode: String,
    /// Flat steps.
    pub steps: Vec<StepConfig>,
    /// Execution order: groups run one after another.
    pub groups: Vec<GroupConfig>,
    /// Run-level wall-clock limit.
    pub timeout_ms: Option<u64>,
    /// Owner session.
    pub session_id: Option<String>,
    /// The run's fan-out budget descriptor (JSON), handed to children.
    #[serde(default)]
    pub fanout_descriptor: Option<serde_json::Value>,
    /// Extra environment for every COMMAND.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Index of the capacity slot the launcher took for the run, so the
    /// finalizer frees that slot without reading the others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_slot: Option<u64>,
    /// Set for `resume`: the runner takes the session lease and runs the
    /// startup handshake before it starts anything.
    #[serde(default)]
    pub revival: Option<RevivalConfig>,
    /// The directory of the session the run belongs to: recorded as
    /// `sessionRoot` and handed to COMMAND as `$SUBAGENTS_SESSION_DIR`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_root: Option<PathBuf>,
    /// Set for a run launched with `--queue` that got no slot: its monitor
    /// waits for its turn in the session's line before it starts the runner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueueConfig>,
}

/// What the monitor of a queued run needs to wait for its slot.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueConfig {
    /// The session whose pool the run waits in.
    pub session_id: String,
    /// The limit it was launched with.
    pub limit: u32,
    /// When it joined the line.
    pub since: u64,
}

/// The launch config of a queued run, kept in its directory (0600): unlike
/// any other run's, its monitor may have to be started again (after a kill
/// or a reboot) by a command that has only the run directory. It holds what
/// the stdin config holds: task paths, never task text.
pub const QUEUED_LAUNCH_FILE: &str = "queued-launch.json";

/// Reads a queued run's [`QUEUED_LAUNCH_FILE`]; `None` when it is missing,
/// unreadable, or not the config of the run in `run_dir`.
pub fn read_queued_launch(run_dir: &std::path::Path) -> Option<LaunchConfig> {
    read_queued_launch_file(run_dir).ok()
}

/// [`read_queued_launch`] with the reason it failed: one line naming the
/// file and, for a damaged one, the field at fault.
pub fn read_queued_launch_file(run_dir: &std::path::Path) -> Result<LaunchConfig, String> {
    let path = run_dir.join(QUEUED_LAUNCH_FILE);
    let config = read_config_file(&path)?;
    if config.run_dir != run_dir || config.queue.is_none() {
        return Err(format!(
            "failed to read launch config '{}': not the queued launch of this run",
            atomic_file::escape_path(&path)
        ));
    }
    Ok(config)
}

/// Reads a launch config kept in a file (a Slurm job's
/// `launch-config.json`, a queued run's [`QUEUED_LAUNCH_FILE`]); the error
/// is one line naming the file and the field at fault.
pub fn read_config_file(path: &std::path::Path) -> Result<LaunchConfig, String> {
    let failed = |cause: String| {
        format!(
            "failed to read launch config '{}': {cause}",
            atomic_file::escape_path(path)
        )
    };
    let bytes = atomic_file::read::read_file(path).map_err(|e| failed(e.to_string()))?;
    let mut de = serde_json::Deserializer::from_slice(&bytes);
    let config = serde_path_to_error::deserialize(&mut de)
        .map_err(|e| failed(format!("{}: {}", e.path(), e.inner())))?;
    de.end().map_err(|e| failed(e.to_string()))?;
    Ok(config)
}

/// What a revival's runner needs for the lease and the handshake.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RevivalConfig {
    /// The run being revived.
    pub source_run_id: String,
    /// The lineage's session file (leased).
    pub session_file: PathBuf,
    /// `<root>/session-leases`.
    pub lease_root: PathBuf,
    /// The handshake token.
    pub token: String,
    /// Handshake timeouts: (launcher waits, runner waits), in ms.
    pub timeouts_ms: (u64, u64),
}

impl LaunchConfig {
    /// Number of logical steps (a parallel group counts as one).
    pub fn chain_step_count(&self) -> usize {
        self.groups.len()
    }

    /// The logical step index of a flat step.
    pub fn logical_index(&self, flat: usize) -> usize {
        self.groups
            .iter()
            .position(|g| flat >= g.start && flat < g.start + g.count)
            .unwrap_or(0)
    }
}

/// Whether step `i`'s child also gets the budget as
/// `PI_SUBAGENT_RUN_FANOUT_BUDGET`: only when a pi-subagents 0.49 child with
/// the child's temp dir would accept it (else it would refuse to start).
pub fn child_gets_reference_env(config: &LaunchConfig) -> bool {
    let Some(directory) = config
        .fanout_descriptor
        .as_ref()
        .and_then(|d| d.get("directory"))
        .and_then(|d| d.as_str())
    else {
        return false;
    };
    let tmpdir = fanout_budget::node_tmpdir(|key| {
        config
            .env
            .get(key)
            .cloned()
            .or_else(|| std::env::var(key).ok())
    });
    fanout_budget::reference_accepts(std::path::Path::new(directory), &tmpdir)
}

/// The env value for step `i`'s child: the run's descriptor with the step's
/// claim label appended to `parentPath` (single runs hand it on unchanged).
pub fn child_fanout_env(config: &LaunchConfig, i: usize) -> Option<String> {
    let descriptor: fanout_budget::Descriptor =
        serde_json::from_value(config.fanout_descriptor.clone()?).ok()?;
    let child = match config.steps.get(i).and_then(|s| s.fanout_label.as_deref()) {
        Some(label) => descriptor.child(label),
        None => descriptor,
    };
    Some(child.to_env_value())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Four flat steps in three groups: `a`, the parallel `b c`, `d`.
    pub(crate) fn launch_config(run_dir: &std::path::Path) -> LaunchConfig {
        let step = |agent: &str| StepConfig {
            agent: agent.into(),
            command: vec!["true".into()],
            cwd: PathBuf::from("/"),
            task_file: None,
            timeout_ms: None,
            fanout_label: None,
            env: BTreeMap::new(),
            idle_timeout_ms: None,
            previous_in_task: false,
        };
        let group = |start, count, parallel| GroupConfig {
            start,
            count,
            concurrency: 2,
            fail_fast: false,
            parallel,
        };
        LaunchConfig {
            run_id: "r".into(),
            root: run_dir.join("root"),
            run_dir: run_dir.to_owned(),
            runner_process_instance_id: "rid".into(),
            mode: "chain".into(),
            steps: vec![step("a"), step("b"), step("c"), step("d")],
            groups: vec![group(0, 1, false), group(1, 2, true), group(3, 1, false)],
            timeout_ms: None,
            session_id: None,
            fanout_descriptor: None,
            env: BTreeMap::new(),
            capacity_slot: None,
            revival: None,
            session_root: None,
            queue: None,
        }
    }

    #[test]
    fn a_parallel_group_is_one_logical_step() {
        let config = launch_config(std::path::Path::new("/nonexistent"));
        assert_eq!(config.chain_step_count(), 3);
        let logical: Vec<usize> = (0..4).map(|i| config.logical_index(i)).collect();
        assert_eq!(logical, [0, 1, 1, 2]);
        assert_eq!(config.logical_index(9), 0);
    }

    fn descriptor(directory: &std::path::Path) -> fanout_budget::Descriptor {
        fanout_budget::Descriptor {
            version: 1,
            root_run_id: "r".into(),
            directory: directory.to_owned(),
            limit: 3,
            parent_path: None,
        }
    }

    #[test]
    fn each_child_gets_the_descriptor_with_its_own_claim_label() {
        let mut config = launch_config(std::path::Path::new("/nonexistent"));
        assert_eq!(child_fanout_env(&config, 0), None);
        let run = descriptor(std::path::Path::new("/budgets/b"));
        config.fanout_descriptor = Some(serde_json::to_value(&run).unwrap());
        config.steps[1].fanout_label = Some("tasks[0]".into());
        assert_eq!(
            child_fanout_env(&config, 1),
            Some(run.child("tasks[0]").to_env_value())
        );
        assert_eq!(child_fanout_env(&config, 0), Some(run.to_env_value()));
    }

    #[test]
    fn only_a_budget_under_the_childs_reference_root_is_handed_on_as_such() {
        let tmp = tempfile::tempdir().unwrap();
        let uid = nix::unistd::getuid().as_raw();
        let root = tmp.path().join(format!("pi-subagents-uid-{uid}"));
        let inside = root.join(fanout_budget::BUDGET_ROOT_DIR).join("b");
        let outside = tmp.path().join("elsewhere");
        std::fs::create_dir_all(&inside).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        let mut config = launch_config(tmp.path());
        assert!(!child_gets_reference_env(&config));
        config
            .env
            .insert("TMPDIR".into(), tmp.path().display().to_string());
        config.fanout_descriptor = Some(serde_json::to_value(descriptor(&inside)).unwrap());
        assert!(child_gets_reference_env(&config));
        config.fanout_descriptor = Some(serde_json::to_value(descriptor(&outside)).unwrap());
        assert!(!child_gets_reference_env(&config));
    }
}

/// Every optional field of a launch config kept in a file, one table row
/// each: absent, `null`, of the wrong type, empty.
#[cfg(test)]
mod optional_fields {
    use serde_json::{Value, json};

    use super::*;

    /// Every field set, no two numbers alike (run, step and idle limits,
    /// the slot, the queue's time and limit).
    fn full(run_dir: &std::path::Path) -> Value {
        json!({
            "runId": "run-a", "root": "/state", "runDir": run_dir,
            "runnerProcessInstanceId": "instance-b", "mode": "chain",
            "steps": [{
                "agent": "agent-c", "command": ["true"], "cwd": "/work",
                "taskFile": "/state/task-0.md", "timeoutMs": 2000, "fanoutLabel": "chain[0]",
                "env": {"STEP": "s"}, "idleTimeoutMs": 3000, "previousInTask": true
            }],
            "groups": [{"start": 0, "count": 1, "concurrency": 1, "failFast": true, "parallel": false}],
            "timeoutMs": 1000, "sessionId": "session-d",
            "fanoutDescriptor": {"version": 1, "rootRunId": "run-a", "directory": "/b", "limit": 7},
            "env": {"RUN": "r"}, "capacitySlot": 4,
            "revival": {"sourceRunId": "run-e", "sessionFile": "/s.jsonl", "leaseRoot": "/leases",
                        "token": "token-f", "timeoutsMs": [8000, 9000]},
            "sessionRoot": "/sessions/d",
            "queue": {"sessionId": "session-d", "limit": 6, "since": 5000}
        })
    }

    /// The optional fields as read, `null` for none.
    fn optionals(c: &LaunchConfig) -> Vec<(&'static str, Value)> {
        let step = &c.steps[0];
        let v = |x: &dyn erased::Ser| x.value();
        vec![
            ("timeoutMs", v(&c.timeout_ms)),
            ("sessionId", v(&c.session_id)),
            ("fanoutDescriptor", v(&c.fanout_descriptor)),
            ("env", v(&c.env)),
            ("capacitySlot", v(&c.capacity_slot)),
            ("revival", v(&c.revival)),
            ("sessionRoot", v(&c.session_root)),
            ("queue", v(&c.queue)),
            ("steps.taskFile", v(&step.task_file)),
            ("steps.timeoutMs", v(&step.timeout_ms)),
            ("steps.fanoutLabel", v(&step.fanout_label)),
            ("steps.env", v(&step.env)),
            ("steps.idleTimeoutMs", v(&step.idle_timeout_ms)),
            ("steps.previousInTask", v(&step.previous_in_task)),
        ]
    }

    mod erased {
        pub(super) trait Ser {
            fn value(&self) -> serde_json::Value;
        }
        impl<T: serde::Serialize> Ser for T {
            fn value(&self) -> serde_json::Value {
                serde_json::to_value(self).unwrap()
            }
        }
    }

    fn slot<'a>(value: &'a mut Value, path: &str) -> (&'a mut Value, String) {
        match path.strip_prefix("steps.") {
            Some(key) => (&mut value["steps"][0], key.to_owned()),
            None => (value, path.to_owned()),
        }
    }

    enum Change {
        Absent,
        To(Value),
    }

    /// The config read back, or the error; `read_queued_launch` agrees.
    fn read_with(path: &str, change: &Change) -> Result<LaunchConfig, String> {
        let tmp = tempfile::tempdir().unwrap();
        let mut value = full(tmp.path());
        let (parent, key) = slot(&mut value, path);
        match change {
            Change::Absent => {
                parent.as_object_mut().unwrap().remove(&key);
            }
            Change::To(v) => parent[&key] = v.clone(),
        }
        let file = tmp.path().join(QUEUED_LAUNCH_FILE);
        std::fs::write(&file, value.to_string()).unwrap();
        let read = read_config_file(&file);
        let queued = read_queued_launch(tmp.path());
        let waits = read.as_ref().is_ok_and(|c| c.queue.is_some());
        assert_eq!(queued.is_some(), waits, "{path}: read_queued_launch agrees");
        if let Err(e) = &read {
            assert!(!e.contains('\n') && e.contains(QUEUED_LAUNCH_FILE), "{e}");
        }
        read
    }

    fn full_value(path: &str) -> Value {
        let mut value = full(std::path::Path::new("/run"));
        let (parent, key) = slot(&mut value, path);
        parent[&key].take()
    }

    #[test]
    fn every_optional_field_absent_null_wrong_or_empty() {
        // What each field reads as when absent, null or empty; `None` for
        // "refused, naming the field".
        let default_of = |path: &str| match path {
            "env" | "steps.env" => json!({}),
            "steps.previousInTask" => json!(false),
            _ => Value::Null,
        };
        let is_map = |path: &str| path.ends_with("env");
        let is_text = |p: &str| {
            matches!(
                p,
                "sessionId" | "sessionRoot" | "steps.taskFile" | "steps.fanoutLabel"
            )
        };
        let full_config = read_with("timeoutMs", &Change::To(json!(1000))).unwrap();
        for (path, value) in optionals(&full_config) {
            assert_eq!(value, full_value(path), "{path} read into its own field");
        }
        for (path, _) in optionals(&full_config) {
            let nullable = !is_map(path) && path != "steps.previousInTask";
            let mut cases = vec![
                ("absent", Change::Absent, Some(default_of(path))),
                (
                    "null",
                    Change::To(Value::Null),
                    nullable.then(|| Value::Null),
                ),
            ];
            let empty = match path {
                p if is_text(p) => Some((json!(""), Some(json!("")))),
                p if is_map(p) => Some((json!({}), Some(json!({})))),
                "revival" | "queue" => Some((json!({}), None)),
                _ => None,
            };
            if let Some((empty, want)) = empty {
                cases.push(("empty", Change::To(empty), want));
            }
            // A descriptor is free-form JSON here (checked where it is
            // used); every other field has a type.
            if path != "fanoutDescriptor" {
                let wrong = if is_text(path) { json!(7) } else { json!("7") };
                cases.push(("wrong type", Change::To(wrong), None));
            }
            for (case, change, want) in cases {
                match (read_with(path, &change), want) {
                    (Ok(config), Some(want)) => {
                        for (other, value) in optionals(&config) {
                            let expected = if other == path {
                                want.clone()
                            } else {
                                full_value(other)
                            };
                            assert_eq!(value, expected, "{path} {case}: {other}");
                        }
                    }
                    (Err(e), None) => {
                        let key = path.rsplit('.').next().unwrap();
                        assert!(e.contains(key), "{path} {case}: names the field: {e}");
                    }
                    (got, want) => panic!("{path} {case}: got {got:?}, wanted {want:?}"),
                }
            }
        }
    }

    #[test]
    fn previous_in_task_false_is_kept_apart_from_true_and_written_as_absent() {
        let off = read_with("steps.previousInTask", &Change::To(json!(false))).unwrap();
        assert!(!off.steps[0].previous_in_task);
        let on = read_with("steps.previousInTask", &Change::To(json!(true))).unwrap();
        assert!(on.steps[0].previous_in_task);
        let written = serde_json::to_value(&off.steps[0]).unwrap();
        assert_eq!(written.get("previousInTask"), None);
        assert_eq!(
            serde_json::to_value(&on.steps[0]).unwrap()["previousInTask"],
            true
        );
    }

    #[test]
    fn a_config_for_another_run_directory_or_without_a_queue_is_no_queued_launch() {
        let tmp = tempfile::tempdir().unwrap();
        let mut value = full(tmp.path());
        value["runDir"] = json!("/elsewhere");
        std::fs::write(tmp.path().join(QUEUED_LAUNCH_FILE), value.to_string()).unwrap();
        assert!(read_queued_launch(tmp.path()).is_none());
        let mut value = full(tmp.path());
        value.as_object_mut().unwrap().remove("queue");
        std::fs::write(tmp.path().join(QUEUED_LAUNCH_FILE), value.to_string()).unwrap();
        assert!(read_queued_launch(tmp.path()).is_none());
        value["queue"] = full(tmp.path())["queue"].take();
        std::fs::write(tmp.path().join(QUEUED_LAUNCH_FILE), value.to_string()).unwrap();
        let config = read_queued_launch(tmp.path()).unwrap();
        let queue = config.queue.unwrap();
        assert_eq!((queue.limit, queue.since), (6, 5000));
    }
}
