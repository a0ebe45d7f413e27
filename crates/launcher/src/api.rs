//! The requests and outcomes of the launcher's API, shared by both
//! front-ends: the command line converts its arguments into these requests
//! and prints these outcomes (`--json` is their serialisation); the MCP
//! server takes them as tool inputs (their JSON Schemas) and returns them as
//! tool results. Errors are [`crate::error::Error`].
//!
//! Outcomes that hold a run summary serialise it exactly as `status --json`
//! does; their schemas describe such a summary as an object.

use std::path::PathBuf;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};

use listing::list::{RunSummary, UnreadableRun};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A run summary in a schema: an object with the fields of `status.json`.
type SummarySchema = Map<String, Value>;
/// Any other JSON object in a schema.
type ObjectSchema = Map<String, Value>;

/// Launch settings that belong to the launcher, not to one request: the
/// command line takes them from flags and the environment of each
/// invocation, the MCP server from its own flags and environment when it
/// starts (so an agent cannot lift the limits its user set).
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// Owner session (else the terminal of stdin, else `default`).
    pub session: Option<String>,
    /// At most N active background runs per session (0 = no limit).
    pub max_active: Option<u32>,
    /// The session's directory, recorded as `sessionRoot`.
    pub session_dir: Option<PathBuf>,
    /// Fan-out budget of a new root run (ignored inside a run).
    pub fanout_limit: Option<u64>,
}

/// Launch a detached background run: a named agent, a command, or a
/// composite spec.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunRequest {
    /// Without `command`: the named agent to run (its definition renders the
    /// command). With `command`: the label shown in status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// The task prompt, handed to the command on stdin and in
    /// `$SUBAGENTS_TASK_FILE`; it never appears in status, events or logs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    /// A file holding the task prompt (read by the launcher; not with `task`).
    #[serde(skip)]
    pub task_file: Option<PathBuf>,
    /// Working directory (absolute, or relative to the launcher's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<PathBuf>,
    /// Wall-clock deadline, e.g. `90s`, `30m`, `1h30m`, `1d`; `0` for none. Default 30m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// End a step that prints nothing (no stdout, stderr or output-file
    /// growth) for this long, e.g. `2m`; `0` for none. Default: the agent's
    /// `idleTimeout`, else `$SUBAGENTS_IDLE_TIMEOUT` (config `idle_timeout`), else none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout: Option<String>,
    /// Explicit run id (refused if it exists or is not a safe file name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// A label for the run, shown by `list`, `status` and `top` (1 to 64
    /// characters, no control characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A composite run, the JSON of a spec file: `{"mode": "parallel",
    /// "tasks": [step, ...], "concurrency"?, "failFast"?}` or `{"mode":
    /// "chain", "steps": [step or {"parallel": [step, ...]}, ...]}`; a step is
    /// `{"agent", "command"?: [argv...], "name"?, "task"? | "taskFile"?, "cwd"?,
    /// "timeout"?, "idleTimeout"?}`; without `command` the step runs the named
    /// agent `agent`; in a chain step's task `{previous}` is the output of
    /// the step before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<Value>,
    /// A composite run's spec file (the command line's `--spec FILE`).
    #[serde(skip)]
    pub spec_file: Option<PathBuf>,
    /// The command and its arguments; `{task_file}` is replaced by the task
    /// file's path.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// Where the run executes: `local` (a process tree on this machine) or
    /// `slurm` (one batch job on a cluster that shares the state root).
    /// Default: `$SUBAGENTS_EXECUTOR` (config key `executor`), else the
    /// agent definition's, else `local`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub executor: Option<ExecutorKind>,
    /// The Slurm partition (with `executor: "slurm"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm_partition: Option<String>,
    /// Extra `sbatch` options, each `--name=value` (with `executor: "slurm"`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slurm_args: Vec<String>,
    /// Over the session's active-run limit, wait in the session's queue for
    /// a slot (first in, first out) instead of being refused. Default: the
    /// spec's `queue`, else the `queue` config key (`$SUBAGENTS_QUEUE`),
    /// else false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<bool>,
}

/// Which executor a request asks for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ExecutorKind {
    /// A detached process tree on this machine.
    #[default]
    Local,
    /// A Slurm batch job (`sbatch`) on a cluster that shares the state root.
    Slurm,
}

impl ExecutorKind {
    /// Parses `local` or `slurm`.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "local" => Some(Self::Local),
            "slurm" => Some(Self::Slurm),
            _ => None,
        }
    }
}

