//! Slurm's side of a run dispatched to a cluster: submitting the batch job
//! whose script is the run's monitor, signalling it, and asking Slurm what
//! became of it. Only the text forms (`-o`, `-P`) are read: Slurm 22.05's
//! JSON output ignores filters and needs the accounting daemon.
//!
//! Evidence that a job's processes are gone: Slurm reports it terminal and
//! no longer `COMPLETING`, on a cluster whose process tracking is
//! `proctrack/cgroup` (the job's cgroup is emptied before the job leaves
//! `COMPLETING`). A job the controller no longer knows (purged after
//! `MinJobAge`) is answered by the job-completion log (`sacct -c`), else by
//! accounting (`sacct`): a purged job was past `COMPLETING` long before.

use std::io::Write;
use std::process::{Command, Output, Stdio};

use serde_json::{Value, json};

/// Process tracking that makes a terminal job a proof (its cgroup is empty).
pub const CGROUP_PROCTRACK: &str = "proctrack/cgroup";

/// Lets a cluster without cgroup tracking run jobs (a test cluster only):
/// its terminal state then proves nothing, and the docs say so.
pub const ALLOW_LINUXPROC_ENV: &str = "SUBAGENTS_SLURM_ALLOW_LINUXPROC";

/// What Slurm says of one job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobRecord {
    /// The job id.
    pub job_id: String,
    /// `JobState` (`PENDING`, `RUNNING`, `COMPLETING`, `COMPLETED`, ...).
    pub state: String,
    /// `ExitCode` as Slurm prints it (`exit:signal`).
    pub exit_code: Option<String>,
    /// Why a pending job waits (`Resources`, `Priority`, ...).
    pub reason: Option<String>,
    /// The node(s) the job runs or ran on.
    pub node: Option<String>,
    /// Which command answered: `scontrol`, `sacct -c` or `sacct`.
    pub source: &'static str,
}

impl JobRecord {
    /// Terminal and no longer `COMPLETING`: nothing of the job runs.
    pub fn is_over(&self) -> bool {
        is_terminal(&self.state)
    }

    /// One line: `slurm job 12 COMPLETED (exit code 0:0, scontrol)`.
    pub fn describe(&self) -> String {
        let mut line = format!("slurm job {} {}", self.job_id, self.state);
        let mut details = Vec::new();
        if let Some(code) = &self.exit_code {
            details.push(format!("exit code {code}"));
        }
        if let Some(reason) = self.reason.as_deref().filter(|r| *r != "None") {
            details.push(format!("reason {reason}"));
        }
        if let Some(node) = &self.node {
            details.push(format!("node {node}"));
        }
        details.push(self.source.to_owned());
        line.push_str(&format!(" ({})", details.join(", ")));
        line
    }

    /// The mechanism as the proof's observer record carries it.
    pub fn evidence(&self) -> Value {
        json!({
            "mechanism": "slurm",
            "jobId": self.job_id,
            "state": self.state,
            "exitCode": self.exit_code,
            "node": self.node,
            "source": self.source,
        })
    }
}

/// States after which no process of the job runs (with cgroup tracking);
/// `COMPLETING` is not one of them.
pub fn is_terminal(state: &str) -> bool {
    matches!(
        state,
        "COMPLETED"
            | "FAILED"
            | "CANCELLED"
            | "TIMEOUT"
            | "NODE_FAIL"
            | "PREEMPTED"
            | "BOOT_FAIL"
            | "DEADLINE"
            | "OUT_OF_MEMORY"
    )
}

fn run(program: &str, args: &[&str]) -> Result<Output, String> {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("failed to run {program}: {e}"))
}

fn stderr_line(output: &Output) -> String {
    let text = String::from_utf8_lossy(&output.stderr);
    let line = text.lines().rev().find(|l| !l.trim().is_empty());
    line.unwrap_or("no message").trim().to_owned()
}

/// Asks Slurm about `job_id`: the controller, then the completion log,
/// then accounting. `Ok(None)`: nobody knows the job. `Err`: Slurm could
/// not be asked (controller down, commands missing).
pub fn query(job_id: &str) -> Result<Option<JobRecord>, String> {
    let output = run("scontrol", &["show", "job", "-o", job_id])?;
    if output.status.success() {
        return Ok(parse_scontrol(
            job_id,
            &String::from_utf8_lossy(&output.stdout),
        ));
    }
    let why = stderr_line(&output);
    if !why.contains("Invalid job id") {
        return Err(format!("scontrol show job {job_id}: {why}"));
    }
    for (source, args) in [
        (
            "sacct -c",
            vec![
                "-c",
                "-j",
                job_id,
                "-P",
                "-n",
                "-o",
                "state,exitcode,nodelist",
            ],
        ),
        (
            "sacct",
            vec![
                "-X",
                "-j",
                job_id,
                "-P",
                "-n",
                "-o",
                "state,exitcode,nodelist",
            ],
        ),
    ] {
        if let Ok(output) = run("sacct", &args)
            && output.status.success()
            && let Some(record) =
                parse_sacct(job_id, source, &String::from_utf8_lossy(&output.stdout))
        {
            return Ok(Some(record));
        }
    }
    Ok(None)
}

