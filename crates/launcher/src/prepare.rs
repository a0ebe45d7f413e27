//! Everything `run` does before a process exists, in the reference's order:
//! plan the steps, pick the run id, take the capacity slot, admit the
//! fan-out batch, and only then create the run directory, task files, the
//! queued status and the active marker.

use std::collections::BTreeMap;
use std::fs::DirBuilder;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use capacity::SlotHandle;
use fanout_budget::{Descriptor, OpenBudget};
use process_identity::ProcessIdentity;
use serde_json::json;
use status::layout::files;
use status::{Layout, index};

use recovery::seal::RootKey;
use recovery::{LaunchContract, RecoveryDescriptor};

use crate::admission;
use crate::api::{RunRequest, Settings};
use crate::error::{Detail, Error, ErrorKind, Result};
use crate::spec::{Plan, StepSpec};
use supervisor::config::{LaunchConfig, QueueConfig, RevivalConfig, StepConfig};

/// Default wall-clock limit of a run, as in the reference.
pub const DEFAULT_TIMEOUT_MS: u64 = 30 * 60 * 1000;

/// A prepared run: its config and the capacity slot it holds.
pub type Prepared = (LaunchConfig, Option<SlotHandle>);

/// Where a run's fan-out budget comes from.
pub enum Budget {
    /// Inherit from the environment, else create a new root budget with this
    /// limit (else the configured one); claim the plan's static batch.
    Claim(Option<u64>),
    /// Reuse a revived run's budget; claim nothing (docs/protocol/fanout-budget.md §8.3).
    Reuse(Descriptor),
}

/// How the run takes its capacity slot.
pub enum Slot {
    /// A new slot in the session's pool.
    Acquire,
    /// A new slot, else a place in the session's queue (`--queue`).
    AcquireOrQueue,
    /// The slot of the run being revived (generation + 1).
    Transfer(String),
}

/// Everything `prepare` needs, from `run` or `resume`.
pub struct Request {
    /// The steps.
    pub plan: Plan,
    /// Working directory (spec steps are relative to it).
    pub cwd: PathBuf,
    /// Run-level timeout.
    pub timeout_ms: Option<u64>,
    /// Task text per flat step.
    pub tasks: Vec<Option<String>>,
    /// `--id`.
    pub explicit_id: Option<String>,
    /// Owner session.
    pub session: String,
    /// `--max-active`.
    pub max_active: Option<u32>,
    /// The fan-out budget.
    pub budget: Budget,
    /// The capacity slot.
    pub slot: Slot,
    /// A revival: the source run and the session file under lease.
    pub revival: Option<Revival>,
    /// Extra environment for every COMMAND (recorded in the launch contract).
    pub env: BTreeMap<String, String>,
    /// The directory of the session the run belongs to (`sessionRoot`).
    pub session_root: Option<PathBuf>,
    /// A named agent's preset: the recovery descriptor fields it fills.
    pub preset: Option<crate::presets::PresetRecord>,
    /// The run's name (`--name`), recorded as `name`.
    pub name: Option<String>,
    /// Where the run executes once prepared.
    pub executor: crate::executor::Executor,
}

/// The part of a request that makes it a revival.
pub struct Revival {
    /// The run being revived.
    pub source_run_id: String,
    /// The lineage's session file, leased by the runner.
    pub session_file: PathBuf,
}