/// A launched run, as the runner reported it ready.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Launched {
    /// Run id.
    pub run_id: String,
    /// Run directory.
    pub async_dir: PathBuf,
    /// Runner pid (0 for a run submitted to Slurm: its runner starts on a
    /// node later).
    pub pid: u32,
    /// Runner instance id.
    pub runner_process_instance_id: String,
    /// The executor, when not local.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub executor: Option<ExecutorKind>,
    /// The Slurm job id, for a run submitted to Slurm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<String>,
    /// The run waits in its session's queue for a capacity slot (`pid` is
    /// then its monitor's): when it joined and its 1-based position.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued_for_slot: Option<QueuedForSlot>,
}

/// A run's place in its session's queue for a capacity slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueuedForSlot {
    /// When it joined the queue (ms since the epoch).
    pub since: u64,
    /// 1-based position among the runs waiting.
    pub position: usize,
}

impl From<supervisor::spawn::Launched> for Launched {
    fn from(l: supervisor::spawn::Launched) -> Self {
        Self {
            run_id: l.run_id,
            async_dir: l.async_dir,
            pid: l.pid,
            runner_process_instance_id: l.runner_process_instance_id,
            executor: None,
            job_id: None,
            queued_for_slot: None,
        }
    }
}

/// One run, by id or unique prefix.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunRef {
    /// Run id, unique prefix or `last` (the newest run of the session).
    pub run: String,
}

/// A run's summary (the fields of its `status.json`, with the live fan-out
/// snapshot and the process-terminal proof).
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(transparent)]
pub struct RunView {
    /// The summary.
    #[schemars(with = "SummarySchema")]
    pub run: RunSummary,
    /// What the observer found, when it keeps the run (text only).
    #[serde(skip)]
    pub observer: Option<String>,
    /// Repairs that could not be written, one line each (text only).
    #[serde(skip)]
    pub warnings: Vec<String>,
}

/// Which runs to list.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ListQuery {
    /// Every run, not only active ones.
    #[serde(default)]
    pub all: bool,
    /// Only the runs hidden with `dismiss` (with `all`).
    #[serde(default)]
    pub dismissed: bool,
    /// Only runs of this session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// At most N runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
    /// Order: by state then last update (default), or `started` (newest
    /// start first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sort: Option<ListSort>,
}

/// `list` order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ListSort {
    /// Newest start first.
    Started,
}

/// A listing: the readable runs, then the unreadable ones; serialised as
/// one array (`{"id", "asyncDir", "state": "unreadable", "error"}` for the
/// unreadable).
#[derive(Debug, Clone, Default)]
pub struct ListOutcome {
    /// Readable runs, in listing order.
    pub runs: Vec<RunSummary>,
    /// Runs whose files could not be read.
    pub unreadable: Vec<UnreadableRun>,
    /// Repairs that could not be written, one line each (not in the array).
    pub warnings: Vec<String>,
}

impl Serialize for ListOutcome {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = serializer.serialize_seq(Some(self.runs.len() + self.unreadable.len()))?;
        for run in &self.runs {
            seq.serialize_element(run)?;
        }
        for run in &self.unreadable {
            seq.serialize_element(run)?;
        }
        seq.end()
    }
}

impl JsonSchema for ListOutcome {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ListOutcome".into()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        <Vec<SummarySchema>>::json_schema(generator)
    }
}

/// Block until every named run is over (or the timeout passes); no run
/// named: every active run of the session.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WaitRequest {
    /// Run ids, unique prefixes or `last`; none (or absent): every active
    /// run of the launcher's session.
    #[serde(default)]
    pub runs: Vec<String>,
    /// Give up after this long (e.g. `90s`, `1h30m`; `0` for never): error code TIMEOUT (124).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// With the outcome, the last N lines of each run's output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tail: Option<usize>,
    /// Ends the wait from another thread (the MCP server's cancelled call).
    #[serde(skip)]
    pub cancel: Cancel,
}

/// Gives up a wait from another thread (an MCP client cancelled the call):
/// the blocked wait wakes at once, returns `WaitCancelled` (exit 1) and ends
/// every thread it started. Clones share one state; cancelling before the
/// wait starts makes it return at its first look.
#[derive(Debug, Clone, Default)]
pub struct Cancel(Arc<Mutex<CancelState>>);

#[derive(Debug, Default)]
struct CancelState {
    cancelled: bool,
    wakers: Vec<Sender<()>>,
}

impl Cancel {
    /// Cancels every wait of this handle, now and later.
    pub fn cancel(&self) {
        let mut state = self.state();
        state.cancelled = true;
        for waker in state.wakers.drain(..) {
            let _ = waker.send(());
        }
    }

    /// Whether [`Cancel::cancel`] was called.
    pub fn is_cancelled(&self) -> bool {
        self.state().cancelled
    }

