//! Regression guards for the cost of the hot paths, counted rather than
//! timed so they cannot flake on a busy machine: fsyncs per launch, files
//! opened per listed run, no walk over `/proc`, and `wait` woken by the
//! monitor's exit through a pidfd.
//!
//! Each test runs the real binary under `strace -f` and counts system calls.
//! Without a usable strace (not installed, or ptrace not permitted) a test
//! prints why and passes without checking anything.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

use common::*;

const STRACE: &str = "/usr/bin/strace";

/// Runs `subagents --root ROOT ARGS` under `strace -f -e trace=TRACE`;
/// returns the trace (one line per call, prefixed by the pid), or `None`
/// when strace cannot be used here.
fn traced(env: &Env, trace: &str, args: &[&str]) -> Option<String> {
    if !Path::new(STRACE).exists() {
        eprintln!("skipped: {STRACE} is not installed");
        return None;
    }
    let log = env.root().join("strace.log");
    let out = Command::new(STRACE)
        .args(["-f", "-qq", "-e"])
        .arg(format!("trace={trace}"))
        .arg("-o")
        .arg(&log)
        .arg(env!("CARGO_BIN_EXE_subagents"))
        .arg("--root")
        .arg(env.root())
        .args(args)
        .env_remove("SUBAGENTS_SESSION_ID")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    if text.is_empty() && !out.status.success() {
        eprintln!(
            "skipped: strace could not trace here: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        return None;
    }
    assert!(out.status.success(), "subagents {args:?} failed: {out:?}");
    Some(text)
}

/// The pid of the traced command itself (the first line's pid).
fn first_pid(trace: &str) -> &str {
    trace.split_whitespace().next().unwrap_or_default()
}

/// Completed calls named `name` (`name(` at the call, not resumed halves).
fn calls<'a>(trace: &'a str, name: &str) -> Vec<&'a str> {
    let needle = format!(" {name}(");
    trace.lines().filter(|l| l.contains(&needle)).collect()
}

fn fsyncs_of(trace: &str, pid: &str) -> usize {
    let mine = |l: &&str| l.split_whitespace().next() == Some(pid);
    let count = |name| calls(trace, name).into_iter().filter(mine).count();
    count("fsync") + count("fdatasync")
}

/// Upper bound of fsyncs the launcher itself makes before it returns: the
/// fan-out budget (manifest, its directories, the first claim), each of
/// the run directory's files once, the run directory and its parent once,
/// and the active marker's directory.
const LAUNCH_FSYNCS: usize = 12;
/// What a capacity slot may add (pool lock directory, the slot's owner
/// file, its staging directory and the pool, binding the runner). Every
/// top-level run takes one, with or without a limit.
const SLOT_FSYNCS: usize = 8;
/// The recovery seal of a single run (`recovery-seal.json`, and the root's
/// `.recovery-key` on the first launch of a root).
const SEAL_FSYNCS: usize = 3;

#[test]
fn a_launch_syncs_each_file_once_and_the_run_directory_once() {
    let env = Env::new();
    let Some(trace) = traced(&env, "fsync,fdatasync", &["run", "--", "true"]) else {
        return;
    };
    let launcher = fsyncs_of(&trace, first_pid(&trace));
    let most = LAUNCH_FSYNCS + SLOT_FSYNCS + SEAL_FSYNCS;
    assert!(
        launcher <= most,
        "the launcher made {launcher} fsyncs (at most {most}):\n{trace}"
    );
}

