//! `subagents mcp`: the launcher's API as MCP tools on stdio (the official
//! Rust SDK, `rmcp`).
//!
//! Each tool takes one request type of [`launcher::api`] (its JSON Schema is
//! the tool's input schema; the server reads the arguments itself, so a
//! mismatch is a `USAGE` error like any other) and calls the same
//! [`Launcher`] method as the command line. A success returns the outcome's
//! JSON, what the command's `--json` prints, as `structuredContent` (lists
//! wrapped in an object, run summaries compact unless `detail: "full"`); a
//! failure is a tool error (`isError: true`) whose text is the command's
//! `--json` error object: `{"error": {code, exitCode, message, hint?},
//! ...detail}`. Titles, annotations and schemas: `mcp_schema`; the stdio
//! line filter (JSON-RPC parse and request errors): `mcp_stdio`.
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
    CallToolResult, ContentBlock, Implementation, JsonObject, ProgressNotificationParam,
    ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{RoleServer, ServerHandler, ServiceExt, tool, tool_handler, tool_router};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::mcp_schema::{
    Detail, DismissArgs, ListRow, OneOrMany, Runs, StopArgs, Summary, Waited, annotate, parse,
    take_detail, unflag,
};
use launcher::api::{
    AgentsRequest, BudgetClaimRequest, BudgetCreateRequest, BudgetQuery, CapacityQuery,
    ConfigRequest, DismissRequest, ListQuery, LogsRequest, PruneRequest, ReconcileRequest,
    ResumeRequest, RunRef, RunRequest, StopRequest, ValidateRequest, WaitRequest,
};
use launcher::error::{Error, ErrorKind, Exit, Result};
use launcher::service::Launcher;
use launcher::wait::{Cancel, Keep, WaitEvent, progress_line};

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
        let (transport, stdio) = crate::mcp_stdio::Stdio::start()
            .map_err(|e| Error::failed(format!("failed to start the MCP server: {e}")))?;
        let service = server
            .serve(transport)
            .await
            .map_err(|e| Error::failed(format!("failed to start the MCP session: {e}")))?;
        let served = service
            .waiting()
            .await
            .map(drop)
            .map_err(|e| Error::failed(format!("failed to serve MCP: {e}")));
        stdio.finish().await;
        served
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
    tool_router: ToolRouter<Self>,
}

