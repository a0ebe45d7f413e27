//! `subagents __runner`: runs the steps of one run and owns its status.
//!
//! The runner blocks its signals and waits on a signalfd, so one `poll`
//! covers child exits, stop requests and every deadline (run, step, kill
//! grace). It is a child subreaper, so orphans of a COMMAND come back to it
//! and are terminated with the run. Groups of steps (one chain step, or a
//! parallel group) run one after another; inside a group up to `concurrency`
//! children run at once. At the end it writes the process-terminal
//! candidate and exits; its parent (the monitor) turns that into the proof.

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::FromRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use handshake::{Binding, RunnerHandshake, RunnerTimeouts};
use nix::sys::signal::Signal;
use process_identity::ProcessIdentity;
use recovery::lease::{LeaseRequest, SessionLease, Writer, acquire_lease};
use serde_json::json;
use status::model::update_status_owned;
use status::proof::{Candidate, ProcessTree, WriterRecord, write_candidate};
use status::{
    LIFECYCLE_ARTIFACT_VERSION, PROMPT_REDACTED, RunState, RunStatus, events, index, now_ms,
};

use crate::config::{GroupConfig, LaunchConfig, READY_FD_ENV, RevivalConfig};
use crate::durable;
use crate::fault::{self, Point};
use crate::handover;
use crate::procs::{Ended, Signals, Wake, empty_group, reap_all, signal_group};
use crate::spawn::Launched;
pub use crate::transitions::output_path;
use crate::transitions::{self, AnswerRef, log_path};

/// How long a COMMAND's group gets between SIGTERM and SIGKILL.
pub const KILL_GRACE: Duration = Duration::from_secs(2);

/// How often the runner looks at its running steps' output (for
/// `lastOutputAt`), and the least time between two records of it.
const OUTPUT_CHECK: Duration = Duration::from_secs(5);

/// The most of the previous output put into a task for `{previous}`.
const MAX_PREVIOUS_BYTES: usize = 1024 * 1024;

/// Why a step or the run ended early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Interruption {
    Stopped,
    TimedOut,
    /// A sibling failed in a fail-fast group.
    FailFast,
    /// The step printed nothing for its idle limit.
    Idle,
}

/// The runner's entry point (`__runner`, config on stdin); returns the
/// process exit code.
pub fn main() -> i32 {
    let config: LaunchConfig = match serde_json::from_reader(std::io::stdin()) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("subagents: failed to read runner config from stdin: {e}");
            return 1;
        }
    };
    run_config(config)
}

/// The runner on its config: started by `exec` ([`main`]) or forked by its
/// monitor; returns the process exit code.
pub fn run_config(config: LaunchConfig) -> i32 {
    fault::init(fault::Process::Runner);
    match run(&config) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("subagents: runner of '{}' failed: {e:#}", config.run_id);
            1
        }
    }
}

fn run(config: &LaunchConfig) -> anyhow::Result<()> {
    let signals = Signals::block()?;
    become_subreaper();
    handover::keep_from_children();
    fault::point(Point::AfterRunDir);
    durable::reserve_evidence(&config.run_dir);
    let started_at = now_ms();
    let identity = ProcessIdentity::current()?;
    let lease = match &config.revival {
        Some(revival) => {
            // The launcher learns our pid first, then the handshake decides.
            send_ready(config, identity.pid);
            Some(revival_startup(config, revival)?)
        }
        None => None,
    };
    let own = OwnStatus::default();
    // A first launch says `ready` before the run directory's fsync, which
    // makes the `running` name durable (docs/reliability.md, "Durable writes
    // of a launch"): the launcher need not wait for it, COMMAND does.
    let first_launch = lease.is_none();
    write_running(config, &own, &identity, started_at, !first_launch)?;
    if first_launch {
        send_ready(config, identity.pid);
        durable::retry("the run directory", || {
            atomic_file::sync_dir(&config.run_dir)
        })?;
    }
    let mut execution = Execution::new(config, signals, started_at, lease, own);
    for (index, group) in config.groups.iter().enumerate() {
        let ok = execution.run_group(index, group);
        if !ok || execution.interruption.is_some() {
            break;
        }
    }
    execution.end_unstarted();
    execution.clean_up_orphans();
    execution.finish()
}

/// A revival takes the session lease, then waits for the launcher's go
/// (ready → ack → acknowledged → proceed). Nothing runs before proceed; on
/// failure the error record is written and the lease given back.
fn revival_startup(config: &LaunchConfig, revival: &RevivalConfig) -> anyhow::Result<SessionLease> {
    let binding = Binding {
        run_id: config.run_id.clone(),
        runner_process_instance_id: config.runner_process_instance_id.clone(),
    };
    let request = LeaseRequest {
        session_file: revival.session_file.clone(),
        run_id: config.run_id.clone(),
        source_run_id: revival.source_run_id.clone(),
        parent_session_id: config.session_id.clone(),
    };
    let lease = match acquire_lease(&revival.lease_root, &request) {
        Ok(lease) => lease,
        Err(e) => {
            let _ = handshake::report_startup_failure(&config.run_dir, &binding, &e.to_string());
            return Err(e.into());
        }
    };
    let wait = Duration::from_millis(revival.timeouts_ms.1);
    let timeouts = RunnerTimeouts {
        ack: wait,
        proceed: wait,
    };
    let startup = RunnerHandshake::new(&config.run_dir, binding, revival.token.clone(), timeouts);
    if let Err(e) = startup.startup(&serde_json::to_value(lease.owner())?) {
        let _ = lease.release();
        return Err(e.into());
    }
    Ok(lease)
}

/// The runner's copy of the status it last wrote. The runner owns
/// `status.json`: when another writer (or anything else) damaged the file,
/// the runner's next write moves it aside and writes from this copy
/// (`status::model::update_status_owned`), so the run ends with a readable
/// status, a candidate and, from its monitor, a proof.
#[derive(Default)]
struct OwnStatus(RefCell<Option<RunStatus>>);

impl OwnStatus {
    /// Read-modify-write of the status; `sync_dir` as in
    /// `update_status_owned`.
    fn update(
        &self,
        dir: &Path,
        sync_dir: bool,
        change: impl FnOnce(Option<RunStatus>) -> Option<RunStatus>,
    ) -> status::Result<Option<RunStatus>> {
        let last = self.0.borrow();
        let (next, damage) = update_status_owned(dir, last.as_ref(), sync_dir, change)?;
        drop(last);
        if let Some(why) = damage {
            eprintln!("subagents: runner rewrote its damaged status from its last write: {why}");
        }
        if let Some(next) = &next {
            *self.0.borrow_mut() = Some(next.clone());
        }
        Ok(next)
    }

    /// The stop reason of the status on disk, else of the last write.
    fn stop_reason(&self, dir: &Path) -> Option<String> {
        match status::model::read_status(dir) {
            Ok(status) => status.and_then(|s| s.stop_reason),
            Err(_) => self.0.borrow().as_ref().and_then(|s| s.stop_reason.clone()),
        }
    }
}

/// Orphaned descendants of our children are reparented to us instead of init.
pub fn become_subreaper() {
    // SAFETY: prctl with integer arguments has no memory effects.
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    }
}

/// Writes `running` (the run directory fsynced with it when `sync_dir`;
/// else the caller syncs it before the first COMMAND).
fn write_running(
    config: &LaunchConfig,
    own: &OwnStatus,
    identity: &ProcessIdentity,
    now: u64,
    sync_dir: bool,
) -> anyhow::Result<()> {
    let dir = &config.run_dir;
    durable::retry("the active marker", || index::create_marker(dir))?;
    // Only a parent that is our monitor counts: after the monitor's death
    // our parent is a reaper, which must never pass for it.
    let parent = std::os::unix::process::parent_id();
    let monitor = crate::procs::runs_as(parent, &["__monitor"])
        .then(|| ProcessIdentity::of(parent).ok())
        .flatten();
    durable::retry("status.json", || {
        own.update(dir, sync_dir, |current| {
            Some(transitions::running(
                current,
                config,
                identity,
                monitor.clone(),
                now,
            ))
        })
    })?;
    let mut fields = json!({
        "lifecycleArtifactVersion": LIFECYCLE_ARTIFACT_VERSION,
        "mode": config.mode,
        "cwd": config.steps.first().map(|s| s.cwd.clone()),
        "pid": identity.pid,
    });
    if let Some(root) = &config.session_root {
        fields["sessionRoot"] = json!(root);
    }
    crate::agent_output::started_fields(config, &mut fields);
    if config.steps.first().is_some_and(|s| s.task_file.is_some()) {
        fields["task"] = json!(PROMPT_REDACTED);
        fields["goal"] = json!(PROMPT_REDACTED);
    }
    let _ = durable::retry("events.jsonl", || {
        events::append(
            dir,
            "subagent.run.started",
            &config.run_id,
            now,
            fields.clone(),
        )
    });
    Ok(())
}

