//! The observer of a run: the code that proves a run's processes are gone and
//! writes its process-terminal proof, shared by the monitor (which waited on
//! the runner) and by every command that meets a run whose monitor is gone.
//!
//! The monitor normally finalizes a run ([`finish`] with [`Role::Monitor`]).
//! When the monitor was killed, nobody waits on the runner any more; then
//! [`observe`] takes over, from evidence only:
//!
//! * the identities recorded in `status.json` (pid + start time + boot id):
//!   the monitor's, the runner's, the launcher's and each step COMMAND's;
//! * the monitor's session: the monitor is a session leader, and every
//!   process of the run that did not start a session of its own (runner,
//!   COMMANDs, their children, orphans) stays in it. The kernel keeps a pid
//!   reserved while any process uses it as a session or group id, so once the
//!   monitor is dead every member of a session named by its pid is ours;
//! * `/proc`.
//!
//! The decision is the pure function [`judge`]: a live monitor is deferred
//! to, a live runner means the run is still running (a later pass finalizes
//! it), a run that never had a runner and whose launcher and monitor are gone
//! is abandoned. Otherwise the observer terminates what is left of the run's
//! groups and session (SIGTERM, then SIGKILL, with identity checks), proves
//! that nothing is left, repairs a status the runner never finished (from
//! `events.jsonl` when every step's end is recorded there), writes the
//! candidate from what it witnessed and finalizes an `observed` proof. The
//! runner instance record of that proof carries an extra `observer` object
//! (`{"role": "reconciler", "reason": …, "pid": …}`): the reference's proof
//! reader accepts extra keys in instance records.
//!
//! Processes that left the run's session and groups (`setsid` daemons) are
//! found by the `SUBAGENTS_RUN_ID=<run>` entry the runner puts in every
//! COMMAND's environment, as the runner itself finds them as their
//! subreaper; the monitors and runners of nested runs started from the run
//! carry that entry too and are spared, since they outlive the COMMAND that
//! started them.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use process_identity::{Liveness, ProcessIdentity};
use serde_json::{Value, json};
use status::layout::files;
use status::model::{read_status, update_status};
use status::proof::{self, Candidate, ProcessTerminal, ProcessTree, ProofState, RunnerClose};
use status::{Layout, RunState, RunStatus, events, index, now_ms, reconcile};

use crate::procs::Ended;

/// Who finalizes a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The runner's parent, which waited on it.
    Monitor,
    /// Any other process, acting because the monitor is gone.
    Reconciler,
}

impl Role {
    /// `monitor` or `reconciler`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Monitor => "monitor",
            Self::Reconciler => "reconciler",
        }
    }
}

/// What is known about one recorded process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Presence {
    /// No identity was recorded.
    NotRecorded,
    /// The very process recorded runs.
    Alive(ProcessIdentity),
    /// It is gone (or its pid belongs to another process now).
    Dead(ProcessIdentity),
    /// `/proc` could not tell.
    Unknown(ProcessIdentity),
    /// It was recorded on another machine: never probed here.
    Foreign(ProcessIdentity),
}

impl Presence {
    /// Checks a recorded identity now.
    pub fn of(identity: Option<&ProcessIdentity>) -> Self {
        let Some(identity) = identity else {
            return Self::NotRecorded;
        };
        match identity.liveness() {
            Liveness::Alive => Self::Alive(identity.clone()),
            Liveness::Dead => Self::Dead(identity.clone()),
            Liveness::Unknown => Self::Unknown(identity.clone()),
            Liveness::Foreign => Self::Foreign(identity.clone()),
        }
    }

    /// The recorded process is dead because its record is of another boot
    /// of this machine: its numbers name nothing of the run now.
    fn is_past_boot(&self) -> bool {
        matches!(self, Self::Dead(identity) if !identity.is_of_this_boot())
    }

    /// The other machine's name, for a process recorded there.
    fn foreign_host(&self) -> Option<String> {
        match self {
            Self::Foreign(identity) => Some(host_of(identity)),
            _ => None,
        }
    }
}

/// How a process of another machine is named: its host name, else its
/// machine id.
fn host_of(identity: &ProcessIdentity) -> String {
    identity
        .foreign_host()
        .unwrap_or("another machine")
        .to_owned()
}

/// The facts [`judge`] decides from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    /// The run state in `status.json`.
    pub state: RunState,
    /// A durable `observed`/`unknown` proof exists, or the status records
    /// `not-started`: nothing is left to finalize.
    pub proof_final: bool,
    /// The monitor.
    pub monitor: Presence,
    /// The runner.
    pub runner: Presence,
    /// The process that wrote the queued record.
    pub launcher: Presence,
    /// Live members of the dead monitor's session; `None` when they cannot
    /// be told (no monitor recorded, monitor alive, or `/proc` unreadable).
    /// Empty for a monitor of another boot: its session ended with that boot.
    pub session: Option<Vec<u32>>,
}

impl Facts {
    /// The other machine that recorded the monitor, runner or launcher.
    fn foreign_host(&self) -> Option<String> {
        [&self.monitor, &self.runner, &self.launcher]
            .into_iter()
            .find_map(Presence::foreign_host)
    }

    /// Whether a recorded process of the run is of another boot of this
    /// machine: then none of the run's pid, group or session numbers may be
    /// used to find or signal anything in this boot.
    fn of_past_boot(&self) -> bool {
        [&self.monitor, &self.runner, &self.launcher]
            .into_iter()
            .any(Presence::is_past_boot)
    }
}

/// What [`judge`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The proof is already final.
    Final,
    /// The monitor lives and will finalize the run itself.
    MonitorAlive(u32),
    /// The monitor is gone but the runner still runs the steps; a later
    /// pass finalizes the run once it has exited.
    RunnerAlive(u32),
    /// Queued and its launcher is alive: it is still being started.
    Launching(u32),
    /// The monitor is gone and no runner is recorded, but a process of the
    /// monitor's session lives: a runner that has not written its status yet.
    Starting(u32),
    /// No runner was ever recorded, and the launcher and monitor are gone
    /// with nothing left of their session: the run never started.
    Abandoned,
    /// The runner was recorded and is gone: end what is left and finalize.
    Settle,
    /// Liveness cannot be decided; one line naming the process.
    Unprovable(String),
    /// Nothing of ours was recorded (e.g. a run of the reference): left to
    /// the stale-run rules.
    Foreign,
    /// A process of the run was recorded on another machine (named here):
    /// only that machine can observe and finalize it.
    OtherHost(String),
}

