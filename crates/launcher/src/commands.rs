//! The user-facing commands other than `wait`.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use process_identity::Liveness;
use serde_json::json;
use status::layout::files;
use status::list::{Hooks, ListOptions, Resolved, RunSummary};
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
use supervisor::observer;

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

/// The observer's options for this state root.
pub fn observer_options(layout: &Layout) -> observer::Options {
    observer::Options::new(layout.root())
}

/// Observes one run: a run whose monitor is gone is finalized here
/// (see `supervisor::observer`); a run with a live monitor is left to it.
pub fn observe(layout: &Layout, id: &str) -> observer::Observation {
    match status::list::exact_run_dir(layout, id) {
        Some(dir) => observer::observe(&dir, &observer_options(layout)),
        None => observer::Observation::NoStatus,
    }
}

/// Loads a run (observing and reconciling it), exit 4 when it has no status.
pub fn load(layout: &Layout, id: &str) -> CliResult<RunSummary> {
    load_observed(layout, id).map(|(run, _)| run)
}

/// [`load`], also returning what the observer found.
fn load_observed(layout: &Layout, id: &str) -> CliResult<(RunSummary, observer::Observation)> {
    let id = resolve(layout, id)?;
    let observation = observe(layout, &id);
    let budgets = layout.fanout_budgets_dir();
    let fanout = |dir: &Path| crate::fanout::live_snapshot(&budgets, dir);
    let hooks = Hooks {
        fanout: Some(&fanout),
        on_repaired: Some(&crate::procs::kill_step_groups),
    };
    let run = status::list::load(layout, &id, true, now_ms(), &hooks)?
        .ok_or_else(|| CliError::new(Exit::NotFound, format!("run '{id}' has no status.json")))?;
    Ok((run, observation))
}

/// `subagents status`.
pub fn status(layout: &Layout, id: &str, json: bool) -> CliResult {
    let (run, observation) = load_observed(layout, id)?;
    admission::release_finished(layout, run.status.session_id.as_deref());
    if json {
        println!("{}", serde_json::to_string_pretty(&run).unwrap_or_default());
        return Ok(());
    }
    println!("{}", describe(&run));
    match observation {
        observer::Observation::Unproven(why) => println!("  Observer: retained: {why}"),
        observer::Observation::RunnerAlive(pid) => {
            println!("  Observer: its monitor is gone; runner {pid} still runs")
        }
        _ => {}
    }
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
    observer::observe_active(layout, &observer_options(layout));
    let budgets = layout.fanout_budgets_dir();
    let options = ListOptions {
        all: args.all,
        session: args.session.clone(),
        limit: args.limit,
        reconcile: true,
        now: now_ms(),
        hooks: Hooks {
            fanout: Some(&|dir| crate::fanout::live_snapshot(&budgets, dir)),
            on_repaired: Some(&crate::procs::kill_step_groups),
        },
    };
    let runs = status::list::list(layout, &options)?;
    admission::release_finished(
        layout,
        runs.iter().filter_map(|r| r.status.session_id.as_deref()),
    );
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&runs).unwrap_or_default()
        );
    } else {
        let heading = if args.all {
            "Async runs"
        } else {
            "Active async runs"
        };
        println!(
            "{}",
            status::format::format_run_list(&runs, heading, now_ms(), home().as_deref())
        );
    }
    Ok(())
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
    settle_without_monitor(layout, &run.id, reason);
    let final_run = load(layout, &run.id)?;
    admission::release_finished(layout, final_run.status.session_id.as_deref());
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

