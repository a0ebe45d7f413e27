//! The compact `list`: one line per run, in columns, coloured on a terminal.

use std::path::Path;

use launcher::format::{shorten, spell_duration};
use launcher::{RunState, RunSummary};

/// `--color`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ColorChoice {
    /// On a terminal, unless `$NO_COLOR` is set.
    #[default]
    Auto,
    /// Always (even with `$NO_COLOR`: the flag is the more specific choice).
    Always,
    /// Never.
    Never,
}

/// Whether to colour: `--color` first, then `$NO_COLOR`, then the terminal.
pub fn use_color(choice: ColorChoice, is_terminal: bool, no_color: Option<&str>) -> bool {
    match choice {
        ColorChoice::Always => true,
        ColorChoice::Never => false,
        ColorChoice::Auto => is_terminal && no_color.is_none_or(str::is_empty),
    }
}

const HEADINGS: [&str; 8] = [
    "ID", "STATE", "AGENT", "STEPS", "STARTED", "TIME", "CWD", "REASON",
];

/// Longest reason a row shows, in characters (`status` shows it whole).
const REASON_CHARS: usize = 80;

/// The table: a heading line and one line per run; the `REASON` column
/// only when a run that did not complete has one.
pub fn render(runs: &[RunSummary], now: u64, home: Option<&Path>, color: bool) -> String {
    let mut rows: Vec<Vec<String>> = runs.iter().map(|r| row(r, now, home)).collect();
    let mut headings: Vec<String> = HEADINGS.map(str::to_owned).to_vec();
    if rows.iter().all(|r| r.last().is_some_and(String::is_empty)) {
        headings.pop();
        rows.iter_mut().for_each(|r| {
            r.pop();
        });
    }
    let mut widths: Vec<usize> = headings.iter().map(String::len).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut lines = vec![line(&headings, &widths, None, color)];
    for (row, run) in rows.iter().zip(runs) {
        lines.push(line(row, &widths, Some(run.status.state), color));
    }
    lines.join("\n")
}

fn line(cells: &[String], widths: &[usize], state: Option<RunState>, color: bool) -> String {
    let mut out = String::new();
    for (i, (cell, width)) in cells.iter().zip(widths).enumerate() {
        let last = i == cells.len() - 1;
        let pad = if last {
            String::new()
        } else {
            " ".repeat(width - cell.chars().count() + 2)
        };
        match (color, state, i) {
            (true, None, _) => out.push_str(&format!("\x1b[1m{cell}\x1b[0m{pad}")),
            (true, Some(state), 1) => {
                out.push_str(&format!("\x1b[{}m{cell}\x1b[0m{pad}", state_color(state)))
            }
            _ => out.push_str(&format!("{cell}{pad}")),
        }
    }
    out.trim_end().to_owned()
}

fn state_color(state: RunState) -> &'static str {
    match state {
        RunState::Running => "32",
        RunState::Queued | RunState::Paused => "33",
        RunState::Failed | RunState::Rejected => "31",
        RunState::Stopped => "35",
        RunState::Complete => "2",
    }
}

fn row(run: &RunSummary, now: u64, home: Option<&Path>) -> Vec<String> {
    let s = &run.status;
    let steps = s.steps();
    let done = steps
        .iter()
        .filter(|st| matches!(st.status.as_str(), "complete" | "completed"))
        .count();
    let agent = launcher::format::run_label(s);
    let started = s
        .started_at
        .map(|t| format!("{} ago", ago(now.saturating_sub(t))))
        .unwrap_or_else(|| "-".to_owned());
    let time = match (s.started_at, s.ended_at) {
        (Some(start), Some(end)) => spell_duration(end.saturating_sub(start)),
        (Some(start), None) if s.state.is_active() => {
            format!("{}…", spell_duration(now.saturating_sub(start)))
        }
        _ => "-".to_owned(),
    };
    let cwd = s
        .cwd
        .as_deref()
        .map(|c| shorten(Path::new(c), home))
        .unwrap_or_default();
    // A run of another machine says where it runs: nothing here can tell.
    let state = match s.foreign_host() {
        Some(host) => format!(
            "{}@{}",
            launcher::format::state_label(s),
            launcher::escape(host)
        ),
        None => launcher::format::state_with_queue(s),
    };
    // A run in a Slurm job says where it is: its job, node or why it waits.
    let state = match launcher::format::dispatch_line(s) {
        Some(line) => format!("{state} [{}]", launcher::escape(&line)),
        None => state,
    };
    let reason = s
        .extra
        .get("reason")
        .and_then(|r| r.as_str())
        .filter(|_| !s.state.is_active() && s.state != RunState::Complete)
        .map(|r| launcher::escape(&launcher::format::bounded(r, REASON_CHARS)))
        .unwrap_or_default();
    vec![
        launcher::escape(&run.id),
        state,
        launcher::escape(&agent),
        format!("{done}/{}", steps.len()),
        started,
        time,
        launcher::escape(&cwd),
        reason,
    ]
}

