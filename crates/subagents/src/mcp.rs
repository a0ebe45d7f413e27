//! `subagents mcp`: the launcher's API as MCP tools on stdio (the official
//! Rust SDK, `rmcp`).
//!
//! Each tool takes one request type of [`launcher::api`] (its JSON Schema is
//! the tool's input schema) and calls the same [`Launcher`] method as the
//! command line. A success returns the outcome's JSON, exactly what the
//! command's `--json` prints (as structured content when it is an object);
//! a failure is a tool error (`isError: true`) whose content is the
//! command's `--json` error object: `{"error": {code, exitCode, message,
//! hint?}, ...detail}`.
//!
//! The server is a launcher, never a parent: every run it starts is detached
//! exactly as `subagents run` detaches it (the monitor in its own session),
//! so runs outlive the connection and the server; the server only reaps the
//! monitors it spawned once they exit, so none lingers as a zombie. Budgets
//! and capacity apply as for the command line (a server started inside a run
//! inherits that run's budget from its environment), and the task text
//! travels only into the run's task file.

use std::sync::Arc;
use std::time::Duration;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolResult, ContentBlock, Implementation, ProgressNotificationParam, ServerCapabilities,
    ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{RoleServer, ServerHandler, ServiceExt, tool, tool_handler, tool_router};
use serde::Serialize;

use launcher::api::{
    AgentsRequest, BudgetClaimRequest, BudgetCreateRequest, BudgetQuery, CapacityQuery,
    ConfigRequest, DismissRequest, ListQuery, LogsRequest, PruneRequest, ReconcileRequest,
    ResumeRequest, RunRef, RunRequest, StopRequest, ValidateRequest, WaitReport, WaitRequest,
};
use launcher::error::{Error, ErrorKind, Exit, Result};
use launcher::service::Launcher;
use launcher::wait::{Keep, WaitEvent, progress_line};

/// `wait` without a timeout gives up after this long (error TIMEOUT, code
/// 124): under the 60 s a client such as Codex allows a tool call by default.
pub const DEFAULT_WAIT_TIMEOUT: &str = "50s";
/// Lines of each log file `wait` returns without `tail`.
pub const WAIT_TAIL_LINES: usize = 20;
/// Lines of each log file `logs` returns without `tail`.
pub const LOGS_TAIL_LINES: usize = 200;
/// At most this many lines of each file, whatever `tail` asks.
pub const MAX_TAIL_LINES: usize = 5000;
/// At most this many bytes of each file (its end).
pub const MAX_LOG_BYTES: usize = 64 * 1024;
/// `list` without `limit` shows at most this many runs.
pub const DEFAULT_LIST_LIMIT: usize = 100;

/// Serves the tools on stdin/stdout until the client disconnects. Runs the
/// server started keep going.
pub fn serve(launcher: Launcher) -> Result {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::failed(format!("failed to start the MCP server: {e}")))?;
    let server = Server::new(launcher);
    let served = runtime.block_on(async move {
        let service = server
            .serve(rmcp::transport::stdio())
            .await
            .map_err(|e| Error::failed(format!("failed to start the MCP session: {e}")))?;
        service
            .waiting()
            .await
            .map(drop)
            .map_err(|e| Error::failed(format!("failed to serve MCP: {e}")))
    });
    // A tool call still blocked (a `wait`) ends with the process.
    runtime.shutdown_background();
    served
}

/// The variable (or config key `timeout`) that sets a run's default deadline.
const DEFAULT_TIMEOUT_ENV: &str = "SUBAGENTS_TIMEOUT";

/// The MCP server: the tools over one [`Launcher`].
#[derive(Clone)]
pub struct Server {
    launcher: Arc<Launcher>,
    // Read by the code `#[tool_handler]` generates.
    #[allow(dead_code)]
    tool_router: ToolRouter<Self>,
}

