//! Regression guards for the cost of the hot paths, counted rather than
//! timed so they cannot flake on a busy machine: fsyncs per launch, files
//! opened per listed run (none for a finished run with a warm listing
//! index), no walk over `/proc`, `wait` woken by the monitor's exit through
//! a pidfd, a binary whose relocations stay packed, and a monitor and a
//! runner that give back their code pages before they wait.
//!
//! Each test runs the real binary under `strace -f` and counts system calls.
//! Without a usable strace (not installed, or ptrace not permitted) a test
//! prints why and passes without checking anything.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::*;

const STRACE: &str = "/usr/bin/strace";

/// Runs `subagents --root ROOT ARGS` under `strace -f -e trace=TRACE`;
/// returns the trace (one line per call, prefixed by the pid), or `None`
/// when strace cannot be used here.
fn traced(env: &Env, trace: &str, args: &[&str]) -> Option<String> {
    traced_exit(env, trace, args, 0)
}

/// [`traced`] of a command expected to exit with `code`.
fn traced_exit(env: &Env, trace: &str, args: &[&str], code: i32) -> Option<String> {
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
    assert_eq!(
        out.status.code(),
        Some(code),
        "subagents {args:?} exited otherwise: {out:?}"
    );
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
/// fan-out budget (its manifest, the budget directory and its parent, the
/// first claim and the claims directory: 5), each of the run directory's
/// files once (persisted budget, launch contract, recovery descriptor,
/// queued status: 4), the run directory and its parent once, and the active
/// marker's directory.
const LAUNCH_FSYNCS: usize = 12;
/// What the capacity slot adds (every top-level run takes one, with or
/// without a limit): `owner.json` and the staging directory that is renamed
/// into the pool (2); binding the runner, the claim's and the new
/// `owner.json`'s content (2). The pool and the slot directory are not
/// fsynced: a slot or binding lost in a crash belonged to a run the crash
/// ended (see docs/history/benchmarks-log.md, "What each fsync protects").
const SLOT_FSYNCS: usize = 4;
/// The recovery seal of a single run (`recovery-seal.json`, and the root's
/// `.recovery-key` with the root directory on the first launch of a root).
const SEAL_FSYNCS: usize = 3;
/// The monitor: its registration in the queued status (the content only,
/// 1), the proof (file and directory, 2), the status overlay (2) and the
/// claim under which it frees the run's capacity slot (1), so that no
/// reader pays for it later.
const MONITOR_FSYNCS: usize = 6;
/// The runner of a one-step run: `running` (file and directory, 2), the
/// step's start and end (content only, 1 each; the final write syncs the
/// directory), its output when COMMAND wrote nothing (empty: none), the
/// final status (2) and the candidate (2).
const RUNNER_FSYNCS: usize = 8;

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

/// The launcher's run files (persisted budget, launch contract, recovery
/// descriptor, seal, queued status) are written as one batch: the
/// writeback of all five starts before the first of their fsyncs, so the
/// fsyncs share journal commits instead of making one each.
#[test]
fn a_launch_starts_the_writeback_of_its_run_files_before_syncing_them() {
    let env = Env::new();
    let trace = "fsync,fdatasync,sync_file_range";
    let Some(trace) = traced(&env, trace, &["run", "--", "true"]) else {
        return;
    };
    let pid = first_pid(&trace);
    let mine: Vec<&str> = trace
        .lines()
        .filter(|l| l.split_whitespace().next() == Some(pid))
        .collect();
    let started = |l: &str| l.contains(" sync_file_range(") && l.contains("SYNC_FILE_RANGE_WRITE");
    let first = mine.iter().position(|l| started(l));
    let first = first.unwrap_or_else(|| panic!("no writeback started:\n{trace}"));
    let run = mine[first..].iter().take_while(|l| started(l)).count();
    assert_eq!(run, 5, "writebacks started in one go:\n{trace}");
    let synced = mine[first + 5..]
        .iter()
        .take_while(|l| l.contains(" fsync("))
        .count();
    assert!(synced >= 5, "the five files fsynced right after:\n{trace}");
}

/// The pid of the only run's monitor (`__monitor`) or runner (`__runner`),
/// from the identities its status records: they are forked without
/// `exec`, so no `execve` names them.
fn pid_of_role(env: &Env, role: &str) -> String {
    let runs = env.root().join("async-subagent-runs");
    let id = std::fs::read_dir(&runs)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|name| !name.starts_with('.'))
        .unwrap_or_else(|| panic!("no run in {}", runs.display()));
    let key = match role {
        "__monitor" => "monitorIdentity",
        _ => "runnerIdentity",
    };
    let status = env.status_json(&id);
    status[key]["pid"]
        .as_u64()
        .unwrap_or_else(|| panic!("no {key} in {status}"))
        .to_string()
}

