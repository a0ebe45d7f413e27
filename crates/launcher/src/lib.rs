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
pub mod prepare;
pub mod revive;
pub mod root;
pub mod spec;
pub mod validate;
pub mod wait;

use clap::Parser;

use crate::cli::{Cli, Command};
use crate::error::CliResult;

/// Parses the command line, runs the command, prints errors; returns the exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Monitor | Command::Runner) {
        // `subagents list | head` should end quietly, like any Unix filter.
        // (Runners keep ignoring SIGPIPE: a vanished launcher must not kill them.)
        // SAFETY: restoring a default signal disposition has no memory effects.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
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

fn wants_json(command: &Command) -> bool {
    match command {
        Command::Run(args) => args.json,
        Command::List(args) => args.json,
        Command::Resume(args) => args.json,
        Command::Status { json, .. }
        | Command::Wait { json, .. }
        | Command::Stop { json, .. }
        | Command::Reconcile { json }
        | Command::Capacity { json, .. }
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
        Command::Monitor | Command::Runner | Command::Completions { .. }
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
        Command::Logs { run, follow } => commands::logs(&layout, &run, follow),
        Command::Reconcile { json } => commands::reconcile(&layout, json),
        Command::Dismiss { run } => commands::dismiss(&layout, &run),
        Command::Budget { doctor, action } => fanout::budget_command(&layout, &doctor, action),
        Command::Resume(args) => revive::resume(&layout, &args),
        Command::Validate { kind, file, json } => validate::command(&layout, kind, &file, json),
        Command::Capacity {
            session,
            limit,
            json,
        } => commands::capacity(&layout, session.as_deref(), limit, json),
        Command::Completions { shell } => {
            let mut command = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut command, "subagents", &mut std::io::stdout());
            Ok(())
        }
        Command::Monitor => std::process::exit(supervisor::monitor::main()),
        Command::Runner => std::process::exit(supervisor::runner::main()),
    }
}
