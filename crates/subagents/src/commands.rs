//! The command line's side of each command: runs the typed operation of
//! [`launcher::service::Launcher`] and prints its outcome as text or as
//! `--json` (the outcome's serialisation). Nothing here parses arguments
//! (that is `cli`) and nothing below calls back up here.

use std::io::{IsTerminal, Write};

use launcher::{RunState, RunSummary, now_ms};
use serde::Serialize;

use crate::table::ColorChoice;
use launcher::api::{
    AgentsOutcome, AgentsRequest, BudgetClaimRequest, BudgetCreateRequest, BudgetOutcome,
    BudgetQuery, CapacityOutcome, ConfigRequest, DismissRequest, ListQuery, ListSort, LogsRequest,
    PruneRequest, ReconcileRequest, ResumeRequest, RunRequest, StopRequest, ValidateRequest,
    WaitRequest,
};
use launcher::error::{Error, ErrorKind, Exit, Result};
use launcher::listing::ListFormat;
use launcher::logs::{LogChunk, LogStream};
use launcher::root::home;
use launcher::service::Launcher;
use launcher::wait::{Keep, WaitEvent, outcome_line, progress_line, wait_for_runs};

/// `--json`, one rule for every command: pretty on a terminal, one line
/// on a pipe or in a file (one value per line for `jq` and `read`).
pub fn print_json(value: &impl Serialize) {
    println!("{}", json_text(value));
}

/// The text [`print_json`] prints.
pub fn json_text(value: &impl Serialize) -> String {
    let text = if std::io::stdout().is_terminal() {
        serde_json::to_string_pretty(value)
    } else {
        serde_json::to_string(value)
    };
    text.unwrap_or_default()
}

/// Exit code of `run --wait` / `wait` for final runs: 1 unless all completed.
fn exit_for(all_complete: bool) -> Result {
    if all_complete {
        Ok(())
    } else {
        Err(Error::quiet(ErrorKind::RunFailed))
    }
}

/// `subagents run`.
pub fn run(launcher: &Launcher, request: &RunRequest, json: bool, wait: bool) -> Result {
    let launched = launcher.run(request)?;
    // Before the id is printed: whoever reads it may press Ctrl-C at once.
    if wait {
        hint_on_interrupt(&launched.run_id);
    }
    if !json {
        println!("{}", launched.run_id);
    } else if !wait {
        print_json(&launched);
    }
    if !wait {
        return Ok(());
    }
    wait_and_exit(launcher, &launched.run_id, json)
}

/// The end of `run --wait` and `resume --wait`: the final summary (`--json`)
/// or the outcome line of a run that did not complete, and its exit.
fn wait_and_exit(launcher: &Launcher, id: &str, json: bool) -> Result {
    let runs = wait_for_runs(launcher.layout(), &[id.to_owned()], None)?;
    let run = &runs[0];
    if json {
        // The outcome, on one line: the final run summary.
        print_json(run);
    } else if run.status.state != RunState::Complete {
        eprintln!("{}", outcome_line(run));
    }
    exit_for(run.status.state == RunState::Complete)
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
    let id = launcher::escape(id);
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

/// `subagents status`.
pub fn status(launcher: &Launcher, id: &str, json: bool) -> Result {
    let view = launcher.status(id)?;
    print_warnings(&view.warnings);
    if json {
        print_json(&view);
        return Ok(());
    }
    println!("{}", describe(&view.run));
    if let Some(note) = &view.observer {
        println!("  Observer: {}", launcher::escape(note));
    }
    Ok(())
}

/// The human view of one run.
pub fn describe(run: &RunSummary) -> String {
    let home = home();
    let s = &run.status;
    let now = now_ms();
    let mut lines = launcher::format::run_lines(run, now, home.as_deref());
    // The run's label after its id (`list`'s AGENT column), and its
    // current step numbered as every message numbers steps.
    if let Some(header) = lines.first_mut() {
        if let Some(current) = s
            .current_step
            .filter(|_| s.mode.as_deref() != Some("parallel"))
        {
            let theirs = format!(" | {} | ", launcher::format::progress_label(run));
            let ours = format!(
                " | step {} | ",
                launcher::format::step_number(current, s.steps().len())
            );
            *header = header.replacen(&theirs, &ours, 1);
        }
        let label = format!(" ({}) | ", launcher::format::run_label(s));
        *header = header.replacen(" | ", &label, 1);
    }
    // Our own step lines: numbered like `logs` headers, skipped steps named.
    let steps = s.steps();
    if lines.len() > steps.len() {
        for (i, step) in steps.iter().enumerate() {
            lines[i + 1] = step_line(i, step, s.state, now);
        }
    }
    if let Some(reason) = extra_str(&s.extra, "reason").filter(|_| s.state != RunState::Complete) {
        lines.push(format!("  Reason: {reason}"));
    }
    lines.push(format!("  State: {}", s.state));
    if let Some(queue) = launcher::format::queue_label(s) {
        lines.push(format!("  Queue: {queue} (waiting for a capacity slot)"));
    }
    lines.extend(agent_lines(s, now));
    if s.timed_out == Some(true) {
        let after = s
            .timeout_ms
            .map(|ms| format!(" after {}", launcher::format::spell_duration(ms)))
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
            launcher::format::spell_duration(elapsed)
        ));
    }
    let failing = failing_step(s.steps(), s.state);
    if let Some((i, step)) = failing {
        let error = extra_str(&step.extra, "reason")
            .or(step.error.as_deref())
            .unwrap_or("exited non-zero");
        lines.push(format!(
            "  Failed step: {} {}: {error}",
            launcher::format::step_number(i, steps.len()),
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
    // Every recorded string (an agent label, an error) stays on its line.
    let lines: Vec<String> = lines.iter().map(|l| launcher::escape(l)).collect();
    lines.join("\n")
}

fn extra_str<'a>(
    fields: &'a serde_json::Map<String, serde_json::Value>,
    key: &str,
) -> Option<&'a str> {
    fields.get(key).and_then(serde_json::Value::as_str)
}