/// `run --wait -- /bin/true` starts two programs, the command line itself
/// and COMMAND: the monitor and the runner are forks of the command line,
/// not new `exec`s of the whole binary (`supervisor::spawn::SpawnMode`).
#[test]
fn a_launch_execs_only_the_command_line_and_command() {
    let env = Env::new();
    let args = ["run", "--wait", "--", "/bin/true"];
    let Some(trace) = traced(&env, "execve", &args) else {
        return;
    };
    let execs: Vec<&str> = calls(&trace, "execve")
        .into_iter()
        .filter(|l| l.ends_with("= 0"))
        .collect();
    let ours = execs
        .iter()
        .filter(|l| l.contains(env!("CARGO_BIN_EXE_subagents")));
    assert_eq!(
        ours.count(),
        1,
        "the binary was executed more than once:\n{trace}"
    );
    let helpers = execs
        .iter()
        .filter(|l| l.contains("\"__monitor\"") || l.contains("\"__runner\""));
    assert_eq!(
        helpers.count(),
        0,
        "a monitor or runner was exec'ed:\n{trace}"
    );
    assert_eq!(
        execs.len(),
        2,
        "the command line and COMMAND only:\n{trace}"
    );
}

#[test]
fn the_monitor_and_the_runner_sync_only_what_a_crash_must_keep() {
    let env = Env::new();
    let Some(trace) = traced(
        &env,
        "fsync,fdatasync,execve",
        &["run", "--wait", "--", "true"],
    ) else {
        return;
    };
    let monitor = fsyncs_of(&trace, &pid_of_role(&env, "__monitor"));
    assert!(
        monitor <= MONITOR_FSYNCS,
        "the monitor made {monitor} fsyncs (at most {MONITOR_FSYNCS}):\n{trace}"
    );
    let runner = fsyncs_of(&trace, &pid_of_role(&env, "__runner"));
    assert!(
        runner <= RUNNER_FSYNCS,
        "the runner of one step made {runner} fsyncs (at most {RUNNER_FSYNCS}):\n{trace}"
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
    // Nor does it read the held slots' owners while a slot is free.
    let opened = traced(&env, "openat,openat2", &launch(&session, &["true"]));
    for id in &held {
        env.ok(&["stop", id]);
    }
    assert!(
        crowded <= alone,
        "admission with 8 slots taken made {crowded} fsyncs, alone {alone}:\n{busy}"
    );
    let Some(opened) = opened else {
        return;
    };
    let launcher = first_pid(&opened);
    let mine: Vec<&str> = opened
        .lines()
        .filter(|l| l.split_whitespace().next() == Some(launcher))
        .collect();
    // The slot it creates (`.slot-N.creating-…`) it reads back when binding.
    let own = mine
        .iter()
        .find_map(|l| l.split("/.slot-").nth(1)?.split('.').next())
        .map(|n| format!("/slot-{n}/owner.json\""))
        .expect("the launcher creates a slot");
    let others_read = mine
        .iter()
        .filter(|l| l.contains("/slot-") && l.contains("/owner.json\"") && !l.contains(&own))
        .count();
    assert_eq!(
        others_read, 0,
        "admission with 8 slots taken read their owners:\n{opened}"
    );
}

/// Copies the owner record of the pool's first slot into the free ones of
/// `slot-1` .. `slot-<total-1>` (each naming the same live run), as bench/all.sh holds
/// many slots without as many processes.
fn clone_slots(env: &Env, total: usize) {
    let root = env.root().join("session-active-async-capacity");
    let pool = std::fs::read_dir(&root)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let owner = std::fs::read_to_string(pool.join("slot-0/owner.json")).unwrap();
    let mut owner: serde_json::Value = serde_json::from_str(&owner).unwrap();
    for n in 1..total {
        let dir = pool.join(format!("slot-{n}"));
        if dir.exists() {
            continue;
        }
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .unwrap();
        owner["slot"] = n.into();
        std::fs::write(dir.join("owner.json"), owner.to_string()).unwrap();
    }
}

/// Calls of the launcher itself (the trace's first pid) that stat a path
/// or a descriptor: the root's trust check once stat'ed every held slot.
fn stats_of_launcher(trace: &str) -> usize {
    let pid = first_pid(trace);
    ["statx", "newfstatat", "fstat", "stat", "lstat"]
        .into_iter()
        .flat_map(|name| calls(trace, name))
        .filter(|l| l.split_whitespace().next() == Some(pid))
        // The fan-out budget's lock looks at a stale holder's directory
        // only when it meets one (under load, once in a while): a cost of
        // that lock's contention, not of the slots held.
        .filter(|l| !l.contains("/admission.stale-"))
        .count()
}

#[test]
fn a_launch_stats_no_more_with_many_capacity_slots_held() {
    let env = Env::new();
    let session = ["--session", "held", "--max-active", "100000"];
    let launch = |command: &[&str]| {
        let mut args = vec!["run"];
        args.extend(session);
        args.push("--");
        args.extend(command);
        env.ok(&args).trim().to_owned()
    };
    let held = launch(&["sleep", "600"]);
    let trace = "statx,newfstatat,fstat,stat,lstat";
    let run = [
        "run", session[0], session[1], session[2], session[3], "--", "true",
    ];
    let one = traced(&env, trace, &run);
    clone_slots(&env, 200);
    let many = traced(&env, trace, &run);
    env.ok(&["stop", &held]);
    let (Some(one), Some(many)) = (one, many) else {
        return;
    };
    let (alone, crowded) = (stats_of_launcher(&one), stats_of_launcher(&many));
    // Its own new slot it may stat; none of the held ones.
    let slot_paths = |trace: &str| {
        calls(trace, "statx")
            .into_iter()
            .chain(calls(trace, "newfstatat"))
            .filter(|l| l.contains("/slot-"))
            .count()
    };
    assert_eq!(
        slot_paths(&many),
        slot_paths(&one),
        "a launch stat'ed held slots:\n{many}"
    );
    assert!(
        crowded <= alone,
        "with 200 slots held a launch made {crowded} stat calls, with one {alone}:\n{many}"
    );
}

#[test]
fn a_claim_on_a_full_budget_is_refused_without_the_lock_or_a_write() {
    let env = Env::new();
    let descriptor = env.root().join("budget.json");
    let created = env.ok(&["budget", "create", "--root-run-id", "full", "--limit", "1"]);
    std::fs::write(&descriptor, created).unwrap();
    let file = descriptor.to_str().unwrap();
    env.ok(&["budget", "claim", "--descriptor", file, "--path", "a"]);
    let trace = "flock,mkdir,openat,linkat,fsync,fdatasync";
    let args = ["budget", "claim", "--descriptor", file, "--path", "b"];
    let Some(trace) = traced_exit(&env, trace, &args, 3) else {
        return;
    };
    let locks = calls(&trace, "flock").len();
    let lock_dirs = calls(&trace, "mkdir")
        .into_iter()
        .filter(|l| l.contains("admission.lock"))
        .count();
    let writes = calls(&trace, "fsync").len() + calls(&trace, "linkat").len();
    let created = calls(&trace, "openat")
        .into_iter()
        .filter(|l| l.contains("O_CREAT"))
        .count();
    assert_eq!(
        (locks, lock_dirs, writes, created),
        (0, 0, 0, 0),
        "a refusal took the lock or wrote:\n{trace}"
    );
}

/// Opens of files (not directories) that succeeded and name a run's
/// directory, whole-path or relative to the runs directory.
fn run_file_opens(trace: &str, runs_dir: &Path) -> usize {
    let ids: Vec<String> = std::fs::read_dir(runs_dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| !n.starts_with('.'))
                .collect()
        })
        .unwrap_or_default();
    let mut opens = calls(trace, "openat");
    opens.extend(calls(trace, "openat2"));
    opens
        .into_iter()
        .filter(|l| !l.contains("= -1") && !l.contains("O_DIRECTORY"))
        .filter(|l| {
            ids.iter()
                .any(|id| l.contains(&format!("\"{id}/")) || l.contains(&format!("/{id}/")))
        })
        .count()
}

