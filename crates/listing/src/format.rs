//! The reference's run-list text (`formatAsyncRunList`), for the fields our
//! runs and the reference's runs share.

use std::cell::Cell;
use std::path::Path;

use serde_json::Value;

use crate::list::RunSummary;
use status::model::Step;

/// Renders runs under `heading` ("Active async runs", "Async runs").
pub fn format_run_list(
    runs: &[RunSummary],
    heading: &str,
    now: u64,
    home: Option<&Path>,
) -> String {
    if runs.is_empty() {
        return format!("No {}.", heading.to_lowercase());
    }
    let mut lines = vec![format!("{heading}: {}", runs.len()), String::new()];
    for run in runs {
        lines.extend(run_lines(run, now, home));
        lines.push(String::new());
    }
    lines.join("\n").trim_end().to_owned()
}

/// The lines of one run (header, steps, fan-out, error, output, session).
pub fn run_lines(run: &RunSummary, now: u64, home: Option<&Path>) -> Vec<String> {
    run_lines_timed(run, now, home).0
}

/// "Now" for one rendering, noting whether the text showed a time relative
/// to it.
struct Now {
    ms: u64,
    read: Cell<bool>,
}

/// [`run_lines`], and whether they show a time relative to `now` (then
/// they change with it; otherwise any `now` gives the same lines).
pub(crate) fn run_lines_timed(
    run: &RunSummary,
    now: u64,
    home: Option<&Path>,
) -> (Vec<String>, bool) {
    let now = Now {
        ms: now,
        read: Cell::new(false),
    };
    let lines = lines_at(run, &now, home);
    (lines, now.read.get())
}

/// [`raw_lines`] with control characters escaped: a label or any recorded
/// string holding a newline must not forge another row.
fn lines_at(run: &RunSummary, now: &Now, home: Option<&Path>) -> Vec<String> {
    raw_lines(run, now, home)
        .iter()
        .map(|line| atomic_file::escape(line))
        .collect()
}

fn raw_lines(run: &RunSummary, now: &Now, home: Option<&Path>) -> Vec<String> {
    let status = &run.status;
    let mut header = vec![format!("- {}", run.id), state_label(status)];
    header.extend(queue_label(status));
    if let Some(activity) = activity(
        status.state.as_str(),
        status.last_activity_at,
        &status.extra,
        now,
        home,
    ) {
        header.push(activity);
    }
    let mode = status.mode.clone().unwrap_or_else(|| "unknown mode".into());
    header.push(match context_label(status.steps()) {
        Some(label) => format!("{mode} [{label}]"),
        None => mode,
    });
    header.push(progress_label(run));
    let place = status
        .cwd
        .as_deref()
        .map(Path::new)
        .unwrap_or(&run.async_dir);
    header.push(shorten(place, home));
    let mut lines = vec![header.join(" | ")];
    for (i, step) in status.steps().iter().enumerate() {
        lines.push(step_line(i, step, status.state, now, home));
    }
    if let Some(host) = status.foreign_host() {
        lines.push(format!(
            "  Host: {} (another machine: its processes are not probed here)",
            atomic_file::escape(host)
        ));
    }
    if let Some(line) = dispatch_line(status) {
        lines.push(format!("  Executor: {line}"));
    }
    if let Some(line) = fanout_line(status.run_fanout_budget.as_ref()) {
        lines.push(format!("  {line}"));
    } else if let Some(reason) = status
        .extra
        .get(crate::list::FANOUT_UNAVAILABLE)
        .and_then(Value::as_str)
    {
        lines.push(format!("  Run fan-out: unavailable ({reason})"));
    }
    if let Some(error) = &status.error {
        lines.push(format!("  Error: {error}"));
    }
    if let Some(output) = &status.output_file {
        let path = run.async_dir.join(output);
        lines.push(format!("  output: {}", shorten(&path, home)));
    }
    if let Some(session) = &status.session_file {
        lines.push(format!("  session: {}", shorten(Path::new(session), home)));
    }
    if let Some(source) = status.extra.get("resumedFrom").and_then(Value::as_str) {
        lines.push(
            match status.extra.get("agentSessionId").and_then(Value::as_str) {
                Some(id) => format!("  resumed from {source} (agent session {id})"),
                None => format!("  resumed from {source}"),
            },
        );
    }
    lines
}

