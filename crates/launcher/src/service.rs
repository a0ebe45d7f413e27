//! [`Launcher`]: the launcher's typed API, one method per operation, under
//! both front-ends (the command line in `cli`/`commands`, the MCP server in
//! `mcp`). Methods take [`crate::api`] requests and return its outcomes or
//! an [`Error`](crate::Error) carrying the exit code and structured detail; none prints.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};

use listing::list::RunSummary;
use nix::sys::signal::Signal;
use process_identity::Liveness;
use serde_json::json;
use status::model::update_status;
use status::reconcile;
use status::{Layout, RunState, now_ms};
use supervisor::observer;

use crate::admission;
use crate::api::{
    AgentsOutcome, AgentsRequest, BudgetClaimRequest, BudgetCreateRequest, BudgetOutcome,
    BudgetQuery, CapacityOutcome, CapacityQuery, CapacitySlot, ConfigOutcome, ConfigRequest,
    DEFAULT_STOP_REASON, DismissOutcome, DismissRequest, Launched, ListOutcome, ListQuery,
    LogsOutcome, LogsRequest, PruneOutcome, PruneRequest, ReconcileOutcome, ReconcileRequest,
    ResumeRequest, Resumed, RunRequest, RunView, Settings, StopOutcome, StopRequest,
    ValidateOutcome, ValidateRequest, WaitOutcome, WaitRequest,
};
use crate::error::Result;
use crate::runs::{load, load_observed, observe, observer_options};
use crate::wait::{Keep, WaitEvent, watch_dirs};
use supervisor::procs::signal_group;

/// The operations of [`Launcher`]: each is a method of that name (with a
/// streaming variant `<name>_each` where a front-end prints as it reads),
/// and each has a command line command (`budget_create` is `budget create`)
/// and an MCP tool of the same name; the `tidy` tests checks all three. The
/// other public methods (`new`, `layout`, `settings`) are accessors.
pub const OPERATIONS: &[&str] = &[
    "run",
    "status",
    "list",
    "wait",
    "stop",
    "resume",
    "logs",
    "budget",
    "budget_create",
    "budget_claim",
    "capacity",
    "reconcile",
    "dismiss",
    "prune",
    "validate",
    "agents",
    "config",
];

/// The launcher of one state root with its launch settings.
#[derive(Debug, Clone)]
pub struct Launcher {
    layout: Layout,
    settings: Settings,
}

impl Launcher {
    /// A launcher of `layout`'s state root.
    pub fn new(layout: Layout, settings: Settings) -> Self {
        Self { layout, settings }
    }

    /// The state root's layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The launch settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Launches a detached run; returns once its runner is running. Limits
    /// refuse with exit 3 and the fan-out rejection or capacity snapshot.
    pub fn run(&self, request: &RunRequest) -> Result<Launched> {
        crate::launch::run(&self.layout, request, &self.settings)
    }

    /// One run's summary (observed and reconciled first).
    pub fn status(&self, run: &str) -> Result<RunView> {
        let run = &self.handle(run)?;
        let mut warnings = Vec::new();
        let (mut run, observation) = load_observed(&self.layout, run, &mut warnings)
            .map_err(|e| crate::damaged::status_error(&self.layout, run, e))?;
        run.status = crate::executor::with_dispatch(&run.async_dir, run.status);
        crate::answers::attach(&mut run);
        // Freeing the session's over slots reads every slot's owner; an
        // active run has no slot to give back, so asking about it costs the
        // same however many runs are active (a full pool is reconciled by
        // the launch that needs a slot, and `list` frees slots too).
        if !run.status.state.is_active() {
            admission::release_finished(&self.layout, run.status.session_id.as_deref());
        }
        let observer = match observation {
            observer::Observation::Unproven(why) => Some(format!("retained: {why}")),
            observer::Observation::RunnerAlive(pid) => {
                Some(format!("its monitor is gone; runner {pid} still runs"))
            }
            _ => None,
        };
        Ok(RunView {
            run,
            observer,
            warnings,
        })
    }

    /// The runs `query` asks for, in listing order, collected.
    pub fn list(&self, query: &ListQuery) -> Result<ListOutcome> {
        crate::listing::collect(&self.layout, query)
    }