/// Decides what an observer may do with a run (pure).
pub fn judge(facts: &Facts) -> Verdict {
    if facts.proof_final {
        return Verdict::Final;
    }
    if let Some(host) = facts.foreign_host() {
        return Verdict::OtherHost(host);
    }
    match &facts.monitor {
        Presence::Alive(m) => return Verdict::MonitorAlive(m.pid),
        Presence::Unknown(m) => return Verdict::Unprovable(unknown_line("monitor", m)),
        _ => {}
    }
    match &facts.runner {
        Presence::Alive(r) => Verdict::RunnerAlive(r.pid),
        Presence::Unknown(r) => Verdict::Unprovable(unknown_line("runner", r)),
        Presence::Dead(_) => Verdict::Settle,
        Presence::NotRecorded => judge_unstarted(facts),
        Presence::Foreign(r) => Verdict::OtherHost(host_of(r)),
    }
}

fn judge_unstarted(facts: &Facts) -> Verdict {
    if let Presence::Dead(m) = &facts.monitor {
        return match &facts.session {
            Some(live) if live.is_empty() => Verdict::Abandoned,
            Some(live) => Verdict::Starting(live[0]),
            None => Verdict::Unprovable(format!(
                "processes of the session of monitor {} cannot be listed",
                m.pid
            )),
        };
    }
    if facts.state != RunState::Queued {
        return Verdict::Foreign;
    }
    match &facts.launcher {
        Presence::Alive(l) => Verdict::Launching(l.pid),
        Presence::Dead(_) => Verdict::Abandoned,
        Presence::Unknown(l) => Verdict::Unprovable(unknown_line("launcher", l)),
        Presence::NotRecorded => Verdict::Foreign,
        Presence::Foreign(l) => Verdict::OtherHost(host_of(l)),
    }
}

fn unknown_line(what: &str, identity: &ProcessIdentity) -> String {
    format!(
        "{what} process {} (start time {}) cannot be checked: /proc/{} is unreadable",
        identity.pid, identity.start_time, identity.pid
    )
}

/// How to observe.
#[derive(Debug, Clone)]
pub struct Options {
    /// The state root (session leases are looked up under it).
    pub root: PathBuf,
    /// How long leftovers get after SIGTERM.
    pub term_grace: Duration,
    /// How long leftovers get after SIGKILL.
    pub kill_grace: Duration,
    /// A stop was requested: a repaired run becomes `stopped` with this error.
    pub stop_reason: Option<String>,
}

impl Options {
    /// Defaults for a state root: 1 s SIGTERM grace, 1 s SIGKILL grace.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            term_grace: Duration::from_secs(1),
            kill_grace: Duration::from_secs(1),
            stop_reason: None,
        }
    }
}

/// What one observation found or did.
#[derive(Debug, Clone)]
pub enum Observation {
    /// There is no status.
    NoStatus,
    /// The proof was already final.
    Final,
    /// The monitor lives; nothing was done.
    MonitorAlive(u32),
    /// The runner still runs without its monitor; nothing was done.
    RunnerAlive(u32),
    /// The run is being started (launcher alive or runner starting), or
    /// another observer is at work; nothing was done.
    Waiting(String),
    /// Some process of the run may be alive; the slot and marker stay.
    Unproven(String),
    /// Not a run this observer can judge.
    Foreign,
    /// The run's processes were recorded on another machine (named here);
    /// nothing was probed or done.
    OtherHost(String),
    /// The run never started: recorded failed with a `not-started` proof,
    /// marker released.
    Abandoned(String),
    /// A queued run whose monitor was gone waits for its capacity slot
    /// again, under the monitor started here (its pid).
    Requeued(u32),
    /// Every process of the run is gone and the proof is final.
    Finalized {
        /// The durable proof.
        proof: Box<ProcessTerminal>,
        /// The repair message, when the runner never wrote its final status.
        repaired: Option<String>,
        /// Why the observer acted.
        reason: String,
    },
}

impl Observation {
    /// One line for a report, for observations that changed something or
    /// that keep a run from being released.
    pub fn line(&self) -> Option<String> {
        match self {
            Self::Unproven(why) => Some(format!("retained: {why}")),
            Self::OtherHost(host) => Some(format!("left to {host}: it runs there")),
            Self::Abandoned(why) => Some(format!("failed (never started): {why}")),
            Self::Requeued(pid) => Some(format!(
                "waiting for a capacity slot again: its monitor was gone, monitor {pid} took over"
            )),
            Self::Finalized { proof, reason, .. } => {
                let mut line = format!("process terminal {}: {reason}", proof.state.as_str());
                if let Some(r) = &proof.reason {
                    line.push_str(&format!(" ({r})"));
                }
                Some(line)
            }
            _ => None,
        }
    }
}

/// Observes every run of the active index; returns `(run id, observation)`.
pub fn observe_active(layout: &Layout, options: &Options) -> Vec<(String, Observation)> {
    let names = index::read_index(&layout.runs_dir()).unwrap_or_default();
    let Some(run_dir) = status::layout::exact_run_dirs(layout) else {
        return Vec::new();
    };
    names
        .into_iter()
        .filter_map(|id| {
            let dir = run_dir(&id)?;
            Some((id, observe(&dir, options)))
        })
        .collect()
}

/// Observes one run directory: decides with [`judge`] and, when the monitor
/// is gone, ends what is left of the run and finalizes it.
pub fn observe(run_dir: &Path, options: &Options) -> Observation {
    let Some(status) = status_or_stand_in(run_dir) else {
        return Observation::NoStatus;
    };
    observe_read(run_dir, &status, options)
}

/// The run's status; when it exists but cannot be read (damaged), a
/// stand-in made from `run-processes.json` ([`stand_in`]).
fn status_or_stand_in(run_dir: &Path) -> Option<RunStatus> {
    match read_status(run_dir) {
        Ok(status) => status,
        Err(_) => stand_in(run_dir),
    }
}