/// A dispatched run's place, from the `dispatch` view the launcher adds:
/// `slurm job 12 on n1 (RUNNING)`, `slurm job 13 (PENDING: Resources)`.
pub fn dispatch_line(status: &status::RunStatus) -> Option<String> {
    let view = status.extra.get("dispatch")?;
    let text = |key: &str| view.get(key).and_then(Value::as_str);
    let mut line = format!("{} job {}", text("executor")?, text("jobId")?);
    if let Some(cluster) = text("cluster") {
        line.push_str(&format!(" of {cluster}"));
    }
    if let Some(node) = text("node") {
        line.push_str(&format!(" on {node}"));
    }
    match (text("slurmState"), text("slurmReason")) {
        (Some(state), Some(reason)) => line.push_str(&format!(" ({state}: {reason})")),
        (Some(state), None) => line.push_str(&format!(" ({state})")),
        _ => {}
    }
    Some(line)
}

/// The run's state as listings show it: `finishing (complete)` for a run
/// whose status is over but whose proof is not final yet (the active
/// listing marks it so), else the state.
pub fn state_label(status: &status::model::RunStatus) -> String {
    if crate::list::is_finishing(status) {
        format!("finishing ({})", status.state)
    } else {
        status.state.to_string()
    }
}

/// `queue position N` for a run waiting for a capacity slot whose place
/// in line a reader filled in (`queuedForSlot.position`).
pub fn queue_label(status: &status::model::RunStatus) -> Option<String> {
    let wait = status::slot_wait::queued_for_slot(status)?;
    Some(match wait.position {
        Some(n) => format!("queue position {n}"),
        None => "waiting for a capacity slot".to_owned(),
    })
}

/// [`state_label`] with the place in the queue of a run waiting for a
/// capacity slot (`queued #2`): the one-line views (`list` table, `top`).
pub fn state_with_queue(status: &status::model::RunStatus) -> String {
    let state = state_label(status);
    match status::slot_wait::queued_for_slot(status).and_then(|w| w.position) {
        Some(n) => format!("{state} #{n}"),
        None => state,
    }
}

/// `Run fan-out: U/L used, R remaining` from a snapshot value.
pub fn fanout_line(snapshot: Option<&Value>) -> Option<String> {
    let s = snapshot?;
    let (used, limit, remaining) = (
        s.get("used")?.as_u64()?,
        s.get("limit")?.as_u64()?,
        s.get("remaining")?.as_u64()?,
    );
    Some(format!(
        "Run fan-out: {used}/{limit} used, {remaining} remaining"
    ))
}

fn step_line(
    i: usize,
    step: &Step,
    run: status::RunState,
    now: &Now,
    home: Option<&Path>,
) -> String {
    let extra = &step.extra;
    let mut name = String::new();
    if let Some(phase) = extra.get("phase").and_then(Value::as_str) {
        name.push_str(&format!("[{phase}] "));
    }
    match extra.get("label").and_then(Value::as_str) {
        Some(label) => name.push_str(&format!("{label} ({})", step.agent)),
        None => name.push_str(&step.agent),
    }
    if let Some(context) = extra.get("context").and_then(Value::as_str) {
        name.push_str(&format!(" [{context}]"));
    }
    let state = step_state(step, run);
    let mut parts = vec![format!("  {}. {name}", i + 1), state.to_owned()];
    let last_activity = extra.get("lastActivityAt").and_then(Value::as_u64);
    if let Some(activity) = activity(state, last_activity, extra, now, home) {
        parts.push(activity);
    }
    if let Some(model) = model_label(extra) {
        parts.push(model);
    }
    if let Some(ms) = step.duration_ms {
        parts.push(format_duration(ms));
    }
    if let Some(total) = extra
        .get("tokens")
        .and_then(|t| t.get("total"))
        .and_then(Value::as_u64)
    {
        parts.push(format!("{} tok", format_tokens(total)));
    }
    parts.join(" | ")
}