#[test]
fn taking_a_capacity_slot_costs_the_same_with_many_runs_active() {
    let env = Env::new();
    let session = ["--session", "costs", "--max-active", "64"];
    fn launch<'a>(session: &[&'a str], command: &[&'a str]) -> Vec<&'a str> {
        let mut args = vec!["run"];
        args.extend(session);
        args.push("--");
        args.extend(command);
        args
    }
    let Some(empty) = traced(&env, "fsync,fdatasync", &launch(&session, &["true"])) else {
        return;
    };
    let alone = fsyncs_of(&empty, first_pid(&empty));
    assert!(
        alone <= LAUNCH_FSYNCS + SLOT_FSYNCS + SEAL_FSYNCS,
        "{alone} fsyncs:\n{empty}"
    );
    // Eight runs hold slots while the next one is admitted.
    let held: Vec<String> = (0..8)
        .map(|_| {
            env.ok(&launch(&session, &["sleep", "600"]))
                .trim()
                .to_owned()
        })
        .collect();
    let Some(busy) = traced(&env, "fsync,fdatasync", &launch(&session, &["true"])) else {
        return;
    };
    let crowded = fsyncs_of(&busy, first_pid(&busy));
    for id in &held {
        env.ok(&["stop", id]);
    }
    assert!(
        crowded <= alone,
        "admission with 8 slots taken made {crowded} fsyncs, alone {alone}:\n{busy}"
    );
}

#[test]
fn list_all_reads_one_file_per_finished_run_and_list_none() {
    let env = Env::new();
    let runs = 6;
    for _ in 0..runs {
        env.ok(&["run", "--wait", "--", "true"]);
    }
    let runs_dir = env.root().join("async-subagent-runs");
    let under_runs = |trace: &str| {
        calls(trace, "openat")
            .into_iter()
            .filter(|l| l.contains(&format!("{}/", runs_dir.display())))
            // Files, not directories (the active index is listed as one).
            .filter(|l| !l.contains("= -1") && !l.contains("O_DIRECTORY"))
            .count()
    };
    // The first listing after runs end also frees their capacity slots
    // (reading each one's status and proof once); the steady state is traced.
    env.ok(&["list", "--all"]);
    let Some(all) = traced(&env, "openat", &["list", "--all"]) else {
        return;
    };
    let opened = under_runs(&all);
    assert!(
        opened <= runs,
        "list --all opened {opened} files for {runs} finished runs (at most one each):\n{all}"
    );
    let Some(active) = traced(&env, "openat", &["list"]) else {
        return;
    };
    let opened: Vec<&str> = calls(&active, "openat")
        .into_iter()
        .filter(|l| l.contains("status.json"))
        .collect();
    assert!(opened.is_empty(), "list read finished runs: {opened:#?}");
}

#[test]
fn no_process_of_a_run_walks_proc() {
    let env = Env::new();
    let Some(trace) = traced(&env, "openat", &["run", "--wait", "--", "true"]) else {
        return;
    };
    let walks: Vec<&str> = calls(&trace, "openat")
        .into_iter()
        .filter(|l| l.contains("\"/proc\""))
        .collect();
    assert!(walks.is_empty(), "listed /proc: {walks:#?}");
}

#[test]
fn wait_is_woken_by_the_monitors_exit_through_a_pidfd() {
    if !Path::new(STRACE).exists() {
        eprintln!("skipped: {STRACE} is not installed");
        return;
    }
    let env = Env::new();
    let fifo = env.fifo("gate");
    let id = env.ok(&["run", "--", "cat", fifo.to_str().unwrap()]);
    let id = id.trim().to_owned();
    let log = env.root().join("wait.strace");
    let mut waiter = Command::new(STRACE)
        .args(["-f", "-qq", "-e", "trace=pidfd_open", "-o"])
        .arg(&log)
        .arg(env!("CARGO_BIN_EXE_subagents"))
        .arg("--root")
        .arg(env.root())
        .args(["wait", &id])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The run cannot end before the gate opens, so the waiter finds its
    // monitor alive and must watch it.
    let opened = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .any(|l| l.contains("pidfd_open(") && !l.contains("= -1"))
    };
    let mut watched = false;
    poll(std::time::Duration::from_secs(60), || {
        watched = opened() || waiter.try_wait().ok().flatten().is_some();
        watched
    });
    // Opening the FIFO for writing (and closing it) ends `cat`.
    drop(std::fs::OpenOptions::new().write(true).open(&fifo));
    let status = waiter.wait().unwrap();
    let trace = std::fs::read_to_string(&log).unwrap_or_default();
    if trace.is_empty() && !status.success() {
        eprintln!("skipped: strace could not trace here");
        return;
    }
    assert!(status.success(), "wait failed");
    assert!(
        opened(),
        "wait never opened a pidfd for the monitor:\n{trace}"
    );
}
