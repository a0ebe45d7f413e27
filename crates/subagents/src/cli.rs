//! The command line: its definitions (the contract summarised in the
//! README), the conversion of its arguments into the API's requests, and
//! the dispatch to `commands`, which prints the outcomes. The only module
//! that knows clap.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::commands;
use launcher::api::{
    AgentsRequest, BudgetClaimRequest, BudgetCreateRequest, BudgetQuery, DismissRequest, ListQuery,
    ListSort, LogsRequest, PruneRequest, ResumeRequest, RunRequest, Settings, StopRequest,
    ValidateRequest, WaitRequest,
};
use launcher::error::{self, Result};
use launcher::service::Launcher;

/// Durable background runs of AI agent CLIs.
#[derive(Debug, Parser)]
#[command(name = "subagents", version, about, propagate_version = true)]
pub struct Cli {
    /// State root (else $SUBAGENTS_ROOT, $XDG_STATE_HOME/subagents, ~/.local/state/subagents).
    #[arg(long, global = true, value_name = "DIR")]
    pub root: Option<PathBuf>,
    /// Trust a state root (or state directories and files in it) that other
    /// users own or can write to (also $SUBAGENTS_ALLOW_SHARED_ROOT=1).
    /// Without it such a root is refused: another user could plant files in it.
    #[arg(long, global = true)]
    pub allow_shared_root: bool,
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// Every command.
// Parsed once per process: the size of `run`'s arguments costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Launch a detached background run of COMMAND.
    Run(RunArgs),
    /// Show one run.
    Status {
        /// Run id, unique prefix or `last` (the newest run of this session).
        #[arg(add = run_ids())]
        run: String,
        /// Print the run summary as JSON.
        #[arg(long)]
        json: bool,
    },
    /// List active runs (or every run with --all).
    List(ListArgs),
    /// Block until every named run is over (no run named: every active run
    /// of this session). Exit 0 when every run completed, else the worst.
    Wait {
        /// Run ids, unique prefixes or `last` (none: the session's active runs).
        #[arg(add = run_ids())]
        runs: Vec<String>,
        /// Give up after this long (e.g. 90s, 30m, 1h30m; 0 for never); exit 124.
        #[arg(long, value_name = "DURATION")]
        timeout: Option<String>,
        /// Print the final summaries as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Stop runs: each one's runner and every child process group.
    Stop {
        /// Run ids, unique prefixes or `last`.
        #[arg(required = true, add = run_ids())]
        runs: Vec<String>,
        /// Why (kept in status.json).
        #[arg(long, default_value = "Subagent stopped by user.")]
        reason: String,
        /// Print the final summary as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show a run's output and logs.
    Logs {
        /// Run id, unique prefix or `last`.
        #[arg(add = run_ids())]
        run: String,
        /// Keep printing new output until the run is over, then exit as `wait`.
        #[arg(long, short)]
        follow: bool,
        /// Print {runId, state, logs: [{name, path, text}]} as JSON (not with --follow).
        #[arg(long, conflicts_with = "follow")]
        json: bool,
        /// Only step N of a composite run (numbered as `status` shows them).
        #[arg(long, value_name = "N")]
        step: Option<usize>,
        /// Only the last N lines of each file.
        #[arg(long, value_name = "N", conflicts_with = "follow")]
        tail: Option<usize>,
        /// Only COMMAND's stderr.
        #[arg(long)]
        stderr: bool,
    },
    /// Repair stale runs and finalize what the evidence allows.
    Reconcile {
        /// Print what was repaired as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Hide finished runs from `list` without touching their processes.
    Dismiss {
        /// Run ids, unique prefixes or `last`.
        #[arg(required = true, add = run_ids())]
        runs: Vec<String>,
        /// Hide it even while it is still active.
        #[arg(long)]
        force: bool,
        /// Print {runId, displayDismissedAt} as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Revive a finished run with a follow-up task (same agent, same contract);
    /// a named agent's run continues its CLI's own session.
    Resume(ResumeArgs),
    /// Named agent definitions: list them, show one, or print a snippet for CLAUDE.md / AGENTS.md.
    Agents {
        /// What to do (default: list).
        #[command(subcommand)]
        action: Option<AgentsAction>,
        /// Print JSON (list, show; prompt: {snippet}).
        #[arg(long, global = true)]
        json: bool,
    },
    /// Validate one on-disk artifact exactly as the readers do.
    Validate {
        /// The artifact kind.
        #[arg(long, value_enum)]
        kind: KindArg,
        /// The file.
        file: PathBuf,
        /// Print {"valid", "error"} as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Run fan-out budget: with no subcommand, the report of `budget doctor`.
    #[command(args_conflicts_with_subcommands = true)]
    Budget {
        /// The report's options (no subcommand).
        #[command(flatten)]
        doctor: DoctorArgs,
        /// What to do.
        #[command(subcommand)]
        action: Option<BudgetAction>,
    },
    /// Show the active-run capacity of a session.
    Capacity {
        /// The session (else $SUBAGENTS_SESSION_ID, else the terminal).
        #[arg(long, env = "SUBAGENTS_SESSION_ID")]
        session: Option<String>,
        /// The limit to report against (else $SUBAGENTS_MAX_ACTIVE).
        #[arg(long, env = "SUBAGENTS_MAX_ACTIVE")]
        limit: Option<u32>,
        /// Print the snapshot as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete finished runs older than a cutoff, with the budgets, leases,
    /// index entries and capacity slots only they use. A run whose exit was
    /// not observed is kept (the reason is printed).
    Prune {
        /// How old a run's end must be (e.g. 7d, 1d12h, 30m).
        #[arg(long, value_name = "DURATION", default_value = launcher::prune::DEFAULT_AGE)]
        older_than: Option<String>,
        /// Only say what would be deleted.
        #[arg(long)]
        dry_run: bool,
        /// Print {dryRun, olderThanMs, pruned, kept, budgets, leases, capacitySlots} as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show the config file ($XDG_CONFIG_HOME/subagents/config.toml) and
    /// each setting's value and source (flag > environment > file > default).
    Config {
        /// Print {path, exists, keys: [{key, variable, value, source}]} as JSON.
        #[arg(long)]
        json: bool,
    },
    /// A live view of the active runs: steps, elapsed time, fan-out and
    /// capacity per session, the selected run's output; `s` stops a run.
    #[cfg(feature = "top")]
    Top,
    /// Print a shell's completion script: flags, subcommands, run ids
    /// (active first) and agent names, asked of this binary at each Tab
    /// (bash: `source <(subagents completions bash)`).
    Completions {
        /// bash, zsh or fish (also elvish, powershell).
        shell: clap_complete::Shell,
    },
    /// Serve the launcher's API to an agent as an MCP server on stdio
    /// (a tool per operation: run, status, list, wait, stop, resume, logs,
    /// reconcile, dismiss, prune, budget, capacity, validate, agents, config).
    #[cfg(feature = "mcp")]
    Mcp(McpArgs),
}

/// `subagents run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Without COMMAND: the named agent to run (see `subagents agents list`).
    /// With COMMAND: the label shown in status (default: COMMAND's file name).
    #[arg(long, add = agent_names())]
    pub agent: Option<String>,
    /// The task prompt (written to task.md, stdin and $SUBAGENTS_TASK_FILE).
    #[arg(long, conflicts_with = "task_file")]
    pub task: Option<String>,
    /// Read the task prompt from FILE (`-` for stdin). Without --task or
    /// --task-file, a pipe on stdin is the task.
    #[arg(long, value_name = "FILE")]
    pub task_file: Option<PathBuf>,
    /// Working directory of COMMAND.
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<PathBuf>,
    /// Wall-clock deadline (e.g. 90s, 30m, 1h30m, 1d; 0 for none). Default 30m.
    #[arg(long, env = "SUBAGENTS_TIMEOUT", value_name = "DURATION")]
    pub timeout: Option<String>,
    /// End a step that prints nothing for this long (e.g. 2m; 0 for none).
    /// Default: the agent's idleTimeout, else $SUBAGENTS_IDLE_TIMEOUT.
    #[arg(long, value_name = "DURATION")]
    pub idle_timeout: Option<String>,
    /// Explicit run id (refused if it exists or is not a safe file name).
    #[arg(long)]
    pub id: Option<String>,
    /// A label for the run in `list`, `status` and `top` (1 to 64 characters).
    #[arg(long, value_name = "LABEL")]
    pub name: Option<String>,
    /// Owner session (else $SUBAGENTS_SESSION_ID, else the terminal).
    #[arg(long, env = "SUBAGENTS_SESSION_ID")]
    pub session: Option<String>,
    /// At most N active background runs per session (0 = no limit); runs started inside a run take no slot.
    #[arg(long, env = "SUBAGENTS_MAX_ACTIVE", value_name = "N")]
    pub max_active: Option<u32>,
    /// The session's directory, recorded as `sessionRoot` (else $SUBAGENTS_SESSION_DIR).
    #[arg(long, env = "SUBAGENTS_SESSION_DIR", value_name = "DIR")]
    pub session_dir: Option<PathBuf>,
    /// Print {runId, asyncDir, pid, runnerProcessInstanceId} as JSON.
    #[arg(long)]
    pub json: bool,
    /// Block until the run is over and exit with its result.
    #[arg(long)]
    pub wait: bool,
    /// Over --max-active, wait in the session's queue for a slot (first in,
    /// first out) instead of being refused (default: the spec's `queue`,
    /// else $SUBAGENTS_QUEUE / the `queue` config key).
    #[arg(long, overrides_with = "no_queue")]
    pub queue: bool,
    /// Refuse the launch over --max-active (exit 3), whatever the default.
    #[arg(long, overrides_with = "queue")]
    pub no_queue: bool,
    /// A composite run from a JSON spec file (see README: parallel, chain).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["agent", "task", "task_file"])]
    pub spec: Option<PathBuf>,
    /// Run fan-out budget of a new root run, 1..=1000000 (else $SUBAGENTS_MAX_SPAWNS_PER_RUN, else 64); ignored inside a run.
    #[arg(long, value_name = "N", value_parser = fanout_limit_parser())]
    pub fanout_limit: Option<u64>,
    /// Where the run executes: `local` or `slurm` (one batch job on a cluster
    /// that shares the state root; docs/cluster.md). Default: $SUBAGENTS_EXECUTOR
    /// (config key `executor`), else the agent's, else local.
    #[arg(long, value_name = "EXECUTOR", value_parser = ["local", "slurm"])]
    pub executor: Option<String>,
    /// The Slurm partition (with --executor slurm).
    #[arg(long, value_name = "PARTITION")]
    pub slurm_partition: Option<String>,
    /// An extra sbatch option as --name=value (with --executor slurm; repeatable).
    #[arg(long = "slurm-arg", value_name = "OPTION", allow_hyphen_values = true)]
    pub slurm_args: Vec<String>,
    /// The command and its arguments; `{task_file}` is replaced by the task file path.
    #[arg(
        last = true,
        required_unless_present_any = ["spec", "agent"],
        conflicts_with = "spec",
        value_name = "COMMAND"
    )]
    pub command: Vec<String>,
}

/// `subagents list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Every run, not only active ones.
    #[arg(long)]
    pub all: bool,
    /// Only the runs hidden with `dismiss` (with --all).
    #[arg(long, requires = "all")]
    pub dismissed: bool,
    /// Only runs of this session.
    #[arg(long)]
    pub session: Option<String>,
    /// At most N runs.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Print an array of run summaries as JSON.
    #[arg(long)]
    pub json: bool,
    /// The detailed listing (steps, fan-out, errors, output), the default
    /// when stdout is not a terminal.
    #[arg(long, conflicts_with = "short")]
    pub long: bool,
    /// One line per run, the default on a terminal.
    #[arg(long)]
    pub short: bool,
    /// Colour the table: auto (a terminal without $NO_COLOR), always, never.
    #[arg(long, value_enum, env = "SUBAGENTS_COLOR", default_value_t = ColorArg::Auto)]
    pub color: ColorArg,
    /// Order: by state then last update (default: running, queued, failed
    /// and stopped, complete, each newest first), or newest start first.
    #[arg(long, value_enum)]
    pub sort: Option<SortKey>,
}

/// `list --sort`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SortKey {
    /// Newest start first.
    Started,
}

fn fanout_limit_parser() -> clap::builder::RangedU64ValueParser<u64> {
    clap::value_parser!(u64).range(1..=launcher::process::MAX_FANOUT_LIMIT)
}

/// `subagents budget [doctor]`.
#[derive(Debug, Clone, Default, Args)]
pub struct DoctorArgs {
    /// Report the limit as if `run --fanout-limit N` were given.
    #[arg(long, value_name = "N", value_parser = fanout_limit_parser())]
    pub fanout_limit: Option<u64>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// `subagents budget ...`.
#[derive(Debug, Subcommand)]
pub enum BudgetAction {
    /// The limit a new root run gets and from where, the inherited budget
    /// inside a run, and how claims are counted (also `budget` alone).
    Doctor(DoctorArgs),
    /// Create a budget; prints its descriptor JSON.
    Create {
        /// Root run id recorded in the manifest.
        #[arg(long)]
        root_run_id: String,
        /// The limit (else $SUBAGENTS_MAX_SPAWNS_PER_RUN, else 64).
        #[arg(long)]
        limit: Option<u64>,
        /// Errors as JSON too (the descriptor is always JSON).
        #[arg(long)]
        json: bool,
    },
    /// Show {used, limit, remaining} of a run's budget or of a descriptor file.
    Show {
        /// Run id or unique prefix.
        #[arg(required_unless_present = "descriptor", conflicts_with = "descriptor", add = run_ids())]
        run: Option<String>,
        /// A descriptor JSON file.
        #[arg(long, value_name = "FILE")]
        descriptor: Option<PathBuf>,
        /// Errors as JSON too (the snapshot is always JSON).
        #[arg(long)]
        json: bool,
    },
    /// Claim slots all-or-nothing; exit 3 over the limit.
    Claim {
        /// A descriptor JSON file (else the inherited $SUBAGENTS_RUN_FANOUT_BUDGET).
        #[arg(long, value_name = "FILE")]
        descriptor: Option<PathBuf>,
        /// Claim path (repeat for a batch).
        #[arg(long = "path", value_name = "LABEL", required = true)]
        paths: Vec<String>,
        /// Print the snapshot or the rejection as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `subagents agents ...`.
#[derive(Debug, Subcommand)]
pub enum AgentsAction {
    /// Every agent found (project first, then the user's), and every file that could not be read.
    List,
    /// One agent: its file and the command a run renders from it.
    Show {
        /// The agent's name.
        #[arg(add = agent_names())]
        name: String,
    },
    /// A snippet for CLAUDE.md / AGENTS.md that lets an agent delegate through `subagents`.
    Prompt,
}

/// `subagents resume`.
#[derive(Debug, Args)]
pub struct ResumeArgs {
    /// The run to revive (id, unique prefix or `last`).
    #[arg(add = run_ids())]
    pub run: String,
    /// The follow-up task, handed to the agent as given.
    #[arg(long, conflicts_with = "task_file")]
    pub task: Option<String>,
    /// Read the follow-up task from FILE.
    #[arg(long, value_name = "FILE")]
    pub task_file: Option<PathBuf>,
    /// Wall-clock deadline of the revival (else the source's).
    #[arg(long, value_name = "DURATION")]
    pub timeout: Option<String>,
    /// At most N active background runs per session (0 = no limit).
    #[arg(long, env = "SUBAGENTS_MAX_ACTIVE", value_name = "N")]
    pub max_active: Option<u32>,
    /// Block until the revival is over and exit as `wait` does.
    #[arg(long)]
    pub wait: bool,
    /// Print {runId, asyncDir, pid, runnerProcessInstanceId, sourceRunId} as JSON.
    #[arg(long)]
    pub json: bool,
}

#[cfg(feature = "mcp")]
/// `subagents mcp`: the launch settings of every run the server starts
/// (an agent's tool call cannot change them).
#[derive(Debug, Args)]
pub struct McpArgs {
    /// Owner session of the runs it starts (else $SUBAGENTS_SESSION_ID, else `default`).
    #[arg(long, env = "SUBAGENTS_SESSION_ID")]
    pub session: Option<String>,
    /// At most N active background runs per session (0 = no limit).
    #[arg(long, env = "SUBAGENTS_MAX_ACTIVE", value_name = "N")]
    pub max_active: Option<u32>,
    /// The session's directory, recorded as `sessionRoot` (else $SUBAGENTS_SESSION_DIR).
    #[arg(long, env = "SUBAGENTS_SESSION_DIR", value_name = "DIR")]
    pub session_dir: Option<PathBuf>,
    /// Fan-out budget of each new root run (else $SUBAGENTS_MAX_SPAWNS_PER_RUN, else 64); inside a run the inherited budget applies.
    #[arg(long, value_name = "N", value_parser = fanout_limit_parser())]
    pub fanout_limit: Option<u64>,
}

/// `list --color`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ColorArg {
    /// On a terminal, unless `$NO_COLOR` is set.
    Auto,
    /// Always (even with `$NO_COLOR`: the flag is the more specific choice).
    Always,
    /// Never.
    Never,
}

impl From<ColorArg> for crate::table::ColorChoice {
    fn from(c: ColorArg) -> Self {
        match c {
            ColorArg::Auto => Self::Auto,
            ColorArg::Always => Self::Always,
            ColorArg::Never => Self::Never,
        }
    }
}

/// `validate --kind`: the artifact kinds of [`launcher::validate::Kind`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KindArg(pub launcher::validate::Kind);

impl ValueEnum for KindArg {
    fn value_variants<'a>() -> &'a [Self] {
        use launcher::validate::Kind;
        const ALL: [KindArg; 9] = [
            KindArg(Kind::ALL[0]),
            KindArg(Kind::ALL[1]),
            KindArg(Kind::ALL[2]),
            KindArg(Kind::ALL[3]),
            KindArg(Kind::ALL[4]),
            KindArg(Kind::ALL[5]),
            KindArg(Kind::ALL[6]),
            KindArg(Kind::ALL[7]),
            KindArg(Kind::ALL[8]),
        ];
        &ALL
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(self.0.name()).help(kind_help(self.0)))
    }
}

fn kind_help(kind: launcher::validate::Kind) -> &'static str {
    use launcher::validate::Kind;
    match kind {
        Kind::Recovery => "`recovery-descriptor.json` (strict v1 rules + the live fan-out budget)",
        Kind::LaunchContract => {
            "`launch-contract.json` (strict; the digest is checked by `resume`)"
        }
        Kind::FanoutDescriptor => {
            "`run-fanout-budget.json` or any fan-out descriptor (checked against its manifest)"
        }
        Kind::FanoutManifest => "A budget's `manifest.json`",
        Kind::ProcessTerminal => "`process-terminal.json`",
        Kind::TerminalCandidate => "`process-terminal-candidate.json`",
        Kind::Status => "`status.json`",
        Kind::Startup => {
            "`runner-startup.json`, `runner-startup-ack.json` or `runner-startup-proceed.json`"
        }
        Kind::CapacityOwner => "A capacity slot's `owner.json`",
    }
}

impl RunArgs {
    /// The API request of these arguments. A piped stdin (or `--task-file -`)
    /// is read here: the API never reads stdin.
    pub fn request(&self) -> Result<RunRequest> {
        let mut task = self.task.clone();
        let mut task_file = self.task_file.clone();
        let from_stdin = self.spec.is_none()
            && (task_file.as_deref() == Some(std::path::Path::new("-"))
                || (task.is_none() && task_file.is_none() && stdin_is_pipe()));
        if from_stdin {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut text).map_err(|e| {
                error::Error::failed(format!("failed to read the task from stdin: {e}"))
            })?;
            task = Some(text);
            task_file = None;
        }
        Ok(RunRequest {
            agent: self.agent.clone(),
            task,
            task_file,
            cwd: self.cwd.clone(),
            timeout: self.timeout.clone(),
            idle_timeout: self.idle_timeout.clone(),
            id: self.id.clone(),
            name: self.name.clone(),
            spec: None,
            spec_file: self.spec.clone(),
            command: self.command.clone(),
            executor: self
                .executor
                .as_deref()
                .and_then(launcher::executor::ExecutorKind::parse),
            slurm_partition: self.slurm_partition.clone(),
            slurm_args: self.slurm_args.clone(),
            queue: match (self.queue, self.no_queue) {
                (true, _) => Some(true),
                (_, true) => Some(false),
                _ => None,
            },
        })
    }

    /// The launch settings of these arguments.
    pub fn settings(&self) -> Settings {
        Settings {
            session: self.session.clone(),
            max_active: self.max_active,
            session_dir: self.session_dir.clone(),
            fanout_limit: self.fanout_limit,
        }
    }
}

/// `echo task | subagents run -- agent`: a pipe on stdin is the task. Not
/// inside a run, where stdin may be a tool's pipe that never closes.
fn stdin_is_pipe() -> bool {
    use std::os::unix::fs::FileTypeExt;
    !launcher::fanout::is_nested()
        && std::fs::metadata("/proc/self/fd/0").is_ok_and(|m| m.file_type().is_fifo())
}

impl ListArgs {
    /// The API query of these arguments.
    pub fn query(&self) -> ListQuery {
        ListQuery {
            all: self.all,
            dismissed: self.dismissed,
            session: self.session.clone(),
            limit: self.limit,
            sort: self.sort.map(|SortKey::Started| ListSort::Started),
        }
    }
}

impl ResumeArgs {
    /// The API request of these arguments.
    pub fn request(&self) -> ResumeRequest {
        ResumeRequest {
            run: self.run.clone(),
            task: self.task.clone(),
            task_file: self.task_file.clone(),
            timeout: self.timeout.clone(),
        }
    }
}

#[cfg(feature = "mcp")]
impl McpArgs {
    /// The launch settings of the server.
    pub fn settings(&self) -> Settings {
        Settings {
            session: self.session.clone(),
            max_active: self.max_active,
            session_dir: self.session_dir.clone(),
            fanout_limit: self.fanout_limit,
        }
    }
}

/// True for the commands that start runs (they take part in fault injection).
fn launches_runs(command: &Command) -> bool {
    match command {
        Command::Run(_) | Command::Resume(_) => true,
        #[cfg(feature = "mcp")]
        Command::Mcp(_) => true,
        _ => false,
    }
}

/// Parses the command line, runs the command, prints errors; returns the exit code.
pub fn main() -> i32 {
    if let Some(code) = internal_process() {
        return code;
    }
    let config_warning = match launcher::settings::apply() {
        Ok(warning) => warning,
        Err(e) => {
            eprintln!("subagents: {}", launcher::escape(&e.message));
            return e.exit().code();
        }
    };
    // A shell asking for candidates (the script of `completions` sets
    // the variable): answer and exit before anything else reads the root.
    clap_complete::CompleteEnv::with_factory(<Cli as clap::CommandFactory>::command)
        .var(COMPLETE_VAR)
        .complete();
    let parsed = Cli::try_parse();
    // `config` needs the file and reports its error itself.
    if let Some(warning) = config_warning
        && !matches!(
            &parsed,
            Ok(Cli {
                command: Command::Config { .. },
                ..
            })
        )
    {
        eprintln!("subagents: warning: {}", launcher::escape(&warning));
    }
    let cli = match parsed {
        Ok(cli) => cli,
        Err(e) => return usage_error(&e),
    };
    // `subagents list | head` should end quietly, like any Unix filter.
    // (A run's monitor and runner, started by `internal_process`, keep
    // ignoring SIGPIPE: a vanished launcher must not kill them.)
    // SAFETY: restoring a default signal disposition has no memory effects.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    if launches_runs(&cli.command) {
        launcher::process::init_launcher_faults();
    }
    // `run` and `resume` launch from this process's only thread: their
    // monitors are forked without `exec`. The MCP server launches from
    // many threads and keeps `exec`.
    if matches!(cli.command, Command::Run(_) | Command::Resume(_)) {
        launcher::process::allow_fork();
    }
    let json = wants_json(&cli.command);
    match dispatch(cli) {
        Ok(()) => 0,
        Err(e) => report(with_usage_hint(e), json),
    }
}