    /// Sends on `tx` when cancelled (at once if already).
    pub(crate) fn wake(&self, tx: Sender<()>) {
        let mut state = self.state();
        if state.cancelled {
            let _ = tx.send(());
        } else {
            state.wakers.push(tx);
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, CancelState> {
        // A panic elsewhere leaves a flag and senders: still usable.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The final summaries of the waited-for runs, in request order.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(transparent)]
pub struct WaitOutcome {
    /// The runs.
    #[schemars(with = "Vec<SummarySchema>")]
    pub runs: Vec<RunSummary>,
}

impl WaitOutcome {
    /// True when every run completed.
    pub fn all_complete(&self) -> bool {
        self.runs
            .iter()
            .all(|r| r.status.state == status::RunState::Complete)
    }
}

/// [`WaitOutcome`] with the tail of each run's output (the MCP `wait` tool).
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WaitReport {
    /// The final summaries.
    pub runs: WaitOutcome,
    /// Each run's output tail (as `logs`), in the same order.
    pub logs: Vec<LogsOutcome>,
}

/// Stop a run: its runner and every process group of its commands.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StopRequest {
    /// Run id, unique prefix or `last` (the newest run of the session).
    pub run: String,
    /// Why (kept in status.json). Default "Subagent stopped by user.".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The reason of a stop without one.
pub const DEFAULT_STOP_REASON: &str = "Subagent stopped by user.";

/// A stopped run's final summary.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(transparent)]
pub struct StopOutcome {
    /// The final summary.
    #[schemars(with = "SummarySchema")]
    pub run: RunSummary,
    /// The run was already over: nothing was stopped.
    #[serde(skip)]
    pub was_over: bool,
    /// Repairs that could not be written, one line each (text only).
    #[serde(skip)]
    pub warnings: Vec<String>,
}

/// Revive a finished run with a follow-up task (same agent, same contract).
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResumeRequest {
    /// The run to revive (id, unique prefix or `last`).
    pub run: String,
    /// The follow-up task, handed to the agent as given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    /// A file holding the follow-up task (the command line's `--task-file`).
    #[serde(skip)]
    pub task_file: Option<PathBuf>,
    /// Wall-clock deadline of the revival (else the source's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
}

/// A revival: the new run and the run it revives.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Resumed {
    /// The new run.
    #[serde(flatten)]
    pub launched: Launched,
    /// The revived run.
    pub source_run_id: String,
}

/// A run's output and logs.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LogsRequest {
    /// Run id, unique prefix or `last` (the newest run of the session).
    pub run: String,
    /// Only step N of a composite run (numbered from 1, as `status` shows them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<usize>,
    /// Only the last N lines of each file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tail: Option<usize>,
    /// Only the command's stderr.
    #[serde(default)]
    pub stderr: bool,
    /// At most this many bytes of each file (its end), on a character boundary.
    #[serde(skip)]
    pub max_bytes: Option<usize>,
}

/// The files `logs` shows, with their content.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LogsOutcome {
    /// Run id.
    pub run_id: String,
    /// The run's state.
    pub state: String,
    /// One entry per non-empty file.
    pub logs: Vec<LogFile>,
    /// Repairs that could not be written, one line each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// One log file.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct LogFile {
    /// `output`, `stdout`, `stderr`, `runner stderr`, `step N stdout`, ...
    pub name: String,
    /// The file.
    pub path: String,
    /// Its text (lossy UTF-8), or its tail.
    pub text: String,
}

/// A run fan-out budget: a run's, or (without `run`) the report of what a
/// launch here gets.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BudgetQuery {
    /// Run id or unique prefix: that run's `{used, limit, remaining}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
    /// A descriptor JSON file: its budget's `{used, limit, remaining}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub descriptor: Option<PathBuf>,
}

/// A budget snapshot or the doctor's report.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum BudgetOutcome {
    /// `{used, limit, remaining}` of a run's budget.
    Snapshot(#[schemars(with = "BudgetSnapshotSchema")] fanout_budget::Snapshot),
    /// The limit a new root run gets and from where, and the inherited budget.
    Doctor(DoctorReport),
}

/// The schema of `fanout_budget::Snapshot`.
#[derive(JsonSchema)]
#[allow(dead_code)]
struct BudgetSnapshotSchema {
    /// Claimed slots.
    used: u64,
    /// The limit.
    limit: u64,
    /// `limit - used`.
    remaining: u64,
}