impl Request {
    /// The request of `subagents run` (or the MCP `run` tool).
    pub fn from_run(run: &RunRequest, settings: &Settings, session: &str) -> Result<Self> {
        check_shape(run)?;
        if let Some(name) = &run.name {
            crate::spec::check_name(name).map_err(|why| {
                Error::of(
                    ErrorKind::BadName,
                    format!("failed to launch run: name {why}"),
                )
            })?;
        }
        let composite = run.spec.is_some() || run.spec_file.is_some();
        let preset = match (&run.agent, run.command.is_empty() && !composite) {
            (Some(name), true) => Some(crate::presets::resolve(name, &resolve_cwd(None)?)?),
            _ => None,
        };
        let mut plan = match &preset {
            Some(preset) => preset_plan(preset),
            None => plan(run)?,
        };
        let requested_idle = idle_request(run)?;
        let definitions = match composite {
            true => resolve_named_agents(run, &mut plan)?,
            false => vec![preset.as_ref().map(|p| p.definition.clone())],
        };
        let tasks = read_tasks(run, &plan)?;
        if composite {
            check_spec_tasks(run, &mut plan, &tasks, &definitions)?;
        }
        for (planned, definition) in plan.steps.iter_mut().zip(&definitions) {
            planned.idle_timeout_ms =
                settle_idle(planned.idle_timeout_ms, requested_idle, definition.as_ref())?;
        }
        let definition = preset.as_ref().map(|p| &p.definition);
        let executor = crate::executor::Executor::of_request(run, definition)?;
        let queue = match executor {
            crate::executor::Executor::Local => resolve_queue(run.queue, plan.queue)?,
            crate::executor::Executor::Slurm(_) => slurm_queue(run.queue.or(plan.queue))?,
        };
        if definition.is_some_and(|d| d.runner.is_agent_cli()) && tasks[0].is_none() {
            return Err(Error::of(
                ErrorKind::MissingTask,
                "failed to launch run: an agent run needs a task",
            ));
        }
        // The request wins over the definition.
        let cwd = run
            .cwd
            .clone()
            .or_else(|| definition.and_then(|d| d.cwd.clone()));
        let timeout = match (
            run.timeout.as_deref(),
            definition.and_then(|d| d.timeout_ms),
        ) {
            (None, Some(ms)) => Some(ms),
            (text, _) => run_timeout(text)?,
        };
        Ok(Self {
            cwd: resolve_cwd(cwd.as_deref())?,
            timeout_ms: timeout,
            plan,
            tasks,
            explicit_id: run.id.clone(),
            session: session.to_owned(),
            max_active: settings.max_active,
            budget: Budget::Claim(settings.fanout_limit),
            slot: match queue {
                true => Slot::AcquireOrQueue,
                false => Slot::Acquire,
            },
            revival: None,
            env: preset
                .as_ref()
                .map(|p| p.invocation.env.clone())
                .unwrap_or_default(),
            session_root: session_root(settings.session_dir.as_deref())?,
            preset: preset.as_ref().map(crate::presets::Preset::record),
            name: run.name.clone(),
            executor,
        })
    }
}

/// The request's `idleTimeout` in ms (`Some(0)`: off); malformed is a usage error.
fn idle_request(run: &RunRequest) -> Result<Option<u64>> {
    run.idle_timeout
        .as_deref()
        .map(|text| {
            crate::spec::duration_ms(text)
                .map_err(|e| Error::bad_duration(crate::error::DurationField::IdleTimeout, e))
        })
        .transpose()
}

/// A step's idle limit: the spec's, else the request's, else its agent
/// definition's, else `$SUBAGENTS_IDLE_TIMEOUT` (config `idle_timeout`);
/// `0` anywhere turns it off.
fn settle_idle(
    spec: Option<u64>,
    request: Option<u64>,
    definition: Option<&agents::AgentDefinition>,
) -> Result<Option<u64>> {
    let mut ms = spec.or(request);
    if ms.is_none()
        && let Some(def) = definition
    {
        ms = crate::presets::idle_timeout_ms(def)?;
    }
    if ms.is_none() {
        let var = IDLE_TIMEOUT_ENV;
        if let Some(text) = std::env::var(var).ok().filter(|v| !v.is_empty()) {
            let parsed = crate::spec::duration_ms(&text).map_err(|e| {
                Error::bad_duration(
                    crate::error::DurationField::IdleTimeout,
                    format!("${var}: {e}"),
                )
            })?;
            ms = Some(parsed);
        }
    }
    Ok(ms.filter(|ms| *ms > 0))
}

/// An error about a spec's content, named after the spec as `read_plan`
/// names it: the file when there is one.
fn spec_error(run: &RunRequest, kind: ErrorKind, message: String) -> Error {
    let text = match &run.spec_file {
        Some(path) => format!(
            "invalid spec file '{}': {message}",
            atomic_file::escape_path(path)
        ),
        None => format!("failed to read the spec: {message}"),
    };
    Error::of(kind, text)
}

/// Renders each spec step that names an agent without a command, as `run
/// --agent NAME` does (looked up from the launcher's directory): its argv,
/// environment, and the definition's cwd and timeout where the step sets
/// none. Returns each step's definition (`None` for a command step).
fn resolve_named_agents(
    run: &RunRequest,
    plan: &mut Plan,
) -> Result<Vec<Option<agents::AgentDefinition>>> {
    let mut definitions = Vec::new();
    let mut catalog = None;
    for planned in &mut plan.steps {
        if !planned.spec.is_named_agent() {
            definitions.push(None);
            continue;
        }
        let catalog = match &catalog {
            Some(catalog) => catalog,
            None => catalog.insert(crate::presets::catalog(&resolve_cwd(None)?)),
        };
        let context = format!("{}.agent", planned.at);
        let context = spec_error(run, ErrorKind::UnknownAgent, context).message;
        let preset = crate::presets::resolve_in(catalog, &planned.spec.agent, &context)?;
        let def = preset.definition;
        planned.spec.command = preset.invocation.argv;
        planned.env = preset.invocation.env;
        if planned.spec.cwd.is_none() {
            planned.spec.cwd = def.cwd.clone();
        }
        if planned.spec.timeout.is_none() {
            planned.timeout_ms = def.timeout_ms;
        }
        definitions.push(Some(def));
    }
    Ok(definitions)
}