impl Server {
    /// A server over `launcher`.
    pub fn new(launcher: Launcher) -> Self {
        let mut tool_router = Self::tool_router();
        annotate(&mut tool_router);
        Self {
            launcher: Arc::new(launcher),
            tool_router,
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

    /// [`Server::call`] with the request `R` read from the arguments first.
    async fn with<R, T, F>(&self, args: JsonObject, op: F) -> CallToolResult
    where
        R: DeserializeOwned + Send + 'static,
        T: Serialize + Send + 'static,
        F: FnOnce(&Launcher, R) -> Result<T> + Send + 'static,
    {
        match parse::<R>(args) {
            Ok(request) => self.call(move |launcher| op(launcher, request)).await,
            Err(e) => tool_result::<()>(Err(e)),
        }
    }

    /// [`Server::with`] for the tools that return run summaries: `detail`
    /// is taken out of the arguments and handed to `op`.
    async fn detailed<R, T, F>(&self, mut args: JsonObject, op: F) -> CallToolResult
    where
        R: DeserializeOwned + Send + 'static,
        T: Serialize + Send + 'static,
        F: FnOnce(&Launcher, R, Detail) -> Result<T> + Send + 'static,
    {
        match take_detail(&mut args) {
            Ok(detail) => {
                self.with(args, move |launcher, request| op(launcher, request, detail))
                    .await
            }
            Err(e) => tool_result::<()>(Err(e)),
        }
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

/// One outcome as itself when the call named `run`, `{runs: [...]}` for `runs`.
fn one_or_many<T>(runs: &Option<Vec<String>>, outcomes: Vec<T>) -> OneOrMany<T> {
    let mut outcomes = outcomes;
    match (runs, outcomes.len()) {
        (None, 1) => OneOrMany::One(outcomes.remove(0)),
        _ => OneOrMany::Many { runs: outcomes },
    }
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

/// An outcome as a tool result: its JSON object as `structuredContent`
/// (and as text), or the JSON error object as a tool error (text only: the
/// output schema describes a success).
pub fn tool_result<T: Serialize>(outcome: Result<T>) -> CallToolResult {
    match outcome.and_then(|value| {
        serde_json::to_value(value)
            .map_err(|e| Error::failed(format!("failed to serialise the outcome: {e}")))
    }) {
        Ok(value) if value.is_object() => CallToolResult::structured(value),
        // Every outcome is an object; anything else is wrapped, not lost.
        Ok(value) => CallToolResult::structured(serde_json::json!({ "value": value })),
        Err(e) => {
            let error = for_mcp(e).to_json();
            CallToolResult::error(vec![ContentBlock::text(error.to_string())])
        }
    }
}

/// An error as MCP shows it: the command line's flags in its message and
/// hint named as request fields, and every usage error with a hint.
fn for_mcp(mut e: Error) -> Error {
    if e.exit() == Exit::Usage && e.hint.is_none() {
        e.hint = Some(usage_hint(e.kind));
    }
    e.message = unflag(&e.message);
    e.hint = e.hint.as_deref().map(unflag);
    e
}

/// The MCP hint for a usage mistake of `kind`.
fn usage_hint(kind: ErrorKind) -> String {
    match kind {
        ErrorKind::MissingTask => "give the task in `task`".to_owned(),
        ErrorKind::TaskTwice => "give `task` or `taskFile`, not both".to_owned(),
        ErrorKind::BadTaskFile => "`taskFile` names a readable file".to_owned(),
        ErrorKind::BadDuration(field) => format!(
            "`{}` takes a duration with its unit (ms, s, m, h, d), largest first, e.g. \"90s\", \"30m\" or \"1h30m\"; \"0\" for none",
            field.name()
        ),
        ErrorKind::BadSpec => "`spec` is {\"mode\": \"parallel\", \"tasks\": [step, ...]} or {\"mode\": \"chain\", \"steps\": [...]}, each step {\"agent\", \"command\": [argv], \"task\"?}".to_owned(),
        ErrorKind::UnknownAgent => "`agent` names an agent definition (the `agents` tool lists them)".to_owned(),
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

/// Cancels the wait when the tool call's future ends, however it ends.
struct CancelOnDrop(Cancel);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// The `wait` tool's work, on its own thread: the wait, then each run's tail.
fn wait_and_tail(
    launcher: &Launcher,
    request: &WaitRequest,
    detail: Detail,
    report: &mut dyn FnMut(WaitEvent<'_>) -> Keep,
) -> Result<Waited> {
    let waited = launcher.wait(request, report)?;
    let tail = request.tail.unwrap_or(WAIT_TAIL_LINES);
    let logs = waited
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
    let runs = waited
        .runs
        .into_iter()
        .map(|run| Summary::of(run, detail))
        .collect();
    Ok(Waited { runs, logs })
}

#[tool_router]
impl Server {
    #[tool(
        description = "Launch a detached background run and return at once with its runId: a named agent (`agent` + `task`; the `agents` tool lists them), any command (`command` argv + optional `task` on its stdin), or a composite `spec` ({\"mode\": \"parallel\", \"tasks\": [step, ...]} or {\"mode\": \"chain\", \"steps\": [...]}, each step {\"agent\", \"command\": [argv], \"task\"?}). `timeout` \"0\" is no deadline. The run outlives this server; collect it with `wait` and `logs`. Errors: LIMIT (3) when the fan-out budget or the session's capacity refuses it (detail: runFanoutRejection/runFanoutBudget or capacity), USAGE (2), FAILED (1)."
    )]
    async fn run(&self, Parameters(args): Parameters<JsonObject>) -> CallToolResult {
        self.with(args, |launcher, mut request: RunRequest| {
            // The user's default deadline (`timeout` in config.toml, or
            // $SUBAGENTS_TIMEOUT) applies to runs an agent starts, as to the CLI's.
            if request.timeout.is_none() {
                request.timeout = std::env::var(DEFAULT_TIMEOUT_ENV)
                    .ok()
                    .filter(|v| !v.is_empty());
            }
            let launched = launcher.run(&request)?;
            reap_monitor(launcher, &launched.run_id);
            Ok(launched)
        })
        .await
    }

    #[tool(
        description = "One run's summary: compact by default (id, label, state, step, timings, exit codes and errors, output paths); `detail: \"full\"` gives every field (identities, fan-out budget, process-terminal proof), as `subagents status --json`. Errors: NOT_FOUND (4) for an unknown or ambiguous id."
    )]
    async fn status(&self, Parameters(args): Parameters<JsonObject>) -> CallToolResult {
        self.detailed(args, |launcher, request: RunRef, detail| {
            Ok(Summary::of(launcher.status(&request.run)?.run, detail))
        })
        .await
    }

    #[tool(
        description = "List runs as {runs: [run summaries]}: active ones, or every run with `all` (at most 100 unless `limit` says otherwise). Summaries are compact unless `detail: \"full\"`."
    )]
    async fn list(&self, Parameters(args): Parameters<JsonObject>) -> CallToolResult {
        self.detailed(args, |launcher, mut query: ListQuery, detail| {
            query.limit = Some(query.limit.unwrap_or(DEFAULT_LIST_LIMIT));
            let listed = launcher.list(&query)?;
            let runs = listed.runs.into_iter().map(|run| Summary::of(run, detail));
            let rows = runs
                .map(ListRow::Run)
                .chain(listed.unreadable.into_iter().map(ListRow::Unreadable))
                .collect();
            Ok(Runs {
                runs: rows,
                warnings: listed.warnings,
            })
        })
        .await
    }

    #[tool(
        description = "Block until every named run (`runs`: ids, prefixes or `last`; none: every active run of this server's session) is over, then return {runs: [final summaries], logs: [the last `tail` (default 20) lines of each run's output]}. Gives up after `timeout` (default 50s; \"0\" waits without a deadline) with error TIMEOUT (124): call it again to keep waiting; the runs go on. Sends progress notifications while it blocks when the request carries a progress token; a cancelled call stops at once."
    )]
    async fn wait(
        &self,
        Parameters(mut args): Parameters<JsonObject>,
        context: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let request = take_detail(&mut args).and_then(|detail| Ok((detail, parse(args)?)));
        let (detail, mut request): (Detail, WaitRequest) = match request {
            Ok(parsed) => parsed,
            Err(e) => return tool_result::<()>(Err(e)),
        };
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
        // The wait blocks a thread of its own, which a cancelled call (or
        // this future dropped) wakes and ends at once, with every thread the
        // wait started: nothing lingers until the runs end.
        let cancel = request.cancel.clone();
        let _cancel_on_drop = CancelOnDrop(cancel.clone());
        let (done, outcome) = tokio::sync::oneshot::channel();
        let launcher = self.launcher.clone();
        let spawned = std::thread::Builder::new()
            .name("mcp-wait".into())
            .spawn(move || {
                let mut last: Option<Duration> = None;
                let mut settled = 0usize;
                let mut report = |event: WaitEvent<'_>| {
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
                let _ = done.send(wait_and_tail(&launcher, &request, detail, &mut report));
            });
        if let Err(e) = spawned {
            return tool_result::<()>(Err(Error::failed(format!("failed to start the wait: {e}"))));
        }
        let result = tokio::select! {
            waited = outcome => waited.unwrap_or_else(|_| Err(Error::failed("failed to wait: the wait ended without an outcome"))),
            () = context.ct.cancelled() => {
                cancel.cancel();
                Err(Error::of(ErrorKind::WaitCancelled, "failed to wait: the wait was cancelled"))
            }
        };
        if let Some(forward) = forwarding {
            // The sender is gone with the thread: the forwarder drains and ends.
            let _ = forward.await;
        }
        tool_result(result)
    }