/// Prints an error (the JSON error object on stdout too with `--json`);
/// returns its exit code, the one the error's kind maps to.
fn report(e: error::Error, json: bool) -> i32 {
    if !e.quiet {
        if json {
            commands::print_json(&e.to_json());
        }
        // One line per message, whatever ids or paths it quotes.
        eprintln!("subagents: {}", launcher::escape(&e.message));
        for note in &e.notes {
            eprintln!("  {}", launcher::escape(note));
        }
        if let Some(hint) = &e.hint {
            eprintln!("  hint: {}", launcher::escape(hint));
        }
    }
    e.exit().code()
}

/// Every usage error leaves with a hint: the library names the field at
/// fault, and this edge words it as the command line's flags.
fn with_usage_hint(mut e: error::Error) -> error::Error {
    if e.exit() == error::Exit::Usage && e.hint.is_none() {
        e.hint = Some(usage_hint(e.kind, &command_words(std::env::args().skip(1))));
    }
    e
}

/// The settings of a command that names runs: its session (for `last` and
/// `wait` without ids) is `$SUBAGENTS_SESSION_ID`, else the terminal, as a
/// launch's.
fn caller() -> Settings {
    Settings {
        session: std::env::var("SUBAGENTS_SESSION_ID")
            .ok()
            .filter(|s| !s.is_empty()),
        ..Settings::default()
    }
}