impl Server {
    /// A server over `launcher`.
    pub fn new(launcher: Launcher) -> Self {
        Self {
            launcher: Arc::new(launcher),
            tool_router: Self::tool_router(),
        }
    }

    /// Runs `op` on the blocking pool (every operation reads files, and some
    /// spawn or wait) and turns its outcome into a tool result.
    async fn call<T, F>(&self, op: F) -> CallToolResult
    where
        T: Serialize + Send + 'static,
        F: FnOnce(&Launcher) -> Result<T> + Send + 'static,
    {
        let launcher = self.launcher.clone();
        let joined = tokio::task::spawn_blocking(move || op(&launcher)).await;
        let outcome =
            joined.unwrap_or_else(|e| Err(Error::failed(format!("failed to run the tool: {e}"))));
        tool_result(outcome)
    }
}

/// The runs a `stop` or `dismiss` call names: `run` (the request types'
/// field, kept for existing clients) or `runs`, not both.
fn names(run: &Option<String>, runs: &Option<Vec<String>>) -> Result<Vec<String>> {
    match (run, runs) {
        (Some(run), None) => Ok(vec![run.clone()]),
        (None, Some(runs)) if !runs.is_empty() => Ok(runs.clone()),
        (Some(_), Some(_)) => Err(Error::usage(
            "failed to read the request: give `run` or `runs`, not both",
        )),
        _ => Err(Error::of(
            ErrorKind::NoRunNamed,
            "failed to read the request: name a run in `run` or `runs`",
        )),
    }
}

/// One outcome as itself when the call named `run`, an array for `runs`.
fn one_or_many<T: Serialize>(
    runs: &Option<Vec<String>>,
    outcomes: Result<Vec<T>>,
) -> Result<serde_json::Value> {
    let outcomes = outcomes?;
    let value = match (runs, &outcomes[..]) {
        (None, [one]) => serde_json::to_value(one),
        _ => serde_json::to_value(&outcomes),
    };
    value.map_err(|e| Error::failed(format!("failed to serialise the outcome: {e}")))
}

/// Applies `one` to every run, going on past errors; the error with the
/// largest exit code wins (as on the command line).
fn each<T>(runs: &[String], one: impl Fn(&String) -> Result<T>) -> Result<Vec<T>> {
    let mut outcomes = Vec::new();
    let mut worst: Option<Error> = None;
    for run in runs {
        match one(run) {
            Ok(outcome) => outcomes.push(outcome),
            Err(e)
                if worst
                    .as_ref()
                    .is_none_or(|w| e.exit().code() > w.exit().code()) =>
            {
                worst = Some(e)
            }
            Err(_) => {}
        }
    }
    worst.map_or(Ok(outcomes), Err)
}

/// The `stop` tool's request: [`StopRequest`] with `runs`.
#[derive(Debug, Clone, Default, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct StopArgs {
    /// Run id, unique prefix or `last` (the newest run of this server's session).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    run: Option<String>,
    /// Several runs (ids, prefixes or `last`); the outcome is then an array.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    runs: Option<Vec<String>>,
    /// Why (kept in status.json). Default "Subagent stopped by user.".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
}

/// The `dismiss` tool's request: [`DismissRequest`] with `runs`.
#[derive(Debug, Clone, Default, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct DismissArgs {
    /// Run id, unique prefix or `last` (the newest run of this server's session).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    run: Option<String>,
    /// Several runs (ids, prefixes or `last`); the outcome is then an array.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    runs: Option<Vec<String>>,
    /// Hide it even while it is still active.
    #[serde(default)]
    force: bool,
}

/// An outcome as a tool result: its JSON (structured when an object), or
/// the JSON error object as a tool error.
pub fn tool_result<T: Serialize>(outcome: Result<T>) -> CallToolResult {
    match outcome.and_then(|value| {
        serde_json::to_value(value)
            .map_err(|e| Error::failed(format!("failed to serialise the outcome: {e}")))
    }) {
        Ok(value) if value.is_object() => CallToolResult::structured(value),
        Ok(value) => CallToolResult::success(vec![ContentBlock::text(value.to_string())]),
        Err(e) => CallToolResult::structured_error(with_usage_hint(e).to_json()),
    }
}