    #[tool(
        description = "Stop a run (`run`) or several (`runs`): each one's runner and every process group of its commands; returns the final summary, or with `runs` {runs: [summaries]} (a run already over is left as it is). `last` names the newest run of this server's session. Summaries are compact unless `detail: \"full\"`."
    )]
    async fn stop(&self, Parameters(args): Parameters<JsonObject>) -> CallToolResult {
        self.detailed(args, |launcher, request: StopArgs, detail| {
            let runs = names(&request.run, &request.runs)?;
            let stop = |run: &String| {
                let one = StopRequest {
                    run: run.clone(),
                    reason: request.reason.clone(),
                };
                launcher.stop(&one).map(|o| Summary::of(o.run, detail))
            };
            Ok(one_or_many(&request.runs, each(&runs, stop)?))
        })
        .await
    }

    #[tool(
        description = "Revive a finished (complete, failed or stopped) single run with a follow-up `task`: same agent, same contract; a named agent's run continues its CLI's own session. Returns the new run (runId, ..., sourceRunId). Errors: LIMIT (3) when the session's capacity refuses it, NOT_FOUND (4), FAILED (1) when the run cannot be resumed."
    )]
    async fn resume(&self, Parameters(args): Parameters<JsonObject>) -> CallToolResult {
        self.with(args, |launcher, request: ResumeRequest| {
            let resumed = launcher.resume(&request)?;
            reap_monitor(launcher, &resumed.launched.run_id);
            Ok(resumed)
        })
        .await
    }

    #[tool(
        description = "A run's output: {runId, state, logs: [{name, path, text}]} with the last `tail` lines (default 200, at most 5000; at most 64 KiB) of each file: the output of a finished run, else the command's stdout, and its stderr. `step` picks one step of a composite run, `stderr` only stderr."
    )]
    async fn logs(&self, Parameters(args): Parameters<JsonObject>) -> CallToolResult {
        self.with(args, |launcher, request: LogsRequest| {
            launcher.logs(&bounded(request, LOGS_TAIL_LINES))
        })
        .await
    }

    #[tool(
        description = "The run fan-out budget: with `run`, that run's {used, limit, remaining}; without, the report of what a launch from this server gets (newRootRun limit and its source, the inherited budget when the server runs inside a run)."
    )]
    async fn budget(&self, Parameters(args): Parameters<JsonObject>) -> CallToolResult {
        self.with(args, |launcher, query: BudgetQuery| launcher.budget(&query))
            .await
    }

    #[tool(
        description = "The active-run capacity of a session (default: this server's): {session, used, limit (0 = unlimited), slots: [{slot, release, observer?}]}."
    )]
    async fn capacity(&self, Parameters(args): Parameters<JsonObject>) -> CallToolResult {
        self.with(args, |launcher, query: CapacityQuery| {
            launcher.capacity(&query)
        })
        .await
    }

    #[tool(
        description = "Create a run fan-out budget for root run `rootRunId` with `limit` slots (else the configured default); returns its descriptor {version, rootRunId, directory, limit}, as `subagents budget create`."
    )]
    async fn budget_create(&self, Parameters(args): Parameters<JsonObject>) -> CallToolResult {
        self.with(args, |launcher, request: BudgetCreateRequest| {
            launcher.budget_create(&request)
        })
        .await
    }

    #[tool(
        description = "Claim one fan-out slot per `paths` entry, all or nothing, from the budget of `descriptor` (else the one this server inherited); returns {used, limit, remaining}. Errors: LIMIT (3) over the limit, with the rejection."
    )]
    async fn budget_claim(&self, Parameters(args): Parameters<JsonObject>) -> CallToolResult {
        self.with(args, |launcher, request: BudgetClaimRequest| {
            launcher.budget_claim(&request)
        })
        .await
    }

    #[tool(
        description = "Repair stale runs (runner and monitor gone) and finalize what the evidence allows: {repaired: [{runId, message}], observed: [{runId, message}], unreadable: [...], warnings?}, as `subagents reconcile --json`."
    )]
    async fn reconcile(&self, Parameters(args): Parameters<JsonObject>) -> CallToolResult {
        self.with(args, |launcher, request: ReconcileRequest| {
            launcher.reconcile(&request)
        })
        .await
    }

    #[tool(
        description = "Hide a finished run (`run`) or several (`runs`) from `list` without touching its processes: {runId, displayDismissedAt}, or with `runs` {runs: [...]}. An active run is refused (FAILED, 1) unless `force`."
    )]
    async fn dismiss(&self, Parameters(args): Parameters<JsonObject>) -> CallToolResult {
        self.with(args, |launcher, request: DismissArgs| {
            let runs = names(&request.run, &request.runs)?;
            let dismiss = |run: &String| {
                let one = DismissRequest {
                    run: run.clone(),
                    force: request.force,
                };
                launcher.dismiss(&one)
            };
            Ok(one_or_many(&request.runs, each(&runs, dismiss)?))
        })
        .await
    }

    #[tool(
        description = "Delete finished runs older than `olderThan` (default 7d) with the budgets, leases and capacity slots only they use; `dryRun` only says what would go. Returns {dryRun, olderThanMs, pruned: [{runId, state, endedAt}], kept: [{runId, reason}], budgets, leases, capacitySlots}."
    )]
    async fn prune(&self, Parameters(args): Parameters<JsonObject>) -> CallToolResult {
        self.with(args, |launcher, request: PruneRequest| {
            launcher.prune(&request)
        })
        .await
    }

    #[tool(
        description = "Validate one on-disk artifact `file` as `kind` exactly as the readers read it: {valid, error}; an invalid file is a result, not a tool error."
    )]
    async fn validate(&self, Parameters(args): Parameters<JsonObject>) -> CallToolResult {
        self.with(args, |launcher, request: ValidateRequest| {
            launcher.validate(&request)
        })
        .await
    }

    #[tool(
        description = "The agents a run can delegate to (`agent` of `run`), from this server's directory and the user's: `list` (default) {agents: [{name, description, runner, ...}], errors}, `show` with `name` (the agent, systemPrompt, the rendered argv and env), or `prompt` {snippet} for CLAUDE.md / AGENTS.md."
    )]
    async fn agents(&self, Parameters(args): Parameters<JsonObject>) -> CallToolResult {
        self.with(args, |launcher, request: AgentsRequest| {
            launcher.agents(&request)
        })
        .await
    }

    #[tool(
        description = "The config file this server read and each setting's value and source: {path, exists, keys: [{key, variable, value, source}]}."
    )]
    async fn config(&self, Parameters(args): Parameters<JsonObject>) -> CallToolResult {
        self.with(args, |launcher, request: ConfigRequest| {
            launcher.config(&request)
        })
        .await
    }
}

// The router `new` annotated, not a fresh one (the macro's default).
#[tool_handler(router = self.tool_router)]
impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("subagents", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Durable background runs (subagents). `run` starts a detached run and returns its runId at once; start several to work in parallel (`agents` lists the named agents to delegate to). `wait` blocks (up to its timeout) until runs are over and returns their summaries and output tails; `logs` reads a run's output; `status`/`list` show runs (compact; `detail: \"full\"` for everything); `stop` ends one; `resume` continues a finished run with a follow-up task. Runs outlive this server. Errors carry error.code and error.exitCode: LIMIT (3) = fan-out budget or capacity refused (nothing started), NOT_FOUND (4), TIMEOUT (124) = wait gave up (the runs go on), USAGE (2), FAILED (1).",
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