/// The command line's hint for a usage mistake of `kind` in `command`.
fn usage_hint(kind: error::ErrorKind, command: &str) -> String {
    use error::ErrorKind;
    let help = format!("see `subagents {command}--help`");
    match kind {
        ErrorKind::MissingTask if command.starts_with("resume") => {
            "give the follow-up task with --task TEXT or --task-file FILE".to_owned()
        }
        ErrorKind::MissingTask => {
            "give the task with --task TEXT, --task-file FILE or on stdin".to_owned()
        }
        ErrorKind::TaskTwice => "give --task or --task-file, not both".to_owned(),
        ErrorKind::BadTaskFile => "--task-file names a readable file (or - for stdin)".to_owned(),
        ErrorKind::BadDuration(field) => format!(
            "{} takes a duration with its unit (ms, s, m, h, d), largest first, e.g. 90s, 30m or 1h30m{}",
            field.flag(),
            if field == error::DurationField::Timeout {
                "; 0 is no deadline"
            } else {
                ""
            }
        ),
        ErrorKind::BadSpec => format!(
            "a spec is {{\"mode\": \"parallel\", \"tasks\": [step, ...]}} or {{\"mode\": \"chain\", \"steps\": [...]}}; {help}"
        ),
        ErrorKind::UnknownAgent => "`subagents agents list` shows the agents".to_owned(),
        ErrorKind::UnsafeId => {
            "--id takes letters, digits, '-', '_' and '.', not starting with '.'".to_owned()
        }
        ErrorKind::BadName => {
            "--name takes 1 to 64 characters, none a control character".to_owned()
        }
        ErrorKind::NoSuchStep => {
            "--step counts from 1; `subagents status RUN` shows the steps".to_owned()
        }
        _ => help,
    }
}

