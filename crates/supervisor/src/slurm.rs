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

/// The command for one of Slurm's programs. A unit test can stand in for
/// them (a script per program, run by `sh` so that no other test's fork can
/// hold it open for writing when it is executed).
fn command(program: &str) -> Command {
    #[cfg(test)]
    if let Some(dir) = tests::FAKE_BIN.with(|dir| dir.borrow().clone()) {
        let mut command = Command::new("sh");
        command.arg(dir.join(program));
        return command;
    }
    Command::new(program)
}

fn run(program: &str, args: &[&str]) -> Result<Output, String> {
    command(program)
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
    let mut child = command("sbatch")
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
    use std::cell::RefCell;
    use std::path::{Path, PathBuf};

    thread_local! {
        /// Where this thread's stand-ins for Slurm's programs are.
        pub(super) static FAKE_BIN: RefCell<Option<PathBuf>> = const { RefCell::new(None) };
    }

    /// Stand-ins for Slurm's programs, for the test's thread only; each
    /// call appends `program args` to `calls`.
    struct FakeSlurm {
        dir: tempfile::TempDir,
    }

    impl FakeSlurm {
        fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            FAKE_BIN.with(|bin| *bin.borrow_mut() = Some(dir.path().to_owned()));
            FakeSlurm { dir }
        }

        fn tool(&self, program: &str, body: &str) -> &Self {
            let calls = self.dir.path().join("calls");
            let script = format!("echo \"{program} $*\" >> '{}'\n{body}\n", calls.display());
            std::fs::write(self.dir.path().join(program), script).unwrap();
            self
        }

        fn calls(&self) -> String {
            std::fs::read_to_string(self.dir.path().join("calls")).unwrap_or_default()
        }

        fn path(&self) -> &Path {
            self.dir.path()
        }
    }

    impl Drop for FakeSlurm {
        fn drop(&mut self) {
            FAKE_BIN.with(|bin| *bin.borrow_mut() = None);
        }
    }

    const DOWN: &str = "echo 'slurm_load_jobs error: Unable to contact slurm controller (connect failure)' >&2; exit 1";
    const PURGED: &str = "echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1";

    #[test]
    fn the_controller_answers_first() {
        let fake = FakeSlurm::new();
        fake.tool(
            "scontrol",
            "echo 'JobId=12 JobState=RUNNING Reason=None ExitCode=0:0 NodeList=n1'",
        )
        .tool("sacct", "echo 'COMPLETED|0:0|n2'");
        let record = query("12").unwrap().unwrap();
        assert_eq!(
            (record.state.as_str(), record.source),
            ("RUNNING", "scontrol")
        );
        assert_eq!(record.node.as_deref(), Some("n1"));
        assert_eq!(fake.calls(), "scontrol show job -o 12\n");
    }

    #[test]
    fn a_purged_job_is_answered_by_the_completion_log_then_accounting() {
        let fake = FakeSlurm::new();
        fake.tool("scontrol", PURGED).tool(
            "sacct",
            "case \"$1\" in -c) echo 'CANCELLED by 0|0:15|n1';; *) echo 'FAILED|1:0|n2';; esac",
        );
        let record = query("12").unwrap().unwrap();
        assert_eq!(
            (record.state.as_str(), record.source),
            ("CANCELLED", "sacct -c")
        );

        fake.tool(
            "sacct",
            "case \"$1\" in -c) ;; *) echo 'FAILED|1:0|n2';; esac",
        );
        let record = query("12").unwrap().unwrap();
        assert_eq!((record.state.as_str(), record.source), ("FAILED", "sacct"));
        assert_eq!(record.exit_code.as_deref(), Some("1:0"));

        fake.tool("sacct", "exit 1");
        assert_eq!(query("12"), Ok(None));
    }

    #[test]
    fn a_controller_that_cannot_be_asked_is_an_error_not_a_purged_job() {
        let fake = FakeSlurm::new();
        fake.tool("scontrol", DOWN)
            .tool("sacct", "echo 'COMPLETED|0:0|n2'");
        assert_eq!(
            query("12"),
            Err("scontrol show job 12: slurm_load_jobs error: Unable to contact slurm controller (connect failure)".to_owned())
        );
        assert!(!fake.calls().contains("sacct"), "{}", fake.calls());
    }

    #[test]
    fn the_last_line_of_a_message_is_its_reason() {
        use std::os::unix::process::ExitStatusExt;
        let output = |stderr: &str| Output {
            status: std::process::ExitStatus::from_raw(256),
            stdout: Vec::new(),
            stderr: stderr.as_bytes().to_vec(),
        };
        assert_eq!(
            stderr_line(&output(
                "sbatch: warning: x\n  sbatch: error: no partition  \n\n \n"
            )),
            "sbatch: error: no partition"
        );
        assert_eq!(stderr_line(&output("")), "no message");
    }

    #[test]
    fn no_node_is_no_node() {
        for line in [
            "PENDING|0:0|None assigned",
            "PENDING|0:0|(null)",
            "PENDING|0:0|",
        ] {
            assert_eq!(
                parse_sacct("7", "sacct", line).unwrap().node,
                None,
                "{line}"
            );
        }
    }

    #[test]
    fn the_cluster_config_names_its_tracking_and_cluster() {
        let fake = FakeSlurm::new();
        fake.tool(
            "scontrol",
            "echo 'Configuration data as of 2026-12-03T18:00:00'; echo 'AccountingStorageType   = accounting_storage/none'; echo 'ClusterName             = lab'; echo 'ProctrackType           = proctrack/cgroup'",
        );
        assert_eq!(
            cluster_config(),
            Ok(("proctrack/cgroup".to_owned(), Some("lab".to_owned())))
        );
        assert_eq!(fake.calls(), "scontrol show config\n");
        fake.tool("scontrol", "echo 'ProctrackType = proctrack/linuxproc'");
        assert_eq!(
            cluster_config(),
            Ok(("proctrack/linuxproc".to_owned(), None))
        );
        fake.tool("scontrol", "echo 'ClusterName = lab'");
        assert_eq!(
            cluster_config(),
            Err("scontrol show config: no ProctrackType".to_owned())
        );
        fake.tool("scontrol", DOWN);
        assert_eq!(
            cluster_config(),
            Err("scontrol show config: slurm_load_jobs error: Unable to contact slurm controller (connect failure)".to_owned())
        );
    }

    #[test]
    fn a_held_job_is_submitted_with_its_script_on_stdin() {
        let fake = FakeSlurm::new();
        let script = fake.path().join("script");
        fake.tool(
            "sbatch",
            &format!("cat > '{}'; echo '42;lab'", script.display()),
        );
        let args = ["--partition".to_owned(), "debug".to_owned()];
        assert_eq!(
            submit_held("#!/bin/sh\nexec monitor\n", &args),
            Ok(("42".to_owned(), Some("lab".to_owned())))
        );
        assert_eq!(
            std::fs::read_to_string(&script).unwrap(),
            "#!/bin/sh\nexec monitor\n"
        );
        assert_eq!(fake.calls(), "sbatch --parsable --hold --partition debug\n");

        fake.tool("sbatch", "cat > /dev/null; echo 43");
        assert_eq!(submit_held("x", &[]), Ok(("43".to_owned(), None)));
    }

    #[test]
    fn a_refused_or_unreadable_submission_is_an_error() {
        let fake = FakeSlurm::new();
        fake.tool(
            "sbatch",
            "cat > /dev/null; echo 'sbatch: error: invalid partition specified: gpu' >&2; exit 1",
        );
        assert_eq!(
            submit_held("x", &[]),
            Err(
                "sbatch refused the job: sbatch: error: invalid partition specified: gpu"
                    .to_owned()
            )
        );
        fake.tool("sbatch", "cat > /dev/null; echo 'Submitted batch job 44'");
        assert_eq!(
            submit_held("x", &[]),
            Err("sbatch printed no job id: \"Submitted batch job 44\"".to_owned())
        );
    }

    #[test]
    fn release_signal_and_cancel_ask_slurm_and_report_its_refusal() {
        let fake = FakeSlurm::new();
        fake.tool("scontrol", "").tool("scancel", "");
        assert_eq!(release("12"), Ok(()));
        assert_eq!(signal_batch_term("12"), Ok(()));
        assert_eq!(cancel("12"), Ok(()));
        assert_eq!(
            fake.calls(),
            "scontrol release 12\nscancel --batch --signal=TERM 12\nscancel 12\n"
        );
        let refusal = "echo 'scancel: error: Kill job error on job id 12: Invalid job id specified' >&2; exit 1";
        fake.tool("scancel", refusal)
            .tool("scontrol", &refusal.replace("scancel", "scontrol"));
        assert_eq!(
            cancel("12"),
            Err(
                "scancel 12: scancel: error: Kill job error on job id 12: Invalid job id specified"
                    .to_owned()
            )
        );
        assert_eq!(
            signal_batch_term("12"),
            Err("scancel --batch --signal=TERM 12: scancel: error: Kill job error on job id 12: Invalid job id specified".to_owned())
        );
        assert!(
            release("12")
                .unwrap_err()
                .starts_with("scontrol release 12: scontrol: error")
        );
    }

    #[test]
    fn the_evidence_names_the_job_and_who_answered() {
        let record = parse_sacct("7", "sacct -c", "COMPLETED|0:0|n1").unwrap();
        assert_eq!(
            record.evidence(),
            json!({
                "mechanism": "slurm",
                "jobId": "7",
                "state": "COMPLETED",
                "exitCode": "0:0",
                "node": "n1",
                "source": "sacct -c",
            })
        );
    }

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
