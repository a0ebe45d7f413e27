//! Command-line definitions (the contract summarised in the README).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

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
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Launch a detached background run of COMMAND.
    Run(RunArgs),
    /// Show one run.
    Status {
        /// Run id or unique prefix.
        run: String,
        /// Print the run summary as JSON.
        #[arg(long)]
        json: bool,
    },
    /// List active runs (or every run with --all).
    List(ListArgs),
    /// Block until every named run is over.
    Wait {
        /// Run ids or unique prefixes.
        #[arg(required = true)]
        runs: Vec<String>,
        /// Give up after this long (e.g. 90s, 30m); exit 124.
        #[arg(long, value_name = "DURATION")]
        timeout: Option<String>,
        /// Print the final summaries as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Stop a run: its runner and every child process group.
    Stop {
        /// Run id or unique prefix.
        run: String,
        /// Why (kept in status.json).
        #[arg(long, default_value = "Subagent stopped by user.")]
        reason: String,
        /// Print the final summary as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show a run's output and logs.
    Logs {
        /// Run id or unique prefix.
        run: String,
        /// Keep printing new output until the run is over.
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
    /// Hide a finished run from `list` without touching its processes.
    Dismiss {
        /// Run id or unique prefix.
        run: String,
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
        /// Print JSON (list, show).
        #[arg(long, global = true)]
        json: bool,
    },
    /// Validate one on-disk artifact exactly as the readers do.
    Validate {
        /// The artifact kind.
        #[arg(long, value_enum)]
        kind: crate::validate::Kind,
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
        /// How old a run's end must be (e.g. 7d, 12h, 30m).
        #[arg(long, value_name = "DURATION", default_value = crate::prune::DEFAULT_AGE)]
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
    Top,
    /// Print a shell completion script.
    Completions {
        /// bash, zsh or fish (also elvish, powershell).
        shell: clap_complete::Shell,
    },
    /// Internal: the supervisor that waits on a runner and writes its proof.
    #[command(name = "__monitor", hide = true)]
    Monitor {
        /// The run id, shown by `ps` only (the config comes on stdin).
        run: Option<String>,
    },
    /// Internal: the runner of one run.
    #[command(name = "__runner", hide = true)]
    Runner {
        /// The run id, shown by `ps` only (the config comes on stdin).
        run: Option<String>,
    },
}

/// `subagents run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Without COMMAND: the named agent to run (see `subagents agents list`).
    /// With COMMAND: the label shown in status (default: COMMAND's file name).
    #[arg(long)]
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
    /// Wall-clock deadline (e.g. 30m, 90s; 0 for none). Default 30m.
    #[arg(long, env = "SUBAGENTS_TIMEOUT", value_name = "DURATION")]
    pub timeout: Option<String>,
    /// Explicit run id (refused if it exists or is not a safe file name).
    #[arg(long)]
    pub id: Option<String>,
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
    /// A composite run from a JSON spec file (see README: parallel, chain).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["agent", "task", "task_file"])]
    pub spec: Option<PathBuf>,
    /// Run fan-out budget of a new root run, 1..=1000000 (else $SUBAGENTS_MAX_SPAWNS_PER_RUN, else 64); ignored inside a run.
    #[arg(long, value_name = "N", value_parser = fanout_limit_parser())]
    pub fanout_limit: Option<u64>,
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
    #[arg(long, value_enum, env = "SUBAGENTS_COLOR", default_value_t = crate::table::ColorChoice::Auto)]
    pub color: crate::table::ColorChoice,
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
    clap::value_parser!(u64).range(1..=fanout_budget::MAX_LIMIT)
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
        #[arg(required_unless_present = "descriptor", conflicts_with = "descriptor")]
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
        name: String,
    },
    /// A snippet for CLAUDE.md / AGENTS.md that lets an agent delegate through `subagents`.
    Prompt,
}

/// `subagents resume`.
#[derive(Debug, Args)]
pub struct ResumeArgs {
    /// The run to revive (id or unique prefix).
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
    /// Print {runId, asyncDir, pid, runnerProcessInstanceId, sourceRunId} as JSON.
    #[arg(long)]
    pub json: bool,
}