/// Lists until the listing index holds a row for each of the `runs`
/// finished runs (a status is indexed once it is a couple of seconds old;
/// see `listing::list_index::SETTLE_NS`), so what is traced next is the
/// steady state.
fn settle_index(env: &Env, runs: usize) {
    let index = env.root().join("listing-index/finished-runs-v2");
    poll(std::time::Duration::from_secs(120), || {
        env.ok(&["list", "--all"]);
        let text = std::fs::read_to_string(&index).unwrap_or_default();
        let header: Option<serde_json::Value> = text
            .lines()
            .nth(1)
            .and_then(|l| serde_json::from_str(l).ok());
        header.is_some_and(|h| h["rows"] == runs)
    });
}

fn forget_index(env: &Env) {
    std::fs::remove_file(env.root().join("listing-index/finished-runs-v2")).unwrap();
}

#[test]
fn list_all_reads_one_file_per_finished_run_and_list_none() {
    let env = Env::new();
    let runs = 6;
    for _ in 0..runs {
        env.ok(&["run", "--wait", "--", "true"]);
    }
    let runs_dir = env.root().join("async-subagent-runs");
    // The first listing after runs end also frees their capacity slots
    // (reading each one's status and proof once); the steady state is traced.
    settle_index(&env, runs);
    let Some(warm) = traced(&env, "openat,openat2", &["list", "--all"]) else {
        return;
    };
    let opened = run_file_opens(&warm, &runs_dir);
    assert_eq!(
        opened, 0,
        "list --all with a warm index opened {opened} files of {runs} finished runs:\n{warm}"
    );
    // Without the index: one file per run (and the index written again).
    forget_index(&env);
    let Some(all) = traced(&env, "openat,openat2", &["list", "--all"]) else {
        return;
    };
    let opened = run_file_opens(&all, &runs_dir);
    assert_eq!(
        opened, runs,
        "list --all without an index opened {opened} files for {runs} finished runs (one each):\n{all}"
    );
    let Some(active) = traced(&env, "openat,openat2", &["list"]) else {
        return;
    };
    let mut opened = calls(&active, "openat");
    opened.extend(calls(&active, "openat2"));
    let opened: Vec<&str> = opened
        .into_iter()
        .filter(|l| l.contains("status.json"))
        .collect();
    assert!(opened.is_empty(), "list read finished runs: {opened:#?}");
}