/// `budget doctor`'s report.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DoctorReport {
    /// The limit a new root run gets, its source, and ignored settings.
    #[schemars(with = "ObjectSchema")]
    pub new_root_run: crate::fanout::NewRootLimit,
    /// `$SUBAGENTS_RUN_ID`, when this process runs inside a run.
    pub inside_run: Option<String>,
    /// A launch here is nested (claims from the inherited budget, takes no slot).
    pub nested: bool,
    /// The inherited budget (`rootRunId`, `parentPath`, `directory`, `used`,
    /// `limit`, `remaining`), null, or `{"error"}`.
    pub inherited: Value,
    /// Always false: claims are never released.
    pub claims_released: bool,
    /// Always false: nested runs take no capacity slot.
    pub nested_runs_take_capacity: bool,
    /// The report as text.
    #[serde(skip)]
    pub text: String,
    /// The inherited budget could not be opened.
    #[serde(skip)]
    pub inherited_error: Option<String>,
}

/// A session's active-run capacity.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CapacityQuery {
    /// The session (else the launcher's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// The limit to report against (else the launcher's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

/// Used/limit and each slot's run and release verdict.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CapacityOutcome {
    /// The session.
    pub session: String,
    /// Occupied slots.
    pub used: usize,
    /// The limit; 0 means unlimited.
    pub limit: u32,
    /// One entry per occupied slot.
    pub slots: Vec<CapacitySlot>,
    /// What could not be written (freeing finished runs' slots), one line each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// One occupied slot.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CapacitySlot {
    /// The slot (`slot`, `readable`, `runId`, `kind`, `generation`, ...).
    #[schemars(with = "ObjectSchema")]
    pub slot: capacity::SlotSummary,
    /// Whether the slot can be released (`state`, `reason`).
    #[schemars(with = "Option<ObjectSchema>")]
    pub release: Option<capacity::Verdict>,
    /// Why the observer keeps the slot's run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observer: Option<String>,
}

/// Repair stale runs and finalize what the evidence allows (no parameters).
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReconcileRequest {}

/// What `reconcile` did.
#[derive(Debug, Clone, Default, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReconcileOutcome {
    /// Runs repaired (a repair may restore a complete run).
    pub repaired: Vec<RunNote>,
    /// What the observer found in runs whose monitor is gone.
    pub observed: Vec<RunNote>,
    /// Runs whose files could not be read (`{id, asyncDir, state, error}`).
    #[schemars(with = "Vec<ObjectSchema>")]
    pub unreadable: Vec<UnreadableRun>,
    /// Repairs that could not be written, one line each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// One line about one run.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunNote {
    /// Run id.
    pub run_id: String,
    /// What happened to it.
    pub message: String,
}

impl RunNote {
    /// A note about run `id`.
    pub fn new(id: &str, message: &str) -> Self {
        Self {
            run_id: id.to_owned(),
            message: message.to_owned(),
        }
    }
}

/// Hide a finished run from `list` without touching its processes.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DismissRequest {
    /// Run id, unique prefix or `last` (the newest run of the session).
    pub run: String,
    /// Hide it even while it is still active.
    #[serde(default)]
    pub force: bool,
}

/// A dismissed run.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DismissOutcome {
    /// Run id.
    pub run_id: String,
    /// When it was hidden (ms since the epoch).
    pub display_dismissed_at: u64,
}

/// Delete finished runs older than a cutoff, with what only they use.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PruneRequest {
    /// How old a run's end must be (e.g. `7d`, `1d12h`, `30m`); default `7d`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub older_than: Option<String>,
    /// Only say what would be deleted.
    #[serde(default)]
    pub dry_run: bool,
}

/// What `prune` deleted (or would delete) and what it kept.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PruneOutcome {
    /// Nothing was deleted.
    pub dry_run: bool,
    /// The cutoff's age.
    pub older_than_ms: u64,
    /// The runs deleted.
    pub pruned: Vec<PrunedRun>,
    /// Old runs kept, and why.
    pub kept: Vec<KeptRun>,
    /// Fan-out budgets deleted (their root run ids).
    pub budgets: Vec<String>,
    /// Session leases deleted.
    pub leases: Vec<String>,
    /// Capacity slots freed.
    pub capacity_slots: usize,
}

/// A run `prune` deleted.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PrunedRun {
    /// Run id.
    pub run_id: String,
    /// Its final state.
    pub state: String,
    /// When it ended (ms since the epoch).
    pub ended_at: u64,
}

/// An old run `prune` kept.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeptRun {
    /// Run id.
    pub run_id: String,
    /// Why it was kept.
    pub reason: String,
}