/// Tells the launcher we are running, then closes the pipe.
fn send_ready(config: &LaunchConfig, pid: u32) {
    fault::point(Point::BeforeReady);
    let Some(fd) = std::env::var(READY_FD_ENV)
        .ok()
        .and_then(|v| v.parse::<i32>().ok())
    else {
        return;
    };
    // SAFETY: the monitor handed us this descriptor for exactly this use; we own it from here.
    let mut pipe = unsafe { File::from_raw_fd(fd) };
    let launched = Launched {
        run_id: config.run_id.clone(),
        async_dir: config.run_dir.clone(),
        pid,
        runner_process_instance_id: config.runner_process_instance_id.clone(),
        queued: false,
    };
    let _ = writeln!(
        pipe,
        "ready {}",
        serde_json::to_string(&launched).unwrap_or_default()
    );
    drop(pipe);
    fault::point(Point::AfterReady);
}

/// What happened to one step's COMMAND.
#[derive(Debug, Default)]
struct StepRun {
    pid: Option<u32>,
    started_at: Option<u64>,
    ended: Option<Ended>,
    closed_at: u64,
    interruption: Option<Interruption>,
    tree: Option<ProcessTree>,
    spawn_error: Option<String>,
    /// The shell's code for a command that could not start: 127 not found, 126 not executable.
    spawn_exit: i64,
    deadline: Option<Instant>,
    kill_at: Option<Instant>,
    /// The last output seen (ms since the epoch; the start before any).
    output_at: u64,
    /// The `lastOutputAt` last written to the status.
    recorded_output_at: Option<u64>,
    /// What its output said once it ended.
    report: crate::agent_output::StepReport,
}

impl StepRun {
    fn succeeded(&self) -> bool {
        self.interruption.is_none()
            && self.spawn_error.is_none()
            && self.ended == Some(Ended::Exited(0))
    }
}

struct Execution<'a> {
    config: &'a LaunchConfig,
    signals: Signals,
    started_at: u64,
    steps: Vec<StepRun>,
    run_deadline: Option<Instant>,
    interruption: Option<Interruption>,
    /// Exits reaped while waiting for something else.
    exits: BTreeMap<u32, Ended>,
    previous_output: Option<PathBuf>,
    /// Processes still alive after the final clean-up (none, normally).
    survivors: Vec<u32>,
    /// A revival's session lease, held until the run is over.
    lease: Option<SessionLease>,
    /// The status as last written.
    own: OwnStatus,
    /// Each ended step's end as recorded (or meant to be, on a root that
    /// refused the write): the final write applies them all again.
    ends: BTreeMap<usize, (transitions::StepEnd, u64)>,
    /// When the running steps' output is looked at next.
    next_output_check: Instant,
    /// Each running step's logs, as far as they were read.
    watches: BTreeMap<usize, crate::live::Watch>,
}

impl<'a> Execution<'a> {
    fn new(
        config: &'a LaunchConfig,
        signals: Signals,
        started_at: u64,
        lease: Option<SessionLease>,
        own: OwnStatus,
    ) -> Self {
        let elapsed = Duration::from_millis(now_ms().saturating_sub(started_at));
        let run_deadline = config
            .timeout_ms
            .map(|t| Instant::now() + Duration::from_millis(t).saturating_sub(elapsed));
        Execution {
            config,
            signals,
            started_at,
            steps: config.steps.iter().map(|_| StepRun::default()).collect(),
            run_deadline,
            interruption: None,
            exits: BTreeMap::new(),
            previous_output: None,
            survivors: Vec::new(),
            lease,
            own,
            ends: BTreeMap::new(),
            next_output_check: Instant::now() + OUTPUT_CHECK,
            watches: BTreeMap::new(),
        }
        .stopped_before_start()
    }

    /// A `stop` that arrived while the run was still queued wins: nothing starts.
    fn stopped_before_start(mut self) -> Self {
        let status = status::model::read_status(&self.config.run_dir)
            .ok()
            .flatten();
        if status.is_some_and(|s| s.stop_reason.is_some()) {
            self.interruption = Some(Interruption::Stopped);
        }
        self
    }

    /// Runs one group to its end; true when every step of it succeeded.
    fn run_group(&mut self, index: usize, group: &GroupConfig) -> bool {
        let members: Vec<usize> = (group.start..group.start + group.count).collect();
        if group.parallel {
            let agents: Vec<&str> = members
                .iter()
                .map(|i| self.config.steps[*i].agent.as_str())
                .collect();
            self.event(
                "subagent.parallel.started",
                json!({"stepIndex": index, "agents": agents, "count": group.count}),
            );
        }
        let mut queue: VecDeque<usize> = members.iter().copied().collect();
        let mut active: Vec<usize> = Vec::new();
        let mut tripped = false;
        loop {
            let mut started = false;
            while self.interruption.is_none() && !tripped && active.len() < group.concurrency.max(1)
            {
                // A stop that arrived between steps must not let another one start.
                if self.stop_pending() {
                    break;
                }
                let Some(step) = queue.pop_front() else { break };
                if self.start_step(step, index) {
                    fault::point(Point::DuringStep);
                    active.push(step);
                    started = true;
                } else if group.fail_fast {
                    tripped = true;
                    self.interrupt(&active, Interruption::FailFast);
                }
            }
            if active.is_empty() {
                break;
            }
            if started {
                crate::idle::release_clean_file_pages();
            }
            for step in self.wait_and_collect(&mut active) {
                if !self.steps[step].succeeded() && group.fail_fast && !tripped {
                    tripped = true;
                    self.interrupt(&active, Interruption::FailFast);
                }
            }
        }
        self.skip_unstarted(&queue, tripped);
        let ok = members.iter().all(|i| self.steps[*i].succeeded());
        if group.parallel {
            self.event(
                "subagent.parallel.completed",
                json!({"stepIndex": index, "success": ok}),
            );
        }
        self.previous_output = self.group_output(index, group);
        ok
    }

    /// Takes a stop request that is already pending, without waiting.
    fn stop_pending(&mut self) -> bool {
        if self.interruption.is_none() && self.signals.stop_requested() {
            self.signals.clear_stop();
            self.interruption = Some(Interruption::Stopped);
        }
        self.interruption.is_some()
    }

    /// Waits for the next wake-up; handles deadlines and stop requests;
    /// returns the steps that ended (removed from `active`).
    fn wait_and_collect(&mut self, active: &mut Vec<usize>) -> Vec<usize> {
        // An exit reaped while emptying another step's group sent its SIGCHLD
        // already: do not wait for it again.
        let known = active.iter().any(|i| {
            self.steps[*i]
                .pid
                .is_some_and(|p| self.exits.contains_key(&p))
        });
        let wake = if known {
            Wake::Child
        } else {
            self.signals
                .wait(self.next_deadline(active))
                .unwrap_or(Wake::Child)
        };
        match wake {
            Wake::Stop => {
                self.interruption.get_or_insert(Interruption::Stopped);
                // A COMMAND that exited before the stop was read completed
                // before the stop could take effect: only the others are
                // interrupted (its group is still emptied when it is reaped).
                self.exits.extend(reap_all());
                let running: Vec<usize> = active
                    .iter()
                    .copied()
                    .filter(|i| {
                        self.steps[*i]
                            .pid
                            .is_none_or(|pid| !self.exits.contains_key(&pid))
                    })
                    .collect();
                self.interrupt(&running, Interruption::Stopped);
            }
            Wake::Deadline => self.handle_deadlines(active),
            Wake::Child => {}
        }
        self.look_at_output(active);
        self.exits.extend(reap_all());
        let ended: Vec<usize> = active
            .iter()
            .copied()
            .filter(|i| {
                self.steps[*i]
                    .pid
                    .is_some_and(|pid| self.exits.contains_key(&pid))
            })
            .collect();
        active.retain(|i| !ended.contains(i));
        for step in &ended {
            let pid = self.steps[*step].pid.unwrap_or_default();
            let exit = self.exits.remove(&pid).unwrap_or(Ended::Exited(-1));
            self.end_step(*step, exit);
        }
        // Only steps still running: one that exited silent at its limit
        // ended on its own.
        self.watch_output(active);
        ended
    }