/// What only the tasks show: an agent CLI's step needs one, and
/// `{previous}` only stands for something in a chain step after the first
/// (the runner replaces it there).
fn check_spec_tasks(
    run: &RunRequest,
    plan: &mut Plan,
    tasks: &[Option<String>],
    definitions: &[Option<agents::AgentDefinition>],
) -> Result {
    let has_previous: Vec<bool> = (0..plan.steps.len())
        .map(|i| plan.has_previous(i))
        .collect();
    for (i, planned) in plan.steps.iter_mut().enumerate() {
        let field = |name: &str| format!("{}.{name}", planned.at);
        let agent_cli = definitions[i]
            .as_ref()
            .is_some_and(|d| d.runner.is_agent_cli());
        let Some(task) = &tasks[i] else {
            if agent_cli {
                let why = format!(
                    "{}: agent '{}' needs a task (give task or taskFile)",
                    field("task"),
                    planned.spec.agent
                );
                return Err(spec_error(run, ErrorKind::BadSpec, why));
            }
            continue;
        };
        if !task.contains(crate::spec::PREVIOUS_PLACEHOLDER) {
            continue;
        }
        if !has_previous[i] {
            let which = if planned.spec.task_file.is_some() {
                "taskFile"
            } else {
                "task"
            };
            let why = format!(
                "{}: {{previous}} stands for the output of the step before, which only a chain step after the first has",
                field(which)
            );
            return Err(spec_error(run, ErrorKind::BadSpec, why));
        }
        planned.previous_in_task = true;
    }
    Ok(())
}

/// The combinations the command line's parser refuses, refused here too
/// for every front-end (exit 2).
fn check_shape(run: &RunRequest) -> Result {
    let composite = run.spec.is_some() || run.spec_file.is_some();
    let refuse = |kind, why: &str| Err(Error::of(kind, format!("failed to launch run: {why}")));
    let usage = |why: &str| refuse(ErrorKind::BadCombination, why);
    if run.spec.is_some() && run.spec_file.is_some() {
        return usage("give the spec inline or as a file, not both");
    }
    if composite && (run.agent.is_some() || run.task.is_some() || run.task_file.is_some()) {
        return usage("a spec names its own agents and tasks (no agent or task with it)");
    }
    if composite && !run.command.is_empty() {
        return usage("a spec run takes no command");
    }
    if run.task.is_some() && run.task_file.is_some() {
        return refuse(
            ErrorKind::TaskTwice,
            "give the task as text or as a file, not both",
        );
    }
    if !composite && run.agent.is_none() && run.command.is_empty() {
        return usage("give a command, an agent or a spec");
    }
    Ok(())
}

/// `--session-dir` / `$SUBAGENTS_SESSION_DIR` as an absolute, existing
/// directory; empty is none.
fn session_root(dir: Option<&Path>) -> Result<Option<PathBuf>> {
    let Some(dir) = dir.filter(|d| !d.as_os_str().is_empty()) else {
        return Ok(None);
    };
    let real = dir.canonicalize().ok().filter(|d| d.is_dir());
    real.map(Some).ok_or_else(|| {
        Error::failed(format!(
            "failed to launch run: session directory '{}' is not an existing directory",
            dir.display()
        ))
    })
}