/// The subcommand words of the command line (`run `, `budget claim `, or
/// nothing), each followed by a space, for a `subagents <command> --help` hint.
fn command_words(args: impl Iterator<Item = String>) -> String {
    use clap::CommandFactory;
    let mut command = Cli::command();
    let mut words = String::new();
    // Global flags may come first (`--root DIR run ...`); a flag's value
    // that happens to be a subcommand name is rare enough to ignore.
    for arg in args.take_while(|a| a != "--") {
        let Some(sub) = command.find_subcommand(&arg).cloned() else {
            continue;
        };
        words.push_str(sub.get_name());
        words.push(' ');
        command = sub;
    }
    words
}

/// Runs a run's monitor or runner when this process is one (`__monitor` /
/// `__runner` as the first argument); `None` for every user command.
///
/// They skip clap and the config file: building the parser for every
/// subcommand touches pages of the binary that two processes per run would
/// otherwise keep resident for the whole run.
fn internal_process() -> Option<i32> {
    let first = std::env::args_os().nth(1)?;
    let main: fn() -> i32 = if first == "__monitor" {
        launcher::process::monitor_main
    } else if first == "__runner" {
        launcher::process::runner_main
    } else {
        return None;
    };
    // The processes of a run were started by a launcher that checked the root.
    launcher::process::set_allow_foreign_owner(launcher::root::allow_shared_root(false));
    Some(main())
}

