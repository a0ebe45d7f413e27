//! The user-facing commands other than `wait`.

use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use process_identity::Liveness;
use serde_json::json;
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
    if !args.json {
        println!("{}", launched.run_id);
    } else if !args.wait {
        println!("{}", serde_json::to_string(&launched).unwrap_or_default());
    }
    if !args.wait {
        return Ok(());
    }
    hint_on_interrupt(&launched.run_id);
    let runs = wait_for_runs(layout, std::slice::from_ref(&launched.run_id), None)?;
    let run = &runs[0];
    if args.json {
        // The outcome, on one line: the final run summary.
        println!("{}", serde_json::to_string(run).unwrap_or_default());
    } else if run.status.state != RunState::Complete {
        eprintln!("{}", crate::wait::outcome_line(run));
    }
    launch::exit_for(run.status.state)
}

static INTERRUPT_HINT: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();

extern "C" fn on_interrupt(_: libc::c_int) {
    if let Some(hint) = INTERRUPT_HINT.get() {
        // SAFETY: write(2) is async-signal-safe; the buffer is never freed.
        unsafe {
            libc::write(2, hint.as_ptr().cast(), hint.len());
        }
    }
    // SAFETY: _exit(2) is async-signal-safe.
    unsafe { libc::_exit(130) }
}

/// Ctrl-C on `run --wait` ends the wait, not the run (it lives in its own
/// session): say so, and how to stop it.
fn hint_on_interrupt(id: &str) {
    let id = atomic_file::escape(id);
    let hint = format!(
        "\nsubagents: stopped waiting; run {id} goes on in the background\n  hint: `subagents stop {id}` stops it, `subagents wait {id}` waits again\n"
    );
    let _ = INTERRUPT_HINT.set(hint.into_bytes());
    let handler: extern "C" fn(libc::c_int) = on_interrupt;
    // SAFETY: the handler only calls async-signal-safe functions.
    unsafe {
        libc::signal(libc::SIGINT, handler as libc::sighandler_t);
    }
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
    let mut skipped = Vec::new();
    let run = status::list::load_noting(layout, &id, true, now_ms(), &hooks, &mut skipped);
    report_skipped(&skipped);
    let run = run?
        .ok_or_else(|| CliError::new(Exit::NotFound, format!("run '{id}' has no status.json")))?;
    Ok((run, observation))
}

/// One stderr line per repair a read-only command could not write.
pub fn report_skipped(skipped: &[String]) {
    for line in skipped {
        eprintln!("subagents: warning: {line}");
    }
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
    let now = now_ms();
    let mut lines = status::format::run_lines(run, now, home.as_deref());
    // Our own step lines: numbered like `logs` headers, skipped steps named.
    let steps = s.steps();
    if lines.len() > steps.len() {
        for (i, step) in steps.iter().enumerate() {
            lines[i + 1] = step_line(i, step, !s.state.is_active(), now);
        }
    }
    lines.push(format!("  State: {}", s.state));
    if s.timed_out == Some(true) {
        let after = s
            .timeout_ms
            .map(|ms| format!(" after {}", status::format::format_duration(ms)))
            .unwrap_or_default();
        lines.push(format!("  Timed out{after}"));
    }
    if let Some(pid) = s.pid {
        lines.push(format!("  Runner pid: {pid}"));
    }
    if let Some(root) = s.extra.get("sessionRoot").and_then(|v| v.as_str()) {
        lines.push(format!("  Session root: {root}"));
    }
    if let (Some(start), end) = (s.started_at, s.ended_at) {
        let elapsed = end.unwrap_or(now).saturating_sub(start);
        lines.push(format!(
            "  Elapsed: {}",
            status::format::format_duration(elapsed)
        ));
    }
    let failing = failing_step(s.steps());
    if let Some((i, step)) = failing {
        let error = step.error.as_deref().unwrap_or("exited non-zero");
        lines.push(format!(
            "  Failed step: {}/{} {}: {error}",
            i + 1,
            steps.len(),
            step.agent
        ));
    }
    if let Some(proof) = run.proof() {
        let mut line = format!("  Process terminal: {}", proof.state.as_str());
        if let Some(reason) = &proof.reason {
            line.push_str(&format!(" ({reason})"));
        }
        lines.push(line);
    }
    if !s.state.is_active() {
        // The failing step's code, else the last step that has one.
        let ended = failing
            .map(|(_, st)| st)
            .or_else(|| steps.iter().rev().find(|st| st.exit_code.is_some()));
        if let Some(step) = ended {
            if let Some(signal) = step
                .external_process
                .as_ref()
                .and_then(|p| p.process_signal.as_deref())
            {
                lines.push(format!("  Signal: {signal}"));
            }
            if let Some(code) = step.exit_code {
                lines.push(format!("  Exit code: {code}"));
            }
        }
    }
    lines.join("\n")
}

