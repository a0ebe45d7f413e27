//! The user-facing commands other than `wait`.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use process_identity::Liveness;
use serde_json::json;
use status::layout::files;
use status::list::{Hooks, Resolved, RunSummary};
use status::model::update_status;
use status::reconcile::{self, Outcome};
use status::{Layout, RunState, now_ms};

use crate::admission;
use crate::cli::{ListArgs, RunArgs};
use crate::error::{CliError, CliResult, Exit};
use crate::launch;
use crate::procs::signal_group;
use crate::root::home;
use crate::wait::{wait_for_runs, watch_dirs};

/// `subagents run`.
pub fn run(layout: &Layout, args: &RunArgs) -> CliResult {
    let launched = launch::run(layout, args)?;
    if args.json {
        println!("{}", serde_json::to_string(&launched).unwrap_or_default());
    } else {
        println!("{}", launched.run_id);
    }
    if !args.wait {
        return Ok(());
    }
    let runs = wait_for_runs(layout, std::slice::from_ref(&launched.run_id), None)?;
    launch::exit_for(runs[0].status.state)
}

/// Resolves a run id or prefix, exit 4 when unknown or ambiguous.
pub fn resolve(layout: &Layout, id: &str) -> CliResult<String> {
    match status::list::resolve(layout, id)? {
        Resolved::Run(id) => Ok(id),
        Resolved::NotFound => Err(CliError::new(
            Exit::NotFound,
            format!("no such run: '{id}'"),
        )),
        Resolved::Ambiguous(ids) => Err(CliError::new(
            Exit::NotFound,
            format!("run id prefix '{id}' is ambiguous: {}", ids.join(", ")),
        )),
    }
}

/// Loads a run (reconciling it), exit 4 when it has no status.
pub fn load(layout: &Layout, id: &str) -> CliResult<RunSummary> {
    let id = resolve(layout, id)?;
    let budgets = layout.fanout_budgets_dir();
    let fanout = |dir: &Path| crate::fanout::live_snapshot(&budgets, dir);
    let hooks = Hooks {
        fanout: Some(&fanout),
        on_repaired: Some(&crate::procs::kill_step_groups),
    };
    let mut skipped = Vec::new();
    let run = status::list::load_noting(layout, &id, true, now_ms(), &hooks, &mut skipped);
    report_skipped(&skipped);
    run?.ok_or_else(|| CliError::new(Exit::NotFound, format!("run '{id}' has no status.json")))
}

/// One stderr line per repair a read-only command could not write.
pub fn report_skipped(skipped: &[String]) {
    for line in skipped {
        eprintln!("subagents: warning: {line}");
    }
}

/// `subagents status`.
pub fn status(layout: &Layout, id: &str, json: bool) -> CliResult {
    let run = load(layout, id)?;
    admission::release_finished(layout, run.status.session_id.as_deref());
    if json {
        println!("{}", serde_json::to_string_pretty(&run).unwrap_or_default());
        return Ok(());
    }
    println!("{}", describe(&run));
    Ok(())
}

/// The human view of one run.
pub fn describe(run: &RunSummary) -> String {
    let home = home();
    let s = &run.status;
    let mut lines = status::format::run_lines(run, now_ms(), home.as_deref());
    lines.push(format!("  State: {}", s.state));
    if let Some(pid) = s.pid {
        lines.push(format!("  Runner pid: {pid}"));
    }
    if let Some(root) = s.extra.get("sessionRoot").and_then(|v| v.as_str()) {
        lines.push(format!("  Session root: {root}"));
    }
    if let (Some(start), end) = (s.started_at, s.ended_at) {
        let elapsed = end.unwrap_or_else(now_ms).saturating_sub(start);
        lines.push(format!(
            "  Elapsed: {}",
            status::format::format_duration(elapsed)
        ));
    }
    if s.error.is_none() {
        for (i, step) in s.steps().iter().enumerate() {
            if let Some(error) = &step.error {
                lines.push(format!("  Step {} error: {error}", i + 1));
            }
        }
    }
    if let Some(proof) = run.proof() {
        let mut line = format!("  Process terminal: {}", proof.state.as_str());
        if let Some(reason) = &proof.reason {
            line.push_str(&format!(" ({reason})"));
        }
        lines.push(line);
    }
    if let Some(step) = s.steps().first()
        && let Some(code) = step.exit_code
    {
        lines.push(format!("  Exit code: {code}"));
    }
    lines.join("\n")
}

