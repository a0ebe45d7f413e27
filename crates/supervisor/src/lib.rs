#![doc = include_str!("../README.md")]
//!
//! The process side of a run: everything that runs, waits on, signals or
//! proves the end of a run's processes.
//!
//! * [`spawn`] starts the detached monitor and waits for the runner's
//!   `ready` line on an inherited pipe; [`spawn::SpawnMode`] says whether
//!   a monitor or runner is forked alone or `exec`ed.
//! * [`monitor`] is the runner's parent: it waits on the runner, empties
//!   what is left, and writes the process-terminal proof.
//! * [`slot_wait`] is the monitor of a queued run waiting for its
//!   capacity slot (`run --queue`), and the restart of that wait.
//! * [`runner`] runs the steps and owns `status.json` while the run lives.
//! * [`observer`] proves a run's processes gone and writes its proof: for
//!   the monitor at the end of every run, and for any command that meets a
//!   run whose monitor is gone.
//! * [`procs`] is the Unix plumbing they share: a signalfd wait, reaping,
//!   emptying process groups.
//! * [`transitions`] are every status change the processes make, as pure
//!   functions of the current status and injected facts.
//! * [`config`] is what travels from launcher to monitor to runner on stdin.
//! * [`agent_output`] reads a preset run's CLI output back after its step:
//!   the final answer into `answer.md` and `output-<i>.log`, the CLI's
//!   session into the status, the failure's reason in the agent's words.
//! * [`live`] reads a running step's logs as they grow: when output last
//!   came, the agent's latest activity, its session id as soon as printed.
//! * [`durable`] keeps state writes going through a full disk (retry with
//!   backoff, space reserved for the step-end evidence).
//! * [`handover`] carries the runner's outcome to its monitor when the
//!   root cannot take it (read-only or full past the retry budget).
//! * [`idle`] gives back the monitor's and the runner's clean code pages
//!   before they wait.
//! * [`slurm`] submits a run as a Slurm batch job, signals it, and asks
//!   Slurm whether it is over (for the observer of a dispatched run).
//! * [`fault`] kills a named process at a named point (`SUBAGENTS_FAULT`),
//!   for crash tests; off unless the variable is set.
//!
//! A host binary embeds this crate by dispatching the hidden arguments
//! `__monitor` and `__runner` to [`monitor::main`] and [`runner::main`]
//! (the `exec` path; a forked monitor or runner calls [`monitor::run`] and
//! [`runner::run_config`] directly).
#![warn(missing_docs)]

pub mod agent_output;
pub mod config;
pub mod durable;
pub mod fault;
pub mod handover;
pub mod idle;
pub mod live;
pub mod monitor;
pub mod observer;
#[cfg(test)]
mod process_tests;
pub mod procs;
pub mod runner;
pub mod slot_wait;
pub mod slurm;
pub mod spawn;
mod title;
pub mod transitions;