fn activity(
    state: &str,
    last: Option<u64>,
    extra: &serde_json::Map<String, Value>,
    now: &Now,
    home: Option<&Path>,
) -> Option<String> {
    // Only a running run or step is "active"; finished ones keep their facts.
    let last = last.filter(|_| state == "running");
    let attention = extra.get("activityState").and_then(Value::as_str);
    let mut facts = Vec::new();
    let label = match (last, attention) {
        (None, Some("needs_attention")) => Some("needs attention".to_owned()),
        (None, Some("active_long_running")) => Some("active but long-running".to_owned()),
        // A run or step that is not running has no `last` (see above).
        (None, _) => None,
        (Some(t), Some("needs_attention")) => Some(format!("no activity for {}", age(now, t))),
        (Some(t), Some("active_long_running")) => Some(match age(now, t).as_str() {
            "now" => "active but long-running · last activity now".to_owned(),
            a => format!("active but long-running · last activity {a} ago"),
        }),
        (Some(t), _) => Some(match age(now, t).as_str() {
            "now" => "active now".to_owned(),
            a => format!("active {a} ago"),
        }),
    };
    facts.extend(label);
    if let Some(tool) = extra.get("currentTool").and_then(Value::as_str) {
        facts.push(format!("tool {tool}"));
    }
    if let Some(path) = extra.get("currentPath").and_then(Value::as_str) {
        facts.push(shorten(Path::new(path), home));
    }
    if let Some(n) = extra.get("turnCount").and_then(Value::as_u64) {
        facts.push(format!("{n} turns"));
    }
    if let Some(n) = extra.get("toolCount").and_then(Value::as_u64) {
        facts.push(format!("{n} tools"));
    }
    if let Some(s) = extra.get("steering") {
        let n = |k: &str| s.get(k).and_then(Value::as_u64).unwrap_or(0);
        facts.push(format!(
            "steering {} scheduled, {} pending, {} delivered, {} failed, {} recovered",
            n("scheduled"),
            n("pending"),
            n("delivered"),
            n("failed"),
            n("recovered")
        ));
    }
    (!facts.is_empty()).then(|| facts.join(" | "))
}

fn age(now: &Now, then: u64) -> String {
    now.read.set(true);
    let ms = now.ms.saturating_sub(then);
    match ms {
        0..1000 => "now".into(),
        1000..60_000 => format!("{}s", ms / 1000),
        _ => format!("{}m", ms / 60_000),
    }
}

fn context_label(steps: &[Step]) -> Option<String> {
    let contexts: Vec<&str> = steps
        .iter()
        .filter_map(|s| s.extra.get("context").and_then(Value::as_str))
        .collect();
    let first = *contexts.first()?;
    Some(if contexts.iter().all(|c| *c == first) {
        first.to_owned()
    } else {
        "mixed".to_owned()
    })
}

const THINKING: [&str; 7] = ["off", "minimal", "low", "medium", "high", "xhigh", "max"];

fn model_label(extra: &serde_json::Map<String, Value>) -> Option<String> {
    let model = extra.get("model").and_then(Value::as_str);
    let explicit = extra
        .get("thinking")
        .and_then(Value::as_str)
        .filter(|t| THINKING.contains(t));
    let (base, suffix) = match model {
        Some(m) => match m.rsplit_once(':') {
            Some((b, s)) if THINKING.contains(&s) => (Some(b), Some(s)),
            _ => (Some(m), None),
        },
        None => (None, None),
    };
    let name = base.map(|b| b.rsplit('/').next().unwrap_or(b));
    match (name, suffix.or(explicit)) {
        (Some(n), Some(t)) => Some(format!("{n} · thinking {t}")),
        (Some(n), None) => Some(n.to_owned()),
        (None, Some(t)) => Some(format!("thinking {t}")),
        (None, None) => None,
    }
}

/// `N/M`: step `index` (flat, from 0) among all `total` steps of a run,
/// counted from 1 — how `status` numbers its step lines, `logs --step`
/// takes them, and every message names a step (the reference's list text
/// alone counts a parallel group as one step).
pub fn step_number(index: usize, total: usize) -> String {
    format!("{}/{}", index + 1, total.max(1))
}

/// The reference's progress part of a run's list header: `step 2/3` (a
/// chain's parallel group counted as one step), `steps 3`, or a parallel
/// run's outcome.
pub fn progress_label(run: &RunSummary) -> String {
    let status = &run.status;
    let steps = status.steps();
    let count = steps.len().max(1);
    let chain_steps = status.chain_step_count.unwrap_or(count);
    let groups = parallel_groups(status.extra.get("parallelGroups"), steps.len(), chain_steps);
    let state = status.state.as_str();
    let current = status.current_step;
    if let Some(group) = current.and_then(|c| {
        groups
            .iter()
            .find(|g| c >= g.start && c < g.start + g.count)
    }) {
        let members = &steps[group.start..group.start + group.count];
        let outcome = outcome(members, state, group.count);
        if status.mode.as_deref() == Some("parallel") {
            return outcome;
        }
        return format!(
            "step {}/{chain_steps} · parallel group: {outcome}",
            group.step_index + 1
        );
    }
    if status.mode.as_deref() == Some("parallel") {
        return outcome(steps, state, count);
    }
    match current {
        Some(flat) if status.mode.as_deref() == Some("chain") && !groups.is_empty() => {
            let folded: usize = groups
                .iter()
                .filter(|g| g.start + g.count <= flat)
                .map(|g| g.count - 1)
                .sum();
            format!("step {}/{chain_steps}", flat - folded + 1)
        }
        Some(flat) => format!("step {}/{count}", flat + 1),
        None => format!("steps {count}"),
    }
}