/// Every usage error leaves with a hint, worded as the tool's request
/// fields (never the command line's flags).
fn with_usage_hint(mut e: Error) -> Error {
    if e.exit() == Exit::Usage && e.hint.is_none() {
        e.hint = Some(usage_hint(e.kind));
    }
    e
}

/// The MCP hint for a usage mistake of `kind`.
fn usage_hint(kind: ErrorKind) -> String {
    match kind {
        ErrorKind::MissingTask => "give the task in `task`".to_owned(),
        ErrorKind::TaskTwice => "give `task` or `taskFile`, not both".to_owned(),
        ErrorKind::BadTaskFile => "`taskFile` names a readable file".to_owned(),
        ErrorKind::BadDuration(field) => format!(
            "`{}` takes a duration with its unit (ms, s, m, h, d), largest first, e.g. \"90s\", \"30m\" or \"1h30m\"",
            field.name()
        ),
        ErrorKind::BadSpec => "`spec` is {\"mode\": \"parallel\", \"tasks\": [step, ...]} or {\"mode\": \"chain\", \"steps\": [...]}, each step {\"agent\", \"command\": [argv], \"task\"?}".to_owned(),
        ErrorKind::UnknownAgent => "`agent` names an agent definition".to_owned(),
        ErrorKind::UnsafeId => {
            "`id` takes letters, digits, '-', '_' and '.', not starting with '.'".to_owned()
        }
        ErrorKind::BadName => {
            "`name` takes 1 to 64 characters, none a control character".to_owned()
        }
        ErrorKind::NoSuchStep => "`step` counts from 1".to_owned(),
        ErrorKind::NoRunNamed => "name at least one run in `runs`".to_owned(),
        kind => match kind.field() {
            Some(field) => format!("check `{field}` against the tool's input schema"),
            None => "check the request against the tool's input schema".to_owned(),
        },
    }
}

/// Bounds a tail request: `default` lines when none, never more than
/// [`MAX_TAIL_LINES`], never more than [`MAX_LOG_BYTES`] per file.
fn bounded(mut request: LogsRequest, default: usize) -> LogsRequest {
    request.tail = Some(request.tail.unwrap_or(default).min(MAX_TAIL_LINES));
    request.max_bytes = Some(MAX_LOG_BYTES);
    request
}