/// The first step that failed on its own (not one skipped or stopped
/// because of it).
fn failing_step(steps: &[status::model::Step]) -> Option<(usize, &status::model::Step)> {
    steps.iter().enumerate().find(|(_, st)| {
        !is_skipped(st) && (st.status == "failed" || st.exit_code.is_some_and(|c| c != 0))
    })
}

fn is_skipped(step: &status::model::Step) -> bool {
    step.error
        .as_deref()
        .is_some_and(|e| e.starts_with("skipped:") || e.starts_with("stopped: a sibling"))
}

fn step_line(i: usize, step: &status::model::Step, over: bool, now: u64) -> String {
    let state = if is_skipped(step) || (over && step.status == "pending") {
        "skipped"
    } else {
        step.status.as_str()
    };
    let mut parts = vec![format!("  {}. {}", i + 1, step.agent), state.to_owned()];
    match (step.duration_ms, step.started_at) {
        (Some(ms), _) => parts.push(status::format::format_duration(ms)),
        (None, Some(start)) if step.status == "running" => parts.push(format!(
            "{} so far",
            status::format::format_duration(now.saturating_sub(start))
        )),
        _ => {}
    }
    // A skipped step never ran: the exit code its record carries (the
    // reference writes 1) is not one a process returned.
    if let Some(code) = step
        .exit_code
        .filter(|_| step.status != "running" && state != "skipped")
    {
        parts.push(format!("exit {code}"));
    }
    if let Some(error) = &step.error {
        parts.push(error.clone());
    }
    parts.join(" | ")
}

/// `subagents list`.
pub fn list(layout: &Layout, args: &ListArgs) -> CliResult {
    if args.dismissed {
        return list_dismissed(layout, args);
    }
    observer::observe_active(layout, &observer_options(layout));
    let by_start = args.sort == Some(crate::cli::SortKey::Started);
    use std::io::IsTerminal;
    let table = args.short || (std::io::stdout().is_terminal() && !args.long);
    // The detailed text and JSON stream through `listing` with bounded memory;
    // sorting by start and the one-line table need every row first.
    if !by_start && (args.json || !table) {
        return crate::listing::list(layout, args);
    }
    let budgets = layout.fanout_budgets_dir();
    let options = ListOptions {
        all: args.all,
        session: args.session.clone(),
        // Sorted by start below, then cut.
        limit: args.limit.filter(|_| !by_start),
        reconcile: true,
        now: now_ms(),
        hooks: Hooks {
            fanout: Some(&|dir| crate::fanout::live_snapshot(&budgets, dir)),
            on_repaired: Some(&crate::procs::kill_step_groups),
        },
    };
    let listing = status::list::list(layout, &options)?;
    report_skipped(&listing.skipped_repairs);
    let mut runs = listing.runs;
    if by_start {
        runs.sort_by_key(|r| std::cmp::Reverse(r.status.started_at.unwrap_or(0)));
        runs.truncate(args.limit.unwrap_or(usize::MAX));
    }
    admission::release_finished(
        layout,
        runs.iter().filter_map(|r| r.status.session_id.as_deref()),
    );
    if args.json {
        // Unreadable runs follow the readable ones as `{id, asyncDir, state: "unreadable", error}`.
        let mut entries: Vec<serde_json::Value> = runs
            .iter()
            .map(|r| serde_json::to_value(r).unwrap_or_default())
            .collect();
        entries.extend(
            listing
                .unreadable
                .iter()
                .map(|u| serde_json::to_value(u).unwrap_or_default()),
        );
        println!(
            "{}",
            serde_json::to_string_pretty(&entries).unwrap_or_default()
        );
    } else {
        let heading = if args.all {
            "Async runs"
        } else {
            "Active async runs"
        };
        let terminal = std::io::stdout().is_terminal();
        if !runs.is_empty() && table {
            let no_color = std::env::var("NO_COLOR").ok();
            let color = crate::table::use_color(args.color, terminal, no_color.as_deref());
            println!(
                "{}",
                crate::table::render(&runs, now_ms(), home().as_deref(), color)
            );
            print_unreadable(&listing.unreadable);
            return Ok(());
        }
        println!(
            "{}",
            status::format::format_run_list(&runs, heading, now_ms(), home().as_deref())
        );
        print_unreadable(&listing.unreadable);
    }
    Ok(())
}