    fn next_deadline(&self, active: &[usize]) -> Option<Instant> {
        let step_times = active
            .iter()
            .flat_map(|i| [self.steps[*i].deadline, self.steps[*i].kill_at]);
        let run = if self.interruption.is_none() {
            self.run_deadline
        } else {
            None
        };
        let output = (!active.is_empty()).then_some(self.next_output_check);
        let idle = active.iter().map(|i| self.idle_due(*i));
        let looks = active
            .iter()
            .filter_map(|i| self.watches.get(i).map(crate::live::Watch::due));
        step_times
            .chain([run, output])
            .chain(idle)
            .flatten()
            .chain(looks)
            .min()
    }

    /// Records what the running steps' output said since the last look
    /// (each step at most once per `live::TICK`).
    fn look_at_output(&mut self, active: &[usize]) {
        let now = now_ms();
        for i in active {
            let Some(live) = self
                .watches
                .get_mut(i)
                .and_then(|w| w.look(self.config, now))
            else {
                continue;
            };
            let config = self.config;
            let _ = self.own.update(&config.run_dir, false, |s| {
                let s = s?;
                // Only a step still running gains live fields.
                let running = s.steps().get(*i).is_some_and(|st| st.status == "running");
                Some(match running {
                    true => transitions::step_live(s, *i, &live, now),
                    false => s,
                })
            });
        }
    }

    /// When running step `i` has been silent for its idle limit (ms since the epoch).
    fn idle_due_ms(&self, i: usize) -> Option<u64> {
        let run = &self.steps[i];
        let limit = self.config.steps[i].idle_timeout_ms?;
        if run.interruption.is_some() || run.pid.is_none() {
            return None;
        }
        Some(run.output_at + limit)
    }

    /// [`Self::idle_due_ms`] as a deadline of the wait.
    fn idle_due(&self, i: usize) -> Option<Instant> {
        let left = self.idle_due_ms(i)?.saturating_sub(now_ms());
        Some(Instant::now() + Duration::from_millis(left))
    }

    fn idle_expired(&self, i: usize) -> bool {
        self.idle_due_ms(i).is_some_and(|due| due <= now_ms())
    }

    /// Looks at the active steps' output when it is time: records when
    /// each last wrote (`lastOutputAt`, at most every [`OUTPUT_CHECK`]) and
    /// ends a step silent for its idle limit, as a timeout ends one.
    fn watch_output(&mut self, active: &[usize]) {
        let now = Instant::now();
        let idle_due = active.iter().any(|i| self.idle_expired(*i));
        if now < self.next_output_check && !idle_due {
            return;
        }
        let mut seen = Vec::new();
        for i in active {
            let run = &mut self.steps[*i];
            if run.pid.is_none() || run.ended.is_some() {
                continue;
            }
            if let Some(at) = last_output_ms(self.config, *i) {
                run.output_at = run.output_at.max(at);
                let fresh = run
                    .recorded_output_at
                    .is_none_or(|r| run.output_at >= r + OUTPUT_CHECK.as_millis() as u64);
                if fresh && now >= self.next_output_check {
                    run.recorded_output_at = Some(run.output_at);
                    seen.push((*i, run.output_at));
                }
            }
        }
        if now >= self.next_output_check {
            self.next_output_check = now + OUTPUT_CHECK;
        }
        if !seen.is_empty() {
            let at = now_ms();
            let _ = self.own.update(&self.config.run_dir, false, |s| {
                Some(transitions::output_seen(s?, &seen, at))
            });
        }
        let stalled: Vec<usize> = active
            .iter()
            .copied()
            .filter(|i| self.idle_expired(*i))
            .collect();
        for i in stalled {
            let fields = json!({"stepIndex": i, "agent": self.config.steps[i].agent,
                "idleTimeoutMs": self.config.steps[i].idle_timeout_ms, "lastOutputAt": self.steps[i].output_at});
            self.event("subagent.step.stalled", fields);
            self.interrupt(&[i], Interruption::Idle);
        }
    }

    fn handle_deadlines(&mut self, active: &[usize]) {
        let now = Instant::now();
        if self.interruption.is_none() && self.run_deadline.is_some_and(|d| d <= now) {
            self.interruption = Some(Interruption::TimedOut);
            self.interrupt(active, Interruption::TimedOut);
        }
        for i in active {
            let step = &mut self.steps[*i];
            if step.kill_at.is_some_and(|k| k <= now) {
                step.kill_at = None;
                if let Some(pid) = step.pid {
                    signal_group(pid, Signal::SIGKILL);
                }
            } else if step.interruption.is_none() && step.deadline.is_some_and(|d| d <= now) {
                self.interrupt(&[*i], Interruption::TimedOut);
            }
        }
    }

    /// SIGTERM to each step's group; SIGKILL follows after [`KILL_GRACE`].
    fn interrupt(&mut self, steps: &[usize], why: Interruption) {
        for i in steps {
            let step = &mut self.steps[*i];
            if step.interruption.is_some() {
                continue;
            }
            step.interruption = Some(why);
            step.deadline = None;
            step.kill_at = Some(Instant::now() + KILL_GRACE);
            if let Some(pid) = step.pid {
                signal_group(pid, Signal::SIGTERM);
            }
        }
    }

    /// Starts step `i`; false when its command could not be started.
    fn start_step(&mut self, i: usize, group_index: usize) -> bool {
        let now = now_ms();
        self.steps[i].started_at = Some(now);
        let lease_env = self.lease.as_ref().map(SessionLease::writer_env);
        let previous = self
            .previous_output
            .clone()
            .or_else(|| self.config.revival.as_ref().map(|r| r.session_file.clone()));
        let placed = match self.config.steps[i].previous_in_task {
            true => put_previous(self.config, i, self.previous_output.as_deref()),
            false => Ok(()),
        };
        let spawned =
            placed.and_then(|()| spawn_command(self.config, i, previous.as_deref(), lease_env));
        match spawned {
            Ok(pid) => {
                // An old orphan's exit under a now reused pid is not this step's.
                self.exits.remove(&pid);
                if let Some(lease) = self.lease.as_mut() {
                    let _ = lease.update_writer(Writer::Running(pid));
                }
                let timeout = self.config.steps[i].timeout_ms;
                self.steps[i].pid = Some(pid);
                self.steps[i].output_at = now;
                self.steps[i].deadline = timeout.map(|t| Instant::now() + Duration::from_millis(t));
                self.write_step_started(i, pid, now);
                self.watches
                    .insert(i, crate::live::Watch::new(self.config, i));
                let agent = &self.config.steps[i].agent;
                let _ = group_index;
                let mut fields = json!({"stepIndex": i, "agent": agent});
                crate::agent_output::step_started_fields(self.config, i, &mut fields);
                self.event("subagent.step.started", fields);
                true
            }
            Err(e) => {
                let program = self.config.steps[i]
                    .command
                    .first()
                    .cloned()
                    .unwrap_or_default();
                self.steps[i].spawn_error =
                    Some(format!("failed to start command '{program}': {e}"));
                self.steps[i].spawn_exit = match e.kind() {
                    std::io::ErrorKind::NotFound => 127,
                    std::io::ErrorKind::PermissionDenied => 126,
                    _ => 1,
                };
                self.steps[i].closed_at = now;
                self.write_step_end(i);
                false
            }
        }
    }

    fn write_step_started(&self, i: usize, pid: u32, now: u64) {
        let config = self.config;
        let identity = ProcessIdentity::of(pid).ok();
        // Content fsynced, directory not (see `update_status_unsynced_dir`):
        // lost in a crash, the status is back at `running`, which the
        // observer repairs as it would this one; the run's final write
        // syncs the directory, and with it this rename.
        let _ = durable::retry("status.json", || {
            self.own.update(&config.run_dir, false, |s| {
                Some(transitions::step_started(
                    s?,
                    config,
                    i,
                    pid,
                    identity.clone(),
                    now,
                ))
            })
        });
    }

    /// Records a step's end: proves its group is gone, fills its output,
    /// writes its status and event.
    fn end_step(&mut self, i: usize, exit: Ended) {
        self.watches.remove(&i);
        self.steps[i].ended = Some(exit);
        self.steps[i].closed_at = now_ms();
        let pgid = self.steps[i].pid.unwrap_or_default();
        self.steps[i].tree = Some(self.verify_group_gone(pgid));
        let ok = self.steps[i].succeeded();
        self.steps[i].report = crate::agent_output::after_step(self.config, i, ok);
        let filled = fill_output(self.config, i);
        if ok && crate::agent_output::preset_kind(self.config).is_none() {
            // A command's answer is its output file, as filled.
            self.steps[i].report.answer = AnswerRef::of_file(output_path(self.config, i));
        }
        self.write_step_end(i);
        if filled.is_err() {
            // The root was full or read-only; the step end's write waited
            // for it to come back, so the copy may go through now.
            let _ = fill_output(self.config, i);
        }
    }