#[tool_router]
impl Server {
    #[tool(
        description = "Launch a detached background run and return at once with its runId: a named agent (`agent` + `task`), any command (`command` argv + optional `task` on its stdin), or a composite `spec` ({\"mode\": \"parallel\", \"tasks\": [step, ...]} or {\"mode\": \"chain\", \"steps\": [...]}, each step {\"agent\", \"command\": [argv], \"task\"?}). The run outlives this server; collect it with `wait` and `logs`. Errors: LIMIT (3) when the fan-out budget or the session's capacity refuses it (detail: runFanoutRejection/runFanoutBudget or capacity), USAGE (2), FAILED (1)."
    )]
    async fn run(&self, Parameters(mut request): Parameters<RunRequest>) -> CallToolResult {
        // The user's default deadline (`timeout` in config.toml, or
        // $SUBAGENTS_TIMEOUT) applies to runs an agent starts, as to the CLI's.
        if request.timeout.is_none() {
            request.timeout = std::env::var(DEFAULT_TIMEOUT_ENV)
                .ok()
                .filter(|v| !v.is_empty());
        }
        self.call(move |launcher| {
            let launched = launcher.run(&request)?;
            reap_monitor(launcher, &launched.run_id);
            Ok(launched)
        })
        .await
    }

    #[tool(
        description = "One run's summary (state, steps, exit codes, errors, fan-out budget, process-terminal proof), as `subagents status --json`. Errors: NOT_FOUND (4) for an unknown or ambiguous id."
    )]
    async fn status(&self, Parameters(request): Parameters<RunRef>) -> CallToolResult {
        self.call(move |launcher| launcher.status(&request.run))
            .await
    }

    #[tool(
        description = "List runs as an array of run summaries: active ones, or every run with `all` (at most 100 unless `limit` says otherwise)."
    )]
    async fn list(&self, Parameters(mut query): Parameters<ListQuery>) -> CallToolResult {
        query.limit = Some(query.limit.unwrap_or(DEFAULT_LIST_LIMIT));
        self.call(move |launcher| launcher.list(&query)).await
    }

    #[tool(
        description = "Block until every named run (`runs`: ids, prefixes or `last`; none: every active run of this server's session) is over, then return {runs: [final summaries], logs: [the last `tail` (default 20) lines of each run's output]}. Gives up after `timeout` (default 50s) with error TIMEOUT (124): call it again to keep waiting; the runs go on. Sends progress notifications while it blocks when the request carries a progress token."
    )]
    async fn wait(
        &self,
        Parameters(mut request): Parameters<WaitRequest>,
        context: RequestContext<RoleServer>,
    ) -> CallToolResult {
        request.timeout = Some(
            request
                .timeout
                .take()
                .unwrap_or_else(|| DEFAULT_WAIT_TIMEOUT.to_owned()),
        );
        let peer = context.peer.clone();
        let (progress, forwarding) = match context.meta.get_progress_token() {
            Some(token) => {
                let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(f64, String)>();
                let forward = tokio::spawn(async move {
                    while let Some((done, message)) = rx.recv().await {
                        let param = ProgressNotificationParam::new(token.clone(), done)
                            .with_message(message);
                        if peer.notify_progress(param).await.is_err() {
                            break;
                        }
                    }
                });
                (Some(tx), Some(forward))
            }
            None => (None, None),
        };
        // A cancelled call gives up at the wait's next look (within 1 s)
        // instead of blocking a thread until its timeout.
        let cancelled = context.ct.clone();
        let result = self
            .call(move |launcher| {
                let mut last: Option<Duration> = None;
                let mut settled = 0usize;
                let mut report = |event: WaitEvent<'_>| {
                    if cancelled.is_cancelled() {
                        return Keep::Break(());
                    }
                    let Some(tx) = &progress else {
                        return Keep::Continue(());
                    };
                    match event {
                        WaitEvent::Settled(run) => {
                            settled += 1;
                            let since = last.unwrap_or_default().as_secs_f64();
                            let _ = tx.send((
                                since + settled as f64 / 1000.0,
                                format!("{} {}", run.id, run.status.state),
                            ));
                        }
                        // At most one notification a second; progress only grows.
                        WaitEvent::Pending(runs, elapsed)
                            if last.is_none_or(|l| elapsed >= l + Duration::from_secs(1)) =>
                        {
                            last = Some(elapsed);
                            let _ = tx.send((elapsed.as_secs_f64(), progress_line(runs, elapsed)));
                        }
                        WaitEvent::Pending(..) => {}
                    }
                    Keep::Continue(())
                };
                let runs = launcher.wait(&request, &mut report)?;
                let tail = request.tail.unwrap_or(WAIT_TAIL_LINES);
                let logs = runs
                    .runs
                    .iter()
                    .map(|run| {
                        let logs = bounded(
                            LogsRequest {
                                run: run.id.clone(),
                                tail: Some(tail),
                                ..Default::default()
                            },
                            WAIT_TAIL_LINES,
                        );
                        launcher::logs::outcome(run, &logs)
                    })
                    .collect();
                Ok(WaitReport { runs, logs })
            })
            .await;
        if let Some(forward) = forwarding {
            // The sender is gone with the closure: the forwarder drains and ends.
            let _ = forward.await;
        }
        result
    }

    #[tool(
        description = "Stop a run (`run`) or several (`runs`): each one's runner and every process group of its commands; returns the final summary, or with `runs` an array of them (a run already over is left as it is). `last` names the newest run of this server's session."
    )]
    async fn stop(&self, Parameters(request): Parameters<StopArgs>) -> CallToolResult {
        self.call(move |launcher| {
            let runs = names(&request.run, &request.runs)?;
            let stop = |run: &String| {
                let one = StopRequest {
                    run: run.clone(),
                    reason: request.reason.clone(),
                };
                launcher.stop(&one).map(|o| o.run)
            };
            one_or_many(&request.runs, each(&runs, stop))
        })
        .await
    }

    #[tool(
        description = "Revive a finished (complete, failed or stopped) single run with a follow-up `task`: same agent, same contract; a named agent's run continues its CLI's own session. Returns the new run (runId, ..., sourceRunId). Errors: LIMIT (3) when the session's capacity refuses it, NOT_FOUND (4), FAILED (1) when the run cannot be resumed."
    )]
    async fn resume(&self, Parameters(request): Parameters<ResumeRequest>) -> CallToolResult {
        self.call(move |launcher| {
            let resumed = launcher.resume(&request)?;
            reap_monitor(launcher, &resumed.launched.run_id);
            Ok(resumed)
        })
        .await
    }

    #[tool(
        description = "A run's output: {runId, state, logs: [{name, path, text}]} with the last `tail` lines (default 200, at most 5000; at most 64 KiB) of each file: the output of a finished run, else the command's stdout, and its stderr. `step` picks one step of a composite run, `stderr` only stderr."
    )]
    async fn logs(&self, Parameters(request): Parameters<LogsRequest>) -> CallToolResult {
        let request = bounded(request, LOGS_TAIL_LINES);
        self.call(move |launcher| launcher.logs(&request)).await
    }

    #[tool(
        description = "The run fan-out budget: with `run`, that run's {used, limit, remaining}; without, the report of what a launch from this server gets (newRootRun limit and its source, the inherited budget when the server runs inside a run)."
    )]
    async fn budget(&self, Parameters(query): Parameters<BudgetQuery>) -> CallToolResult {
        self.call(move |launcher| launcher.budget(&query)).await
    }

    #[tool(
        description = "The active-run capacity of a session (default: this server's): {session, used, limit (0 = unlimited), slots: [{slot, release, observer?}]}."
    )]
    async fn capacity(&self, Parameters(query): Parameters<CapacityQuery>) -> CallToolResult {
        self.call(move |launcher| launcher.capacity(&query)).await
    }

    #[tool(
        description = "Create a run fan-out budget for root run `rootRunId` with `limit` slots (else the configured default); returns its descriptor {version, rootRunId, directory, ...}, as `subagents budget create`."
    )]
    async fn budget_create(
        &self,
        Parameters(request): Parameters<BudgetCreateRequest>,
    ) -> CallToolResult {
        self.call(move |launcher| launcher.budget_create(&request))
            .await
    }

    #[tool(
        description = "Claim one fan-out slot per `paths` entry, all or nothing, from the budget of `descriptor` (else the one this server inherited); returns {used, limit, remaining}. Errors: LIMIT (3) over the limit, with the rejection."
    )]
    async fn budget_claim(
        &self,
        Parameters(request): Parameters<BudgetClaimRequest>,
    ) -> CallToolResult {
        self.call(move |launcher| launcher.budget_claim(&request))
            .await
    }

    #[tool(
        description = "Repair stale runs (runner and monitor gone) and finalize what the evidence allows: {repaired: [{runId, message}], observed: [{runId, message}], unreadable: [...], warnings?}, as `subagents reconcile --json`."
    )]
    async fn reconcile(&self, Parameters(request): Parameters<ReconcileRequest>) -> CallToolResult {
        self.call(move |launcher| launcher.reconcile(&request))
            .await
    }

    #[tool(
        description = "Hide a finished run (`run`) or several (`runs`) from `list` without touching its processes: {runId, displayDismissedAt}, or with `runs` an array of them. An active run is refused (FAILED, 1) unless `force`."
    )]
    async fn dismiss(&self, Parameters(request): Parameters<DismissArgs>) -> CallToolResult {
        self.call(move |launcher| {
            let runs = names(&request.run, &request.runs)?;
            let dismiss = |run: &String| {
                let one = DismissRequest {
                    run: run.clone(),
                    force: request.force,
                };
                launcher.dismiss(&one)
            };
            one_or_many(&request.runs, each(&runs, dismiss))
        })
        .await
    }

    #[tool(
        description = "Delete finished runs older than `olderThan` (default 7d) with the budgets, leases and capacity slots only they use; `dryRun` only says what would go. Returns {dryRun, olderThanMs, pruned: [{runId, state, endedAt}], kept: [{runId, reason}], budgets, leases, capacitySlots}."
    )]
    async fn prune(&self, Parameters(request): Parameters<PruneRequest>) -> CallToolResult {
        self.call(move |launcher| launcher.prune(&request)).await
    }

    #[tool(
        description = "Validate one on-disk artifact `file` as `kind` exactly as the readers read it: {valid, error}; an invalid file is a result, not a tool error."
    )]
    async fn validate(&self, Parameters(request): Parameters<ValidateRequest>) -> CallToolResult {
        self.call(move |launcher| launcher.validate(&request)).await
    }

    #[tool(
        description = "Named agent definitions of this server's directory and of the user: `list` (default) {agents, errors}, `show` with `name` (the agent, systemPrompt, the rendered argv and env), or `prompt` {snippet} for CLAUDE.md / AGENTS.md."
    )]
    async fn agents(&self, Parameters(request): Parameters<AgentsRequest>) -> CallToolResult {
        self.call(move |launcher| launcher.agents(&request)).await
    }

    #[tool(
        description = "The config file this server read and each setting's value and source: {path, exists, keys: [{key, variable, value, source}]}."
    )]
    async fn config(&self, Parameters(request): Parameters<ConfigRequest>) -> CallToolResult {
        self.call(move |launcher| launcher.config(&request)).await
    }
}