/// The agent's side of a run: its CLI session (known while it runs), what
/// a running step last did and when its output last came, the answer.
fn agent_lines(s: &launcher::RunStatus, now: u64) -> Vec<String> {
    let mut lines = Vec::new();
    if let Some(id) = extra_str(&s.extra, "agentSessionId") {
        lines.push(format!("  Agent session: {id}"));
    }
    let running = s
        .steps()
        .iter()
        .enumerate()
        .filter(|(_, st)| st.status == "running");
    for (i, step) in running {
        let n = s.steps().len();
        if let Some(at) = step
            .extra
            .get("lastOutputAt")
            .and_then(serde_json::Value::as_u64)
        {
            let ago = launcher::format::format_duration(now.saturating_sub(at));
            lines.push(format!("  Step {}/{n} last output: {ago} ago", i + 1));
        }
        if let Some(activity) = extra_str(&step.extra, "lastActivity") {
            lines.push(format!("  Step {}/{n} activity: {activity}", i + 1));
        }
    }
    // The answer's file, not its text (which may quote the task).
    if s.state == RunState::Complete
        && let Some(path) = extra_str(&s.extra, "answerPath")
    {
        lines.push(format!("  Answer file: {path}"));
    }
    lines
}

/// The first step that failed on its own (not one skipped or stopped
/// because of it).
fn failing_step(steps: &[launcher::Step], run: RunState) -> Option<(usize, &launcher::Step)> {
    steps.iter().enumerate().find(|(_, st)| {
        let own = launcher::format::step_state(st, run) != "skipped"
            && !st
                .error
                .as_deref()
                .is_some_and(|e| e.starts_with("stopped: a sibling"));
        own && (st.status == "failed" || st.exit_code.is_some_and(|c| c != 0))
    })
}