/// Plans and admits a run, then writes its first files.
pub fn prepare(layout: &Layout, request: &Request) -> Result<Prepared> {
    atomic_file::ensure_private_dir(&layout.runs_dir())?;
    // Everything that can be refused is checked before anything is reserved.
    for planned in &request.plan.steps {
        if let Some(dir) = &planned.spec.cwd {
            resolve_cwd(Some(&request.cwd.join(dir)))?;
        }
    }
    let run_id = pick_id(layout, request.explicit_id.as_deref())?;
    let run_dir = layout.run_dir(&run_id);
    let (mut slot, queue) = match take_slot(layout, request, &run_id, &run_dir)? {
        admission::Admitted::Slot(slot) => (slot.map(|s| *s), None),
        admission::Admitted::Queued(queued) => (None, Some(queued)),
    };
    let queue = queue.map(|q| QueueConfig {
        session_id: request.session.clone(),
        limit: request.max_active.unwrap_or(0),
        since: q.since,
    });
    let admitted = create_run_dir(&run_dir, &run_id).and_then(|()| {
        // The run directory exists before its budget, so a launcher killed
        // anywhere below leaves a directory that `reconcile` can finish
        // (with the budget it finds by the run's id) once this lock is free.
        let lock = crate::leftovers::CreationLock::take(&run_dir, &run_id);
        let written = lock.and_then(|_lock| {
            let (budget, created) = admit_fanout(layout, &run_id, request)?;
            write_run(layout, request, &run_id, &budget, queue.clone()).inspect_err(|_| {
                if created {
                    let _ = std::fs::remove_dir_all(&budget.descriptor().directory);
                }
            })
        });
        // No half-made run: a directory without status.json is invisible to every command.
        written.inspect_err(|_| {
            let _ = std::fs::remove_dir_all(&run_dir);
        })
    });
    match admitted {
        Ok(mut config) => {
            config.capacity_slot = slot.as_ref().map(|h| h.owner().slot);
            Ok((config, slot))
        }
        Err(e) => {
            if let Some(handle) = slot.as_mut() {
                let _ = handle.rollback();
            }
            if queue.is_some() {
                admission::leave_queue(layout, &request.session, &run_id);
            }
            Err(e)
        }
    }
}

/// A Slurm run does not wait in our queue: its job would hold an
/// allocation while it waited, and Slurm queues jobs itself
/// (docs/cluster.md). Asked for, that is a usage error; the config default
/// does not apply.
fn slurm_queue(asked: Option<bool>) -> Result<bool> {
    match asked {
        Some(true) => Err(Error::of(
            ErrorKind::Other(crate::error::Exit::Usage),
            "failed to launch run: `queue` does not apply to a Slurm run (Slurm queues the job itself)",
        )
        .with_hint("leave out --queue, or run it with --executor local")),
        _ => Ok(false),
    }
}

/// Whether a launch waits for a slot when the session is full: the
/// request's `queue`, else the spec's, else `$SUBAGENTS_QUEUE` (the `queue`
/// config key), else no.
fn resolve_queue(request: Option<bool>, spec: Option<bool>) -> Result<bool> {
    if let Some(queue) = request.or(spec) {
        return Ok(queue);
    }
    let value = std::env::var(QUEUE_ENV).unwrap_or_default();
    parse_queue(&value).ok_or_else(|| {
        Error::of(
            ErrorKind::Other(crate::error::Exit::Usage),
            format!(
                "failed to launch run: ${QUEUE_ENV} (the `queue` config key) must be true or false, not '{}'",
                atomic_file::escape(&value)
            ),
        )
        .with_hint("set it to true, false, 1 or 0, or unset it; `subagents config` shows where it comes from")
    })
}

/// The variable of the default idle limit (config `idle_timeout`), read by
/// the launcher itself: an agent's own `idleTimeout` wins over it.
pub const IDLE_TIMEOUT_ENV: &str = "SUBAGENTS_IDLE_TIMEOUT";

/// The environment variable of the `queue` config key.
pub const QUEUE_ENV: &str = "SUBAGENTS_QUEUE";

/// `true`/`1`, `false`/`0` (any case), and empty for unset (false).
pub fn parse_queue(value: &str) -> Option<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "" | "false" | "0" => Some(false),
        "true" | "1" => Some(true),
        _ => None,
    }
}