/// Validate one on-disk artifact exactly as the readers do.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ValidateRequest {
    /// The artifact kind: `recovery`, `launch-contract`, `fanout-descriptor`,
    /// `fanout-manifest`, `process-terminal`, `terminal-candidate`,
    /// `status`, `startup` or `capacity-owner`.
    pub kind: String,
    /// The file.
    pub file: PathBuf,
}

/// The verdict of `validate`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ValidateOutcome {
    /// The file reads as its kind.
    pub valid: bool,
    /// The reader's error, naming the field.
    pub error: Option<String>,
}

/// Named agent definitions: list them, show one, or the delegation snippet.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentsRequest {
    /// What to do (default `list`).
    #[serde(default)]
    pub action: AgentsAction,
    /// The agent to show (with `show`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// What `agents` does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum AgentsAction {
    /// Every agent found, and every file that could not be read.
    #[default]
    List,
    /// One agent: its file and the command a run renders from it.
    Show,
    /// A snippet for CLAUDE.md / AGENTS.md that lets an agent delegate.
    Prompt,
}

/// The answer of `agents`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum AgentsOutcome {
    /// `{agents: [...], errors: [...]}`.
    List(AgentList),
    /// One agent's summary with `systemPrompt`, `argv` and `env`.
    Show(AgentView),
    /// `{snippet}`.
    Prompt(AgentPrompt),
}

impl AgentsOutcome {
    /// The definition files that could not be read, one line each (the
    /// command line prints them on stderr; `list` also returns them as `errors`).
    pub fn warnings(&self) -> &[String] {
        match self {
            Self::List(o) => &o.warnings,
            Self::Show(o) => &o.warnings,
            Self::Prompt(o) => &o.warnings,
        }
    }
}

/// Every agent found (project first, then the user's).
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct AgentList {
    /// One summary per agent (`name`, `description`, `runner`, `model`, ...).
    #[schemars(with = "Vec<AgentSummarySchema>")]
    pub agents: Vec<ObjectSchema>,
    /// One entry per file that could not be read.
    #[schemars(with = "Vec<ObjectSchema>")]
    pub errors: Vec<Value>,
    /// The errors as lines.
    #[serde(skip)]
    pub warnings: Vec<String>,
}

/// The schema of one agent's summary in [`AgentList`].
#[derive(JsonSchema)]
#[allow(dead_code)]
struct AgentSummarySchema {
    /// The name `run`'s `agent` takes.
    name: String,
    /// What the agent is for (from its definition's front matter).
    description: Option<String>,
    /// `pi`, `claude`, `codex` or `command`.
    runner: String,
    /// `model`, `thinking`, `tools`, `cwd`, `timeoutMs`, `systemPromptMode`,
    /// `scope`, `path`.
    #[serde(flatten)]
    rest: ObjectSchema,
}

/// One agent.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct AgentView {
    /// Its summary, `systemPrompt`, the rendered `argv` and `env`.
    #[serde(flatten)]
    pub agent: ObjectSchema,
    /// The rendered command as shell words.
    #[serde(skip)]
    pub command: String,
    /// The task goes to the command on stdin (an agent CLI's runner).
    #[serde(skip)]
    pub task_on_stdin: bool,
    /// The unreadable definition files, as lines.
    #[serde(skip)]
    pub warnings: Vec<String>,
}

/// The delegation snippet.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct AgentPrompt {
    /// Markdown for CLAUDE.md / AGENTS.md.
    pub snippet: String,
    /// The unreadable definition files, as lines.
    #[serde(skip)]
    pub warnings: Vec<String>,
}

/// The config file and each setting's value and source (no parameters).
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConfigRequest {}

/// `config`: the file and every key.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConfigOutcome {
    /// The file looked for (none without a home directory).
    pub path: Option<String>,
    /// It exists.
    pub exists: bool,
    /// Every key.
    pub keys: Vec<ConfigKey>,
}

/// One setting.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConfigKey {
    /// The key in the file.
    pub key: String,
    /// The environment variable it stands in for.
    pub variable: String,
    /// Its effective value (`max_active` 0: no limit).
    pub value: Option<String>,
    /// `flag` (`root` only), `environment`, `config` (the file) or `default`.
    pub source: String,
}

/// Create a fan-out budget.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BudgetCreateRequest {
    /// Root run id recorded in the manifest.
    pub root_run_id: String,
    /// The limit (else `$SUBAGENTS_MAX_SPAWNS_PER_RUN`, else 64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
}

/// Claim fan-out slots all-or-nothing.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BudgetClaimRequest {
    /// A descriptor JSON file (else the inherited `$SUBAGENTS_RUN_FANOUT_BUDGET`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub descriptor: Option<PathBuf>,
    /// One claim path per slot.
    pub paths: Vec<String>,
}