/// A parser error: clap's own output, or with `--json` on the command line
/// the JSON error object on stdout (exit 2 either way; help and version exit 0).
fn usage_error(e: &clap::Error) -> i32 {
    use clap::error::ErrorKind;
    let informational = matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion);
    if informational {
        e.exit();
    }
    // One line, like every other error, and where to read more.
    let error = error::Error::of(error::ErrorKind::Parse, one_line(&e.render().to_string()));
    let json = json_on_command_line(std::env::args_os().skip(1));
    report(with_usage_hint(error), json)
}

/// clap's message up to its usage block, on one line.
fn one_line(rendered: &str) -> String {
    let message: Vec<&str> = rendered
        .lines()
        .map(str::trim)
        .skip_while(|l| l.is_empty())
        .take_while(|l| !l.is_empty() && !l.starts_with("Usage:"))
        .collect();
    let message = message.join(" ");
    let message = message.trim_start_matches("error: ");
    if message.is_empty() {
        "invalid command line".to_owned()
    } else {
        message.to_owned()
    }
}

/// True when `--json` appears before a `--` (after it, it belongs to COMMAND).
fn json_on_command_line(args: impl Iterator<Item = std::ffi::OsString>) -> bool {
    args.take_while(|a| a != "--").any(|a| a == "--json")
}