fn step_line(i: usize, step: &launcher::Step, run: RunState, now: u64) -> String {
    let state = launcher::format::step_state(step, run);
    let label = launcher::format::step_label(step);
    let mut parts = vec![format!("  {}. {label}", i + 1), state.to_owned()];
    match (step.duration_ms, step.started_at) {
        (Some(ms), _) => parts.push(launcher::format::spell_duration(ms)),
        (None, Some(start)) if step.status == "running" => {
            parts.push(format!(
                "{} so far",
                launcher::format::spell_duration(now.saturating_sub(start))
            ));
            parts.push(last_output(step, now));
        }
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
    // A skipped step's record repeats the run's error (a stop's reason);
    // only a fail-fast skip says why on its own.
    match (&step.error, state) {
        (Some(error), "skipped") => {
            parts.extend(error.strip_prefix("skipped: ").map(str::to_owned))
        }
        (Some(error), _) => parts.push(error.clone()),
        (None, _) => {}
    }
    parts.join(" | ")
}

/// A running step's time since its COMMAND last wrote output, as its
/// runner recorded it (`lastOutputAt`, refreshed every few seconds).
fn last_output(step: &launcher::Step, now: u64) -> String {
    match step.extra.get("lastOutputAt").and_then(|v| v.as_u64()) {
        Some(at) => format!(
            "last output {} ago",
            launcher::format::spell_duration(now.saturating_sub(at))
        ),
        None => "no output yet".to_owned(),
    }
}

/// How `list` prints (the command line's display flags).
#[derive(Debug, Clone, Copy, Default)]
pub struct ListDisplay {
    /// `--json`.
    pub json: bool,
    /// `--long`.
    pub long: bool,
    /// `--short`.
    pub short: bool,
    /// `--color`.
    pub color: ColorChoice,
}

/// `subagents list`.
pub fn list(launcher: &Launcher, query: &ListQuery, display: ListDisplay) -> Result {
    let by_start = query.sort == Some(ListSort::Started);
    let terminal = std::io::stdout().is_terminal();
    let table = display.short || (terminal && !display.long);
    // The detailed text and JSON stream through `listing` with bounded memory;
    // sorting by start, the dismissed runs and the one-line table need every
    // row first.
    if !query.dismissed && !by_start && (display.json || !table) {
        let format = if display.json && terminal {
            ListFormat::Json
        } else if display.json {
            ListFormat::CompactJson
        } else {
            ListFormat::Text
        };
        let warnings = launcher.list_each(query, format, &mut std::io::stdout().lock())?;
        print_warnings(&warnings);
        return Ok(());
    }
    let listing = launcher.list(query)?;
    print_warnings(&listing.warnings);
    if display.json {
        print_json(&listing);
        return Ok(());
    }
    let heading = match (query.dismissed, query.all) {
        (true, _) => "Dismissed runs",
        (false, true) => "Async runs",
        (false, false) => "Active async runs",
    };
    let runs = &listing.runs;
    if runs.is_empty() && table && listing.unreadable.is_empty() {
        // Our words on a terminal; a pipe keeps the reference's line.
        println!("{}", nothing_listed(query));
    } else if !runs.is_empty() && table && !query.dismissed {
        let no_color = std::env::var("NO_COLOR").ok();
        let color = crate::table::use_color(display.color, terminal, no_color.as_deref());
        println!(
            "{}",
            crate::table::render(runs, now_ms(), home().as_deref(), color)
        );
    } else {
        println!(
            "{}",
            launcher::format::format_run_list(runs, heading, now_ms(), home().as_deref())
        );
    }
    print_unreadable(&listing.unreadable);
    Ok(())
}

/// What an empty table says.
fn nothing_listed(query: &ListQuery) -> String {
    let what = match (query.dismissed, query.all) {
        (true, _) => "No dismissed runs",
        (false, true) => "No runs",
        (false, false) => "No active runs (`subagents list --all` shows finished ones)",
    };
    match &query.session {
        Some(session) => format!("{what} in session {}", launcher::escape(session)),
        None => what.to_owned(),
    }
}

fn print_unreadable(unreadable: &[launcher::UnreadableRun]) {
    if unreadable.is_empty() {
        return;
    }
    println!("\nUnreadable runs: {}\n", unreadable.len());
    for run in unreadable {
        println!(
            "- {} | unreadable | {}",
            launcher::escape(&run.id),
            run.error
        );
    }
}

/// `subagents wait`: each run's line as soon as it is over, a progress
/// line on a terminal meanwhile.
pub fn wait(launcher: &Launcher, request: &WaitRequest, json: bool) -> Result {
    let progress = std::io::stderr().is_terminal();
    let mut report = |event: WaitEvent<'_>| {
        match event {
            WaitEvent::Settled(run) => {
                if progress {
                    eprint!("\r\x1b[K");
                }
                if !json {
                    println!("{}", outcome_line(run));
                }
            }
            WaitEvent::Pending(runs, elapsed) => {
                if progress {
                    eprint!("\r\x1b[K{}", progress_line(runs, elapsed));
                }
            }
        }
        Keep::Continue(())
    };
    let outcome = launcher.wait(request, &mut report);
    if progress {
        match &outcome {
            Ok(_) => eprint!("\r\x1b[K"),
            Err(_) => eprintln!(),
        }
    }
    let outcome = outcome?;
    if request.runs.is_empty() && outcome.runs.is_empty() {
        eprintln!("subagents: no active run in this session; nothing to wait for");
    }
    if json {
        print_json(&outcome);
    }
    exit_for(outcome.all_complete())
}