    fn verify_group_gone(&mut self, pgid: u32) -> ProcessTree {
        let (alive, reaped) = empty_group(
            &mut self.signals,
            Some(pgid),
            Duration::from_secs(3),
            Duration::from_secs(1),
        );
        self.exits.extend(reaped);
        if alive.is_empty() {
            ProcessTree::Observed {
                mechanism: "posix-process-group".into(),
                process_group_id: pgid,
                verified_at: now_ms(),
            }
        } else {
            let diagnostic = format!("processes still alive after SIGKILL: {alive:?}");
            ProcessTree::Unknown {
                reason: "verification-failed".into(),
                diagnostic: Some(diagnostic),
            }
        }
    }

    fn write_step_end(&mut self, i: usize) {
        let (status, error, exit_code) = step_verdict(self.config, i, &self.steps[i]);
        let run = &self.steps[i];
        let reason = step_reason(status, error.as_deref(), run);
        let now = now_ms();
        let end = transitions::StepEnd {
            status,
            error: error.clone(),
            exit_code,
            started_at: run.started_at,
            closed_at: run.closed_at,
            timed_out: run.interruption == Some(Interruption::TimedOut),
            process: run.ended.map(|e| (e.code(), e.signal())),
            reason,
            answer: run.report.answer.clone(),
        };
        self.ends.insert(i, (end.clone(), now));
        // As the step's start: the run's final status write syncs the
        // directory before the run counts as finished.
        let write = || {
            self.own.update(&self.config.run_dir, false, |s| {
                Some(transitions::step_ended(s?, self.config, i, &end, now))
            })
        };
        let fields = json!({"stepIndex": i, "agent": self.config.steps[i].agent, "exitCode": run.ended.and_then(Ended::code),
            "durationMs": run.started_at.map(|t| run.closed_at.saturating_sub(t)), "tokens": null});
        let kind = if status == "complete" {
            "completed"
        } else {
            status
        };
        let kind = format!("subagent.step.{kind}");
        if write().is_err_and(|e| durable::Unwritable::blocked(&e).is_some()) {
            // Evidence first: a runner killed while it waits for space must
            // still leave the step's end (its reserved room takes the line).
            self.event(&kind, fields);
            let _ = durable::retry("status.json", write);
        } else {
            self.event(&kind, fields);
        }
    }

    /// Steps a group never started: skipped after a fail-fast trip, stopped
    /// or timed out with the run; otherwise they stay `pending`.
    fn skip_unstarted(&mut self, queue: &VecDeque<usize>, tripped: bool) {
        let why = match (self.interruption, tripped) {
            (Some(why), _) => why,
            (None, true) => Interruption::FailFast,
            (None, false) => return,
        };
        for i in queue {
            self.steps[*i].interruption = Some(why);
            self.steps[*i].closed_at = now_ms();
            self.write_step_end(*i);
        }
    }

    /// What the next chain step receives as `$SUBAGENTS_PREVIOUS_OUTPUT`.
    fn group_output(&self, index: usize, group: &GroupConfig) -> Option<PathBuf> {
        if group.count == 1 {
            return Some(output_path(self.config, group.start));
        }
        let combined = self
            .config
            .run_dir
            .join(format!("output-group-{index}.log"));
        let mut text = Vec::new();
        for i in group.start..group.start + group.count {
            text.extend(
                format!("=== {} (step {}) ===\n", self.config.steps[i].agent, i + 1).bytes(),
            );
            text.extend(std::fs::read(output_path(self.config, i)).unwrap_or_default());
        }
        atomic_file::write_private(&combined, &text)
            .ok()
            .map(|()| combined)
    }

    /// Terminates anything that escaped its group and was reparented to us.
    fn clean_up_orphans(&mut self) {
        let (alive, reaped) = empty_group(
            &mut self.signals,
            None,
            Duration::from_secs(2),
            Duration::from_secs(1),
        );
        self.exits.extend(reaped);
        self.survivors = alive;
    }

    fn event(&self, kind: &str, fields: serde_json::Value) {
        let now = now_ms();
        let dir = &self.config.run_dir;
        let _ = durable::retry("events.jsonl", || {
            events::append(dir, kind, &self.config.run_id, now, fields.clone())
        });
    }

    fn finish(&mut self) -> anyhow::Result<()> {
        let config = self.config;
        let now = now_ms();
        let stop_reason = self.own.stop_reason(&config.run_dir);
        let (state, error) = self.run_verdict(stop_reason);
        let verdict = Verdict {
            state,
            error,
            timed_out: self.interruption == Some(Interruption::TimedOut),
            stopped: state == RunState::Stopped && self.interruption == Some(Interruption::Stopped),
            now,
        };
        let written = durable::retry("status.json", || {
            self.own.update(&config.run_dir, true, |s| {
                Some(self.final_status(s?, &verdict))
            })
        });
        if let Err(e) = written {
            self.hand_over(&e, &verdict);
            return Err(e.into());
        }
        self.append_end_events(state, verdict.error.as_deref(), now);
        let mut candidate = self.candidate();
        let written = durable::retry("the candidate", || {
            write_candidate(&config.run_dir, &candidate)
        });
        if let Err(e) = written {
            self.hand_over(&e, &verdict);
            return Err(e.into());
        }
        if let Some(lease) = self.lease.take() {
            // The proof needs to know the lease was given back, and by whom.
            candidate.session_file = config
                .revival
                .as_ref()
                .map(|r| r.session_file.display().to_string());
            candidate.revival_lease_token = Some(lease.token().to_owned());
            durable::retry("the candidate", || {
                write_candidate(&config.run_dir, &candidate)
            })?;
            candidate.revival_lease_release_acknowledged = Some(lease.release().unwrap_or(false));
            durable::retry("the candidate", || {
                write_candidate(&config.run_dir, &candidate)
            })?;
        }
        fault::point(Point::AfterCandidate);
        Ok(())
    }

    /// `s` with every step's end and the run's verdict: what the final
    /// write makes of the status on disk. The step ends are applied again
    /// (they are idempotent) because a write of one may have been refused.
    fn final_status(&self, mut s: RunStatus, verdict: &Verdict) -> RunStatus {
        for (i, (end, at)) in &self.ends {
            s = transitions::step_ended(s, self.config, *i, end, *at);
        }
        transitions::finished(
            s,
            verdict.state,
            verdict.error.clone(),
            verdict.timed_out,
            verdict.stopped,
            verdict.now,
        )
    }

    /// The final status or the candidate could not be written because the
    /// root stayed read-only or full past the retry budget: rather than let
    /// the outcome die with us, hand it to the monitor, which writes it once
    /// the root takes it (see `handover`). Any other error hands nothing
    /// over: the monitor repairs the run from the evidence as before.
    fn hand_over(&mut self, error: &impl durable::Unwritable, verdict: &Verdict) {
        if error.blocked().is_none() {
            return;
        }
        let dir = &self.config.run_dir;
        // Reading still works on such a root; the copy of our last write
        // stands in for a status that cannot be read.
        let current = status::model::read_status(dir).ok().flatten();
        let Some(base) = current.or_else(|| self.own.0.borrow().clone()) else {
            return;
        };
        let status = self.final_status(base, verdict);
        let mut candidate = self.candidate();
        if let Some(lease) = self.lease.take() {
            candidate.session_file = self
                .config
                .revival
                .as_ref()
                .map(|r| r.session_file.display().to_string());
            candidate.revival_lease_token = Some(lease.token().to_owned());
            candidate.revival_lease_release_acknowledged = Some(lease.release().unwrap_or(false));
        }
        handover::send(&handover::Outcome { status, candidate });
    }