/// `45s`, `12m`, `3h`, `2d`.
fn ago(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86_400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use launcher::{RunStatus, Step};

    const NOW: u64 = 1_800_000_000_000;

    fn run(
        id: &str,
        state: RunState,
        started: u64,
        ended: Option<u64>,
        steps: &[&str],
    ) -> RunSummary {
        let mut status = RunStatus::new(id, state);
        status.started_at = Some(started);
        status.ended_at = ended;
        status.cwd = Some("/home/me/project".into());
        status.mode = Some(if steps.len() > 1 { "chain" } else { "single" }.into());
        status.steps = Some(
            steps
                .iter()
                .map(|s| Step {
                    agent: "claude".into(),
                    status: (*s).into(),
                    ..Step::default()
                })
                .collect(),
        );
        RunSummary {
            id: id.into(),
            async_dir: "/x".into(),
            status,
        }
    }

    #[test]
    fn one_aligned_line_per_run() {
        let runs = [
            run(
                "aaaa",
                RunState::Running,
                NOW - 90_000,
                None,
                &["complete", "running", "pending"],
            ),
            run(
                "bbbbbbbb",
                RunState::Failed,
                NOW - 3 * 86_400_000,
                Some(NOW - 3 * 86_400_000 + 2_500),
                &["failed"],
            ),
        ];
        let table = render(&runs, NOW, Some(Path::new("/home/me")), false);
        assert_eq!(
            table,
            "ID        STATE    AGENT     STEPS  STARTED  TIME    CWD\n\
             aaaa      running  chain ×3  1/3    1m ago   1m30s…  ~/project\n\
             bbbbbbbb  failed   claude    0/1    3d ago   2.5s    ~/project"
        );
    }

    #[test]
    fn color_follows_the_flag_then_no_color_then_the_terminal() {
        assert!(use_color(ColorChoice::Always, false, Some("1")));
        assert!(!use_color(ColorChoice::Never, true, None));
        assert!(use_color(ColorChoice::Auto, true, None));
        assert!(use_color(ColorChoice::Auto, true, Some("")));
        assert!(!use_color(ColorChoice::Auto, true, Some("1")));
        assert!(!use_color(ColorChoice::Auto, false, None));
        let runs = [run("a", RunState::Failed, NOW, Some(NOW), &["failed"])];
        assert!(render(&runs, NOW, None, true).contains("\x1b[31mfailed\x1b[0m"));
    }

    #[test]
    fn a_run_that_did_not_complete_shows_its_reason_last() {
        let mut failed = run(
            "bbbb",
            RunState::Failed,
            NOW - 2_000,
            Some(NOW - 1_000),
            &["failed"],
        );
        let long = format!("Not logged in · Please run /login\n{}", "x".repeat(200));
        failed.status.extra.insert("reason".into(), long.into());
        let mut done = run(
            "aaaa",
            RunState::Complete,
            NOW - 2_000,
            Some(NOW),
            &["complete"],
        );
        done.status.extra.insert("reason".into(), "stale".into());
        let table = render(&[done, failed], NOW, None, false);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].ends_with(" REASON"), "{table}");
        assert!(lines[1].ends_with("/home/me/project"), "{table}");
        let reason = lines[2].split("/home/me/project  ").nth(1).unwrap();
        assert!(
            reason.starts_with("Not logged in · Please run /login\\nxxx"),
            "{reason}"
        );
        // 80 characters and `…`, the newline escaped as two.
        assert_eq!(reason.chars().count(), REASON_CHARS + 2, "{reason}");
    }
}