/// A validated `parallelGroups` entry (as the reference validates it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParallelGroup {
    /// First flat index.
    pub start: usize,
    /// Number of steps.
    pub count: usize,
    /// Logical step index.
    pub step_index: usize,
}

/// Keeps the groups whose integers are in range, sorted by step index then start.
pub fn parallel_groups(
    value: Option<&Value>,
    step_count: usize,
    chain_steps: usize,
) -> Vec<ParallelGroup> {
    let Some(entries) = value.and_then(Value::as_array) else {
        return Vec::new();
    };
    let field = |e: &Value, k: &str| e.get(k).and_then(Value::as_u64).map(|n| n as usize);
    let mut groups: Vec<ParallelGroup> = entries
        .iter()
        .filter_map(|e| {
            Some(ParallelGroup {
                start: field(e, "start")?,
                count: field(e, "count")?,
                step_index: field(e, "stepIndex")?,
            })
        })
        .filter(|g| g.count > 0 && g.step_index < chain_steps && g.start + g.count <= step_count)
        .collect();
    groups.sort_by_key(|g| (g.step_index, g.start));
    groups
}

/// `[<n> agent(s) running · ]<done>/<total> done[ · <f> failed]...`
pub fn outcome(steps: &[Step], run_state: &str, total: usize) -> String {
    let count = |names: &[&str]| {
        steps
            .iter()
            .filter(|s| names.contains(&s.status.as_str()))
            .count()
    };
    let mut parts = Vec::new();
    let running = count(&["running"]);
    if run_state == "running" && running > 0 {
        parts.push(if running == 1 {
            "1 agent running".to_owned()
        } else {
            format!("{running} agents running")
        });
    }
    parts.push(format!(
        "{}/{total} done",
        count(&["complete", "completed"])
    ));
    for (name, label) in [
        ("failed", "failed"),
        ("stopped", "stopped"),
        ("paused", "paused"),
    ] {
        let n = count(&[name]);
        if n > 0 {
            parts.push(format!("{n} {label}"));
        }
    }
    parts.join(" · ")
}

/// `<ms>ms`, `<s.s>s`, `<m>m<s>s`.
pub fn format_duration(ms: u64) -> String {
    match ms {
        0..1000 => format!("{ms}ms"),
        1000..60_000 => format!("{:.1}s", ms as f64 / 1000.0),
        _ => format!("{}m{}s", ms / 60_000, (ms % 60_000) / 1000),
    }
}

fn format_tokens(n: u64) -> String {
    match n {
        0..1000 => n.to_string(),
        1000..10_000 => format!("{:.1}k", n as f64 / 1000.0),
        _ => format!("{}k", (n as f64 / 1000.0).round() as u64),
    }
}

/// The state a step is shown with (our extension of the recorded one):
/// `skipped` for a step that never started in a run that is over, whatever
/// its record says (a stop, a fail-fast trip, a timeout or an earlier
/// failed chain step leaves it `stopped`, `failed` or `pending` with exit
/// code 1); `stopped` for a fail-fast sibling ended while it ran; else the
/// recorded state.
pub fn step_state(step: &Step, run: status::RunState) -> &str {
    if never_ran(step, run) {
        "skipped"
    } else if step
        .error
        .as_deref()
        .is_some_and(|e| e.starts_with("stopped: a sibling"))
    {
        "stopped"
    } else {
        step.status.as_str()
    }
}

/// A step of a finished run that never started: no start time, no
/// duration (a command that could not be started has one), no process, not
/// complete. A paused run's pending steps may still run.
pub fn never_ran(step: &Step, run: status::RunState) -> bool {
    !run.holds_capacity()
        && step.started_at.is_none()
        && step.duration_ms.is_none()
        && step.external_process.is_none()
        && !matches!(step.status.as_str(), "complete" | "completed" | "running")
}