/// `subagents list`.
pub fn list(layout: &Layout, args: &ListArgs) -> CliResult {
    crate::listing::list(layout, args)
}

fn print_unreadable(unreadable: &[status::list::UnreadableRun]) {
    if unreadable.is_empty() {
        return;
    }
    println!("\nUnreadable runs: {}\n", unreadable.len());
    for run in unreadable {
        println!(
            "- {} | unreadable | {}",
            atomic_file::escape(&run.id),
            run.error
        );
    }
}

/// `subagents stop`: ask the runner (SIGTERM), then force the groups.
pub fn stop(layout: &Layout, id: &str, reason: &str, json: bool) -> CliResult {
    let run = load(layout, id)?;
    let dir = run.async_dir.clone();
    if run.status.state.is_active() {
        request_stop(&dir, reason)?;
        let runner_alive = run
            .status
            .runner_identity
            .as_ref()
            .is_some_and(|r| r.liveness() == Liveness::Alive);
        if runner_alive {
            signal_runner(&run, Signal::SIGTERM);
        }
        // The runner needs its kill grace (2 s) to end COMMAND's group.
        let grace = supervisor::runner::KILL_GRACE + Duration::from_secs(3);
        if !wait_terminal(layout, &run.id, grace)? {
            force_stop(&dir, reason)?;
        }
    }
    let final_run = load(layout, &run.id)?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&final_run).unwrap_or_default()
        );
    } else {
        println!("{} {}", final_run.id, final_run.status.state);
    }
    Ok(())
}

fn request_stop(dir: &Path, reason: &str) -> CliResult {
    update_status(dir, |s| {
        let mut s = s?;
        s.stop_reason = Some(reason.to_owned());
        s.extra.insert("stopRequestedAt".into(), json!(now_ms()));
        Some(s)
    })?;
    Ok(())
}

fn signal_runner(run: &RunSummary, sig: Signal) {
    if let Some(identity) = &run.status.runner_identity
        && identity.liveness() == Liveness::Alive
    {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(identity.pid as i32), sig);
    }
}

fn wait_terminal(layout: &Layout, id: &str, within: Duration) -> CliResult<bool> {
    let deadline = Instant::now() + within;
    let dir = layout.run_dir(id);
    let (_watcher, events) = watch_dirs(std::slice::from_ref(&dir));
    loop {
        let current = status::model::read_status(&dir)?;
        if current.is_none_or(|s| !s.state.is_active()) {
            return Ok(true);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(false);
        }
        let _ = events.recv_timeout(left.min(Duration::from_millis(500)));
    }
}

/// The runner did not end in time: kill its group and every step's group,
/// and record the stop ourselves unless the runner managed to.
fn force_stop(dir: &Path, reason: &str) -> CliResult {
    let Some(status) = status::model::read_status(dir)? else {
        return Ok(());
    };
    if let Some(identity) = &status.runner_identity
        && identity.liveness() == Liveness::Alive
    {
        signal_group(identity.pid, Signal::SIGKILL);
    }
    crate::procs::kill_step_groups(&status);
    let monitor_alive = status
        .monitor_identity
        .as_ref()
        .is_some_and(|m| m.liveness() == Liveness::Alive);
    let now = now_ms();
    update_status(dir, |s| {
        let s = s?;
        s.state.is_active().then(|| {
            // A live monitor still writes the real proof; otherwise nobody will.
            let mut s = if monitor_alive {
                reconcile::fail_active(s, reason, now)
            } else {
                reconcile::repair(s, reason, now)
            };
            s.state = RunState::Stopped;
            s.stopped = Some(true);
            s.error = Some(reason.to_owned());
            for step in s
                .steps
                .iter_mut()
                .flatten()
                .filter(|st| st.status == "failed")
            {
                step.status = "stopped".into();
                step.stopped = Some(true);
            }
            s
        })
    })?;
    Ok(())
}