/// `subagents stop A B ...`: each run in turn; a run that cannot be
/// stopped is reported and the others are still stopped. Exit: the largest
/// of the errors' exit codes, else 0. `--json` of one run is its summary, of several an array.
pub fn stop(launcher: &Launcher, requests: &[StopRequest], json: bool) -> Result {
    let mut stopped = Vec::new();
    let worst = each(requests, |request| {
        let outcome = launcher.stop(request)?;
        print_warnings(&outcome.warnings);
        let run = &outcome.run;
        if json {
            stopped.push(outcome.run.clone());
        } else if outcome.was_over {
            println!(
                "{} was already over ({}); nothing to stop",
                run.id, run.status.state
            );
        } else {
            println!("{} {}", run.id, run.status.state);
        }
        Ok(())
    });
    // `--json` prints one value: the error when there is one.
    match worst {
        Some(e) => Err(e),
        None => {
            if json {
                print_one_or_many(&stopped, requests.len());
            }
            Ok(())
        }
    }
}

/// Runs `one` on every request, going on past errors; the error with the
/// largest exit code is returned (the command's exit), the others are
/// printed as they happen.
fn each<T>(requests: &[T], mut one: impl FnMut(&T) -> Result) -> Option<Error> {
    let mut worst: Option<Error> = None;
    for request in requests {
        let Err(e) = one(request) else { continue };
        let (shown, kept) = match worst.take() {
            Some(w) if w.exit().code() >= e.exit().code() => (e, w),
            Some(w) => (w, e),
            None => {
                worst = Some(e);
                continue;
            }
        };
        eprintln!("subagents: {}", launcher::escape(&shown.message));
        worst = Some(kept);
    }
    worst
}

/// One outcome as itself, several as an array (`--json` of commands that
/// take several runs).
fn print_one_or_many<T: serde::Serialize>(items: &[T], asked: usize) {
    match items {
        [one] if asked == 1 => print_json(one),
        many => print_json(&many),
    }
}

/// `subagents resume`; with `wait`, blocks until the revival is over and
/// exits as `run --wait`.
pub fn resume(launcher: &Launcher, request: &ResumeRequest, json: bool, wait: bool) -> Result {
    let resumed = launcher.resume(request)?;
    let id = &resumed.launched.run_id;
    if wait {
        hint_on_interrupt(id);
    }
    if !json {
        println!("{id}");
    } else if !wait {
        print_json(&resumed);
    }
    if !wait {
        return Ok(());
    }
    wait_and_exit(launcher, id, json)
}

/// `subagents logs`.
pub fn logs(launcher: &Launcher, request: &LogsRequest, json: bool, follow: bool) -> Result {
    if json {
        let outcome = launcher.logs(request)?;
        print_warnings(&outcome.warnings);
        print_json(&outcome);
        return Ok(());
    }
    let mut write = |chunk: LogChunk<'_>| match chunk.stream {
        LogStream::Stdout => {
            let mut out = std::io::stdout().lock();
            out.write_all(chunk.bytes).and_then(|()| out.flush())
        }
        LogStream::Stderr => {
            let mut err = std::io::stderr().lock();
            err.write_all(chunk.bytes).and_then(|()| err.flush())
        }
    };
    let streamed = launcher.logs_each(request, follow, &mut write)?;
    print_warnings(&streamed.warnings);
    if let Some(silence) = &streamed.silence {
        eprintln!("subagents: {silence}");
    }
    if !follow {
        return Ok(());
    }
    // The run is over: its settled summary, its outcome line, and the exit
    // of `wait`.
    let request = WaitRequest {
        runs: vec![streamed.run_id],
        ..WaitRequest::default()
    };
    let outcome = launcher.wait(&request, &mut |_| Keep::Continue(()))?;
    for run in &outcome.runs {
        eprintln!("{}", outcome_line(run));
    }
    exit_for(outcome.all_complete())
}

/// `subagents capacity`.
pub fn capacity(launcher: &Launcher, json: bool) -> Result {
    let outcome = launcher.capacity(&Default::default())?;
    print_warnings(&outcome.warnings);
    if json {
        print_json(&outcome);
    } else {
        println!("{}", capacity_text(&outcome));
    }
    Ok(())
}