/// The run's files, in order: fan-out descriptor, task files, recovery
/// files (single runs), the queued status, and last the active marker, so
/// an active listing can never miss a run whose runner may exist.
fn write_run(
    layout: &Layout,
    request: &Request,
    run_id: &str,
    budget: &OpenBudget,
    queue: Option<QueueConfig>,
) -> Result<LaunchConfig> {
    let run_dir = layout.run_dir(run_id);
    // The files below land in a directory nothing points to until the active
    // marker exists: each is fsynced, their names once, before the marker.
    // They are staged in one batch: all written, all fsynced (their
    // writeback started together), then renamed in this order.
    let deferred = atomic_file::defer_dir_sync(&run_dir);
    let mut files = atomic_file::Batch::new();
    let persisted = fanout_budget::stage_persisted(
        &run_dir,
        &layout.fanout_budgets_dir(),
        budget.descriptor(),
        &mut files,
    )
    .map_err(|e| {
        Error::failed(format!(
            "failed to create run directory '{}': {e}",
            run_dir.display()
        ))
    })?;
    let steps = step_configs(
        &request.plan,
        &run_dir,
        &request.cwd,
        &request.tasks,
        &mut files,
    )?;
    let config = LaunchConfig {
        run_id: run_id.to_owned(),
        root: layout.root().to_path_buf(),
        run_dir,
        runner_process_instance_id: uuid::Uuid::new_v4().to_string(),
        mode: request.plan.mode.clone(),
        steps,
        groups: request.plan.groups.clone(),
        timeout_ms: request.timeout_ms,
        session_id: Some(request.session.clone()),
        fanout_descriptor: serde_json::to_value(persisted.descriptor()).ok(),
        env: request.env.clone(),
        capacity_slot: None,
        revival: request.revival.as_ref().map(|r| revival_config(layout, r)),
        session_root: request.session_root.clone(),
        queue,
    };
    if config.mode == "single" {
        stage_persist(&config, request, persisted.descriptor(), &mut files)?;
    }
    if config.queue.is_some() {
        // Its monitor may have to be started again from the directory alone.
        let path = config.run_dir.join(supervisor::config::QUEUED_LAUNCH_FILE);
        files.add(&path, atomic_file::to_pretty_json(&config));
    }
    write_queued(&config, request, budget.snapshot().ok(), files)?;
    deferred.commit()?;
    atomic_file::sync_dir(&layout.runs_dir())?;
    index::create_marker(&config.run_dir)?;
    Ok(config)
}

fn take_slot(
    layout: &Layout,
    request: &Request,
    run_id: &str,
    run_dir: &Path,
) -> Result<admission::Admitted> {
    // A nested launch is bounded by the fan-out budget it inherits, never
    // by the session's capacity (docs/protocol/capacity.md §2.1: top-level launches only).
    if crate::fanout::is_nested() {
        return Ok(admission::Admitted::Slot(None));
    }
    let queue = match &request.slot {
        Slot::Acquire => false,
        Slot::AcquireOrQueue => true,
        Slot::Transfer(source) => {
            return admission::transfer(
                layout,
                &request.session,
                request.max_active,
                source,
                run_id,
                run_dir,
            )
            .map(|slot| admission::Admitted::Slot(slot.map(Box::new)));
        }
    };
    let (session, limit) = (&request.session, request.max_active);
    admission::admit(layout, session, limit, run_id, run_dir, queue)
}

fn revival_config(layout: &Layout, revival: &Revival) -> RevivalConfig {
    RevivalConfig {
        source_run_id: revival.source_run_id.clone(),
        session_file: revival.session_file.clone(),
        lease_root: recovery::lease::lease_root(layout.root()),
        token: uuid::Uuid::new_v4().to_string(),
        timeouts_ms: startup_timeouts_ms(),
    }
}

/// The plan of a plain `run -- COMMAND` or of a spec (inline or a file).
fn plan(run: &RunRequest) -> Result<Plan> {
    if let Some(path) = &run.spec_file {
        return crate::spec::read_plan(path).map_err(|e| Error::of(ErrorKind::BadSpec, e));
    }
    if let Some(spec) = &run.spec {
        return crate::spec::parse_plan(spec)
            .map_err(|e| Error::of(ErrorKind::BadSpec, format!("failed to read the spec: {e}")));
    }
    let program = run.command.first().filter(|c| !c.is_empty());
    let program = program.ok_or_else(|| {
        Error::of(
            ErrorKind::BadCombination,
            "failed to launch run: COMMAND is empty",
        )
    })?;
    // Without `--agent` the step is known by its command's short form.
    let command_label = run
        .agent
        .is_none()
        .then(|| listing::format::command_label(&run.command));
    let agent = run.agent.clone().unwrap_or_else(|| file_name(program));
    let spec = StepSpec {
        agent,
        command: run.command.clone(),
        name: None,
        command_label,
        task: None,
        task_file: None,
        cwd: None,
        timeout: None,
        idle_timeout: None,
    };
    Ok(Plan::single(spec))
}

/// The single step of a named agent's run.
fn preset_plan(preset: &crate::presets::Preset) -> Plan {
    Plan::single(StepSpec {
        agent: preset.definition.name.clone(),
        command: preset.invocation.argv.clone(),
        name: None,
        command_label: None,
        task: None,
        task_file: None,
        cwd: None,
        timeout: None,
        idle_timeout: None,
    })
}

fn file_name(program: &str) -> String {
    Path::new(program)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| program.to_owned())
}