/// The status key of a run's or a step's `--name` (our extension; the
/// reference ignores it).
pub const NAME_KEY: &str = "name";

/// The step key of a command step's short form (our extension), written
/// when the step's agent label is only the command's file name.
pub const COMMAND_LABEL_KEY: &str = "commandLabel";

/// How many characters of the first argument a command label keeps.
const ARG_CHARS: usize = 24;

/// A command's short form: its file name and its first argument (shortened,
/// escaped), e.g. `sh -c`, `sleep 30`. Made from argv before any
/// placeholder is replaced, so a task never shows in it.
pub fn command_label(argv: &[String]) -> String {
    let Some(program) = argv.first() else {
        return String::new();
    };
    let program = Path::new(program)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| program.clone());
    let mut label = atomic_file::escape(&program);
    if let Some(arg) = argv.get(1) {
        let mut short: String = arg.chars().take(ARG_CHARS).collect();
        if arg.chars().count() > ARG_CHARS {
            short.push('…');
        }
        label.push(' ');
        label.push_str(&atomic_file::escape(&short));
    }
    label
}

/// What listings call a step: its `name`, else its command's short form,
/// else its agent.
pub fn step_label(step: &Step) -> String {
    [NAME_KEY, COMMAND_LABEL_KEY]
        .iter()
        .find_map(|key| non_empty_str(&step.extra, key))
        .unwrap_or(&step.agent)
        .to_owned()
}

/// What `list`, `status`, `top` and `--json` call a run: its `name`, else
/// its one step's label, else `<mode> ×<steps>` (the mode alone before
/// it has steps). Not escaped (callers
/// escape where they print).
pub fn run_label(status: &status::model::RunStatus) -> String {
    if let Some(name) = non_empty_str(&status.extra, NAME_KEY) {
        return name.to_owned();
    }
    let mode = status.mode.as_deref().unwrap_or("single");
    match status.steps() {
        [] => mode.to_owned(),
        [only] => step_label(only),
        steps => format!("{mode} ×{}", steps.len()),
    }
}

fn non_empty_str<'a>(map: &'a serde_json::Map<String, Value>, key: &str) -> Option<&'a str> {
    map.get(key)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