    /// The run's final state. A stop that arrived once every step had
    /// completed took no effect: the run is complete (the request stays in
    /// the events and in `stopReason`).
    fn run_verdict(&self, stop_reason: Option<String>) -> (RunState, Option<String>) {
        let all_succeeded = self.steps.iter().all(StepRun::succeeded);
        match self.interruption {
            Some(Interruption::Stopped) if !all_succeeded => {
                return (
                    RunState::Stopped,
                    Some(stop_message(stop_reason.as_deref())),
                );
            }
            Some(Interruption::TimedOut) => {
                let message = timed_out(self.config.timeout_ms.unwrap_or(0));
                // What the agent last said before the deadline (a CLI that
                // retries a connection it never gets says so).
                let words = self
                    .steps
                    .iter()
                    .filter(|r| r.interruption == Some(Interruption::TimedOut))
                    .find_map(|r| r.report.words.clone());
                let message = match words {
                    Some(words) => format!("{message}; last words: {words}"),
                    None => message,
                };
                return (RunState::Failed, Some(message));
            }
            _ => {}
        }
        // The step that really failed comes first; fail-fast casualties after.
        let started = |run: &&StepRun| run.started_at.is_some() && !run.succeeded();
        let real = |run: &&StepRun| run.interruption != Some(Interruption::FailFast);
        let pairs = || self.steps.iter().zip(&self.config.steps);
        let failed = pairs()
            .find(|(run, _)| started(run) && real(run))
            .or_else(|| pairs().find(|(run, _)| started(run)));
        let Some((run, step)) = failed else {
            return match all_succeeded {
                true => (RunState::Complete, None),
                false => (
                    RunState::Failed,
                    Some("Run ended before every step ran.".into()),
                ),
            };
        };
        // The run's error is its failing step's reason (named in a run of
        // several steps), not a generic "step failed".
        let i = self
            .steps
            .iter()
            .position(|r| std::ptr::eq(r, run))
            .unwrap_or(0);
        let (status, error, _) = step_verdict(self.config, i, run);
        let reason = step_reason(status, error.as_deref(), run)
            .unwrap_or_else(|| format!("step {} failed", step.agent));
        let reason = match self.config.steps.len() {
            1 => reason,
            _ => format!("{}: {reason}", step.agent),
        };
        // The reference: a child killed by a signal nobody here sent means stopped.
        let signaled = run.interruption.is_none() && matches!(run.ended, Some(Ended::Signaled(_)));
        let state = if signaled {
            RunState::Stopped
        } else {
            RunState::Failed
        };
        (state, Some(reason))
    }

    fn append_end_events(&self, state: RunState, error: Option<&str>, now: u64) {
        match self.interruption {
            Some(Interruption::Stopped) if state == RunState::Stopped => {
                self.event("subagent.run.stopped", json!({"message": error}))
            }
            Some(Interruption::TimedOut) => {
                let deadline = self.config.timeout_ms.map(|t| self.started_at + t);
                let fields = json!({"timeoutMs": self.config.timeout_ms, "deadlineAt": deadline, "message": error});
                self.event("subagent.run.timed_out", fields);
            }
            _ => {}
        }
        let fields = json!({"lifecycleArtifactVersion": LIFECYCLE_ARTIFACT_VERSION, "status": state.as_str(),
            "durationMs": now.saturating_sub(self.started_at)});
        self.event("subagent.run.completed", fields);
    }

    fn candidate(&self) -> Candidate {
        let mut writers = BTreeMap::new();
        let mut expected = BTreeMap::new();
        for (i, run) in self.steps.iter().enumerate() {
            expected.insert(i.to_string(), u64::from(run.pid.is_some()));
            if let (Some(ended), Some(tree)) = (run.ended, &run.tree) {
                let record = WriterRecord {
                    process_instance_id: format!(
                        "{}-writer-{i}",
                        self.config.runner_process_instance_id
                    ),
                    kind: "pi-writer".into(),
                    attempt: 0,
                    close_observed_at: run.closed_at,
                    exit_code: ended.code(),
                    signal: ended.signal(),
                    process_tree: self.proven_tree(tree),
                };
                writers.insert(i.to_string(), vec![record]);
            }
        }
        Candidate {
            version: 1,
            run_id: self.config.run_id.clone(),
            runner_process_instance_id: self.config.runner_process_instance_id.clone(),
            writers,
            expected_writers: Some(expected),
            session_file: None,
            revival_lease_token: None,
            revival_lease_release_acknowledged: None,
        }
    }
}

impl Execution<'_> {
    /// A group verified empty is still not proof while an orphan survives.
    fn proven_tree(&self, tree: &ProcessTree) -> ProcessTree {
        if self.survivors.is_empty() {
            return tree.clone();
        }
        let diagnostic = format!(
            "processes outside the group survived SIGKILL: {:?}",
            self.survivors
        );
        ProcessTree::Unknown {
            reason: "verification-failed".into(),
            diagnostic: Some(diagnostic),
        }
    }

    /// Steps that never started when the run was stopped or timed out end
    /// with the run (the reference marks pending steps stopped / failed).
    fn end_unstarted(&mut self) {
        let Some(why) = self.interruption else { return };
        for i in 0..self.steps.len() {
            if self.steps[i].started_at.is_none() && self.steps[i].interruption.is_none() {
                self.steps[i].interruption = Some(why);
                self.steps[i].closed_at = now_ms();
                self.write_step_end(i);
            }
        }
    }
}

/// The run's verdict as the final write records it.
struct Verdict {
    state: RunState,
    error: Option<String>,
    timed_out: bool,
    /// A stop request ended the run: its error is the recorded stop reason.
    stopped: bool,
    now: u64,
}

/// The error of a run or step that hit its deadline, spelled as every
/// view spells durations.
fn timed_out(ms: u64) -> String {
    format!("timed out after {}", status::spell_duration(ms))
}

fn stop_message(reason: Option<&str>) -> String {
    reason.unwrap_or("Subagent stopped by user.").to_owned()
}

/// A step's final status, error and exit code.
fn step_verdict(
    config: &LaunchConfig,
    i: usize,
    run: &StepRun,
) -> (&'static str, Option<String>, i64) {
    if let Some(error) = &run.spawn_error {
        return ("failed", Some(error.clone()), run.spawn_exit);
    }
    match (run.interruption, run.ended) {
        (Some(Interruption::Stopped), _) => {
            ("stopped", Some("Subagent stopped by user.".into()), 1)
        }
        (Some(Interruption::TimedOut), _) => {
            let ms = config.steps[i]
                .timeout_ms
                .or(config.timeout_ms)
                .unwrap_or(0);
            ("failed", Some(timed_out(ms)), 1)
        }
        (Some(Interruption::Idle), _) => (
            "failed",
            Some(transitions::idle_reason(
                config.steps[i].idle_timeout_ms.unwrap_or(0),
            )),
            1,
        ),
        (Some(Interruption::FailFast), None) => (
            "failed",
            Some("skipped: a sibling failed (failFast)".into()),
            1,
        ),
        (Some(Interruption::FailFast), Some(_)) => (
            "failed",
            Some("stopped: a sibling failed (failFast)".into()),
            1,
        ),
        (None, Some(Ended::Exited(0))) => ("complete", None, 0),
        (None, Some(ended @ Ended::Signaled(_))) => (
            "stopped",
            Some(format!("command ended with {}", ended.describe())),
            1,
        ),
        (None, Some(ended)) => (
            "failed",
            Some(format!("command ended with {}", ended.describe())),
            ended.code().map_or(1, i64::from),
        ),
        (None, None) => ("pending", None, 1),
    }
}

/// Why a step that did not complete ended: a stop, a timeout (with the
/// agent's last words) or a fail-fast trip as its error says; a failure
/// in the agent's or COMMAND's own words when it gave any, else its error
/// (the exit code or signal).
fn step_reason(status: &str, error: Option<&str>, run: &StepRun) -> Option<String> {
    if status == "complete" || status == "pending" {
        return None;
    }
    let error = error.map(str::to_owned);
    let words = run.report.words.clone();
    match run.interruption {
        Some(Interruption::TimedOut) => match (error, words) {
            (Some(error), Some(words)) => Some(format!("{error}; last words: {words}")),
            (error, words) => error.or(words),
        },
        Some(_) => error,
        None if run.spawn_error.is_some() => error,
        None => match (words, run.ended) {
            (Some(words), Some(ended @ Ended::Signaled(_))) => {
                Some(format!("{words} ({})", ended.describe()))
            }
            (words, _) => words.or(error),
        },
    }
}

/// A step's output file, when the COMMAND left it empty, is a copy of its
/// stdout log. Made durable by the directory fsync of the run's final status.
fn fill_output(config: &LaunchConfig, i: usize) -> Result<(), atomic_file::Error> {
    let output = output_path(config, i);
    if std::fs::metadata(&output).is_ok_and(|m| m.len() > 0) {
        return Ok(());
    }
    let stdout = std::fs::read(log_path(config, i, "stdout")).unwrap_or_default();
    atomic_file::replace_private_with(&output, &stdout, || {})
}

/// The latest write to step `i`'s stdout, stderr or output file that holds
/// anything (ms since the epoch); `None` while all three are empty.
fn last_output_ms(config: &LaunchConfig, i: usize) -> Option<u64> {
    let files = [
        log_path(config, i, "stdout"),
        log_path(config, i, "stderr"),
        output_path(config, i),
    ];
    files
        .iter()
        .filter_map(|f| std::fs::metadata(f).ok())
        .filter(|m| m.len() > 0)
        .filter_map(|m| m.modified().ok())
        .filter_map(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_millis() as u64)
        .max()
}