fn wants_json(command: &Command) -> bool {
    match command {
        Command::Run(args) => args.json,
        Command::List(args) => args.json,
        Command::Resume(args) => args.json,
        Command::Status { json, .. }
        | Command::Wait { json, .. }
        | Command::Stop { json, .. }
        | Command::Reconcile { json }
        | Command::Prune { json, .. }
        | Command::Config { json }
        | Command::Logs { json, .. }
        | Command::Dismiss { json, .. }
        | Command::Validate { json, .. }
        | Command::Capacity { json, .. }
        | Command::Agents { json, .. }
        | Command::Budget {
            action: Some(BudgetAction::Create { json, .. }),
            ..
        }
        | Command::Budget {
            action: Some(BudgetAction::Show { json, .. }),
            ..
        }
        | Command::Budget {
            action: Some(BudgetAction::Claim { json, .. }),
            ..
        } => *json,
        Command::Budget {
            action: Some(BudgetAction::Doctor(args)),
            ..
        } => args.json,
        Command::Budget { doctor, .. } => doctor.json,
        _ => false,
    }
}

fn dispatch(cli: Cli) -> Result {
    let root_flag = cli.root.is_some();
    let layout = launcher::Layout::new(launcher::root::state_root(cli.root));
    if !matches!(
        cli.command,
        Command::Completions { .. } | Command::Agents { .. }
    ) {
        let shared = launcher::root::allow_shared_root(cli.allow_shared_root);
        launcher::process::set_allow_foreign_owner(shared);
        if !shared {
            launcher::root::check_trusted(&layout).map_err(error::Error::failed)?;
        }
    } else {
        // These read no run state.
        launcher::process::set_allow_foreign_owner(launcher::root::allow_shared_root(false));
    }
    let launcher = |settings: Settings| Launcher::new(layout.clone(), settings);
    match cli.command {
        Command::Run(args) => {
            let request = args.request()?;
            commands::run(&launcher(args.settings()), &request, args.json, args.wait)
        }
        Command::Status { run, json } => commands::status(&launcher(caller()), &run, json),
        Command::List(args) => {
            let display = commands::ListDisplay {
                json: args.json,
                long: args.long,
                short: args.short,
                color: args.color.into(),
            };
            commands::list(&launcher(Settings::default()), &args.query(), display)
        }
        Command::Wait {
            runs,
            timeout,
            json,
        } => {
            let request = WaitRequest {
                runs,
                timeout,
                tail: None,
                cancel: Default::default(),
            };
            commands::wait(&launcher(caller()), &request, json)
        }
        Command::Stop { runs, reason, json } => {
            let requests: Vec<StopRequest> = runs
                .into_iter()
                .map(|run| StopRequest {
                    run,
                    reason: Some(reason.clone()),
                })
                .collect();
            commands::stop(&launcher(caller()), &requests, json)
        }
        Command::Logs {
            run,
            follow,
            json,
            step,
            tail,
            stderr,
        } => {
            let request = LogsRequest {
                run,
                step,
                tail,
                stderr,
                max_bytes: None,
            };
            commands::logs(&launcher(caller()), &request, json, follow)
        }
        Command::Reconcile { json } => commands::reconcile(&launcher(Settings::default()), json),
        Command::Dismiss { runs, force, json } => {
            let requests: Vec<DismissRequest> = runs
                .into_iter()
                .map(|run| DismissRequest { run, force })
                .collect();
            commands::dismiss(&launcher(caller()), &requests, json)
        }
        Command::Budget { doctor, action } => budget(&layout, &doctor, action),
        Command::Resume(args) => {
            let settings = Settings {
                max_active: args.max_active,
                ..caller()
            };
            commands::resume(&launcher(settings), &args.request(), args.json, args.wait)
        }
        Command::Agents { action, json } => {
            let (action, name) = match action {
                None | Some(AgentsAction::List) => (launcher::api::AgentsAction::List, None),
                Some(AgentsAction::Show { name }) => {
                    (launcher::api::AgentsAction::Show, Some(name))
                }
                Some(AgentsAction::Prompt) => (launcher::api::AgentsAction::Prompt, None),
            };
            let request = AgentsRequest { action, name };
            commands::agents(&launcher(Settings::default()), &request, json)
        }
        Command::Validate { kind, file, json } => {
            let request = ValidateRequest {
                kind: kind.0.name().to_owned(),
                file,
            };
            commands::validate(&launcher(Settings::default()), &request, json)
        }
        Command::Capacity {
            session,
            limit,
            json,
        } => {
            let settings = Settings {
                session,
                max_active: limit,
                ..Settings::default()
            };
            commands::capacity(&launcher(settings), json)
        }
        Command::Prune {
            older_than,
            dry_run,
            json,
        } => {
            let request = PruneRequest {
                older_than,
                dry_run,
            };
            commands::prune(&launcher(Settings::default()), &request, json)
        }
        Command::Config { json } => {
            commands::config(&launcher(Settings::default()), json, root_flag)
        }
        #[cfg(feature = "top")]
        Command::Top => crate::top::command(&layout),
        #[cfg(feature = "mcp")]
        Command::Mcp(args) => crate::mcp::serve(launcher(args.settings())),
        Command::Completions { shell } => completions(shell),
    }
}