/// Replaces a leading home directory with `~`, comparing whole path components.
pub fn shorten(path: &Path, home: Option<&Path>) -> String {
    match home.and_then(|h| path.strip_prefix(h).ok()) {
        Some(rest) if rest.as_os_str().is_empty() => "~".to_owned(),
        Some(rest) => format!("~/{}", rest.display()),
        None => path.display().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use status::model::parse_status;

    #[test]
    fn renders_the_reference_example() {
        let now = 1_000_000;
        let text = format!(
            r#"{{"lifecycleArtifactVersion":3,"runId":"k3f9a2","sessionId":"sess-1","mode":"chain","state":"running","steering":{{"requested":0,"scheduled":0,"pending":0,"delivered":0,"failed":0,"recovered":0,"recent":[]}},"lastActivityAt":{a},"startedAt":{s},"lastUpdate":{a},"pid":4242,"cwd":"/home/alice/proj","currentStep":1,"chainStepCount":2,"parallelGroups":[],"runFanoutBudget":{{"used":2,"limit":64,"remaining":62}},"steps":[{{"agent":"scout","description":"[prompt redacted]","status":"complete","durationMs":41200,"tokens":{{"input":9000,"output":3456,"total":12456}},"model":"anthropic/claude-haiku-4-5","thinking":"low","context":"fresh"}},{{"agent":"worker","description":"[prompt redacted]","status":"running","startedAt":{w},"lastActivityAt":{a},"currentTool":"edit","currentPath":"/home/alice/proj/src/lib.rs","turnCount":3,"toolCount":5,"model":"openai/gpt-5:high","context":"fresh"}}],"outputFile":"/tmp/r/k3f9a2/output-1.log"}}"#,
            a = now - 4000,
            s = now - 95_000,
            w = now - 50_000
        );
        let status = parse_status(Path::new("s"), &text).unwrap();
        let run = RunSummary {
            id: "k3f9a2".into(),
            async_dir: "/tmp/r/k3f9a2".into(),
            status,
        };
        let out = format_run_list(
            &[run],
            "Active async runs",
            now,
            Some(Path::new("/home/alice")),
        );
        let expected = "Active async runs: 1\n\n- k3f9a2 | running | active 4s ago | steering 0 scheduled, 0 pending, 0 delivered, 0 failed, 0 recovered | chain [fresh] | step 2/2 | ~/proj\n  1. scout [fresh] | complete | claude-haiku-4-5 · thinking low | 41.2s | 12k tok\n  2. worker [fresh] | running | active 4s ago | tool edit | ~/proj/src/lib.rs | 3 turns | 5 tools | gpt-5 · thinking high\n  Run fan-out: 2/64 used, 62 remaining\n  output: /tmp/r/k3f9a2/output-1.log";
        assert_eq!(out, expected);
    }

    #[test]
    fn renders_the_reference_failed_run() {
        let text = r#"{"lifecycleArtifactVersion":3,"runId":"m7q1","mode":"single","state":"failed","steering":{"requested":0,"scheduled":0,"pending":0,"delivered":0,"failed":0,"recovered":0,"recent":[]},"startedAt":1,"lastUpdate":2,"cwd":"/home/alice/proj","currentStep":0,"error":"Step failed: reviewer","steps":[{"agent":"reviewer","status":"failed","durationMs":95000}],"sessionFile":"/home/alice/.pi/sessions/s.jsonl"}"#;
        let status = parse_status(Path::new("s"), text).unwrap();
        let run = RunSummary {
            id: "m7q1".into(),
            async_dir: "/tmp/r/m7q1".into(),
            status,
        };
        let out = format_run_list(&[run], "Async runs", 10, Some(Path::new("/home/alice")));
        let expected = "Async runs: 1\n\n- m7q1 | failed | steering 0 scheduled, 0 pending, 0 delivered, 0 failed, 0 recovered | single | step 1/1 | ~/proj\n  1. reviewer | failed | 1m35s\n  Error: Step failed: reviewer\n  session: ~/.pi/sessions/s.jsonl";
        assert_eq!(out, expected);
    }

    #[test]
    fn a_command_label_is_its_file_name_and_first_argument() {
        let argv = |args: &[&str]| args.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            command_label(&argv(&["/bin/sh", "-c", "echo secret"])),
            "sh -c"
        );
        assert_eq!(command_label(&argv(&["sleep", "30"])), "sleep 30");
        assert_eq!(command_label(&argv(&["true"])), "true");
        assert_eq!(
            command_label(&argv(&["cat", "{task_file}"])),
            "cat {task_file}"
        );
        assert_eq!(
            command_label(&argv(&["echo", "a\nb-0123456789abcdefghijklmnop"])),
            r"echo a\nb-0123456789abcdefghij…"
        );
        assert_eq!(command_label(&argv(&["echo", "a\nb"])), r"echo a\nb");
    }

    #[test]
    fn a_run_label_is_its_name_else_its_step_else_its_mode() {
        let status = |text: &str| parse_status(Path::new("s"), text).unwrap();
        let named = status(
            r#"{"runId":"a","state":"running","name":"nightly","steps":[{"agent":"sh","commandLabel":"sh -c","status":"running"}]}"#,
        );
        assert_eq!(run_label(&named), "nightly");
        let command = status(
            r#"{"runId":"a","state":"running","steps":[{"agent":"sh","commandLabel":"sh -c","status":"running"}]}"#,
        );
        assert_eq!(run_label(&command), "sh -c");
        let old = status(
            r#"{"runId":"a","state":"running","steps":[{"agent":"sh","status":"running"}]}"#,
        );
        assert_eq!(run_label(&old), "sh");
        let chain = status(
            r#"{"runId":"a","state":"running","mode":"chain","steps":[{"agent":"a","name":"first","status":"running"},{"agent":"b","status":"pending"}]}"#,
        );
        assert_eq!(run_label(&chain), "chain ×2");
        assert_eq!(step_label(&chain.steps()[0]), "first");
        assert_eq!(step_label(&chain.steps()[1]), "b");
    }

    #[test]
    fn empty_list_and_helpers() {
        assert_eq!(
            format_run_list(&[], "Active async runs", 0, None),
            "No active async runs."
        );
        assert_eq!(format_duration(95_000), "1m35s");
        assert_eq!(format_duration(900), "900ms");
        assert_eq!(
            shorten(Path::new("/home/alice2/x"), Some(Path::new("/home/alice"))),
            "/home/alice2/x"
        );
        assert_eq!(
            model_label(&serde_json::from_str(r#"{"model":"qwen2.5-coder:7b"}"#).unwrap()).unwrap(),
            "qwen2.5-coder:7b"
        );
    }
}