/// `subagents logs`.
pub fn logs(layout: &Layout, id: &str, follow: bool) -> CliResult {
    let run = load(layout, id)?;
    let dir = run.async_dir.clone();
    let sources: Vec<PathBuf> = [
        "external-0.stdout.log",
        "external-0.stderr.log",
        files::RUNNER_STDERR,
    ]
    .iter()
    .map(|n| dir.join(n))
    .collect();
    if !follow {
        let output = run
            .status
            .output_file
            .as_ref()
            .map(|o| rebased_output(&dir, o));
        let terminal = !run.status.state.is_active();
        let mut shown = false;
        if let Some(output) = output.filter(|o| terminal && o.exists()) {
            print_file(&output, "output", &mut shown)?;
            return print_file(&sources[1], "stderr", &mut shown).map(|_| ());
        }
        for (path, label) in sources.iter().zip(["stdout", "stderr", "runner stderr"]) {
            print_file(path, label, &mut shown)?;
        }
        return Ok(());
    }
    follow_logs(layout, &run.id, &sources)
}

/// The output file of a run whose root was moved or copied: the status still
/// records the old absolute path inside the old run directory; the file now
/// lives in `dir`. Other absolute paths stay as recorded.
fn rebased_output(dir: &Path, recorded: &str) -> PathBuf {
    let path = dir.join(recorded);
    if path.starts_with(dir) {
        return path;
    }
    let same_run = path.parent().and_then(Path::file_name) == dir.file_name();
    match path.file_name().map(|name| dir.join(name)) {
        Some(moved) if same_run && moved.exists() => moved,
        _ => path,
    }
}

fn print_file(path: &Path, label: &str, shown: &mut bool) -> CliResult<bool> {
    // A FIFO or symlink in place of a log is skipped, never waited on.
    let Ok(mut file) = atomic_file::read::open_regular(path) else {
        return Ok(false);
    };
    if file.metadata().map(|m| m.len()).unwrap_or(0) == 0 {
        return Ok(false);
    }
    if *shown || label != "output" {
        eprintln!("==> {label} ({}) <==", atomic_file::escape_path(path));
    }
    *shown = true;
    std::io::copy(&mut file, &mut std::io::stdout())
        .map_err(|e| CliError::failed(format!("failed to write logs: {e}")))?;
    Ok(true)
}

fn follow_logs(layout: &Layout, id: &str, sources: &[PathBuf]) -> CliResult {
    let dir = layout.run_dir(id);
    let (_watcher, events) = watch_dirs(std::slice::from_ref(&dir));
    let mut offsets = vec![0u64; sources.len()];
    loop {
        let over = status::model::read_status(&dir)?.is_none_or(|s| !s.state.is_active());
        for (path, offset) in sources.iter().zip(offsets.iter_mut()) {
            *offset += copy_new_bytes(path, *offset)?;
        }
        if over {
            return Ok(());
        }
        let _ = events.recv_timeout(Duration::from_millis(500));
    }
}

fn copy_new_bytes(path: &Path, offset: u64) -> CliResult<u64> {
    let Ok(mut file) = atomic_file::read::open_regular(path) else {
        return Ok(0);
    };
    file.seek(SeekFrom::Start(offset))
        .map_err(|e| CliError::failed(format!("failed to read '{}': {e}", path.display())))?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)
        .map_err(|e| CliError::failed(format!("failed to read '{}': {e}", path.display())))?;
    let mut out = std::io::stdout();
    out.write_all(&bytes)
        .and_then(|()| out.flush())
        .map_err(|e| CliError::failed(format!("failed to write logs: {e}")))?;
    Ok(bytes.len() as u64)
}