fn budget(layout: &launcher::Layout, doctor: &DoctorArgs, action: Option<BudgetAction>) -> Result {
    let launcher = |fanout_limit| {
        let settings = Settings {
            fanout_limit,
            ..Settings::default()
        };
        Launcher::new(layout.clone(), settings)
    };
    match action {
        None => commands::budget_doctor(&launcher(doctor.fanout_limit), doctor.json),
        Some(BudgetAction::Doctor(args)) => {
            commands::budget_doctor(&launcher(args.fanout_limit), args.json)
        }
        Some(BudgetAction::Create {
            root_run_id, limit, ..
        }) => {
            let request = BudgetCreateRequest { root_run_id, limit };
            commands::budget_create(&launcher(None), &request)
        }
        Some(BudgetAction::Show {
            run, descriptor, ..
        }) => {
            let query = BudgetQuery { run, descriptor };
            commands::budget_show(&launcher(None), &query)
        }
        Some(BudgetAction::Claim {
            descriptor, paths, ..
        }) => {
            let request = BudgetClaimRequest { descriptor, paths };
            commands::budget_claim(&launcher(None), &request)
        }
    }
}

/// The variable under which a shell's completion script asks this binary
/// for candidates (see `completions`).
const COMPLETE_VAR: &str = "SUBAGENTS_COMPLETE";