/// A run whose monitor is gone has nobody to finalize it: wait (bounded)
/// for its runner to exit, kill the runner if it does not, then observe.
fn settle_without_monitor(layout: &Layout, id: &str, reason: &str) {
    let options = observer::Options {
        stop_reason: Some(reason.to_owned()),
        ..observer_options(layout)
    };
    let dir = layout.run_dir(id);
    let deadline = Instant::now() + supervisor::runner::KILL_GRACE + Duration::from_secs(3);
    loop {
        let observation = observer::observe(&dir, &options);
        let observer::Observation::RunnerAlive(_) = observation else {
            return;
        };
        if Instant::now() >= deadline {
            if let Ok(Some(status)) = status::model::read_status(&dir)
                && let Some(identity) = &status.runner_identity
                && identity.liveness() == Liveness::Alive
            {
                signal_group(identity.pid, Signal::SIGKILL);
            }
            observer::observe(&dir, &options);
            return;
        }
        // The runner is not our child: its exit shows only in /proc.
        std::thread::sleep(Duration::from_millis(50));
    }
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
    let now = now_ms();
    update_status(dir, |s| {
        let s = s?;
        s.state.is_active().then(|| {
            // The monitor, or else the observer, writes the real proof.
            let mut s = reconcile::fail_active(s, reason, now);
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
        let output = run.status.output_file.as_ref().map(|o| dir.join(o));
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

fn print_file(path: &Path, label: &str, shown: &mut bool) -> CliResult<bool> {
    let text = std::fs::read(path).unwrap_or_default();
    if text.is_empty() {
        return Ok(false);
    }
    if *shown || label != "output" {
        eprintln!("==> {label} ({}) <==", path.display());
    }
    *shown = true;
    std::io::stdout()
        .write_all(&text)
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
    let Ok(mut file) = std::fs::File::open(path) else {
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
    let mut observed = Vec::new();
    for (id, observation) in observer::observe_active(layout, &observer_options(layout)) {
        if let observer::Observation::Finalized {
            repaired: Some(message),
            ..
        } = &observation
        {
            repaired.push(json!({"runId": id, "message": message}));
        }
        if let Some(line) = observation.line() {
            observed.push(json!({"runId": id, "message": line}));
        }
    }
    let mut names = status::list::run_names(layout)?;
    names.extend(status::index::read_index(&layout.runs_dir())?);
    names.sort();
    names.dedup();
    let mut sessions = Vec::new();
    for id in names {
        let Some(dir) = status::list::exact_run_dir(layout, &id) else {
            continue;
        };
        let outcome = reconcile::reconcile_run(&dir, reconcile::Options::at(now_ms()))?;
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
        println!("{}", json!({"repaired": repaired, "observed": observed}));
    } else if repaired.is_empty() && observed.is_empty() {
        println!("No stale runs.");
    } else {
        for r in &observed {
            println!(
                "{} {}",
                r["runId"].as_str().unwrap_or(""),
                r["message"].as_str().unwrap_or("")
            );
        }
        for r in &repaired {
            println!(
                "{} failed: {}",
                r["runId"].as_str().unwrap_or(""),
                r["message"].as_str().unwrap_or("")
            );
        }
    }
    Ok(())
}

/// `subagents dismiss`: display-only; processes and the marker stay (a run
/// whose monitor is gone is observed first, which may finalize it).
pub fn dismiss(layout: &Layout, id: &str) -> CliResult {
    let id = resolve(layout, id)?;
    observe(layout, &id);
    let dir = layout.run_dir(&id);
    let now = now_ms();
    let dismissed = update_status(&dir, |s| {
        let mut s = s?;
        s.display_dismissed_at = Some(now);
        Some(s)
    })?
    .ok_or_else(|| CliError::new(Exit::NotFound, format!("run '{id}' has no status.json")))?;
    admission::release_finished(layout, dismissed.session_id.as_deref());
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
    // Runs whose monitor is gone are finalized first; what keeps one is said.
    let held = pools
        .count(&session, limit)
        .map_err(admission::capacity_error)?;
    let mut observed = std::collections::HashMap::new();
    for run_id in held.slots.iter().filter_map(|s| s.run_id.clone()) {
        if let observer::Observation::Unproven(why) = observe(layout, &run_id) {
            observed.insert(run_id, why);
        }
    }
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
        let mut entry = json!({"slot": slot, "release": verdict});
        if let Some(why) = slot.run_id.as_ref().and_then(|id| observed.get(id)) {
            entry["observer"] = json!(why);
        }
        slots.push(entry);
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
        let observer = entry["observer"]
            .as_str()
            .map(|why| format!(" | observer: {why}"))
            .unwrap_or_default();
        println!("  slot-{}: run {run}{verdict}{observer}", slot["slot"]);
    }
    Ok(())
}