fn capacity_text(outcome: &CapacityOutcome) -> String {
    let used = match outcome.limit {
        0 => format!("{} active-run slots used, no limit", outcome.used),
        limit => format!("{}/{limit} active-run slots used", outcome.used),
    };
    let mut lines = vec![format!(
        "Session {}: {used}",
        launcher::escape(&outcome.session)
    )];
    for entry in &outcome.slots {
        let run = entry.slot.run_id.as_deref().unwrap_or("<unreadable owner>");
        let verdict = entry
            .release
            .as_ref()
            .map(|v| {
                let state = serde_json::to_value(v.state).unwrap_or_default();
                let state = state.as_str().unwrap_or_default().to_owned();
                format!(" | {state}: {}", v.reason)
            })
            .unwrap_or_default();
        let observer = entry
            .observer
            .as_deref()
            .map(|why| format!(" | observer: {why}"))
            .unwrap_or_default();
        lines.push(format!(
            "  slot-{}: run {run}{verdict}{observer}",
            entry.slot.slot
        ));
    }
    lines.join("\n")
}

/// `subagents budget` / `budget doctor`: the report, then exit 1 when the
/// inherited budget cannot be opened.
pub fn budget_doctor(launcher: &Launcher, json: bool) -> Result {
    let outcome = launcher.budget(&BudgetQuery::default())?;
    let BudgetOutcome::Doctor(report) = &outcome else {
        return Err(Error::failed("failed to report the budget: no report"));
    };
    if json {
        print_json(&outcome);
    } else {
        println!("{}", report.text);
    }
    match &report.inherited_error {
        None => Ok(()),
        Some(_) if json => Err(Error::silent(Exit::Failed)),
        Some(e) => Err(Error::failed(format!(
            "failed to open the inherited run fan-out budget: {e}"
        ))),
    }
}

/// `subagents budget create`.
pub fn budget_create(launcher: &Launcher, request: &BudgetCreateRequest) -> Result {
    // On a pipe, the descriptor's own bytes (what a nested run inherits).
    let text = launcher.budget_create(request)?.to_json();
    match serde_json::from_str::<serde_json::Value>(&text) {
        Ok(value) if std::io::stdout().is_terminal() => print_json(&value),
        _ => println!("{text}"),
    }
    Ok(())
}

/// `subagents budget show`.
pub fn budget_show(launcher: &Launcher, query: &BudgetQuery) -> Result {
    print_json(&launcher.budget(query)?);
    Ok(())
}

/// `subagents budget claim`.
pub fn budget_claim(launcher: &Launcher, request: &BudgetClaimRequest) -> Result {
    print_json(&launcher.budget_claim(request)?);
    Ok(())
}

/// `subagents prune`.
pub fn prune(launcher: &Launcher, request: &PruneRequest, json: bool) -> Result {
    let outcome = launcher.prune(request)?;
    if json {
        print_json(&outcome);
        return Ok(());
    }
    let verb = if outcome.dry_run {
        "would prune"
    } else {
        "pruned"
    };
    let now = now_ms();
    for p in &outcome.pruned {
        let ago = launcher::format::spell_duration(now.saturating_sub(p.ended_at));
        println!("{verb} {} ({}, ended {ago} ago)", p.run_id, p.state);
    }
    for k in &outcome.kept {
        println!("kept {}: {}", k.run_id, k.reason);
    }
    let head = if outcome.dry_run {
        "Would prune"
    } else {
        "Pruned"
    };
    println!(
        "{head} {} run(s), {} budget(s), {} lease(s), {} capacity slot(s); kept {} old run(s).",
        outcome.pruned.len(),
        outcome.budgets.len(),
        outcome.leases.len(),
        outcome.capacity_slots,
        outcome.kept.len()
    );
    Ok(())
}

/// `subagents validate`: exit 0 valid, 1 invalid; `--json` prints `{valid, error}`.
pub fn validate(launcher: &Launcher, request: &ValidateRequest, json: bool) -> Result {
    let outcome = launcher.validate(request)?;
    if json {
        print_json(&outcome);
    }
    match outcome.error {
        None => {
            if !json {
                println!("{}: valid {}", request.file.display(), request.kind);
            }
            Ok(())
        }
        Some(message) if json => {
            eprintln!("subagents: {message}");
            Err(Error::silent(Exit::Failed))
        }
        Some(message) => Err(Error::failed(message)),
    }
}