/// What the first `list --all` after runs ended may sync, however many
/// runs: the listing index it writes (file, directory, and the directory's
/// parent when it creates it).
const FIRST_LISTING_FSYNCS: usize = 3;

/// Each run's finalizer frees its capacity slot with its proof: the first
/// listing after many runs ended releases nothing (before, it paid one
/// claim, fsynced, per run), and `capacity` counts what is really active.
#[test]
fn the_first_list_all_after_finished_runs_makes_no_fsync_per_run() {
    let env = Env::new();
    let runs = 8;
    let mut ids = Vec::new();
    for _ in 0..runs {
        let out = env.ok(&["run", "--session", "costs", "--", "true"]);
        ids.push(out.trim().to_owned());
    }
    // Not `wait`, which frees slots itself: the marker goes last.
    poll(std::time::Duration::from_secs(60), || {
        ids.iter().all(|id| !env.marker(id).exists())
    });
    let Some(trace) = traced(&env, "fsync,fdatasync", &["list", "--all"]) else {
        return;
    };
    let synced = fsyncs_of(&trace, first_pid(&trace));
    assert!(
        synced <= FIRST_LISTING_FSYNCS,
        "the first list --all after {runs} finished runs made {synced} fsyncs (at most {FIRST_LISTING_FSYNCS}):\n{trace}"
    );
}

/// Every system call in a trace (resumed halves and signals not counted,
/// nor the `fcntl(F_GETFD)` with which a debug build checks each adopted
/// descriptor).
fn syscalls(trace: &str) -> usize {
    trace
        .lines()
        .filter(|l| l.contains('(') && !l.contains("<... "))
        .filter(|l| !l.contains("--- ") && !l.contains("+++ ") && !l.contains("F_GETFD"))
        .count()
}