/// `subagents completions SHELL`: the script that registers this binary,
/// by its full path, as the shell's completer of `subagents`.
fn completions(shell: clap_complete::Shell) -> Result {
    use clap_complete::env::{Bash, Elvish, EnvCompleter, Fish, Powershell, Zsh};
    let completer: &dyn EnvCompleter = match shell {
        clap_complete::Shell::Bash => &Bash,
        clap_complete::Shell::Zsh => &Zsh,
        clap_complete::Shell::Fish => &Fish,
        clap_complete::Shell::Elvish => &Elvish,
        _ => &Powershell,
    };
    let exe = std::env::current_exe()
        .ok()
        .and_then(|p| p.into_os_string().into_string().ok())
        .unwrap_or_else(|| "subagents".to_owned());
    let mut script = Vec::new();
    completer
        .write_registration(COMPLETE_VAR, "subagents", "subagents", &exe, &mut script)
        .and_then(|()| std::io::Write::write_all(&mut std::io::stdout(), &script))
        .map_err(|e| error::Error::failed(format!("failed to print the completion script: {e}")))
}

/// Candidates of a run-id argument: [`launcher::listing::choices`] of the
/// root the command line being completed names.
fn run_ids() -> clap_complete::ArgValueCandidates {
    clap_complete::ArgValueCandidates::new(|| {
        let layout = launcher::Layout::new(launcher::root::state_root(root_being_completed()));
        let mut candidates: Vec<clap_complete::CompletionCandidate> =
            launcher::listing::choices(&layout, FINISHED_CHOICES)
                .into_iter()
                .enumerate()
                .map(|(i, run)| {
                    let tag = if run.active { "active" } else { "finished" };
                    clap_complete::CompletionCandidate::new(run.id)
                        .help(run.help.map(|h| launcher::escape(&h).into()))
                        .tag(Some(tag.into()))
                        .display_order(Some(i))
                })
                .collect();
        candidates.push(
            clap_complete::CompletionCandidate::new("last")
                .help(Some("the newest run of this session".into()))
                .tag(Some("handle".into())),
        );
        candidates
    })
}

/// How many finished runs a run id's completion offers (after every active one).
const FINISHED_CHOICES: usize = 100;

/// The `--root` of the command line a shell is completing (its words
/// follow `--` in this process's arguments), if it has one.
fn root_being_completed() -> Option<PathBuf> {
    let words: Vec<std::ffi::OsString> = std::env::args_os()
        .skip_while(|a| a != "--")
        .skip(1)
        .collect();
    words.iter().enumerate().find_map(|(i, word)| {
        let word = word.to_str()?;
        match word.strip_prefix("--root") {
            Some("") => words.get(i + 1).map(PathBuf::from),
            Some(rest) => rest.strip_prefix('=').map(PathBuf::from),
            None => None,
        }
    })
}

/// Candidates of an agent name: every agent `agents list` shows.
fn agent_names() -> clap_complete::ArgValueCandidates {
    clap_complete::ArgValueCandidates::new(|| {
        let request = AgentsRequest {
            action: launcher::api::AgentsAction::List,
            name: None,
        };
        let layout = launcher::Layout::new(launcher::root::state_root(None));
        let Ok(launcher::api::AgentsOutcome::List(list)) =
            Launcher::new(layout, Settings::default()).agents(&request)
        else {
            return Vec::new();
        };
        list.agents
            .iter()
            .filter_map(|agent| {
                let name = agent.get("name")?.as_str()?;
                let help = agent.get("description").and_then(|d| d.as_str());
                Some(
                    clap_complete::CompletionCandidate::new(name)
                        .help(help.map(|h| launcher::escape(h).into())),
                )
            })
            .collect()
    })
}
