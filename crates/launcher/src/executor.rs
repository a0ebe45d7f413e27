//! Where a prepared run executes: the seam between preparing a run (run
//! directory, queued status, marker, task files, fan-out claim, capacity
//! slot — the same for every executor) and starting its process tree.
//!
//! * [`Executor::Local`]: today's detached monitor and runner on this
//!   machine (`supervisor::spawn`, unchanged).
//! * [`Executor::Slurm`]: one Slurm batch job whose script runs the monitor
//!   in the foreground, so the job is the run's process tree. The launch
//!   config crosses `sbatch` as a 0600 file in the run directory (it holds
//!   task paths, never task text); `dispatch.json` records the job.
//!
//! A later executor (e.g. Kubernetes Jobs, docs/cluster.md) is one more
//! variant: admit (refuse what cannot prove a run over), start, and the
//! observer's question "is it over?" in `supervisor`.

use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use supervisor::config::LaunchConfig;
use supervisor::slurm;

pub use crate::api::ExecutorKind;
use crate::api::{Launched, RunRequest};
use crate::error::{Error, Result};

/// The environment variable (and, through it, the config key `executor`)
/// that picks the executor when a request names none.
pub const EXECUTOR_ENV: &str = "SUBAGENTS_EXECUTOR";

/// The config file a Slurm job's monitor reads instead of stdin.
pub const LAUNCH_CONFIG_FILE: &str = "launch-config.json";

/// The executor of one launch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Executor {
    /// Today's monitor and runner, spawned here.
    #[default]
    Local,
    /// A Slurm batch job.
    Slurm(SlurmOptions),
}

/// What `sbatch` gets besides what every run's job gets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlurmOptions {
    /// `--partition`.
    pub partition: Option<String>,
    /// Extra `sbatch` options, each `--name=value` or `--flag`.
    pub args: Vec<String>,
    /// The cluster's name, learned when the cluster was admitted.
    pub cluster: Option<String>,
}

/// Options we set ourselves; a request may not override them.
const RESERVED: [&str; 17] = [
    "-o",
    "--output",
    "-e",
    "--error",
    "-D",
    "--chdir",
    "--wrap",
    "-J",
    "--job-name",
    "-H",
    "--hold",
    "--parsable",
    "-W",
    "--wait",
    "--open-mode",
    "--export",
    "--array",
];

impl Executor {
    /// The request's executor (else `$SUBAGENTS_EXECUTOR`, else the agent
    /// definition's, else local) and its Slurm options.
    pub fn of_request(
        run: &RunRequest,
        definition: Option<&agents::AgentDefinition>,
    ) -> Result<Self> {
        let named = match run.executor {
            Some(kind) => Some(kind),
            None => match std::env::var(EXECUTOR_ENV).ok().filter(|v| !v.is_empty()) {
                Some(text) => Some(ExecutorKind::parse(&text).ok_or_else(|| {
                    Error::usage(format!(
                        "failed to launch run: {EXECUTOR_ENV} must be \"local\" or \"slurm\", not '{text}'"
                    ))
                })?),
                None => None,
            },
        };
        let from_definition = definition.and_then(|d| d.executor.as_deref());
        let kind = match (named, from_definition) {
            (Some(kind), _) => kind,
            (None, Some(text)) => ExecutorKind::parse(text).ok_or_else(|| {
                Error::usage(format!(
                    "failed to launch run: agent executor must be \"local\" or \"slurm\", not '{text}'"
                ))
            })?,
            (None, None) => ExecutorKind::Local,
        };
        let partition = run
            .slurm_partition
            .clone()
            .or_else(|| definition.and_then(|d| d.slurm_partition.clone()));
        let mut args = definition.map(|d| d.slurm_args.clone()).unwrap_or_default();
        args.extend(run.slurm_args.iter().cloned());
        if kind == ExecutorKind::Local {
            if run.slurm_partition.is_some() || !run.slurm_args.is_empty() {
                return Err(Error::usage(
                    "failed to launch run: slurm options need the slurm executor",
                )
                .with_hint("add --executor slurm"));
            }
            return Ok(Self::Local);
        }
        check_partition(partition.as_deref())?;
        check_args(&args)?;
        Ok(Self::Slurm(SlurmOptions {
            partition,
            args,
            cluster: None,
        }))
    }