/// System calls `list --all` may make per finished run whose listing facts
/// are frozen, without a listing index: `fstatat` of its directory,
/// `openat2` + `fstat` + `read` + `close` of its `status.json`, and three
/// `fstatat`s that show the frozen fan-out counts still hold (its
/// descriptor, the claims directory, the next claim slot).
const LIST_ALL_SYSCALLS_PER_RUN: usize = 8;
/// The same with the run's row in the listing index: `fstatat` of its
/// directory and of its `status.json` (unchanged since the row was
/// rendered), of its descriptor (not replaced since the freeze) and of the
/// budget's claims directory (its stamp unchanged: no claim added since
/// the frozen counts were last seen to hold). No open, no read.
const LIST_ALL_INDEXED_SYSCALLS_PER_RUN: usize = 4;

#[test]
fn list_all_costs_a_fixed_number_of_relative_lookups_per_finished_run() {
    let env = Env::new();
    let runs_dir = env.root().join("async-subagent-runs");
    let whole = format!("\"{}/", runs_dir.display());
    // (warm index, no index): system calls, whole-path lookups, trace.
    let measure = |env: &Env, runs: usize| {
        settle_index(env, runs);
        let warm = traced(env, "all", &["list", "--all"])?;
        forget_index(env);
        let cold = traced(env, "all", &["list", "--all"])?;
        let by_path = |t: &str| t.lines().filter(|l| l.contains(&whole)).count();
        Some([warm, cold].map(|t| (syscalls(&t), by_path(&t), t)))
    };
    let batch = 4;
    for _ in 0..batch {
        env.ok(&["run", "--wait", "--", "true"]);
    }
    let Some(few) = measure(&env, batch) else {
        return;
    };
    for _ in 0..batch {
        env.ok(&["run", "--wait", "--", "true"]);
    }
    let Some(more) = measure(&env, 2 * batch) else {
        return;
    };
    let per_run = [LIST_ALL_INDEXED_SYSCALLS_PER_RUN, LIST_ALL_SYSCALLS_PER_RUN];
    for (i, what) in ["a warm index", "no index"].into_iter().enumerate() {
        let ((few, few_paths, _), (more, more_paths, trace)) = (&few[i], &more[i]);
        // A little slack for the allocator growing the heap once more.
        let most = batch * per_run[i] + 2;
        assert!(
            more.saturating_sub(*few) <= most,
            "with {what}, {batch} more finished runs cost {} more system calls (at most {most}):\n{trace}",
            more - few
        );
        // Per-run files are reached relative to the runs directory's handle,
        // never by a whole-path walk.
        assert_eq!(
            more_paths, few_paths,
            "with {what}, whole-path lookups grew with the runs:\n{trace}"
        );
    }
    // The index itself is read in chunks (`read`, then `pread64`).
    let reads = |t: &str| {
        let read = calls(t, "read").len() + calls(t, "pread64").len();
        read + calls(t, "openat2").len()
    };
    assert_eq!(
        reads(&more[0].2),
        reads(&few[0].2),
        "with a warm index, opens and reads grew with the finished runs:\n{}",
        more[0].2
    );
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

/// A run of `cat` on a FIFO: it cannot end before the FIFO is opened for
/// writing, so a waiter started now finds its monitor alive.
fn gated_run(env: &Env) -> (PathBuf, String) {
    let fifo = env.fifo("gate");
    let id = env.ok(&["run", "--", "cat", fifo.to_str().unwrap()]);
    (fifo, id.trim().to_owned())
}

/// `subagents --root ROOT ARGS` under `strace -f -e trace=TRACE -o LOG`.
fn strace_of(env: &Env, trace: &str, log: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(STRACE);
    command
        .args(["-f", "-qq", "-e"])
        .arg(format!("trace={trace}"))
        .arg("-o")
        .arg(log)
        .arg(env!("CARGO_BIN_EXE_subagents"))
        .arg("--root")
        .arg(env.root())
        .args(args)
        .stdin(Stdio::null());
    command
}

#[test]
fn wait_is_woken_by_the_monitors_exit_through_a_pidfd() {
    if !Path::new(STRACE).exists() {
        eprintln!("skipped: {STRACE} is not installed");
        return;
    }
    let env = Env::new();
    let (fifo, id) = gated_run(&env);
    let log = env.root().join("wait.strace");
    let mut waiter = strace_of(&env, "pidfd_open", &log, &["wait", &id])
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

#[test]
fn a_wait_on_runs_with_live_monitors_makes_no_inotify_instance() {
    // Closing an inotify instance waits for a kernel grace period (about
    // 10 ms), paid at the waiter's exit: a wait that a pidfd on each
    // monitor can wake must not make one.
    let env = Env::new();
    let Some(trace) = traced(
        &env,
        "inotify_init1,pidfd_open",
        &["run", "--wait", "--", "true"],
    ) else {
        return;
    };
    let launcher = first_pid(&trace).to_owned();
    let mine = |name: &str| {
        calls(&trace, name)
            .into_iter()
            .filter(|l| l.starts_with(&launcher))
            .count()
    };
    assert!(
        mine("pidfd_open") >= 1,
        "the monitor was not watched:\n{trace}"
    );
    assert_eq!(
        mine("inotify_init1"),
        0,
        "wait made an inotify instance:\n{trace}"
    );
}

#[test]
fn a_wait_on_a_run_of_another_machine_watches_its_directory() {
    // A monitor of another machine (a Slurm job's, on its node) has no
    // pidfd here: only its run directory's file events wake the waiter.
    if !Path::new(STRACE).exists() {
        eprintln!("skipped: {STRACE} is not installed");
        return;
    }
    let env = Env::new();
    let (fifo, id) = gated_run(&env);
    let log = env.root().join("wait.strace");
    let out = strace_of(
        &env,
        "inotify_init1",
        &log,
        &["wait", "--timeout", "1s", &id],
    )
    .env("SUBAGENTS_MACHINE_ID", "another-machine")
    .output()
    .unwrap();
    drop(std::fs::OpenOptions::new().write(true).open(&fifo));
    env.ok(&["wait", &id]);
    let trace = std::fs::read_to_string(&log).unwrap_or_default();
    if trace.is_empty() && !out.status.success() {
        eprintln!("skipped: strace could not trace here");
        return;
    }
    assert_eq!(out.status.code(), Some(124), "{out:?}");
    assert!(
        calls(&trace, "inotify_init1")
            .iter()
            .any(|l| !l.contains("= -1")),
        "no directory watch for a run of another machine:\n{trace}"
    );
}

/// The size of the section named `name` in the ELF64 little-endian file
/// `elf`, or `None` when it has no such section.
fn elf_section_size(elf: &[u8], name: &str) -> Option<u64> {
    let u16_at = |at: usize| u16::from_le_bytes(elf[at..at + 2].try_into().unwrap()) as usize;
    let u64_at = |at: usize| u64::from_le_bytes(elf[at..at + 8].try_into().unwrap());
    assert_eq!(&elf[..5], b"\x7fELF\x02", "not an ELF64 file");
    let (shoff, shentsize) = (u64_at(0x28) as usize, u16_at(0x3a));
    let (shnum, shstrndx) = (u16_at(0x3c), u16_at(0x3e));
    let header = |i: usize| shoff + i * shentsize;
    let strtab = u64_at(header(shstrndx) + 0x18) as usize;
    (0..shnum).find_map(|i| {
        let at =
            strtab + u32::from_le_bytes(elf[header(i)..header(i) + 4].try_into().unwrap()) as usize;
        let end = at + elf[at..].iter().position(|b| *b == 0)?;
        (&elf[at..end] == name.as_bytes()).then(|| u64_at(header(i) + 0x20))
    })
}

/// Every run keeps a monitor and a runner of this binary alive; the
/// dynamic loader's relocation table is read in each (and stays resident),
/// so it must stay packed (`build.rs`: DT_RELR) rather than ~20,000 RELA
/// entries of 24 bytes.
#[test]
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn the_binary_packs_its_relative_relocations() {
    let elf = std::fs::read(env!("CARGO_BIN_EXE_subagents")).unwrap();
    let rela = elf_section_size(&elf, ".rela.dyn").unwrap_or(0);
    let relr = elf_section_size(&elf, ".relr.dyn");
    assert!(
        relr.is_some(),
        "no .relr.dyn section: relative relocations are not packed"
    );
    assert!(
        rela / 24 <= 2_000,
        "{} RELA relocations left unpacked",
        rela / 24
    );
}

/// Before they wait, the monitor and the runner unmap the clean pages of
/// their code and constants (`supervisor::idle`): without it the ~3 MiB
/// per process that start-up mapped stay resident for the whole run
/// (docs/history/benchmarks-log.md, "Floors of the targets not met").
#[test]
fn the_monitor_and_the_runner_release_their_code_pages_before_waiting() {
    let env = Env::new();
    let Some(trace) = traced(&env, "madvise,execve", &["run", "--wait", "--", "true"]) else {
        return;
    };
    for role in ["__monitor", "__runner"] {
        let pid = pid_of_role(&env, role);
        let released = calls(&trace, "madvise")
            .into_iter()
            .filter(|l| l.split_whitespace().next() == Some(pid.as_str()))
            .filter(|l| l.contains("MADV_DONTNEED") && l.ends_with("= 0"))
            .count();
        // At least the binary's code and its read-only data, and the C library's code.
        assert!(
            released >= 3,
            "{role} released {released} mappings (at least 3):\n{trace}"
        );
    }
}

/// System calls `list` may make per active run: the observer and the
/// listing share one read of its `status.json` (`fstatat` of the directory,
/// then `openat` + `fstat` + `read` + `close`), look for its proof (1 each)
/// and check its monitor in `/proc` (`openat`, two `read`s, `close`, each);
/// the stale-run check looks for a result file (1); its fan-out budget is
/// read live (the persisted descriptor 4, the budget directory held and read
/// back 2, its two trust checks 2, the manifest 4, the claims listed 7 and
/// the handle closed 1); its capacity slot's owner is read and, the run
/// being listed active, its status is not read again (slot directory open,
/// `fstat`, `owner.json` 5, two `close`s). It was 94, in two passes that
/// read each status three times, until the observer handed its read to the
/// listing.
const LIST_SYSCALLS_PER_ACTIVE_RUN: usize = 48;

#[test]
fn list_costs_a_fixed_number_of_system_calls_per_active_run_and_reads_its_status_once() {
    let env = Env::new();
    let session = ["run", "--session", "costs", "--", "sleep", "600"];
    let measure = |env: &Env| traced(env, "all", &["list"]);
    let mut ids = vec![env.ok(&session).trim().to_owned()];
    let Some(few) = measure(&env) else {
        return;
    };
    let batch = 4;
    for _ in 0..batch {
        ids.push(env.ok(&session).trim().to_owned());
    }
    let Some(more) = measure(&env) else {
        return;
    };
    for id in &ids {
        env.ok(&["stop", id]);
    }
    let grown = syscalls(&more).saturating_sub(syscalls(&few));
    eprintln!("{batch} more active runs: {grown} more system calls");
    // A little slack for the allocator growing the heap once more.
    let most = batch * LIST_SYSCALLS_PER_ACTIVE_RUN + 2;
    assert!(
        grown <= most,
        "{batch} more active runs cost {grown} more system calls (at most {most}):\n{more}"
    );
    for id in &ids {
        let status = format!("/{id}/status.json\"");
        let reads = more
            .lines()
            .filter(|l| l.contains(" openat(") && l.contains(&status))
            .count();
        assert_eq!(
            reads, 1,
            "the status of {id} was opened {reads} times:\n{more}"
        );
    }
    // Paths are resolved once per listing, not once per run: the runs and
    // budgets roots' `canonicalize` (one `readlink` per component) are not
    // repeated for each run; the one `readlink` per run reads back the
    // budget directory's handle.
    let readlinks = |t: &str| {
        calls(t, "readlink")
            .into_iter()
            .filter(|l| !l.contains("\"/proc/self/fd/"))
            .count()
    };
    assert_eq!(
        readlinks(&more),
        readlinks(&few),
        "path resolutions grew with the active runs:\n{more}"
    );
}

#[test]
fn status_of_an_active_run_reads_no_capacity_slot() {
    let env = Env::new();
    let launch = ["run", "--session", "costs", "--", "sleep", "600"];
    let ids: Vec<String> = (0..3).map(|_| env.ok(&launch).trim().to_owned()).collect();
    let traced_status = traced(&env, "openat,openat2", &["status", &ids[0]]);
    for id in &ids {
        env.ok(&["stop", id]);
    }
    let Some(trace) = traced_status else {
        return;
    };
    // Freeing a session's over slots reads every slot's owner (and its run's
    // status): `status` of an active run, which has no slot to give back,
    // does not, so it costs the same however many runs are active.
    let owners: Vec<&str> = trace
        .lines()
        .filter(|l| l.contains("/owner.json\""))
        .collect();
    assert!(owners.is_empty(), "status read slot owners: {owners:#?}");
    let others: Vec<&str> = trace
        .lines()
        .filter(|l| l.contains("/status.json\"") && !l.contains(&format!("/{}/", ids[0])))
        .collect();
    assert!(others.is_empty(), "status read other runs: {others:#?}");
}