#[tool_handler]
impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("subagents", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Durable background runs (subagents). `run` starts a detached run and returns its runId at once; start several to work in parallel. `wait` blocks (up to its timeout) until runs are over and returns their summaries and output tails; `logs` reads a run's output; `status`/`list` show runs; `stop` ends one; `resume` continues a finished run with a follow-up task. Runs outlive this server. Errors carry error.code and error.exitCode: LIMIT (3) = fan-out budget or capacity refused (nothing started), NOT_FOUND (4), TIMEOUT (124) = wait gave up (the runs go on), USAGE (2), FAILED (1).",
            )
    }
}

/// The run's monitor is this server's child (as it is `subagents run`'s,
/// which exits at once): reap it when it exits, so a long-lived server
/// leaves no zombie. Only a monitor whose parent is this process is waited
/// for, on a small thread of its own.
fn reap_monitor(launcher: &Launcher, run_id: &str) {
    let Some(monitor) = launcher::process::monitor_pid(launcher.layout(), run_id) else {
        return;
    };
    if parent_of(monitor) != Some(std::process::id()) {
        return;
    }
    let Ok(pid) = i32::try_from(monitor) else {
        return;
    };
    let _ = std::thread::Builder::new()
        .name("reap-monitor".into())
        .stack_size(64 * 1024)
        .spawn(move || {
            let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
        });
}

/// The parent pid of `pid` (`/proc/<pid>/stat` field 4).
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields follow the last ')'.
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(1)?.parse().ok()
}