/// Reads `scontrol show job -o` (one line of `Key=Value`).
pub fn parse_scontrol(job_id: &str, text: &str) -> Option<JobRecord> {
    let line = text.lines().find(|l| l.contains("JobState="))?;
    let field = |key: &str| {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
            .map(str::to_owned)
    };
    Some(JobRecord {
        job_id: job_id.to_owned(),
        state: field("JobState")?,
        exit_code: field("ExitCode"),
        reason: field("Reason"),
        node: field("NodeList").filter(|n| !n.is_empty() && n != "(null)"),
        source: "scontrol",
    })
}

/// Reads `sacct -P -n -o state,exitcode,nodelist` (the job's own line first).
pub fn parse_sacct(job_id: &str, source: &'static str, text: &str) -> Option<JobRecord> {
    let line = text.lines().find(|l| !l.trim().is_empty())?;
    let mut fields = line.split('|');
    // `CANCELLED by 0` names who cancelled.
    let state = fields.next()?.split_whitespace().next()?.to_owned();
    let exit_code = fields.next().map(str::to_owned).filter(|c| !c.is_empty());
    let node = fields
        .next()
        .map(str::to_owned)
        .filter(|n| !n.is_empty() && n != "None assigned" && n != "(null)");
    Some(JobRecord {
        job_id: job_id.to_owned(),
        state,
        exit_code,
        reason: None,
        node,
        source,
    })
}

/// The cluster's `ProctrackType` and `ClusterName` (`scontrol show config`).
pub fn cluster_config() -> Result<(String, Option<String>), String> {
    let output = run("scontrol", &["show", "config"])?;
    if !output.status.success() {
        return Err(format!("scontrol show config: {}", stderr_line(&output)));
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let value = |key: &str| {
        text.lines().find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim() == key).then(|| v.trim().to_owned())
        })
    };
    let proctrack = value("ProctrackType").ok_or("scontrol show config: no ProctrackType")?;
    Ok((proctrack, value("ClusterName")))
}

/// Submits `script` (on sbatch's stdin) held, so that nothing of the job
/// runs before the caller recorded it; returns the job id and cluster.
pub fn submit_held(script: &str, args: &[String]) -> Result<(String, Option<String>), String> {
    let mut child = Command::new("sbatch")
        .arg("--parsable")
        .arg("--hold")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("failed to run sbatch: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(script.as_bytes())
            .map_err(|e| format!("failed to hand sbatch its script: {e}"))?;
    }
    let output = child
        .wait_with_output()
        .map_err(|e| format!("failed to run sbatch: {e}"))?;
    if !output.status.success() {
        return Err(format!("sbatch refused the job: {}", stderr_line(&output)));
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let line = text.trim();
    let (id, cluster) = match line.split_once(';') {
        Some((id, cluster)) => (id, Some(cluster.to_owned())),
        None => (line, None),
    };
    if !dispatch::is_job_id(id) {
        return Err(format!("sbatch printed no job id: {line:?}"));
    }
    Ok((id.to_owned(), cluster))
}

/// `scontrol release JOB`: lets a held job start.
pub fn release(job_id: &str) -> Result<(), String> {
    checked("scontrol", &["release", job_id])
}

/// `scancel --batch --signal=TERM JOB`: only the batch script (the run's
/// monitor, which hands it to its runner) is signalled.
pub fn signal_batch_term(job_id: &str) -> Result<(), String> {
    checked("scancel", &["--batch", "--signal=TERM", job_id])
}

/// `scancel JOB`: every process of the job, SIGKILL after `KillWait`.
pub fn cancel(job_id: &str) -> Result<(), String> {
    checked("scancel", &[job_id])
}

fn checked(program: &str, args: &[&str]) -> Result<(), String> {
    let output = run(program, args)?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program} {}: {}",
            args.join(" "),
            stderr_line(&output)
        ))
    }
}

/// Whether cgroup tracking may be done without (the explicit opt-in).
pub fn linuxproc_allowed() -> bool {
    std::env::var(ALLOW_LINUXPROC_ENV).is_ok_and(|v| v == "1")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scontrol_lines_are_read() {
        let line = "JobId=12 JobName=subagents-r1 UserId=root(0) JobState=PENDING Reason=Resources Dependency=(null) ExitCode=0:0 NodeList= Command=(null) WorkDir=/a b";
        let record = parse_scontrol("12", line).unwrap();
        assert_eq!(record.state, "PENDING");
        assert_eq!(record.reason.as_deref(), Some("Resources"));
        assert_eq!(record.node, None);
        assert!(!record.is_over());
        let done = "JobId=12 JobState=COMPLETED Reason=None ExitCode=3:0 NodeList=n2";
        let record = parse_scontrol("12", done).unwrap();
        assert!(record.is_over());
        assert_eq!(record.exit_code.as_deref(), Some("3:0"));
        assert_eq!(record.node.as_deref(), Some("n2"));
        assert_eq!(
            record.describe(),
            "slurm job 12 COMPLETED (exit code 3:0, node n2, scontrol)"
        );
    }

    #[test]
    fn completing_is_not_over() {
        assert!(!is_terminal("COMPLETING"));
        assert!(!is_terminal("RUNNING"));
        assert!(is_terminal("CANCELLED"));
    }

    #[test]
    fn sacct_lines_are_read() {
        let record = parse_sacct("7", "sacct -c", "CANCELLED by 0|0:15|n1\n").unwrap();
        assert_eq!(record.state, "CANCELLED");
        assert_eq!(record.exit_code.as_deref(), Some("0:15"));
        assert_eq!(record.node.as_deref(), Some("n1"));
        assert_eq!(parse_sacct("7", "sacct", "\n"), None);
    }
}