/// Replaces `{previous}` in step `i`'s task file with the previous group's
/// output (its end trimmed, at most [`MAX_PREVIOUS_BYTES`]), before the
/// step starts: the task file stays the only file that holds task text.
fn put_previous(
    config: &LaunchConfig,
    i: usize,
    previous: Option<&std::path::Path>,
) -> std::io::Result<()> {
    let Some(task_file) = &config.steps[i].task_file else {
        return Ok(());
    };
    let task = std::fs::read_to_string(task_file)?;
    let output = previous
        .and_then(|p| std::fs::read(p).ok())
        .unwrap_or_default();
    let mut text = String::from_utf8_lossy(&output[..output.len().min(MAX_PREVIOUS_BYTES)])
        .trim_end()
        .to_owned();
    if output.len() > MAX_PREVIOUS_BYTES {
        let path = previous
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        text.push_str(&format!("\n[output cut at 1 MiB; all of it is in {path}]"));
    }
    let filled = task.replace(STEP_PREVIOUS, &text);
    atomic_file::write_private(task_file, filled.as_bytes()).map_err(std::io::Error::other)
}

/// The placeholder of the previous output in a chain step's task.
pub const STEP_PREVIOUS: &str = "{previous}";

/// The task as COMMAND's stdin: `task.md` itself, byte for byte (the
/// launcher writes it ending with a newline, so an agent that reads a line
/// gets one, and `$SUBAGENTS_TASK_FILE` holds the same bytes).
fn task_stdin(path: &std::path::Path) -> std::io::Result<File> {
    File::open(path)
}