    /// Before anything is reserved: refuses a cluster whose terminal job
    /// state would not prove the run's processes gone.
    pub fn admit(&mut self) -> Result {
        let Self::Slurm(options) = self else {
            return Ok(());
        };
        let (proctrack, cluster) = slurm::cluster_config()
            .map_err(|why| Error::failed(format!("failed to reach the slurm cluster: {why}")))?;
        if proctrack != slurm::CGROUP_PROCTRACK && !slurm::linuxproc_allowed() {
            return Err(Error::failed(format!(
                "failed to launch run: the slurm cluster tracks processes with {proctrack}, not {}: a finished job would not prove its processes gone",
                slurm::CGROUP_PROCTRACK
            )));
        }
        options.cluster = cluster.filter(|c| dispatch::is_name(c));
        Ok(())
    }

    /// Starts the prepared run. Local: the detached monitor, as before.
    /// Slurm: the job is submitted held, recorded in `dispatch.json`, then
    /// released, so that its monitor always finds the record.
    pub fn start(&self, config: &LaunchConfig) -> std::io::Result<Launched> {
        match self {
            Self::Local => supervisor::spawn::spawn(config).map(Launched::from),
            Self::Slurm(options) => submit(config, options).map_err(std::io::Error::other),
        }
    }
}

/// Whether this process is a COMMAND of a run held by Slurm (its
/// `$SUBAGENTS_RUN_ID` names a run of this root with a Slurm
/// `dispatch.json`) and nothing names an executor: a nested run then
/// inherits the executor.
pub fn inside_slurm_run(layout: &status::Layout) -> bool {
    if std::env::var_os(EXECUTOR_ENV).is_some_and(|v| !v.is_empty()) {
        return false;
    }
    let Some(parent) = std::env::var("SUBAGENTS_RUN_ID")
        .ok()
        .filter(|id| !id.is_empty() && !id.contains('/') && id != "." && id != "..")
    else {
        return false;
    };
    matches!(
        dispatch::read(&layout.run_dir(&parent)),
        Ok(Some(record)) if record.executor == dispatch::Executor::Slurm
    )
}

fn check_partition(partition: Option<&str>) -> Result {
    match partition {
        Some(p) if !dispatch::is_name(p) => Err(Error::usage(format!(
            "failed to launch run: slurm partition '{}' is not a partition name",
            atomic_file::escape(p)
        ))
        .with_hint("letters, digits, '.', '_' and '-'")),
        _ => Ok(()),
    }
}

fn check_args(args: &[String]) -> Result {
    for arg in args {
        let name = arg.split_once('=').map_or(arg.as_str(), |(n, _)| n);
        if !arg.starts_with('-') || RESERVED.contains(&name) || arg.contains('\n') {
            return Err(Error::usage(format!(
                "failed to launch run: slurm argument '{}' is not allowed",
                atomic_file::escape(arg)
            ))
            .with_hint("give sbatch options as --name=value; output, job name, working directory and hold are set by subagents"));
        }
    }
    Ok(())
}

fn submit(config: &LaunchConfig, options: &SlurmOptions) -> Result<Launched, String> {
    let dir = &config.run_dir;
    let file = dir.join(LAUNCH_CONFIG_FILE);
    atomic_file::write_json(&file, config).map_err(|e| e.to_string())?;
    // Slurm creates missing output files with its own umask: ours are 0600.
    for name in [
        status::layout::files::RUNNER_STDOUT,
        status::layout::files::RUNNER_STDERR,
    ] {
        std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(atomic_file::FILE_MODE)
            .open(dir.join(name))
            .map_err(|e| format!("failed to create '{}': {e}", dir.join(name).display()))?;
    }
    let exe = std::env::current_exe().map_err(|e| format!("failed to find this program: {e}"))?;
    let script = job_script(&exe, &config.run_id, &file);
    let (job_id, cluster) = slurm::submit_held(&script, &sbatch_args(config, options))?;
    let record = dispatch::Dispatch::slurm(
        &job_id,
        options.partition.clone(),
        cluster.or_else(|| options.cluster.clone()),
        status::now_ms(),
    );
    if let Err(e) = dispatch::write(dir, &record) {
        let _ = slurm::cancel(&job_id);
        return Err(format!("failed to record slurm job {job_id}: {e}"));
    }
    if let Err(why) = slurm::release(&job_id) {
        // The record stays: the observer finalizes the run once Slurm
        // reports the cancelled job over.
        let _ = slurm::cancel(&job_id);
        return Err(format!("failed to release slurm job {job_id}: {why}"));
    }
    Ok(Launched {
        run_id: config.run_id.clone(),
        async_dir: dir.clone(),
        pid: 0,
        runner_process_instance_id: config.runner_process_instance_id.clone(),
        executor: Some(ExecutorKind::Slurm),
        job_id: Some(job_id),
        queued_for_slot: None,
    })
}