/// `list --all --dismissed`: the runs `dismiss` hid, newest first.
fn list_dismissed(layout: &Layout, args: &ListArgs) -> CliResult {
    let hooks = Hooks {
        fanout: None,
        on_repaired: None,
    };
    let now = now_ms();
    let mut runs: Vec<RunSummary> = status::list::run_names(layout)?
        .iter()
        .filter_map(|id| {
            status::list::load(layout, id, false, now, &hooks)
                .ok()
                .flatten()
        })
        .filter(|r| r.status.display_dismissed_at.is_some())
        .filter(|r| {
            args.session
                .as_deref()
                .is_none_or(|s| r.status.session_id.as_deref() == Some(s))
        })
        .collect();
    runs.sort_by_key(|r| std::cmp::Reverse(r.status.sort_time()));
    runs.truncate(args.limit.unwrap_or(usize::MAX));
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&runs).unwrap_or_default()
        );
    } else {
        println!(
            "{}",
            status::format::format_run_list(&runs, "Dismissed runs", now, home().as_deref())
        );
    }
    Ok(())
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
    let was_over = !run.status.state.is_active();
    if !was_over {
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
    } else if was_over {
        println!(
            "{} was already over ({}); nothing to stop",
            final_run.id, final_run.status.state
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
            json!({"repaired": repaired, "observed": observed, "unreadable": unreadable})
        );
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
    if !json {
        print_unreadable(&unreadable);
    }
    Ok(())
}

/// `subagents dismiss`: display-only; processes and the marker stay. An
/// active run is refused unless `force`: it would vanish from `list` while
/// still running.
pub fn dismiss(layout: &Layout, id: &str, force: bool, json: bool) -> CliResult {
    let id = resolve(layout, id)?;
    observe(layout, &id);
    let dir = layout.run_dir(&id);
    let now = now_ms();
    if !force
        && let Some(current) = status::model::read_status(&dir)?
        && current.state.is_active()
    {
        let mut error = CliError::new(
            Exit::Failed,
            format!("run '{id}' is still {}; not dismissed", current.state),
        );
        error.hint = Some(format!(
            "stop it first (`subagents stop {id}`), or hide it anyway with --force (`subagents list --all --dismissed` shows it)"
        ));
        return Err(error);
    }
    let dismissed = update_status(&dir, |s| {
        let mut s = s?;
        s.display_dismissed_at = Some(now);
        Some(s)
    })?
    .ok_or_else(|| CliError::new(Exit::NotFound, format!("run '{id}' has no status.json")))?;
    admission::release_finished(layout, dismissed.session_id.as_deref());
    if json {
        println!("{}", json!({"runId": id, "displayDismissedAt": now}));
    } else {
        println!("{id} dismissed");
    }
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
    // A root we cannot write to (read-only, full) still shows its usage.
    let snapshot = match pools.reconcile(&session, limit, &none) {
        Ok(snapshot) => snapshot,
        Err(e) => {
            report_skipped(&[format!(
                "skipped freeing finished runs' slots: {}",
                atomic_file::escape(&e.to_string())
            )]);
            held
        }
    };
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