    /// The listing of `query` written to `out` as it is read, in bounded
    /// memory: the JSON array of `list --json` (pretty or on one line), or the detailed text
    /// of `list --long`. Not for `sort` or `dismissed` (they need every row
    /// first: use [`Launcher::list`]). Returns the repairs that could not be
    /// written, one line each.
    pub fn list_each(
        &self,
        query: &ListQuery,
        format: crate::listing::ListFormat,
        out: &mut dyn std::io::Write,
    ) -> Result<Vec<String>> {
        crate::listing::stream(&self.layout, query, format, out)
    }

    /// Blocks until every run is over or the timeout passes (exit 124);
    /// `report` hears of each run as it settles and of the rest meanwhile,
    /// and may give up (exit 1).
    pub fn wait(
        &self,
        request: &WaitRequest,
        report: &mut dyn FnMut(WaitEvent<'_>) -> Keep,
    ) -> Result<WaitOutcome> {
        // A malformed timeout is refused before anything is looked up.
        crate::wait::parse_timeout(request.timeout.as_deref())?;
        let runs = if request.runs.is_empty() {
            self.session_runs(false)?
                .into_iter()
                .map(|r| r.id)
                .collect()
        } else {
            self.handles(&request.runs)?
        };
        // No run named and none active in the session: nothing to wait for.
        if runs.is_empty() {
            return Ok(WaitOutcome { runs: Vec::new() });
        }
        let request = WaitRequest {
            runs,
            ..request.clone()
        };
        crate::wait::wait(&self.layout, &request, report)
    }

    /// `last` is the newest run of this launcher's session by start time
    /// (ties broken by the larger id); any other text is an id or prefix,
    /// passed on as given.
    fn handle(&self, run: &str) -> Result<String> {
        if run != crate::runs::LAST {
            return Ok(run.to_owned());
        }
        let session = admission::session_id(self.settings.session.as_deref());
        self.session_runs(true)?
            .into_iter()
            .max_by(|a, b| {
                let start = |r: &RunSummary| r.status.started_at.unwrap_or(0);
                start(a).cmp(&start(b)).then_with(|| a.id.cmp(&b.id))
            })
            .map(|r| r.id)
            .ok_or_else(|| {
                crate::Error::of(
                    crate::ErrorKind::UnknownRun,
                    format!("no such run: 'last': session '{session}' has no run"),
                )
                .with_hint("`last` is the newest run of this session ($SUBAGENTS_SESSION_ID, else the terminal); `subagents list --all` shows every run")
            })
    }

    /// [`Launcher::handle`] of each.
    fn handles(&self, runs: &[String]) -> Result<Vec<String>> {
        runs.iter().map(|r| self.handle(r)).collect()
    }

    /// The runs of this launcher's session: the active ones, or with `all`
    /// every listed one.
    fn session_runs(&self, all: bool) -> Result<Vec<RunSummary>> {
        let query = ListQuery {
            all,
            session: Some(admission::session_id(self.settings.session.as_deref())),
            ..ListQuery::default()
        };
        Ok(crate::listing::collect(&self.layout, &query)?.runs)
    }

    /// Stops a run: its runner (SIGTERM, then its group), every step's group.
    pub fn stop(&self, request: &StopRequest) -> Result<StopOutcome> {
        let reason = request.reason.as_deref().unwrap_or(DEFAULT_STOP_REASON);
        stop(&self.layout, &self.handle(&request.run)?, reason)
    }

    /// Revives a finished run with a follow-up task.
    pub fn resume(&self, request: &ResumeRequest) -> Result<Resumed> {
        let request = ResumeRequest {
            run: self.handle(&request.run)?,
            ..request.clone()
        };
        crate::revive::resume(&self.layout, &request, &self.settings)
    }

    /// `logs` as text, streamed to `sink` (with `follow`, until the run is
    /// over); the chunks say which stream they belong on.
    pub fn logs_each(
        &self,
        request: &LogsRequest,
        follow: bool,
        sink: &mut crate::logs::LogSink<'_>,
    ) -> Result<crate::logs::Streamed> {
        let request = LogsRequest {
            run: self.handle(&request.run)?,
            ..request.clone()
        };
        crate::logs::stream(&self.layout, &request, follow, sink)
    }

    /// A run's log files and their content (or tails).
    pub fn logs(&self, request: &LogsRequest) -> Result<LogsOutcome> {
        let request = LogsRequest {
            run: self.handle(&request.run)?,
            ..request.clone()
        };
        crate::logs::logs(&self.layout, &request)
    }

    /// A run's fan-out budget snapshot, or the doctor's report.
    pub fn budget(&self, query: &BudgetQuery) -> Result<BudgetOutcome> {
        crate::budget::budget(&self.layout, query, &self.settings)
    }

    /// A session's active-run capacity (the launcher's session and limit
    /// unless the query names others).
    pub fn capacity(&self, query: &CapacityQuery) -> Result<CapacityOutcome> {
        let session = query
            .session
            .as_deref()
            .or(self.settings.session.as_deref());
        let limit = query.limit.or(self.settings.max_active);
        capacity(&self.layout, session, limit)
    }

    /// Repairs stale runs and finalizes what the evidence allows.
    pub fn reconcile(&self, _request: &ReconcileRequest) -> Result<ReconcileOutcome> {
        crate::reconcile::reconcile(&self.layout)
    }

    /// Hides a finished run from `list` (an active one only with `force`).
    pub fn dismiss(&self, request: &DismissRequest) -> Result<DismissOutcome> {
        let request = DismissRequest {
            run: self.handle(&request.run)?,
            ..request.clone()
        };
        crate::dismiss::dismiss(&self.layout, &request)
    }

    /// Deletes finished runs older than a cutoff (or says which it would).
    pub fn prune(&self, request: &PruneRequest) -> Result<PruneOutcome> {
        crate::prune::prune(&self.layout, request)
    }

    /// Validates one artifact as its readers read it; an invalid file is
    /// the outcome `valid: false`, not an error.
    pub fn validate(&self, request: &ValidateRequest) -> Result<ValidateOutcome> {
        crate::validate::validate(&self.layout, request)
    }

    /// The named agents of the current directory and of the user. Reads no
    /// run state; a method so that both front-ends reach it the same way.
    pub fn agents(&self, request: &AgentsRequest) -> Result<AgentsOutcome> {
        crate::presets::agents(request)
    }

    /// The config file and each setting's value and source. Reads no run
    /// state; a method so that both front-ends reach it the same way.
    pub fn config(&self, _request: &ConfigRequest) -> Result<ConfigOutcome> {
        // A front-end that took the root from its own flag says so.
        crate::settings::config(&self.layout, false)
    }

    /// Creates a fan-out budget; returns its descriptor.
    pub fn budget_create(
        &self,
        request: &BudgetCreateRequest,
    ) -> Result<fanout_budget::Descriptor> {
        crate::budget::create(&self.layout, &request.root_run_id, request.limit)
    }

    /// Claims fan-out slots all-or-nothing; over the limit exit 3.
    pub fn budget_claim(&self, request: &BudgetClaimRequest) -> Result<fanout_budget::Snapshot> {
        crate::budget::claim(&self.layout, request.descriptor.as_deref(), &request.paths)
    }
}

/// Asks the runner to stop (SIGTERM), then forces the groups; settles a
/// run whose monitor is gone.
pub fn stop(layout: &Layout, id: &str, reason: &str) -> Result<StopOutcome> {
    let mut warnings = Vec::new();
    let run = match load(layout, id, &mut warnings) {
        Ok(run) => run,
        Err(e) => return crate::damaged::stop(layout, id, reason, e),
    };
    let dir = run.async_dir.clone();
    let was_over = !run.status.state.is_active();
    if !was_over && let Ok(Some(record)) = dispatch::read(&dir) {
        stop_dispatched(layout, &run.id, &record, reason)?;
        return stopped_outcome(layout, &run.id, was_over, warnings);
    }
    if !was_over && let Some(host) = run.status.foreign_host() {
        // Its processes are another machine's: nothing here may signal them.
        return Err(crate::Error::failed(format!(
            "failed to stop run '{}': it runs on {host}; stop it there",
            run.id
        )));
    }
    if !was_over && crate::queue::stop_queued(layout, &run, reason)? {
        let run = load(layout, &run.id, &mut warnings)?;
        return Ok(StopOutcome {
            run,
            was_over,
            warnings,
        });
    }
    if !was_over {
        request_stop(&dir, &run.id, reason)?;
        let runner_alive = run
            .status
            .runner_identity
            .as_ref()
            .is_some_and(|r| r.liveness() == Liveness::Alive);
        if runner_alive {
            signal_runner(&run, Signal::SIGTERM);
        }
        // The runner needs its kill grace (2 s) to end COMMAND's group.
        let grace = supervisor::runner::KILL_GRACE + Duration::from_secs(3);
        if !wait_terminal(layout, &run.id, grace)? {
            force_stop(&dir, reason)?;
        }
    }
    settle_without_monitor(layout, &run.id, reason);
    stopped_outcome(layout, &run.id, was_over, warnings)
}

fn stopped_outcome(
    layout: &Layout,
    id: &str,
    was_over: bool,
    mut warnings: Vec<String>,
) -> Result<StopOutcome> {
    let final_run = load(layout, id, &mut warnings)?;
    admission::release_finished(layout, final_run.status.session_id.as_deref());
    Ok(StopOutcome {
        run: final_run,
        was_over,
        warnings,
    })
}

/// A run whose monitor is gone has nobody to finalize it: wait (bounded)
/// for its runner to exit, kill the runner if it does not, then observe.
fn settle_without_monitor(layout: &Layout, id: &str, reason: &str) {
    let options = observer::Options {
        stop_reason: Some(reason.to_owned()),
        ..observer_options(layout)
    };
    let dir = layout.run_dir(id);
    let deadline = Instant::now() + supervisor::runner::KILL_GRACE + Duration::from_secs(3);
    loop {
        let observation = observer::observe(&dir, &options);
        let observer::Observation::RunnerAlive(_) = observation else {
            return;
        };
        if Instant::now() >= deadline {
            if let Ok(Some(status)) = status::model::read_status(&dir)
                && let Some(identity) = &status.runner_identity
                && identity.liveness() == Liveness::Alive
            {
                signal_group(identity.pid, Signal::SIGKILL);
            }
            observer::observe(&dir, &options);
            return;
        }
        // The runner is not our child: its exit shows only in /proc.
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Records the request in the status (the runner reads the reason) and as
/// an event: a run whose steps all completed before the stop took effect
/// ends `complete`, and the request stays on record.
pub(crate) fn request_stop(dir: &Path, id: &str, reason: &str) -> Result {
    let now = now_ms();
    update_status(dir, |s| {
        let mut s = s?;
        s.stop_reason = Some(reason.to_owned());
        s.extra.insert("stopRequestedAt".into(), json!(now));
        Some(s)
    })?;
    let fields = json!({"reason": reason, "pid": std::process::id()});
    let _ = status::events::append(dir, STOP_REQUESTED, id, now, fields);
    Ok(())
}

/// The event `stop` appends before it signals the runner.
const STOP_REQUESTED: &str = "subagent.run.stop_requested";

fn signal_runner(run: &RunSummary, sig: Signal) {
    if let Some(identity) = &run.status.runner_identity
        && identity.liveness() == Liveness::Alive
    {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(identity.pid as i32), sig);
    }
}

pub(crate) fn wait_terminal(layout: &Layout, id: &str, within: Duration) -> Result<bool> {
    let deadline = Instant::now() + within;
    let dir = layout.run_dir(id);
    let (_watcher, events) = watch_dirs(std::slice::from_ref(&dir));
    loop {
        let current = status::model::read_status(&dir)?;
        if current.is_none_or(|s| !s.state.is_active()) {
            return Ok(true);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(false);
        }
        let _ = events.recv_timeout(left.min(Duration::from_millis(500)));
    }
}

/// The runner did not end in time: kill its group and every step's group,
/// and record the stop ourselves unless the runner managed to.
fn force_stop(dir: &Path, reason: &str) -> Result {
    let Some(status) = status::model::read_status(dir)? else {
        return Ok(());
    };
    if let Some(identity) = &status.runner_identity
        && identity.liveness() == Liveness::Alive
    {
        signal_group(identity.pid, Signal::SIGKILL);
    }
    supervisor::procs::kill_step_groups(&status);
    let now = now_ms();
    update_status(dir, |s| {
        let s = s?;
        s.state.is_active().then(|| {
            // The monitor, or else the observer, writes the real proof.
            let mut s = reconcile::fail_active(s, reason, now);
            s.state = RunState::Stopped;
            s.stopped = Some(true);
            s.error = Some(reason.to_owned());
            for step in s
                .steps
                .iter_mut()
                .flatten()
                .filter(|st| st.status == "failed")
            {
                step.status = "stopped".into();
                step.stopped = Some(true);
            }
            s
        })
    })?;
    Ok(())
}

/// Used/limit and each slot's run and release verdict; runs whose monitor
/// is gone are finalized first, and what keeps one is said.
pub fn capacity(
    layout: &Layout,
    session: Option<&str>,
    limit: Option<u32>,
) -> Result<CapacityOutcome> {
    let session = admission::session_id(session);
    let pools = admission::pools(layout);
    let none = HashSet::new();
    let held = pools
        .count(&session, limit)
        .map_err(admission::capacity_error)?;
    let mut observed = HashMap::new();
    for run_id in held.slots.iter().filter_map(|s| s.run_id.clone()) {
        if let observer::Observation::Unproven(why) = observe(layout, &run_id) {
            observed.insert(run_id, why);
        }
    }
    // A root we cannot write to (read-only, full) still shows its usage.
    let mut warnings = Vec::new();
    let snapshot = match pools.reconcile(&session, limit, &none) {
        Ok(snapshot) => snapshot,
        Err(e) => {
            warnings.push(format!(
                "skipped freeing finished runs' slots: {}",
                atomic_file::escape(&e.to_string())
            ));
            held
        }
    };
    let slots = snapshot
        .slots
        .iter()
        .map(|slot| {
            let release = slot.run_id.as_deref().and_then(|run_id| {
                let query = capacity::InspectQuery {
                    run_id,
                    session_id: Some(&session),
                    async_dir: None,
                };
                pools.inspect(&query, &none).ok().map(|i| i.release)
            });
            let observer = slot
                .run_id
                .as_ref()
                .and_then(|id| observed.get(id))
                .map(ToString::to_string);
            CapacitySlot {
                slot: slot.clone(),
                release,
                observer,
            }
        })
        .collect();
    Ok(CapacityOutcome {
        session,
        used: snapshot.used,
        limit: snapshot.limit,
        slots,
        warnings,
    })
}

/// `stop` of a run held by Slurm: the request is recorded, the batch
/// script (the monitor, which hands it to the runner) gets SIGTERM so the
/// steps end gracefully and the run ends `stopped`; after the grace the
/// whole job is cancelled. Returns once the run's proof is final (the
/// monitor's, or the observer's from Slurm's record) or the wait is over.
pub fn stop_dispatched(
    layout: &status::Layout,
    id: &str,
    record: &dispatch::Dispatch,
    reason: &str,
) -> Result {
    let dir = layout.run_dir(id);
    request_stop(&dir, id, reason)?;
    let job = &record.job_id;
    let pending =
        supervisor::slurm::query(job).is_ok_and(|j| j.is_some_and(|j| j.state == "PENDING"));
    let signalled = if pending {
        supervisor::slurm::cancel(job)
    } else {
        supervisor::slurm::signal_batch_term(job)
    };
    let signalled =
        signalled.map_err(|why| crate::Error::failed(format!("failed to stop run '{id}': {why}")));
    let grace = supervisor::runner::KILL_GRACE + std::time::Duration::from_secs(3);
    if signalled.is_err() || !wait_terminal(layout, id, grace)? {
        supervisor::slurm::cancel(job)
            .map_err(|why| crate::Error::failed(format!("failed to stop run '{id}': {why}")))?;
    }
    let options = supervisor::observer::Options {
        stop_reason: Some(reason.to_owned()),
        ..crate::runs::observer_options(layout)
    };
    // Slurm's TERM→KILL grace (`KillWait`) and the cgroup's cleanup come
    // before the job leaves COMPLETING.
    let deadline = std::time::Instant::now() + STOP_SETTLE;
    loop {
        let observation = supervisor::observer::observe(&dir, &options);
        let settled = matches!(
            observation,
            supervisor::observer::Observation::Final
                | supervisor::observer::Observation::Finalized { .. }
        );
        if settled || std::time::Instant::now() >= deadline {
            return Ok(());
        }
        // Slurm tells no one when a job ends: it is asked again.
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// How long `stop` waits for Slurm to report a cancelled job over.
const STOP_SETTLE: std::time::Duration = std::time::Duration::from_secs(60);