fn resolve_cwd(cwd: Option<&Path>) -> Result<PathBuf> {
    let dir = match cwd {
        Some(dir) => dir.to_path_buf(),
        None => std::env::current_dir()
            .map_err(|e| Error::failed(format!("failed to read current directory: {e}")))?,
    };
    let real = dir.canonicalize().map_err(|e| {
        Error::failed(format!(
            "failed to launch run: cwd '{}': {e}",
            dir.display()
        ))
    })?;
    if !real.is_dir() {
        return Err(Error::failed(format!(
            "failed to launch run: cwd is not a directory: {}",
            dir.display()
        )));
    }
    Ok(real)
}

fn run_timeout(text: Option<&str>) -> Result<Option<u64>> {
    let ms = match text {
        Some(text) => {
            let d = crate::wait::parse_timeout(Some(text))?.unwrap_or_default();
            d.as_millis() as u64
        }
        None => DEFAULT_TIMEOUT_MS,
    };
    Ok((ms > 0).then_some(ms))
}

/// Task text per step: the request's task (or task file) for a single
/// run, the spec's `task` fields otherwise. Never stdin: the command line
/// reads a piped task itself, and the MCP server's stdin is its protocol.
fn read_tasks(run: &RunRequest, plan: &Plan) -> Result<Vec<Option<String>>> {
    if run.spec.is_some() || run.spec_file.is_some() {
        let mut tasks = Vec::new();
        for planned in &plan.steps {
            let text = match &planned.spec.task_file {
                Some(path) => Some(read_spec_task_file(run, &planned.at, path)?),
                None => planned.spec.task.clone(),
            };
            tasks.push(non_blank(text));
        }
        return Ok(tasks);
    }
    if let Some(path) = &run.task_file {
        let text = std::fs::read_to_string(path).map_err(|e| Error::bad_task_file(path, e))?;
        return Ok(vec![non_blank(Some(text))]);
    }
    Ok(vec![non_blank(run.task.clone())])
}

/// A spec step's `taskFile` (relative to the launcher's directory, as
/// `--task-file`): a regular file of UTF-8 text, read without following a FIFO.
fn read_spec_task_file(run: &RunRequest, at: &str, path: &Path) -> Result<String> {
    let fail = |why: String| {
        let why = format!("{at}.taskFile: {why}");
        spec_error(run, ErrorKind::BadSpec, why)
    };
    let bytes = atomic_file::read::read_input_file(path).map_err(|e| fail(e.to_string()))?;
    String::from_utf8(bytes).map_err(|e| {
        fail(format!(
            "'{}' is not UTF-8 text: {e}",
            atomic_file::escape_path(path)
        ))
    })
}

/// A task file's bytes: the task ending with a newline (one added when it
/// has none). COMMAND's stdin is this file as is, so stdin and
/// `$SUBAGENTS_TASK_FILE` are the same bytes, and an agent that reads a line
/// gets one.
fn task_bytes(task: &str) -> Vec<u8> {
    let mut bytes = task.as_bytes().to_vec();
    if !bytes.ends_with(b"\n") {
        bytes.push(b'\n');
    }
    bytes
}

/// A task that is blank after trimming is no task: no task file, no
/// `[prompt redacted]` marker, nothing on stdin (as the reference).
fn non_blank(task: Option<String>) -> Option<String> {
    task.filter(|t| !t.trim().is_empty())
}

/// An explicit id (refused when unsafe or taken) or a fresh 10-hex-digit one.
fn pick_id(layout: &Layout, explicit: Option<&str>) -> Result<String> {
    if let Some(id) = explicit {
        if !status::layout::is_safe_run_id(id) {
            return Err(Error::of(
                ErrorKind::UnsafeId,
                format!(
                    "failed to launch run: --id '{id}' is not a safe file name (letters, digits, '-', '_', '.'; not starting with '.')"
                ),
            ));
        }
        if id == crate::runs::LAST {
            // `last` is the handle of the newest run: a run of that id could
            // never be named.
            return Err(Error::of(
                ErrorKind::UnsafeId,
                "failed to launch run: --id 'last' is reserved (it names the newest run of the session)",
            )
            .with_hint("pick another --id; `subagents logs last` already finds this run"));
        }
        if layout.run_dir(id).symlink_metadata().is_ok() {
            return Err(Error::failed(format!(
                "failed to launch run: run '{id}' already exists"
            )));
        }
        return Ok(id.to_owned());
    }
    loop {
        let id = uuid::Uuid::new_v4().simple().to_string()[..10].to_owned();
        if layout.run_dir(&id).symlink_metadata().is_err() {
            return Ok(id);
        }
    }
}

fn create_run_dir(dir: &Path, id: &str) -> Result {
    DirBuilder::new()
        .mode(atomic_file::DIR_MODE)
        .create(dir)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => {
                Error::failed(format!("failed to launch run: run '{id}' already exists"))
            }
            _ => Error::failed(format!(
                "failed to create run directory '{}': {e}",
                dir.display()
            )),
        })
}