/// `subagents agents [list|show NAME|prompt] [--json]`.
pub fn agents(launcher: &Launcher, request: &AgentsRequest, json: bool) -> Result {
    let outcome = launcher.agents(request)?;
    for line in outcome.warnings() {
        eprintln!("subagents: {}", launcher::escape(line));
    }
    match &outcome {
        _ if json => print_json(&outcome),
        AgentsOutcome::Prompt(prompt) => print!("{}", prompt.snippet),
        AgentsOutcome::List(list) => {
            if list.agents.is_empty() {
                println!(
                    "No agents. Add one to .subagents/agents/NAME.md (see `subagents agents show --help`)."
                );
            }
            for agent in &list.agents {
                let text = |key: &str| agent.get(key).and_then(|v| v.as_str()).unwrap_or("");
                println!(
                    "{}\t{}\t{}\t{}",
                    text("name"),
                    text("runner"),
                    text("scope"),
                    text("description")
                );
            }
        }
        AgentsOutcome::Show(view) => {
            let text = |key: &str| view.agent.get(key).and_then(|v| v.as_str());
            println!("name: {}", text("name").unwrap_or(""));
            println!("runner: {}", text("runner").unwrap_or(""));
            println!(
                "file: {} ({})",
                text("path").unwrap_or(""),
                text("scope").unwrap_or("")
            );
            if let Some(description) = text("description") {
                println!("description: {description}");
            }
            println!("command: {}", view.command);
            if view.task_on_stdin {
                println!("task: on stdin");
            }
        }
    }
    Ok(())
}

/// `subagents config`: each key's effective value and its source;
/// `root_flag`: the root came from `--root`.
pub fn config(launcher: &Launcher, json: bool, root_flag: bool) -> Result {
    let mut outcome = launcher.config(&ConfigRequest::default())?;
    if root_flag && let Some(root) = outcome.keys.iter_mut().find(|k| k.key == "root") {
        root.source = "flag".to_owned();
    }
    if json {
        print_json(&outcome);
        return Ok(());
    }
    let file = outcome
        .path
        .as_deref()
        .unwrap_or("none (no home directory)");
    println!(
        "Config file: {file} ({})",
        if outcome.exists { "read" } else { "absent" }
    );
    for k in &outcome.keys {
        let source = match k.source.as_str() {
            "environment" => format!("env {}", k.variable),
            "config" => format!("config file {file}"),
            "flag" => format!("flag --{}", k.key.replace('_', "-")),
            other => other.to_owned(),
        };
        let value = k.value.as_deref().unwrap_or("");
        let note = if k.key == "max_active" && value == "0" {
            " (no limit)"
        } else {
            ""
        };
        println!(
            "  {} = {}{note}  [{source}]",
            k.key,
            launcher::escape(value)
        );
    }
    Ok(())
}

/// Each warning of an outcome, on stderr.
fn print_warnings(warnings: &[String]) {
    for line in warnings {
        eprintln!("subagents: warning: {line}");
    }
}

/// `subagents reconcile`.
pub fn reconcile(launcher: &Launcher, json: bool) -> Result {
    let outcome = launcher.reconcile(&ReconcileRequest::default())?;
    print_warnings(&outcome.warnings);
    if json {
        print_json(&outcome);
        return Ok(());
    }
    if outcome.repaired.is_empty() && outcome.observed.is_empty() {
        println!("No stale runs.");
    } else {
        for r in &outcome.observed {
            println!("{} {}", r.run_id, r.message);
        }
        // "repaired", not "failed": a repair may restore a complete run.
        for r in &outcome.repaired {
            println!("{} repaired: {}", r.run_id, r.message);
        }
    }
    print_unreadable(&outcome.unreadable);
    Ok(())
}

/// `subagents dismiss A B ...`: each run in turn, as `stop`.
pub fn dismiss(launcher: &Launcher, requests: &[DismissRequest], json: bool) -> Result {
    let mut dismissed = Vec::new();
    let worst = each(requests, |request| {
        let outcome = launcher.dismiss(request)?;
        if !json {
            println!("{} dismissed", outcome.run_id);
        }
        dismissed.push(outcome);
        Ok(())
    });
    // `--json` prints one value: the error when there is one.
    match worst {
        Some(e) => Err(e),
        None => {
            if json {
                if let [one] = &dismissed[..]
                    && requests.len() == 1
                {
                    print_json(one);
                } else {
                    print_json(&dismissed);
                }
            }
            Ok(())
        }
    }
}