/// What `run-processes.json` says of a run whose status is damaged, as a
/// status of a running run: its id, session, runner instance, monitor and
/// runner. Enough to judge the run, end what is left of it (the monitor's
/// session and the processes tagged with the run id) and prove it over;
/// never written back. `None` without a readable record.
pub fn stand_in(run_dir: &Path) -> Option<RunStatus> {
    let record = status::processes::read(run_dir).ok().flatten()?;
    let mut status = RunStatus::new(record.run_id, RunState::Running);
    status.session_id = record.session_id;
    status.pid = Some(record.runner.pid);
    status.runner_identity = Some(record.runner);
    status.monitor_identity = Some(record.monitor);
    status.runner_process_instance_id = Some(record.runner_process_instance_id);
    Some(status)
}

/// [`observe`] of the status a listing just read from `run_dir`; returns
/// the status to list: the one given when the observer left the run to its
/// live monitor (the common case), else the file read again, since the
/// observer may have written it.
pub fn observe_status(
    run_dir: &Path,
    status: RunStatus,
    options: &Options,
) -> status::Result<Option<RunStatus>> {
    match observe_read(run_dir, &status, options) {
        Observation::MonitorAlive(_) => Ok(Some(status)),
        _ => read_status(run_dir),
    }
}

fn observe_read(run_dir: &Path, status: &RunStatus, options: &Options) -> Observation {
    // Cheap exit before any /proc scan or lock: most runs are final. A
    // finalizer that died right after writing the proof left its overlay,
    // event or marker release undone: finish them here.
    // A final proof under a status still active: its finalizer could not
    // write the repair (full or read-only root); settled below like a run
    // without a proof.
    if let Some(proof) = final_proof(run_dir, status).filter(|_| !status.state.is_active()) {
        // A live monitor is still persisting it itself.
        let monitor_alive = matches!(
            Presence::of(status.monitor_identity.as_ref()),
            Presence::Alive(_)
        );
        if !monitor_alive
            && proof::persistence_unfinished(run_dir, &proof)
            && let Some(_lock) = ObserverLock::try_take(run_dir)
        {
            let run_id = reconcile::run_id_of(run_dir, status);
            let release = |proof: &ProcessTerminal| {
                if proof.state == ProofState::Observed {
                    release_slot(&options.root, run_dir, &run_id, None);
                }
            };
            proof::complete_persisted_then(run_dir, &run_id, &proof, now_ms(), &release);
        }
        return Observation::Final;
    }
    if projects_not_started(status) {
        return Observation::Final;
    }
    // A run sent to an executor is judged by the executor, from any host
    // that shares the root: nothing of it is looked for in this /proc.
    match dispatch::read(run_dir) {
        Ok(Some(record)) => return observe_dispatched(run_dir, status, &record, options),
        Ok(None) => {}
        Err(e) => return Observation::Unproven(e.to_string()),
    }
    // A live monitor finalizes its run itself: nothing to lock or re-read
    // (the common case of `list`, once per active run). Decided as `judge`
    // decides it under the lock.
    match Presence::of(status.monitor_identity.as_ref()) {
        Presence::Alive(monitor) => return Observation::MonitorAlive(monitor.pid),
        Presence::Foreign(monitor) => return Observation::OtherHost(host_of(&monitor)),
        _ => {}
    }
    let Some(_lock) = ObserverLock::try_take(run_dir) else {
        return Observation::Waiting("another observer is finalizing this run".into());
    };
    // Re-read under the lock: another observer may have just finished.
    let Some(status) = status_or_stand_in(run_dir) else {
        return Observation::NoStatus;
    };
    let facts = gather(run_dir, &status);
    match judge(&facts) {
        Verdict::Final => Observation::Final,
        Verdict::MonitorAlive(pid) => Observation::MonitorAlive(pid),
        Verdict::RunnerAlive(pid) => Observation::RunnerAlive(pid),
        Verdict::Launching(pid) => Observation::Waiting(format!("launcher {pid} is starting it")),
        Verdict::Starting(pid) => Observation::Waiting(format!(
            "process {pid} of its monitor's session is alive (a runner starting)"
        )),
        Verdict::Unprovable(why) => Observation::Unproven(why),
        Verdict::Foreign => Observation::Foreign,
        Verdict::OtherHost(host) => Observation::OtherHost(host),
        Verdict::Abandoned => match restart_wait(run_dir, &status, &options.root) {
            Ok(Some(pid)) => Observation::Requeued(pid),
            Ok(None) => abandon(run_dir, &status, &facts, &options.root, None),
            Err(why) => abandon(run_dir, &status, &facts, &options.root, Some(&why)),
        },
        Verdict::Settle => settle(run_dir, &status, &facts, options),
    }
}

/// How long a Slurm job may stay `RUNNING` after its run's status is
/// final before the observer says why it keeps the run: a SIGKILLed
/// `slurmstepd` leaves its job `RUNNING` (a known Slurm fault).
pub const SLURM_STUCK_ENV: &str = "SUBAGENTS_SLURM_STUCK_MS";
const SLURM_STUCK_DEFAULT_MS: u64 = 60_000;

/// A run whose `dispatch.json` names a Slurm job: over only when Slurm
/// reports the job terminal and not `COMPLETING` (with `proctrack/cgroup`
/// its processes are then gone); then finalized with an `observed` proof
/// whose observer record names the job, its state and exit code.
fn observe_dispatched(
    run_dir: &Path,
    status: &RunStatus,
    record: &dispatch::Dispatch,
    options: &Options,
) -> Observation {
    let job = match crate::slurm::query(&record.job_id) {
        Ok(Some(job)) => job,
        Ok(None) => {
            return Observation::Unproven(format!(
                "slurm knows no job {} (controller, completion log and accounting asked)",
                record.job_id
            ));
        }
        Err(why) => return Observation::Unproven(format!("slurm cannot be asked: {why}")),
    };
    if !job.is_over() {
        return match stuck_for(status, &job) {
            Some(ms) => Observation::Unproven(format!(
                "{} {} s after the run's status became final: its slurmstepd may be gone; the run is kept until Slurm ends the job",
                job.describe(),
                ms / 1000
            )),
            None => Observation::Waiting(job.describe()),
        };
    }
    let Some(_lock) = ObserverLock::try_take(run_dir) else {
        return Observation::Waiting("another observer is finalizing this run".into());
    };
    let Some(status) = status_or_stand_in(run_dir) else {
        return Observation::NoStatus;
    };
    if proof_is_final(run_dir, &status) {
        return Observation::Final;
    }
    let run_id = reconcile::run_id_of(run_dir, &status);
    let reason = format!("{}: every process of the job is gone", job.describe());
    let witness = Witness {
        role: Role::Reconciler,
        reason: Some(reason.clone()),
        runner_instance_id: runner_instance_id(&status),
        runner_end: None,
        closed_at: now_ms(),
        reaped: BTreeMap::new(),
        groups_gone: step_groups(&status)
            .iter()
            .map(|(i, _)| (*i, true))
            .collect(),
        stop_reason: options.stop_reason.clone(),
        evidence: Some(job.evidence()),
    };
    let (proof, repaired) = finish(run_dir, &run_id, &options.root, &witness);
    Observation::Finalized {
        proof: Box::new(proof),
        repaired,
        reason,
    }
}