/// The run's budget: reused for a revival (no claim), else inherited from
/// the environment (nested launch: `parentPath` extended by this run's id)
/// or created for a new root run; then the launch's static batch is claimed
/// all-or-nothing. Over the limit: exit 3, and a budget created here is
/// removed again. Returns the budget and whether it was created here.
fn admit_fanout(layout: &Layout, run_id: &str, request: &Request) -> Result<(OpenBudget, bool)> {
    let root = layout.fanout_budgets_dir();
    atomic_file::ensure_private_dir(&root)?;
    let fail = |e: fanout_budget::Error| Error::failed(format!("failed to admit run fan-out: {e}"));
    let limit = match &request.budget {
        Budget::Reuse(descriptor) => {
            return OpenBudget::open(&root, descriptor)
                .map(|b| (b, false))
                .map_err(fail);
        }
        Budget::Claim(limit) => *limit,
    };
    let plan = &request.plan;
    let (budget, own_limit) = match fanout_budget::inherited_from_env(&root).map_err(fail)? {
        Some(inherited) => {
            let nested: Descriptor = inherited.descriptor().child(run_id);
            (OpenBudget::open(&root, &nested).map_err(fail)?, None)
        }
        None => {
            let resolved = crate::fanout::new_root_limit(limit);
            let budget = fanout_budget::create_budget(&root, run_id, resolved.limit);
            (budget.map_err(fail)?, Some(resolved))
        }
    };
    let paths: Vec<&str> = plan.steps.iter().map(|s| s.claim_path.as_str()).collect();
    let claimed = budget.claim(&paths);
    if claimed.is_err() && own_limit.is_some() {
        // Nothing refers to the budget made for this refused run.
        let _ = std::fs::remove_dir_all(&budget.descriptor().directory);
    }
    match claimed {
        Ok(_) => Ok((budget, own_limit.is_some())),
        Err(e) => match e.rejection() {
            Some(rejection) => {
                let root_run_id = &budget.descriptor().root_run_id;
                let hint =
                    crate::fanout::rejection_hint(rejection, root_run_id, own_limit.as_ref());
                Err(Error::of(
                    ErrorKind::FanoutRefused,
                    format!("failed to launch run: {rejection}"),
                )
                .with_detail(Detail::RunFanout(rejection.clone()))
                .with_hint(hint))
            }
            None => Err(fail(e)),
        },
    }
}

fn step_configs(
    plan: &Plan,
    run_dir: &Path,
    cwd: &Path,
    tasks: &[Option<String>],
    files: &mut atomic_file::Batch,
) -> Result<Vec<StepConfig>> {
    let single = plan.steps.len() == 1 && plan.mode == "single";
    let mut steps = Vec::new();
    for (i, (planned, task)) in plan.steps.iter().zip(tasks).enumerate() {
        let task_file = match task {
            Some(text) => {
                let name = if single {
                    files::TASK.to_owned()
                } else {
                    format!("task-{i}.md")
                };
                let path = run_dir.join(name);
                files.add(&path, task_bytes(text));
                Some(path)
            }
            None => None,
        };
        let previous_in_task = planned.previous_in_task && task_file.is_some();
        let step_cwd = match &planned.spec.cwd {
            Some(dir) => resolve_cwd(Some(&cwd.join(dir)))?,
            None => cwd.to_path_buf(),
        };
        steps.push(StepConfig {
            agent: planned.spec.agent.clone(),
            command: planned.spec.command.clone(),
            cwd: step_cwd,
            task_file,
            timeout_ms: planned.timeout_ms,
            fanout_label: (!single).then(|| planned.claim_path.clone()),
            env: planned.env.clone(),
            idle_timeout_ms: planned.idle_timeout_ms,
            previous_in_task,
        });
    }
    Ok(steps)
}

/// Commits `files`, the run's files staged before it, with the queued
/// status renamed last.
fn write_queued(
    config: &LaunchConfig,
    request: &Request,
    fanout: Option<fanout_budget::Snapshot>,
    files: atomic_file::Batch,
) -> Result {
    let fanout = fanout.and_then(|s| serde_json::to_value(s).ok());
    let mut queued = supervisor::transitions::queued(
        config,
        fanout,
        ProcessIdentity::current().ok(),
        status::now_ms(),
    );
    let specs = request.plan.steps.iter().map(|planned| &planned.spec);
    add_names(&mut queued, request.name.as_deref(), specs);
    if let crate::executor::Executor::Slurm(_) = request.executor {
        // Our key: the run is judged by its executor, not by pids here.
        queued
            .extra
            .insert(status::reconcile::EXECUTOR_KEY.into(), json!("slurm"));
    }
    if let Some(queue) = &config.queue {
        status::slot_wait::set_queued_for_slot(&mut queued, queue.since);
    }
    status::model::write_status_after(files, &config.run_dir, &queued)?;
    Ok(())
}