/// `subagents reconcile`.
pub fn reconcile(layout: &Layout, json: bool) -> CliResult {
    let mut repaired = Vec::new();
    let mut names = status::list::run_names(layout)?;
    names.extend(status::index::read_index(&layout.runs_dir())?);
    names.sort();
    names.dedup();
    let mut sessions = Vec::new();
    let mut unreadable = Vec::new();
    for id in names {
        let Some(dir) = status::list::exact_run_dir(layout, &id) else {
            continue;
        };
        // One unreadable run or one repair that cannot be written never stops the others.
        let outcome = match reconcile::reconcile_run(&dir, reconcile::Options::at(now_ms())) {
            Ok(outcome) => outcome,
            Err(e) => {
                match status::model::read_status(&dir) {
                    Ok(_) => report_skipped(&[format!(
                        "skipped the stale-run repair of '{}': {}",
                        atomic_file::escape(&id),
                        atomic_file::escape(&e.to_string())
                    )]),
                    Err(e) => unreadable.push(status::list::UnreadableRun::new(&id, &dir, &e)),
                }
                continue;
            }
        };
        if let Some(session) = outcome.status().and_then(|s| s.session_id.clone()) {
            sessions.push(session);
        }
        if let Outcome::Repaired { message, status } = outcome {
            // Runner and monitor are gone: nobody else will end the commands.
            crate::procs::kill_step_groups(&status);
            repaired.push(json!({"runId": id, "message": message}));
        }
    }
    admission::release_finished(layout, sessions.iter().map(String::as_str));
    if json {
        println!(
            "{}",
            json!({"repaired": repaired, "unreadable": unreadable})
        );
    } else if repaired.is_empty() {
        println!("No stale runs.");
    } else {
        for r in &repaired {
            println!(
                "{} failed: {}",
                r["runId"].as_str().unwrap_or(""),
                r["message"].as_str().unwrap_or("")
            );
        }
    }
    if !json {
        print_unreadable(&unreadable);
    }
    Ok(())
}

/// `subagents dismiss`: display-only; processes and the marker stay.
pub fn dismiss(layout: &Layout, id: &str) -> CliResult {
    let id = resolve(layout, id)?;
    let dir = layout.run_dir(&id);
    let now = now_ms();
    update_status(&dir, |s| {
        let mut s = s?;
        s.display_dismissed_at = Some(now);
        Some(s)
    })?
    .ok_or_else(|| CliError::new(Exit::NotFound, format!("run '{id}' has no status.json")))?;
    println!("{id} dismissed");
    Ok(())
}

/// `subagents capacity`: used/limit and each slot's run and release verdict.
pub fn capacity(
    layout: &Layout,
    session: Option<&str>,
    limit: Option<u32>,
    json: bool,
) -> CliResult {
    let session = admission::session_id(session);
    let pools = admission::pools(layout);
    let none = std::collections::HashSet::new();
    let snapshot = pools
        .reconcile(&session, limit, &none)
        .map_err(admission::capacity_error)?;
    let mut slots = Vec::new();
    for slot in &snapshot.slots {
        let verdict = slot.run_id.as_deref().and_then(|run_id| {
            let query = capacity::InspectQuery {
                run_id,
                session_id: Some(&session),
                async_dir: None,
            };
            pools.inspect(&query, &none).ok().map(|i| i.release)
        });
        slots.push(json!({"slot": slot, "release": verdict}));
    }
    if json {
        let out = json!({"session": session, "used": snapshot.used, "limit": snapshot.limit, "slots": slots});
        println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
        return Ok(());
    }
    let limit = if snapshot.limit == 0 {
        "unlimited".to_owned()
    } else {
        snapshot.limit.to_string()
    };
    println!(
        "Active async capacity: {}/{limit} used (session {session})",
        snapshot.used
    );
    for entry in &slots {
        let slot = &entry["slot"];
        let run = slot["runId"].as_str().unwrap_or("<unreadable owner>");
        let release = &entry["release"];
        let verdict = match (release["state"].as_str(), release["reason"].as_str()) {
            (Some(state), Some(reason)) => format!(" | {state}: {reason}"),
            (Some(state), None) => format!(" | {state}"),
            _ => String::new(),
        };
        println!("  slot-{}: run {run}{verdict}", slot["slot"]);
    }
    Ok(())
}