/// The batch script: the monitor in the foreground (`exec`), so the job
/// is the run's process tree and `scancel --batch` reaches the monitor.
fn job_script(exe: &Path, run_id: &str, config_file: &Path) -> String {
    format!(
        "#!/bin/sh\n# subagents run {run_id}\nunset {ready}\nexec {exe} __monitor {run_id} {arg} {file}\n",
        ready = supervisor::config::READY_FD_ENV,
        exe = shell_quote(&exe.to_string_lossy()),
        run_id = shell_quote(run_id),
        arg = supervisor::monitor::CONFIG_FILE_ARG,
        file = shell_quote(&config_file.to_string_lossy()),
    )
}

fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// `%` starts a Slurm file-name pattern; `%%` is a literal one.
fn slurm_path(path: &Path) -> String {
    path.to_string_lossy().replace('%', "%%")
}

fn sbatch_args(config: &LaunchConfig, options: &SlurmOptions) -> Vec<String> {
    let dir = &config.run_dir;
    let mut args = vec![
        format!("--job-name=subagents-{}", config.run_id),
        format!(
            "--output={}",
            slurm_path(&dir.join(status::layout::files::RUNNER_STDOUT))
        ),
        format!(
            "--error={}",
            slurm_path(&dir.join(status::layout::files::RUNNER_STDERR))
        ),
        "--open-mode=append".into(),
        format!("--chdir={}", dir.display()),
        "--nodes=1".into(),
        "--ntasks=1".into(),
    ];
    if let Some(partition) = &options.partition {
        args.push(format!("--partition={partition}"));
    }
    if let Some(minutes) = time_limit_minutes(config.timeout_ms) {
        args.push(format!("--time={minutes}"));
    }
    args.extend(options.args.iter().cloned());
    args
}

/// Slurm's `--time` is whole minutes: a backstop above our own deadline
/// (the run's timeout plus the runner's kill grace), never the deadline.
pub fn time_limit_minutes(timeout_ms: Option<u64>) -> Option<u64> {
    let ms = timeout_ms.filter(|ms| *ms > 0)?;
    Some(ms.div_ceil(60_000) + 2)
}

/// The key under which `status`, `list` and `top` show a dispatched run's
/// record and Slurm's view of it (never written to `status.json`).
pub const DISPATCH_VIEW_KEY: &str = "dispatch";

/// `status` with its `dispatch` view added when the run was sent to an
/// executor: executor, cluster, job id, node; for an active run also what
/// Slurm says now (`slurmState`, and `slurmReason` while it waits).
pub fn with_dispatch(dir: &Path, mut status: status::RunStatus) -> status::RunStatus {
    let Ok(Some(record)) = dispatch::read(dir) else {
        return status;
    };
    let mut view = serde_json::json!({
        "executor": record.executor.as_str(),
        "cluster": record.cluster,
        "jobId": record.job_id,
        "partition": record.partition,
        "node": record.node,
    });
    if status.state.is_active()
        && let Ok(Some(job)) = slurm::query(&record.job_id)
    {
        view["slurmState"] = serde_json::json!(job.state);
        if let Some(reason) = job.reason.filter(|r| r != "None") {
            view["slurmReason"] = serde_json::json!(reason);
        }
        if view["node"].is_null() && job.state != "PENDING" {
            view["node"] = serde_json::json!(job.node);
        }
    }
    status.extra.insert(DISPATCH_VIEW_KEY.into(), view);
    status
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_time_limit_is_above_the_deadline() {
        assert_eq!(time_limit_minutes(None), None);
        assert_eq!(time_limit_minutes(Some(0)), None);
        assert_eq!(time_limit_minutes(Some(1)), Some(3));
        assert_eq!(time_limit_minutes(Some(60_000)), Some(3));
        assert_eq!(time_limit_minutes(Some(60_001)), Some(4));
    }

    #[test]
    fn reserved_and_positional_arguments_are_refused() {
        assert!(check_args(&["--mem=1G".into(), "--exclusive".into()]).is_ok());
        for bad in ["--output=x", "-J", "script.sh", "--wrap=true", "--hold"] {
            assert!(check_args(&[bad.into()]).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_script_quotes_every_path() {
        let script = job_script(Path::new("/opt/it's/subagents"), "r1", Path::new("/a b/c"));
        assert!(
            script.contains(r"exec '/opt/it'\''s/subagents' __monitor 'r1' --config-file '/a b/c'"),
            "{script}"
        );
    }
}