/// How long (ms) a job has been `RUNNING` past the bound while its run's
/// status is final; `None` within the bound or when the run is not final.
fn stuck_for(status: &RunStatus, job: &crate::slurm::JobRecord) -> Option<u64> {
    if job.state != "RUNNING" || status.state.is_active() {
        return None;
    }
    let bound = std::env::var(SLURM_STUCK_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(SLURM_STUCK_DEFAULT_MS);
    let since = now_ms().saturating_sub(status.last_update?);
    (since > bound).then_some(since)
}

/// Reads the evidence of a run.
pub fn gather(run_dir: &Path, status: &RunStatus) -> Facts {
    let monitor = Presence::of(status.monitor_identity.as_ref());
    let session = match &monitor {
        // Its session ended with its boot; the number may be anyone's now.
        Presence::Dead(m) if !m.is_of_this_boot() => Some(Vec::new()),
        Presence::Dead(m) => session_of_dead_leader(m).ok(),
        _ => None,
    };
    Facts {
        state: status.state,
        proof_final: proof_is_final(run_dir, status),
        monitor,
        runner: Presence::of(status.runner_identity.as_ref()),
        launcher: Presence::of(status.launcher_identity.as_ref()),
        session,
    }
}

/// Nothing is left to finalize: the run never started, or its proof is
/// final and its status too (a status still active under a final proof is
/// a repair that could not be written).
fn proof_is_final(run_dir: &Path, status: &RunStatus) -> bool {
    projects_not_started(status)
        || (!status.state.is_active() && final_proof(run_dir, status).is_some())
}

/// The status records a `not-started` proof: the run never started.
fn projects_not_started(status: &RunStatus) -> bool {
    let projected = status
        .process_terminal
        .as_ref()
        .and_then(|p| p.get("state"))
        .and_then(Value::as_str);
    projected == Some(ProofState::NotStarted.as_str())
}

/// The run's `process-terminal.json` when it is final (observed or unknown).
fn final_proof(run_dir: &Path, status: &RunStatus) -> Option<ProcessTerminal> {
    let fallback = proof::Fallback {
        run_id: Some(reconcile::run_id_of(run_dir, status)),
        runner_process_instance_id: status.runner_process_instance_id.clone(),
    };
    proof::read_proof(run_dir, &fallback)
        .filter(|p| matches!(p.state, ProofState::Observed | ProofState::Unknown))
}

/// Live members of the session a dead leader created. When the leader's pid
/// is in use again, the kernel had released it, which it only does once no
/// process uses it as a session id: then nothing of ours is left.
fn session_of_dead_leader(leader: &ProcessIdentity) -> std::io::Result<Vec<u32>> {
    if process_identity::read_stat(leader.pid).is_ok() {
        return Ok(Vec::new());
    }
    process_identity::session_members(leader.pid)
}

/// A non-blocking `flock` on `.observer.lock`, so two commands never
/// finalize the same run at once. Dies with its holder.
struct ObserverLock {
    _file: File,
}

impl ObserverLock {
    fn try_take(run_dir: &Path) -> Option<Self> {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(atomic_file::FILE_MODE)
            .custom_flags(libc::O_NOFOLLOW)
            .open(run_dir.join(".observer.lock"))
            .ok()?;
        file.try_lock().ok()?;
        Some(Self { _file: file })
    }
}

/// A queued run still in its session's line whose monitor is gone (killed,
/// or a reboot) has its wait restarted rather than being given up: a new
/// monitor, from the launch config kept in the run directory, keeps the
/// run's place in the line. Returns that monitor's pid; `None` for a run
/// not waiting in a line; why, when its wait cannot be restarted (a
/// damaged `queued-launch.json`, a monitor that failed to start).
fn restart_wait(run_dir: &Path, status: &RunStatus, root: &Path) -> Result<Option<u32>, String> {
    if status::slot_wait::queued_for_slot(status).is_none() {
        return Ok(None);
    }
    let Some(session) = status.session_id.as_deref() else {
        return Ok(None);
    };
    let pools = capacity::Capacity::new(Layout::new(root).capacity_dir());
    let run_id = reconcile::run_id_of(run_dir, status);
    if !pools.is_queued(session, &run_id) {
        return Ok(None);
    }
    crate::slot_wait::restart(run_dir).map(Some)
}

/// No runner ever existed and nobody is left to start one: failed, with a
/// `not-started` proof, and the marker goes (no process can be behind it).
fn abandon(
    run_dir: &Path,
    status: &RunStatus,
    facts: &Facts,
    root: &Path,
    no_restart: Option<&str>,
) -> Observation {
    let who = match (&facts.monitor, &facts.launcher) {
        (Presence::Dead(m), _) => format!("its monitor {} exited", m.pid),
        (_, Presence::Dead(l)) => format!("its launcher {} exited", l.pid),
        _ => "its starters are gone".to_owned(),
    };
    let mut message = format!(
        "Async run never started a runner: {who} first. Marked run failed by the observer."
    );
    // A queued run whose wait could not be restarted says why.
    if let Some(why) = no_restart {
        message.push_str(&format!(" Its wait could not be restarted: {why}"));
    }
    let run_id = reconcile::run_id_of(run_dir, status);
    let runner_id = status
        .runner_process_instance_id
        .clone()
        .unwrap_or_else(|| "unknown".into());
    let now = now_ms();
    let mut registered = false;
    let proof = ProcessTerminal::new(ProofState::NotStarted, &run_id, &runner_id);
    let written = update_status(run_dir, |s| {
        let s = s?;
        // A monitor that registered meanwhile is starting the run after all
        // (it checks the state under this same lock).
        if s.monitor_identity != status.monitor_identity {
            registered = true;
            return None;
        }
        let mut s = if s.state.is_active() {
            let mut s = reconcile::fail_active(s, &message, now);
            s.error = Some(message.clone());
            s
        } else {
            s
        };
        s.process_terminal = Some(proof.to_value());
        Some(s)
    });
    if written.is_err() {
        return Observation::Unproven(format!("failed to write the status of '{run_id}'"));
    }
    if registered {
        return Observation::Waiting("its monitor registered while it was being given up".into());
    }
    // The record in the status decides; the file is its durable copy,
    // which `reconcile` writes again if this process dies first.
    let _ = write_not_started(run_dir, &proof);
    let fields = json!({"message": message, "observer": observer_record(&message)});
    let _ = events::append(run_dir, "subagent.run.repaired_stale", &run_id, now, fields);
    release_slot(root, run_dir, &run_id, None);
    let _ = index::release_marker(run_dir);
    Observation::Abandoned(message)
}

/// Writes a `not-started` proof as `process-terminal.json`, unless a
/// proof file is already there (a final one is never replaced).
pub fn write_not_started(run_dir: &Path, proof: &ProcessTerminal) -> atomic_file::Result<()> {
    let path = run_dir.join(status::layout::files::PROOF);
    if path.symlink_metadata().is_ok() {
        return Ok(());
    }
    atomic_file::write_json(&path, proof)
}

fn observer_record(reason: &str) -> Value {
    json!({
        "role": Role::Reconciler.as_str(),
        "pid": std::process::id(),
        "reason": reason,
    })
}

fn witness_record(witness: &Witness) -> Value {
    let mut record = observer_record(witness.reason.as_deref().unwrap_or(""));
    if let Some(evidence) = &witness.evidence {
        record["evidence"] = evidence.clone();
    }
    record
}

/// The runner is gone and so is its monitor: end what is left, prove it,
/// repair, finalize.
fn settle(run_dir: &Path, status: &RunStatus, facts: &Facts, options: &Options) -> Observation {
    let runner = status.runner_identity.as_ref();
    let monitor = match &facts.monitor {
        Presence::Dead(m) => format!("monitor {} exited", m.pid),
        _ => "no monitor recorded".to_owned(),
    };
    let reason = if facts.of_past_boot() {
        format!(
            "runner {} was recorded in another boot of this machine: every process of the run ended with that boot (nothing signalled)",
            runner.map_or(0, |r| r.pid)
        )
    } else {
        format!(
            "{monitor}; runner {} exited; every process of the run verified gone",
            runner.map_or(0, |r| r.pid)
        )
    };
    let run_id = reconcile::run_id_of(run_dir, status);
    let targets = Targets::of(&run_id, status, facts);
    if let Some(why) = targets.includes_self() {
        return Observation::Unproven(why);
    }
    let survivors = terminate(&targets, options.term_grace, options.kill_grace);
    if let Some(pid) = survivors.first() {
        let start = process_identity::read_stat(*pid)
            .map(|s| s.start_time.to_string())
            .unwrap_or_else(|_| "?".into());
        return Observation::Unproven(format!(
            "process {pid} (start time {start}) of the run survived SIGKILL"
        ));
    }
    let steps = step_groups(status);
    let witness = Witness {
        role: Role::Reconciler,
        reason: Some(reason.clone()),
        runner_instance_id: runner_instance_id(status),
        runner_end: None,
        closed_at: now_ms(),
        reaped: BTreeMap::new(),
        groups_gone: steps.iter().map(|(i, _)| (*i, true)).collect(),
        stop_reason: options.stop_reason.clone(),
        evidence: None,
    };
    let (proof, repaired) = finish(run_dir, &run_id, &options.root, &witness);
    Observation::Finalized {
        proof: Box::new(proof),
        repaired,
        reason,
    }
}

fn runner_instance_id(status: &RunStatus) -> String {
    status
        .runner_process_instance_id
        .clone()
        .or_else(|| {
            let proof = status.process_terminal.as_ref()?;
            Some(proof.get("runnerProcessInstanceId")?.as_str()?.to_owned())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// (step index, COMMAND pid = process group) of every started step.
pub fn step_groups(status: &RunStatus) -> Vec<(usize, u32)> {
    let steps = status.steps().iter().enumerate();
    steps
        .filter_map(|(i, s)| Some((i, s.external_process.as_ref()?.pid?)))
        .filter(|(_, pgid)| signallable(*pgid))
        .collect()
}

/// Whether a recorded pid may name a group or session we signal the
/// members of. 0 and 1 never name a run's: group 1 and session 1 are
/// init's, and in a pid namespace `/proc` shows 0 as the group and session
/// of processes started from outside it, pid 1 among them. A status file
/// recording either (corrupt, or hand-written) must not make us signal them.
fn signallable(id: u32) -> bool {
    id > 1
}

/// The variable that names the run in every COMMAND's environment.
const RUN_ID_ENV: &str = "SUBAGENTS_RUN_ID";

/// The process groups and session that are provably the run's.
#[derive(Debug, Default)]
struct Targets {
    groups: Vec<u32>,
    session: Option<u32>,
    /// The run id its COMMANDs carry as `SUBAGENTS_RUN_ID`.
    run_id: String,
    /// The run was recorded in this boot: processes tagged with its id may
    /// be its own. After a reboot nothing of it is left to look for.
    this_boot: bool,
}

impl Targets {
    fn of(run_id: &str, status: &RunStatus, facts: &Facts) -> Self {
        if facts.of_past_boot() {
            // Everything the run started ended with that boot; its numbers
            // and its tag may name strangers (or a forged record) now.
            return Self {
                run_id: run_id.to_owned(),
                ..Self::default()
            };
        }
        let groups = status
            .steps()
            .iter()
            .filter_map(|s| s.external_process.as_ref())
            .filter_map(|p| {
                let pgid = p.pid.filter(|g| signallable(*g))?;
                let leader = Presence::of(p.identity.as_ref());
                group_is_ours(&leader, process_identity::read_stat(pgid).is_ok()).then_some(pgid)
            })
            .collect();
        // An empty session means the monitor's pid may be in use again
        // (`session_of_dead_leader`): by then it can name a stranger's session.
        let session = match (&facts.monitor, &facts.session) {
            (Presence::Dead(m), Some(live)) if !live.is_empty() && signallable(m.pid) => {
                Some(m.pid)
            }
            _ => None,
        };
        Self {
            groups,
            session,
            run_id: run_id.to_owned(),
            this_boot: true,
        }
    }

    /// Live processes of the run, right now.
    fn alive(&self) -> Vec<u32> {
        if !self.this_boot {
            return Vec::new();
        }
        let mut pids = Vec::new();
        for g in &self.groups {
            pids.extend(process_identity::group_members(*g).unwrap_or_default());
        }
        if let Some(sid) = self.session {
            pids.extend(process_identity::session_members(sid).unwrap_or_default());
        }
        let tagged = process_identity::processes_with_env(RUN_ID_ENV, &self.run_id);
        pids.extend(
            tagged
                .unwrap_or_default()
                .into_iter()
                .filter(|pid| !crate::procs::runs_as(*pid, &["__monitor", "__runner"])),
        );
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// An observer running inside the run (a COMMAND calling `subagents`)
    /// must not end its own caller.
    fn includes_self(&self) -> Option<String> {
        let me = process_identity::read_stat(std::process::id()).ok()?;
        let tagged = std::env::var(RUN_ID_ENV).is_ok_and(|id| id == self.run_id);
        let inside = tagged || self.session == Some(me.session) || self.groups.contains(&me.pgrp);
        inside.then(|| {
            format!(
                "this process ({}) belongs to the run and will not end it",
                std::process::id()
            )
        })
    }
}

/// Whether a recorded COMMAND group is still the run's: its leader is the
/// recorded process, or the leader is gone while the group lives (a pgid is
/// not reused while its group has members).
/// A leader recorded in another boot or on another machine names no group
/// of ours.
pub fn group_is_ours(leader: &Presence, leader_pid_in_use: bool) -> bool {
    match leader {
        Presence::Alive(_) => true,
        Presence::Dead(identity) if !identity.is_of_this_boot() => false,
        Presence::Dead(_) | Presence::NotRecorded => !leader_pid_in_use,
        Presence::Unknown(_) | Presence::Foreign(_) => false,
    }
}

/// SIGTERM, then SIGKILL, to every live process of `targets`, re-reading
/// who is left every 25 ms; returns the survivors.
fn terminate(targets: &Targets, term_grace: Duration, kill_grace: Duration) -> Vec<u32> {
    let mut alive = targets.alive();
    for (sig, grace) in [(Signal::SIGTERM, term_grace), (Signal::SIGKILL, kill_grace)] {
        let deadline = Instant::now() + grace;
        while !alive.is_empty() && Instant::now() < deadline {
            for pid in &alive {
                let _ = nix::sys::signal::kill(Pid::from_raw(*pid as i32), sig);
            }
            // We are not their parent: no SIGCHLD to wait for, only /proc.
            std::thread::sleep(Duration::from_millis(25));
            alive = targets.alive();
        }
        if alive.is_empty() {
            break;
        }
    }
    alive
}

/// What the finalizing process witnessed of the run's end.
#[derive(Debug, Clone)]
pub struct Witness {
    /// Who finalizes.
    pub role: Role,
    /// Why a reconciler acted (recorded in the proof's runner record).
    pub reason: Option<String>,
    /// The runner instance the proof is about.
    pub runner_instance_id: String,
    /// How the runner ended, when the finalizer waited on it.
    pub runner_end: Option<Ended>,
    /// When the runner's end was observed (ms).
    pub closed_at: u64,
    /// Children reaped by the finalizer (pid → how they ended).
    pub reaped: BTreeMap<u32, Ended>,
    /// Step index → whether its COMMAND group was verified empty.
    pub groups_gone: BTreeMap<usize, bool>,
    /// A stop was requested: a repaired run becomes `stopped`.
    pub stop_reason: Option<String>,
    /// What an executor reported (e.g. the Slurm job's state and exit
    /// code), recorded in the proof's observer record as `evidence`.
    pub evidence: Option<Value>,
}

/// The end of every run, for the monitor and reconcilers alike: repairs a
/// status the runner never finished, writes the candidate from what was
/// witnessed when the runner wrote none, and finalizes the proof (writes
/// `process-terminal.json`, overlays it, appends the event, releases the
/// marker when `observed`). Returns the proof and the repair message.
pub fn finish(
    run_dir: &Path,
    run_id: &str,
    root: &Path,
    witness: &Witness,
) -> (ProcessTerminal, Option<String>) {
    finish_in_slot(run_dir, run_id, root, witness, None)
}

/// [`finish`] that, once the observed proof is durable and overlaid and
/// before the marker goes, frees the run's capacity slot (`slot`: the
/// index the launcher took, when known), so no reader repairs the count.
pub fn finish_in_slot(
    run_dir: &Path,
    run_id: &str,
    root: &Path,
    witness: &Witness,
    slot: Option<u64>,
) -> (ProcessTerminal, Option<String>) {
    let candidate = proof::read_candidate(run_dir).ok().flatten();
    // A candidate does not mean the status was finished: a full or
    // read-only root may have taken the status write and let the candidate
    // through (or a finalizer before us wrote its witnessed one).
    let repaired = repair_unfinished(run_dir, run_id, witness, candidate.as_ref());
    if candidate.is_none() {
        // A damaged status names no steps: the candidate then claims only
        // what was witnessed of the whole run (the runner reaped or gone,
        // the monitor's session and the run's tagged processes emptied).
        let status = match read_status(run_dir) {
            Ok(status) => status,
            Err(_) => Some(RunStatus::new(run_id, RunState::Running)),
        };
        if let Some(status) = status {
            let candidate = witnessed_candidate(run_id, &status, witness);
            let _ = proof::write_candidate(run_dir, &candidate);
        }
    }
    let close = RunnerClose {
        process_instance_id: witness.runner_instance_id.clone(),
        close_observed_at: witness.closed_at,
        exit_code: witness.runner_end.and_then(Ended::code),
        signal: witness.runner_end.and_then(Ended::signal),
        observer: match witness.role {
            Role::Monitor => None,
            Role::Reconciler => Some(witness_record(witness)),
        },
    };
    let leases = |file: &str| lease_state(root, file);
    let facts = listing_facts(root, run_dir);
    let freeze = |s: &mut RunStatus| {
        if let (Some((snapshot, facts)), false) = (&facts, s.state.is_active()) {
            if let Some(snapshot) = snapshot {
                s.run_fanout_budget = Some(snapshot.clone());
            }
            s.extra
                .insert(status::model::LISTING_FACTS.into(), facts.clone());
        }
    };
    let release = |proof: &ProcessTerminal| {
        if proof.state == ProofState::Observed {
            release_slot(root, run_dir, run_id, slot);
        }
    };
    let proof = proof::finalize_then(
        run_dir,
        run_id,
        &close,
        &leases,
        now_ms(),
        &freeze,
        &release,
    );
    (proof, repaired)
}

/// Frees the capacity slot of a run whose proof is final, from the session
/// its status names; a slot the verdict keeps (or a pool that cannot be
/// used) is left for the next reconcile.
fn release_slot(root: &Path, run_dir: &Path, run_id: &str, slot: Option<u64>) {
    let Ok(Some(status)) = read_status(run_dir) else {
        return;
    };
    let Some(session) = status.session_id.as_deref() else {
        return;
    };
    let pools = capacity::Capacity::new(Layout::new(root).capacity_dir());
    let _ = pools.release_run(session, run_id, slot);
}

/// The run's listing facts, frozen into its status with the observed proof
/// in the same write: the fan-out counts as of now, so listings take them
/// and the proof from the status as they are instead of validating the
/// proof sidecar and counting claims for every finished run
/// (`status::model::LISTING_FACTS`). `None` when the budget cannot be read:
/// listings then say live why it is unavailable.
fn listing_facts(root: &Path, run_dir: &Path) -> Option<(Option<Value>, Value)> {
    let budgets = Layout::new(root).fanout_budgets_dir();
    let (snapshot, claims) = match fanout_budget::read_persisted(run_dir, &budgets) {
        Ok(Some(budget)) => (
            serde_json::to_value(budget.snapshot().ok()?).ok(),
            Some(budget.descriptor().directory.join("claims")),
        ),
        Ok(None) => (None, None),
        Err(_) => return None,
    };
    let mut facts = json!({"frozenAt": now_ms()});
    if let Some(claims) = claims {
        facts["fanoutClaimsDir"] = json!(claims);
    }
    Some((snapshot, facts))
}

/// An active status whose runner is gone: restore the outcome from the
/// evidence when every step's end is there, else fail (or stop) the run.
fn repair_unfinished(
    run_dir: &Path,
    run_id: &str,
    witness: &Witness,
    candidate: Option<&Candidate>,
) -> Option<String> {
    let current = read_status(run_dir).ok().flatten()?;
    if !current.state.is_active() {
        return None;
    }
    let restored = outcome_from_evidence(&current, &events::read_all(run_dir), candidate);
    let base = match (&witness.role, witness.runner_end) {
        (Role::Monitor, Some(ended)) => format!(
            "Async runner process exited with {} before writing a final status.",
            ended.describe()
        ),
        _ => format!(
            "Async runner process {} and its monitor exited or disappeared before writing a result. Marked run failed by the observer.",
            current.pid.unwrap_or(0)
        ),
    };
    let message = match (&witness.stop_reason, &restored) {
        (Some(reason), _) => reason.clone(),
        (None, Some(r)) => format!(
            "Async runner exited before writing a final status; every step's end is in {}, so the run is {}.",
            r.source, r.state
        ),
        (None, None) => reconcile::with_stderr_tail(run_dir, base),
    };
    let now = now_ms();
    let repaired = update_status(run_dir, |s| {
        let s = s?;
        if !s.state.is_active() {
            return None;
        }
        Some(match (&witness.stop_reason, &restored) {
            (Some(reason), _) => stopped(s, reason, now),
            (None, Some(r)) => restore(s, r, now),
            (None, None) => {
                let mut s = reconcile::fail_active(s, &message, now);
                s.error = Some(message.clone());
                s
            }
        })
    });
    let status = repaired.ok().flatten()?;
    let mut fields = json!({"pid": status.pid, "message": message});
    if witness.role == Role::Reconciler {
        fields["observer"] = witness_record(witness);
    }
    let _ = events::append(run_dir, "subagent.run.repaired_stale", run_id, now, fields);
    Some(message)
}

fn stopped(s: RunStatus, reason: &str, now: u64) -> RunStatus {
    let mut s = reconcile::fail_active(s, reason, now);
    s.state = RunState::Stopped;
    s.stopped = Some(true);
    s.error = Some(reason.to_owned());
    for step in s.steps.iter_mut().flatten() {
        if step.status == "failed" && step.error.as_deref() == Some(reason) {
            step.status = "stopped".into();
            step.stopped = Some(true);
        }
    }
    s
}

/// The outcome the evidence proves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    /// `complete` when every step completed, else `failed`.
    pub state: RunState,
    /// The reason the first step that did not complete recorded (named in
    /// a run of several steps), else `Step failed: <agent>`.
    pub error: Option<String>,
    /// Step index → the step status its end names.
    pub steps: BTreeMap<usize, String>,
    /// Where the step ends were found, for the repair message:
    /// `events.jsonl`, `status.json`, the candidate, or several of them.
    pub source: String,
}

/// The error of a restored run whose step `i` did not complete.
fn restored_error(status: &RunStatus, i: usize) -> String {
    let step = &status.steps()[i];
    match step.extra.get("reason").and_then(Value::as_str) {
        Some(reason) if status.steps().len() == 1 => reason.to_owned(),
        Some(reason) => format!("{}: {reason}", step.agent),
        None => format!("Step failed: {}", step.agent),
    }
}

/// Events are evidence: when `events.jsonl` records the end of every step
/// (`subagent.step.<status>` with `stepIndex`), the run's outcome is known
/// even though the runner died before its final write (pure).
pub fn outcome_from_events(status: &RunStatus, events: &[Value]) -> Option<Restored> {
    outcome_from_evidence(status, events, None)
}

/// The outcome of a run whose runner died before its final write, when
/// every step's end is known (pure). A step's end is, by precedence: its
/// `subagent.step.<status>` event; its status recorded in `status.json`
/// (the runner writes a step's end before its event, so a root that turned
/// full or read-only in between keeps only that); its COMMAND's exit code
/// in the candidate (0 complete, any other failed).
pub fn outcome_from_evidence(
    status: &RunStatus,
    events: &[Value],
    candidate: Option<&Candidate>,
) -> Option<Restored> {
    let count = status.steps().len();
    if count == 0 {
        return None;
    }
    let sources = [
        (files::EVENTS, ends_in_events(events)),
        (files::STATUS, ends_in_status(status)),
        (files::CANDIDATE, ends_in_candidate(candidate)),
    ];
    let mut ends = BTreeMap::new();
    let mut used = Vec::new();
    for i in 0..count {
        let (name, end) = sources
            .iter()
            .find_map(|(name, ends)| Some((*name, ends.get(&i)?.clone())))?;
        ends.insert(i, end);
        if !used.contains(&name) {
            used.push(name);
        }
    }
    let first_bad = (0..count).find(|i| ends[i] != "complete");
    let (state, error) = match first_bad {
        None => (RunState::Complete, None),
        Some(i) => (RunState::Failed, Some(restored_error(status, i))),
    };
    Some(Restored {
        state,
        error,
        steps: ends,
        source: used.join(" and "),
    })
}

/// A step's end status, as `subagent.step.<kind>` names it.
fn end_of_event(kind: &str) -> Option<&'static str> {
    Some(match kind {
        "completed" => "complete",
        "failed" => "failed",
        "stopped" => "stopped",
        "paused" => "paused",
        "rejected" => "rejected",
        _ => return None,
    })
}

/// A step status that records the step's end.
fn is_end_status(status: &str) -> bool {
    matches!(
        status,
        "complete" | "failed" | "stopped" | "paused" | "rejected"
    )
}

fn ends_in_events(events: &[Value]) -> BTreeMap<usize, String> {
    let mut ends = BTreeMap::new();
    for event in events {
        let end = event
            .get("type")
            .and_then(Value::as_str)
            .and_then(|t| t.strip_prefix("subagent.step."))
            .and_then(end_of_event);
        if let (Some(end), Some(i)) = (end, event.get("stepIndex").and_then(Value::as_u64)) {
            ends.insert(i as usize, end.to_owned());
        }
    }
    ends
}

fn ends_in_status(status: &RunStatus) -> BTreeMap<usize, String> {
    let steps = status.steps().iter().enumerate();
    steps
        .filter(|(_, step)| is_end_status(&step.status))
        .map(|(i, step)| (i, step.status.clone()))
        .collect()
}

fn ends_in_candidate(candidate: Option<&Candidate>) -> BTreeMap<usize, String> {
    let Some(candidate) = candidate else {
        return BTreeMap::new();
    };
    let writers = candidate.writers.iter();
    writers
        .filter_map(|(i, records)| {
            let code = records.last()?.exit_code?;
            let end = if code == 0 { "complete" } else { "failed" };
            Some((i.parse().ok()?, end.to_owned()))
        })
        .collect()
}

fn restore(mut s: RunStatus, restored: &Restored, now: u64) -> RunStatus {
    for (i, step) in s.steps.iter_mut().flatten().enumerate() {
        if matches!(step.status.as_str(), "running" | "pending")
            && let Some(end) = restored.steps.get(&i)
        {
            step.status = end.clone();
            step.ended_at.get_or_insert(now);
            step.extra.remove("activityState");
        }
    }
    s.state = restored.state;
    s.error = restored.error.clone().or(s.error);
    s.extra.remove("activityState");
    s.last_update = Some(now);
    s.ended_at.get_or_insert(now);
    s
}

/// The candidate the runner could not write, from what the finalizer
/// witnessed: the children it reaped and the groups it verified empty.
pub fn witnessed_candidate(run_id: &str, status: &RunStatus, witness: &Witness) -> Candidate {
    let mut writers = BTreeMap::new();
    let mut expected: BTreeMap<String, u64> = (0..status.steps().len())
        .map(|i| (i.to_string(), 0))
        .collect();
    for (i, pid) in step_groups(status) {
        let ended = witness.reaped.get(&pid).copied();
        let tree = if witness.groups_gone.get(&i).copied().unwrap_or(false) {
            ProcessTree::Observed {
                mechanism: "posix-process-group".into(),
                process_group_id: pid,
                verified_at: now_ms(),
            }
        } else {
            ProcessTree::Unknown {
                reason: "verification-failed".into(),
                diagnostic: Some("group not empty after SIGKILL".into()),
            }
        };
        let record = proof::WriterRecord {
            process_instance_id: format!("{}-writer-{i}", witness.runner_instance_id),
            kind: "pi-writer".into(),
            attempt: 0,
            close_observed_at: status.ended_at.unwrap_or_else(now_ms),
            exit_code: ended.and_then(Ended::code),
            signal: ended.and_then(Ended::signal),
            process_tree: tree,
        };
        writers.insert(i.to_string(), vec![record]);
        expected.insert(i.to_string(), 1);
    }
    Candidate {
        version: 1,
        run_id: run_id.to_owned(),
        runner_process_instance_id: witness.runner_instance_id.clone(),
        writers,
        expected_writers: Some(expected),
        session_file: None,
        revival_lease_token: None,
        revival_lease_release_acknowledged: None,
    }
}

/// The session lease as the proof finalizer needs it.
fn lease_state(root: &Path, file: &str) -> Result<proof::LeaseState, String> {
    let leases = recovery::lease::lease_root(root);
    let inspection =
        recovery::lease::inspect_lease(&leases, Path::new(file)).map_err(|e| e.to_string())?;
    Ok(match inspection.state {
        recovery::lease::LeaseState::Free => proof::LeaseState::Free(inspection.session.id),
        recovery::lease::LeaseState::Owned(_) => proof::LeaseState::Owned,
        recovery::lease::LeaseState::Unreadable => proof::LeaseState::Unreadable,
    })
}

#[cfg(test)]
mod tests;
