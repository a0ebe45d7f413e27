//! The `subagents` launcher: composes the protocol crates into a command.
//!
//! `main.rs` is a thin shell over [`main`]. Each command lives in its own
//! module ([`launch`], [`commands`], [`wait`]); the two hidden
//! subcommands are the processes of a run, which live in the `supervisor`
//! crate. Errors
//! are [`error::CliError`] values carrying the exit code of `cli.md`.
#![warn(missing_docs)]

pub mod admission;
pub use supervisor::{config, procs, transitions};
pub mod cli;
pub mod commands;
pub mod error;
pub mod fanout;
pub mod launch;
pub mod listing;
pub mod logs;
pub mod prepare;
pub mod presets;
pub mod prune;
pub mod revive;
pub mod root;
pub mod settings;
pub mod spec;
pub mod table;
pub mod top;
pub mod validate;
pub mod wait;

use clap::Parser;

use crate::cli::{Cli, Command};
use crate::error::CliResult;

/// Parses the command line, runs the command, prints errors; returns the exit code.
pub fn main() -> i32 {
    let internal = std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == "__monitor" || a == "__runner");
    if !internal && let Err(e) = settings::apply() {
        eprintln!("subagents: {}", atomic_file::escape(&e.message));
        return e.exit.code();
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(&e),
    };
    if !matches!(
        cli.command,
        Command::Monitor { .. } | Command::Runner { .. }
    ) {
        // `subagents list | head` should end quietly, like any Unix filter.
        // (Runners keep ignoring SIGPIPE: a vanished launcher must not kill them.)
        // SAFETY: restoring a default signal disposition has no memory effects.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    if matches!(cli.command, Command::Run(_) | Command::Resume(_)) {
        supervisor::fault::init(supervisor::fault::Process::Launcher);
    }
    let json = wants_json(&cli.command);
    match dispatch(cli) {
        Ok(()) => 0,
        Err(e) => {
            if !e.quiet {
                if json {
                    println!("{}", e.to_json());
                }
                // One line per message, whatever ids or paths it quotes.
                eprintln!("subagents: {}", atomic_file::escape(&e.message));
                for note in &e.notes {
                    eprintln!("  {}", atomic_file::escape(note));
                }
                if let Some(hint) = &e.hint {
                    eprintln!("  hint: {hint}");
                }
            }
            e.exit.code()
        }
    }
}

/// A parser error: clap's own output, or with `--json` on the command line
/// the JSON error object on stdout (exit 2 either way; help and version exit 0).
fn usage_error(e: &clap::Error) -> i32 {
    use clap::error::ErrorKind;
    let informational = matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion);
    if informational {
        e.exit();
    }
    let error = error::CliError::new(error::Exit::Usage, one_line(&e.render().to_string()));
    if json_on_command_line(std::env::args_os().skip(1)) {
        println!("{}", error.to_json());
    }
    // One line, like every other error, and where to read more.
    eprintln!("subagents: {}", atomic_file::escape(&error.message));
    let command = std::env::args().nth(1).filter(|a| !a.starts_with('-'));
    match command {
        Some(c) => eprintln!("  hint: see `subagents {c} --help`"),
        None => eprintln!("  hint: see `subagents --help`"),
    }
    error.exit.code()
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
            action: Some(cli::BudgetAction::Create { json, .. }),
            ..
        }
        | Command::Budget {
            action: Some(cli::BudgetAction::Show { json, .. }),
            ..
        }
        | Command::Budget {
            action: Some(cli::BudgetAction::Claim { json, .. }),
            ..
        } => *json,
        Command::Budget {
            action: Some(cli::BudgetAction::Doctor(args)),
            ..
        } => args.json,
        Command::Budget { doctor, .. } => doctor.json,
        _ => false,
    }
}

fn dispatch(cli: Cli) -> CliResult {
    let layout = status::Layout::new(root::state_root(cli.root));
    if !matches!(
        cli.command,
        Command::Monitor { .. }
            | Command::Runner { .. }
            | Command::Completions { .. }
            | Command::Agents { .. }
    ) {
        let shared = root::allow_shared_root(cli.allow_shared_root);
        atomic_file::read::set_allow_foreign_owner(shared);
        if !shared {
            root::check_trusted(&layout).map_err(error::CliError::failed)?;
        }
    } else {
        // The processes of a run were started by a launcher that checked the root.
        atomic_file::read::set_allow_foreign_owner(root::allow_shared_root(false));
    }
    match cli.command {
        Command::Run(args) => commands::run(&layout, &args),
        Command::Status { run, json } => commands::status(&layout, &run, json),
        Command::List(args) => commands::list(&layout, &args),
        Command::Wait {
            runs,
            timeout,
            json,
        } => wait::wait_command(&layout, &runs, timeout.as_deref(), json),
        Command::Stop { run, reason, json } => commands::stop(&layout, &run, &reason, json),
        Command::Logs {
            run,
            follow,
            json,
            step,
            tail,
            stderr,
        } => logs::command(
            &layout,
            &run,
            logs::LogsOptions {
                follow,
                json,
                step,
                tail,
                stderr_only: stderr,
            },
        ),
        Command::Reconcile { json } => commands::reconcile(&layout, json),
        Command::Dismiss { run, force, json } => commands::dismiss(&layout, &run, force, json),
        Command::Budget { doctor, action } => fanout::budget_command(&layout, &doctor, action),
        Command::Resume(args) => revive::resume(&layout, &args),
        Command::Agents { action, json } => presets::command(action.as_ref(), json),
        Command::Validate { kind, file, json } => validate::command(&layout, kind, &file, json),
        Command::Capacity {
            session,
            limit,
            json,
        } => commands::capacity(&layout, session.as_deref(), limit, json),
        Command::Prune {
            older_than,
            dry_run,
            json,
        } => prune::command(&layout, older_than.as_deref(), dry_run, json),
        Command::Config { json } => settings::command(json),
        Command::Top => top::command(&layout, root::allow_shared_root(cli.allow_shared_root)),
        Command::Completions { shell } => {
            let mut command = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut command, "subagents", &mut std::io::stdout());
            Ok(())
        }
        Command::Monitor { .. } => std::process::exit(supervisor::monitor::main()),
        Command::Runner { .. } => std::process::exit(supervisor::runner::main()),
    }
}