fn spawn_command(
    config: &LaunchConfig,
    i: usize,
    previous: Option<&std::path::Path>,
    lease_env: Option<(&str, &str)>,
) -> std::io::Result<u32> {
    let step = &config.steps[i];
    let (program, rest) = step
        .command
        .split_first()
        .ok_or_else(|| std::io::Error::other("empty command"))?;
    let task = step
        .task_file
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let log = |stream: &str| {
        OpenOptions::new()
            .append(true)
            .create(true)
            .mode(atomic_file::FILE_MODE)
            .open(log_path(config, i, stream))
    };
    let stdin = match &step.task_file {
        Some(path) => Stdio::from(task_stdin(path)?),
        None => Stdio::null(),
    };
    // Created here, 0600, so a COMMAND writing to it cannot leave it world-readable.
    OpenOptions::new()
        .append(true)
        .create(true)
        .mode(atomic_file::FILE_MODE)
        .open(output_path(config, i))?;
    let mut command = Command::new(program);
    command
        .args(rest.iter().map(|a| a.replace("{task_file}", &task)))
        .current_dir(&step.cwd)
        .stdin(stdin)
        .stdout(log("stdout")?)
        .stderr(log("stderr")?)
        .env_remove(READY_FD_ENV)
        .env_remove(handover::OUTCOME_FD_ENV)
        .env_remove(fault::FAULT_ENV)
        .env("SUBAGENTS_RUN_ID", &config.run_id)
        .env("SUBAGENTS_ROOT", &config.root)
        .env("SUBAGENTS_RUN_DIR", &config.run_dir)
        .env("SUBAGENTS_STEP_INDEX", i.to_string())
        .env("SUBAGENTS_OUTPUT_FILE", output_path(config, i))
        .envs(&config.env)
        .envs(&step.env)
        .process_group(0);
    if step.task_file.is_some() {
        command.env("SUBAGENTS_TASK_FILE", &task);
    }
    if let Some(previous) = previous {
        command.env("SUBAGENTS_PREVIOUS_OUTPUT", previous);
    }
    if let Some((name, token)) = lease_env {
        command.env(name, token);
    }
    if let Some(revival) = &config.revival {
        command.env("SUBAGENTS_RESUMED_FROM", &revival.source_run_id);
    }
    if let Some(root) = &config.session_root {
        command.env("SUBAGENTS_SESSION_DIR", root);
    }
    if let Some(descriptor) = crate::config::child_fanout_env(config, i) {
        if crate::config::child_gets_reference_env(config) {
            command.env(fanout_budget::BUDGET_ENV_ALIAS, &descriptor);
        } else {
            command.env_remove(fanout_budget::BUDGET_ENV_ALIAS);
        }
        command.env(fanout_budget::BUDGET_ENV, descriptor);
    }
    // SAFETY: only resets the signal mask (async-signal-safe) between fork and exec.
    unsafe {
        command.pre_exec(crate::procs::unblock_all_in_child);
    }
    Ok(command.spawn()?.id())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::StepConfig;

    fn config(step_timeout: Option<u64>, run_timeout: Option<u64>) -> LaunchConfig {
        let step = |agent: &str| StepConfig {
            agent: agent.into(),
            command: vec!["true".into()],
            cwd: PathBuf::from("/"),
            task_file: None,
            timeout_ms: step_timeout,
            fanout_label: None,
            env: Default::default(),
            idle_timeout_ms: None,
            previous_in_task: false,
        };
        LaunchConfig {
            run_id: "r".into(),
            root: PathBuf::from("/nonexistent"),
            run_dir: PathBuf::from("/nonexistent/async-subagent-runs/r"),
            runner_process_instance_id: "rid".into(),
            mode: "parallel".into(),
            steps: vec![step("first"), step("second")],
            groups: vec![GroupConfig {
                start: 0,
                count: 2,
                concurrency: 2,
                fail_fast: true,
                parallel: true,
            }],
            timeout_ms: run_timeout,
            session_id: None,
            fanout_descriptor: None,
            env: Default::default(),
            capacity_slot: None,
            revival: None,
            session_root: None,
            queue: None,
        }
    }

    fn ended(exit: Ended, interruption: Option<Interruption>) -> StepRun {
        StepRun {
            pid: Some(1),
            started_at: Some(1),
            ended: Some(exit),
            interruption,
            ..StepRun::default()
        }
    }

    #[test]
    fn a_step_verdict_follows_how_it_ended() {
        let c = config(None, Some(5_000));
        let verdict = |run: &StepRun| {
            let (status, error, code) = step_verdict(&c, 0, run);
            (status, error.unwrap_or_default(), code)
        };
        assert_eq!(
            verdict(&ended(Ended::Exited(0), None)),
            ("complete", String::new(), 0)
        );
        assert_eq!(
            verdict(&ended(Ended::Exited(3), None)),
            ("failed", "command ended with exit code 3".into(), 3)
        );
        assert_eq!(
            verdict(&ended(Ended::Signaled(Signal::SIGSEGV), None)),
            ("stopped", "command ended with signal SIGSEGV".into(), 1)
        );
        let sigterm = Ended::Signaled(Signal::SIGTERM);
        assert_eq!(
            verdict(&ended(sigterm, Some(Interruption::Stopped))),
            ("stopped", "Subagent stopped by user.".into(), 1)
        );
        assert_eq!(
            verdict(&ended(sigterm, Some(Interruption::TimedOut))),
            ("failed", "timed out after 5s".into(), 1)
        );
        assert_eq!(
            verdict(&ended(sigterm, Some(Interruption::FailFast))),
            ("failed", "stopped: a sibling failed (failFast)".into(), 1)
        );
        let skipped = StepRun {
            interruption: Some(Interruption::FailFast),
            ..StepRun::default()
        };
        assert_eq!(
            verdict(&skipped),
            ("failed", "skipped: a sibling failed (failFast)".into(), 1)
        );
        assert_eq!(verdict(&StepRun::default()), ("pending", String::new(), 1));
        let unstartable = StepRun {
            spawn_error: Some("failed to start command 'x': not found".into()),
            ..StepRun::default()
        };
        assert_eq!(verdict(&unstartable).0, "failed");
        assert_eq!(
            verdict(&unstartable).1,
            "failed to start command 'x': not found"
        );
    }

    #[test]
    fn a_step_timeout_is_reported_before_the_run_timeout() {
        let c = config(Some(1_000), Some(9_000));
        let run = ended(
            Ended::Signaled(Signal::SIGKILL),
            Some(Interruption::TimedOut),
        );
        let (_, error, _) = step_verdict(&c, 1, &run);
        assert_eq!(error.as_deref(), Some("timed out after 1s"));
    }

    #[test]
    fn only_a_clean_exit_without_interruption_succeeds() {
        assert!(ended(Ended::Exited(0), None).succeeded());
        assert!(!ended(Ended::Exited(1), None).succeeded());
        assert!(!ended(Ended::Exited(0), Some(Interruption::FailFast)).succeeded());
        let mut spawn_failed = ended(Ended::Exited(0), None);
        spawn_failed.spawn_error = Some("x".into());
        assert!(!spawn_failed.succeeded());
        assert!(!StepRun::default().succeeded());
    }

    /// An execution over `config` with the given step outcomes.
    fn verdict_of(
        c: &LaunchConfig,
        steps: Vec<StepRun>,
        interruption: Option<Interruption>,
    ) -> (RunState, Option<String>) {
        let _serial = crate::procs::tests::serial();
        let mut execution =
            Execution::new(c, Signals::block().unwrap(), 0, None, OwnStatus::default());
        execution.steps = steps;
        execution.interruption = interruption;
        execution.run_verdict(Some("reason given".into()))
    }

    #[test]
    fn the_run_verdict_names_the_step_that_really_failed() {
        let c = config(None, Some(7_000));
        let casualty = ended(
            Ended::Signaled(Signal::SIGTERM),
            Some(Interruption::FailFast),
        );
        let culprit = ended(Ended::Exited(2), None);
        assert_eq!(
            verdict_of(&c, vec![casualty, culprit], None),
            (
                RunState::Failed,
                Some("second: command ended with exit code 2".into())
            )
        );
        let ok = || ended(Ended::Exited(0), None);
        assert_eq!(
            verdict_of(&c, vec![ok(), ok()], None),
            (RunState::Complete, None)
        );
        assert_eq!(
            verdict_of(&c, vec![ok(), StepRun::default()], None),
            (
                RunState::Failed,
                Some("Run ended before every step ran.".into())
            )
        );
        let outside = ended(Ended::Signaled(Signal::SIGKILL), None);
        assert_eq!(
            verdict_of(&c, vec![ok(), outside], None),
            (
                RunState::Stopped,
                Some("second: command ended with signal SIGKILL".into())
            )
        );
        // A stop read after every step completed took no effect.
        assert_eq!(
            verdict_of(&c, vec![ok(), ok()], Some(Interruption::Stopped)),
            (RunState::Complete, None)
        );
        let stopped = ended(
            Ended::Signaled(Signal::SIGTERM),
            Some(Interruption::Stopped),
        );
        assert_eq!(
            verdict_of(&c, vec![ok(), stopped], Some(Interruption::Stopped)),
            (RunState::Stopped, Some("reason given".into()))
        );
        let unstarted = StepRun {
            interruption: Some(Interruption::Stopped),
            ..StepRun::default()
        };
        assert_eq!(
            verdict_of(&c, vec![ok(), unstarted], Some(Interruption::Stopped)),
            (RunState::Stopped, Some("reason given".into()))
        );
        assert_eq!(
            verdict_of(&c, vec![ok(), ok()], Some(Interruption::TimedOut)),
            (RunState::Failed, Some("timed out after 7s".into()))
        );
    }

    #[test]
    fn a_lone_step_that_could_not_start_fails_the_run_with_its_own_error() {
        let unstartable = || StepRun {
            started_at: Some(1),
            spawn_error: Some("failed to start command 'x': not found".into()),
            ..StepRun::default()
        };
        let mut lone = config(None, None);
        lone.steps.truncate(1);
        lone.groups[0].count = 1;
        assert_eq!(
            verdict_of(&lone, vec![unstartable()], None),
            (
                RunState::Failed,
                Some("failed to start command 'x': not found".into())
            )
        );
        let ok = ended(Ended::Exited(0), None);
        assert_eq!(
            verdict_of(&config(None, None), vec![ok, unstartable()], None),
            (
                RunState::Failed,
                Some("second: failed to start command 'x': not found".into())
            )
        );
    }

    #[test]
    fn a_task_reaches_stdin_as_the_task_file_holds_it() {
        let tmp = tempfile::tempdir().unwrap();
        let read = |text: &str| {
            let path = tmp.path().join("task.md");
            std::fs::write(&path, text).unwrap();
            std::io::read_to_string(task_stdin(&path).unwrap()).unwrap()
        };
        assert_eq!(read("do it"), "do it");
        assert_eq!(read("do it\n"), "do it\n");
        assert_eq!(read(""), "");
    }

    #[test]
    fn the_next_step_gets_the_output_of_the_group_before() {
        let tmp = tempfile::tempdir().unwrap();
        let mut c = config(None, None);
        c.run_dir = tmp.path().to_owned();
        std::fs::write(output_path(&c, 0), "one\n").unwrap();
        std::fs::write(output_path(&c, 1), "two\n").unwrap();
        let _serial = crate::procs::tests::serial();
        let execution =
            Execution::new(&c, Signals::block().unwrap(), 0, None, OwnStatus::default());
        let single = GroupConfig {
            start: 1,
            count: 1,
            ..c.groups[0]
        };
        assert_eq!(execution.group_output(0, &single), Some(output_path(&c, 1)));
        let combined = execution.group_output(3, &c.groups[0]).unwrap();
        assert_eq!(combined, tmp.path().join("output-group-3.log"));
        assert_eq!(
            std::fs::read_to_string(combined).unwrap(),
            "=== first (step 1) ===\none\n=== second (step 2) ===\ntwo\n"
        );
    }

    #[test]
    fn the_stop_reason_is_read_from_disk_else_from_the_last_write() {
        let tmp = tempfile::tempdir().unwrap();
        let own = OwnStatus::default();
        assert_eq!(own.stop_reason(tmp.path()), None);
        let mut last = RunStatus::new("r", RunState::Running);
        last.stop_reason = Some("in the runner's copy".into());
        *own.0.borrow_mut() = Some(last.clone());
        let mut on_disk = last;
        on_disk.stop_reason = Some("asked from top".into());
        status::model::write_status(tmp.path(), &on_disk).unwrap();
        assert_eq!(
            own.stop_reason(tmp.path()).as_deref(),
            Some("asked from top")
        );
        std::fs::write(tmp.path().join("status.json"), "{\"runId\":").unwrap();
        assert_eq!(
            own.stop_reason(tmp.path()).as_deref(),
            Some("in the runner's copy")
        );
    }

    #[test]
    fn a_stop_that_came_before_a_group_starts_none_of_its_steps() {
        let tmp = tempfile::tempdir().unwrap();
        let mut c = config(None, None);
        c.run_dir = tmp.path().to_owned();
        let _serial = crate::procs::tests::serial();
        let mut execution =
            Execution::new(&c, Signals::block().unwrap(), 0, None, OwnStatus::default());
        assert!(!execution.stop_pending());
        // SAFETY: raise(3) sends a signal to this thread, which blocks it.
        unsafe { libc::raise(libc::SIGTERM) };
        assert!(!execution.run_group(0, &c.groups[0]));
        assert_eq!(execution.interruption, Some(Interruption::Stopped));
        assert!(
            execution.steps.iter().all(|s| s.pid.is_none()),
            "{:?}",
            execution.steps
        );
    }

    #[test]
    fn the_wait_wakes_for_the_output_check_and_each_steps_idle_limit() {
        let mut c = config(None, None);
        c.steps[0].idle_timeout_ms = Some(10_000);
        let _serial = crate::procs::tests::serial();
        let mut execution =
            Execution::new(&c, Signals::block().unwrap(), 0, None, OwnStatus::default());
        assert_eq!(execution.next_deadline(&[]), None, "nothing runs");
        assert_eq!(
            execution.next_deadline(&[1]),
            Some(execution.next_output_check)
        );
        // Step 0 is running (no signal is sent here) and last wrote now.
        let now = now_ms();
        execution.steps[0].pid = Some(4242);
        execution.steps[0].output_at = now;
        assert_eq!(execution.idle_due_ms(0), Some(now + 10_000));
        assert_eq!(execution.idle_due_ms(1), None, "no idle limit");
        let due = execution.idle_due(0).unwrap();
        let left = due.saturating_duration_since(Instant::now());
        assert!(
            left > Duration::from_secs(8) && left <= Duration::from_secs(10),
            "{left:?}"
        );
        assert!(!execution.idle_expired(0));
        execution.next_output_check = Instant::now() + Duration::from_secs(60);
        let wake = execution.next_deadline(&[0]).unwrap();
        // The idle limit, not the output check a minute away.
        assert!(
            wake.saturating_duration_since(Instant::now()) <= Duration::from_secs(10),
            "{wake:?}"
        );
        execution.steps[0].output_at = now - 10_001;
        assert!(execution.idle_expired(0), "silent past its limit");
        execution.steps[0].interruption = Some(Interruption::Stopped);
        assert_eq!(execution.idle_due_ms(0), None, "already being ended");
        assert!(!execution.idle_expired(0));
        execution.steps[0].interruption = None;
        execution.steps[0].pid = None;
        assert_eq!(execution.idle_due_ms(0), None, "not started");
    }

    #[test]
    fn the_last_output_is_recorded_at_each_output_check_and_at_most_every_five_seconds() {
        let tmp = tempfile::tempdir().unwrap();
        let mut c = config(None, None);
        c.run_dir = tmp.path().to_owned();
        let mut running = RunStatus::new("r", RunState::Running);
        running.last_update = Some(1);
        status::model::write_status(tmp.path(), &running).unwrap();
        let last_update = || {
            status::model::read_status(tmp.path())
                .unwrap()
                .unwrap()
                .last_update
        };
        let before = last_update();
        let stdout = log_path(&c, 0, "stdout");
        let wrote = |ms: u64| {
            std::fs::write(&stdout, "out").unwrap();
            let at = std::time::UNIX_EPOCH + Duration::from_millis(ms);
            File::options()
                .write(true)
                .open(&stdout)
                .unwrap()
                .set_modified(at)
                .unwrap();
        };
        let _serial = crate::procs::tests::serial();
        let mut execution =
            Execution::new(&c, Signals::block().unwrap(), 0, None, OwnStatus::default());
        // Step 0 runs without an idle limit: nothing is signalled here.
        execution.steps[0].pid = Some(4242);
        let t = 1_767_225_601_000;
        wrote(t);
        execution.watch_output(&[0]);
        assert_eq!(
            execution.steps[0].output_at, 0,
            "not looked at before the check"
        );
        let check_due =
            |e: &mut Execution<'_>| e.next_output_check = Instant::now() - Duration::from_secs(1);
        let recorded = |e: &Execution<'_>| (e.steps[0].output_at, e.steps[0].recorded_output_at);

        check_due(&mut execution);
        execution.watch_output(&[0]);
        assert_eq!(recorded(&execution), (t, Some(t)));
        assert!(execution.next_output_check > Instant::now() + Duration::from_secs(4));
        let recorded_once = last_update();
        assert_eq!(before, Some(1));
        assert_ne!(recorded_once, before, "the status gained lastOutputAt");

        wrote(t + 1_000);
        check_due(&mut execution);
        execution.watch_output(&[0]);
        assert_eq!(
            recorded(&execution),
            (t + 1_000, Some(t)),
            "1 s later: not recorded"
        );
        assert_eq!(last_update(), recorded_once, "nothing new was written");

        wrote(t + 6_000);
        check_due(&mut execution);
        execution.watch_output(&[0]);
        assert_eq!(recorded(&execution), (t + 6_000, Some(t + 6_000)));

        execution.steps[0].ended = Some(Ended::Exited(0));
        wrote(t + 20_000);
        check_due(&mut execution);
        execution.watch_output(&[0]);
        assert_eq!(
            recorded(&execution),
            (t + 6_000, Some(t + 6_000)),
            "an ended step"
        );
    }

    #[test]
    fn the_last_output_is_the_latest_write_to_a_file_that_holds_anything() {
        let tmp = tempfile::tempdir().unwrap();
        let mut c = config(None, None);
        c.run_dir = tmp.path().to_owned();
        assert_eq!(last_output_ms(&c, 0), None);
        let at = |ms: u64| std::time::UNIX_EPOCH + Duration::from_millis(ms);
        let write = |path: PathBuf, text: &str, ms: u64| {
            std::fs::write(&path, text).unwrap();
            File::options()
                .write(true)
                .open(&path)
                .unwrap()
                .set_modified(at(ms))
                .unwrap();
        };
        write(output_path(&c, 0), "", 1_767_225_609_000);
        assert_eq!(last_output_ms(&c, 0), None, "all empty");
        write(log_path(&c, 0, "stdout"), "out", 1_767_225_601_000);
        write(log_path(&c, 0, "stderr"), "err", 1_767_225_603_000);
        assert_eq!(last_output_ms(&c, 0), Some(1_767_225_603_000));
        assert_eq!(last_output_ms(&c, 1), None, "another step's files");
    }

    #[test]
    fn an_output_file_the_command_filled_is_kept_and_an_empty_one_gets_stdout() {
        let tmp = tempfile::tempdir().unwrap();
        let mut c = config(None, None);
        c.run_dir = tmp.path().to_owned();
        std::fs::write(log_path(&c, 0, "stdout"), "the log").unwrap();
        std::fs::write(output_path(&c, 0), "the answer").unwrap();
        fill_output(&c, 0).unwrap();
        assert_eq!(
            std::fs::read_to_string(output_path(&c, 0)).unwrap(),
            "the answer"
        );
        std::fs::write(output_path(&c, 0), "").unwrap();
        fill_output(&c, 0).unwrap();
        assert_eq!(
            std::fs::read_to_string(output_path(&c, 0)).unwrap(),
            "the log"
        );
    }

    #[test]
    fn a_step_reason_is_its_own_words_unless_it_never_started() {
        let words = |words: &str, spawn_error: Option<&str>| StepRun {
            spawn_error: spawn_error.map(str::to_owned),
            report: crate::agent_output::StepReport {
                words: Some(words.into()),
                ..Default::default()
            },
            ..ended(Ended::Exited(1), None)
        };
        let failed = words("model not found", None);
        assert_eq!(step_reason("complete", Some("x"), &failed), None);
        assert_eq!(step_reason("pending", Some("x"), &failed), None);
        assert_eq!(
            step_reason("failed", Some("exit code 1"), &failed).as_deref(),
            Some("model not found")
        );
        let unstarted = words("stale words", Some("not found"));
        assert_eq!(
            step_reason(
                "failed",
                Some("failed to start command 'x': not found"),
                &unstarted
            )
            .as_deref(),
            Some("failed to start command 'x': not found")
        );
    }

    #[test]
    fn previous_output_fills_the_task_up_to_one_mebibyte() {
        let tmp = tempfile::tempdir().unwrap();
        let mut c = config(None, None);
        let task = tmp.path().join("task.md");
        c.steps[1].task_file = Some(task.clone());
        let previous = tmp.path().join("output-0.log");
        let fill = |output: &[u8]| {
            std::fs::write(&task, "before {previous} after\n").unwrap();
            std::fs::write(&previous, output).unwrap();
            put_previous(&c, 1, Some(&previous)).unwrap();
            std::fs::read_to_string(&task).unwrap()
        };
        let some = "x".repeat(3000);
        assert_eq!(
            fill(format!("{some}\n\n").as_bytes()),
            format!("before {some} after\n")
        );
        let whole = "y".repeat(MAX_PREVIOUS_BYTES);
        assert_eq!(fill(whole.as_bytes()), format!("before {whole} after\n"));
        let filled = fill(format!("{whole}zzz").as_bytes());
        assert_eq!(
            filled,
            format!(
                "before {whole}\n[output cut at 1 MiB; all of it is in {}] after\n",
                previous.display()
            )
        );
        std::fs::write(&task, "nothing before {previous}.").unwrap();
        put_previous(&c, 1, None).unwrap();
        assert_eq!(std::fs::read_to_string(&task).unwrap(), "nothing before .");
    }

    #[test]
    fn the_candidate_claims_each_started_step_and_no_group_while_an_orphan_survives() {
        let c = config(None, None);
        let _serial = crate::procs::tests::serial();
        let mut execution =
            Execution::new(&c, Signals::block().unwrap(), 0, None, OwnStatus::default());
        let observed = ProcessTree::Observed {
            mechanism: "posix-process-group".into(),
            process_group_id: 100,
            verified_at: 5,
        };
        execution.steps = vec![
            StepRun {
                tree: Some(observed.clone()),
                ..ended(Ended::Exited(0), None)
            },
            StepRun::default(),
        ];
        let candidate = execution.candidate();
        assert_eq!(
            candidate.expected_writers,
            Some(BTreeMap::from([("0".into(), 1), ("1".into(), 0)]))
        );
        assert_eq!(candidate.writers["0"][0].process_tree, observed);
        assert_eq!(
            candidate.writers["0"][0].process_instance_id,
            "rid-writer-0"
        );
        assert!(!candidate.writers.contains_key("1"));
        execution.survivors = vec![4242];
        let candidate = execution.candidate();
        assert!(matches!(
            &candidate.writers["0"][0].process_tree,
            ProcessTree::Unknown { diagnostic: Some(d), .. } if d.contains("4242")
        ));
    }
}