/// Adds the run's `name` and each step's `name` and `commandLabel` to its
/// queued status: keys of our own, which the runner's later writes keep
/// and the reference ignores.
pub fn add_names<'a>(
    queued: &mut status::RunStatus,
    name: Option<&str>,
    specs: impl IntoIterator<Item = &'a StepSpec>,
) {
    use listing::format::{COMMAND_LABEL_KEY, NAME_KEY};
    if let Some(name) = name {
        queued.extra.insert(NAME_KEY.into(), json!(name));
    }
    let steps = queued.steps.iter_mut().flatten();
    for (step, spec) in steps.zip(specs) {
        if let Some(name) = &spec.name {
            step.extra.insert(NAME_KEY.into(), json!(name));
        }
        if let Some(label) = &spec.command_label {
            step.extra.insert(COMMAND_LABEL_KEY.into(), json!(label));
        }
    }
}

/// Environment override of every startup-handshake wait, in milliseconds
/// (defaults: the reference's 10 s on the launcher side, 30 s on the runner's).
pub const STARTUP_TIMEOUT_ENV: &str = "SUBAGENTS_STARTUP_TIMEOUT_MS";

/// (launcher waits, runner waits) in ms.
pub fn startup_timeouts_ms() -> (u64, u64) {
    let configured = std::env::var(STARTUP_TIMEOUT_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok());
    match configured.filter(|ms| *ms > 0) {
        Some(ms) => (ms, ms),
        None => (10_000, 30_000),
    }
}

/// The session file of a run's lineage: a revival continues its source's;
/// a fresh run's is its own first output.
fn session_file(config: &LaunchConfig) -> PathBuf {
    match &config.revival {
        Some(revival) => revival.session_file.clone(),
        None => supervisor::runner::output_path(config, 0),
    }
}

/// Writes `launch-contract.json`, `recovery-descriptor.json` and
/// `recovery-seal.json` for a single run.
pub fn persist(config: &LaunchConfig, request: &Request, budget: &Descriptor) -> Result {
    let mut files = atomic_file::Batch::new();
    stage_persist(config, request, budget, &mut files)?;
    files.commit()?;
    Ok(())
}

/// [`persist`] that stages the three files in `files` (written when the
/// caller commits them).
fn stage_persist(
    config: &LaunchConfig,
    request: &Request,
    budget: &Descriptor,
    files: &mut atomic_file::Batch,
) -> Result {
    let step = &config.steps[0];
    let contract = LaunchContract {
        version: 1,
        run_id: config.run_id.clone(),
        agent: step.agent.clone(),
        cwd: step.cwd.display().to_string(),
        command: step.command.clone(),
        env: request.env.clone(),
        timeout_ms: config.timeout_ms,
        session_id: config.session_id.clone(),
    };
    let fail = |e: String| Error::failed(format!("failed to persist recovery descriptor: {e}"));
    let mut descriptor = json!({
        "version": 1,
        "runFanoutBudget": budget,
        "sourceRunId": config.run_id,
        "agent": step.agent,
        "sessionFile": session_file(config),
        "cwd": step.cwd,
        "systemPromptMode": "append",
        "inheritProjectContext": false,
        "inheritSkills": false,
        "outputPath": supervisor::runner::output_path(config, 0),
        "outputMode": "inline",
        "maxSubagentDepth": 2,
        "share": false,
    });
    crate::presets::fill_descriptor(&mut descriptor, request.preset.as_ref());
    let mut descriptor: RecoveryDescriptor =
        serde_json::from_value(descriptor).map_err(|e| fail(e.to_string()))?;
    let task = request.tasks.first().cloned().flatten().unwrap_or_default();
    let key = RootKey::load_or_create(&config.root).map_err(|e| fail(e.to_string()))?;
    let staged = recovery::stage_recovery(
        &config.run_dir,
        &contract,
        &mut descriptor,
        &task,
        &key,
        files,
    );
    match staged {
        // A task that equals a value the contract needs anyway (argv, cwd,
        // session) cannot be written without "containing" it: the run goes
        // on, but it cannot be resumed. Nothing was staged.
        Err(recovery::ContractError::TaskText { .. }) => Ok(()),
        other => other.map(drop).map_err(|e| fail(e.to_string())),
    }
}
