//! Fault injection for crash tests: `SUBAGENTS_FAULT=<process>:<point>`.
//!
//! Off unless the variable is set. When it names this process and a point
//! it reaches, the process sends itself SIGKILL there — no clean-up, no
//! destructors, exactly like an OOM kill or a power cut of that one process.
//! The crash-matrix test (`tests/crash_matrix.rs`) drives every cell.
//!
//! * `<process>`: `launcher` (`subagents run` / `resume`), `monitor`
//!   (`__monitor`), `runner` (`__runner`).
//! * `<point>`:
//!   - `after-run-dir`: the run directory exists, nothing is spawned yet by
//!     this process (launcher: queued status, marker and slot are written;
//!     monitor: registered in the status, the runner not spawned; runner:
//!     before its marker, status and ready line);
//!   - `before-ready` / `after-ready`: around the runner's `ready` line
//!     (launcher: monitor spawned, ready not read / ready read, capacity slot
//!     not settled);
//!   - `after-ack`: revival handshake (launcher: ack written; runner: ack read
//!     and `acknowledged` written, proceed not yet received);
//!   - `during-step`: a COMMAND is running (runner: right after it started;
//!     monitor: once the status shows a started step);
//!   - `after-candidate`: the process-terminal candidate exists (runner: after
//!     its last candidate write; monitor: the runner is gone, the proof not
//!     yet finalized);
//!   - `after-proof`: monitor, `process-terminal.json` written, not yet
//!     overlaid on the status, marker not released;
//!   - `mid-status-write`: inside this process's first atomic write of
//!     `status.json`: the temp file is written and synced, not renamed.
//!
//! Just before dying the process writes `subagents: fault injected:
//! <process>:<point>` to its stderr (the launcher's terminal, or the run's
//! `runner.stderr.log`), so a test can tell the fault fired.
//!
//! The variable is read once per process. The runner removes it from every
//! COMMAND's environment, so a nested run is not affected. An unknown value
//! is reported once on stderr and otherwise ignored.

use std::sync::OnceLock;

/// The environment variable that arms a fault.
pub const FAULT_ENV: &str = "SUBAGENTS_FAULT";

/// The processes of a run that can be faulted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Process {
    /// `subagents run` / `subagents resume`.
    Launcher,
    /// `subagents __monitor`.
    Monitor,
    /// `subagents __runner`.
    Runner,
}

/// The named points (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Point {
    /// Run directory exists, nothing spawned by this process.
    AfterRunDir,
    /// Just before the runner's ready line is sent / read.
    BeforeReady,
    /// Just after the runner's ready line was sent / read.
    AfterReady,
    /// Revival handshake: after the ack.
    AfterAck,
    /// A COMMAND is running.
    DuringStep,
    /// The process-terminal candidate exists.
    AfterCandidate,
    /// `process-terminal.json` exists, not yet overlaid.
    AfterProof,
    /// Inside the atomic write of `status.json`, before the rename.
    MidStatusWrite,
}

impl Point {
    const ALL: [(Point, &'static str); 8] = [
        (Point::AfterRunDir, "after-run-dir"),
        (Point::BeforeReady, "before-ready"),
        (Point::AfterReady, "after-ready"),
        (Point::AfterAck, "after-ack"),
        (Point::DuringStep, "during-step"),
        (Point::AfterCandidate, "after-candidate"),
        (Point::AfterProof, "after-proof"),
        (Point::MidStatusWrite, "mid-status-write"),
    ];

    /// The point's name in `SUBAGENTS_FAULT`.
    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(p, _)| *p == self)
            .map_or("", |(_, n)| n)
    }

    fn parse(name: &str) -> Option<Point> {
        Self::ALL.iter().find(|(_, n)| *n == name).map(|(p, _)| *p)
    }
}

/// Parses `<process>:<point>`.
pub fn parse(value: &str) -> Option<(Process, Point)> {
    let (process, point) = value.trim().split_once(':')?;
    let process = match process {
        "launcher" => Process::Launcher,
        "monitor" => Process::Monitor,
        "runner" => Process::Runner,
        _ => return None,
    };
    Some((process, Point::parse(point)?))
}

/// The point armed for this process, once `init` said which process we are.
static ARMED: OnceLock<Option<(Process, Point)>> = OnceLock::new();

/// Declares which process this is and arms its fault, if any. Call once at
/// the start of each process, before its first state write.
pub fn init(me: Process) {
    let armed = ARMED.get_or_init(|| {
        let value = std::env::var(FAULT_ENV).ok()?;
        let Some((process, point)) = parse(&value) else {
            eprintln!("subagents: ignoring unknown {FAULT_ENV}='{value}'");
            return None;
        };
        (process == me).then_some((process, point))
    });
    let point = armed.map(|(_, point)| point);
    // Points inside the protocol crates' writers are reached through their hooks.
    if matches!(point, Some(Point::MidStatusWrite | Point::AfterProof)) {
        status::install_fault_hook(named);
    }
    if point == Some(Point::AfterAck) {
        handshake::install_fault_hook(named);
    }
}

/// Dies here if this process's armed fault is `point`.
pub fn point(point: Point) {
    if armed() == Some(point) {
        die();
    }
}

fn armed() -> Option<Point> {
    ARMED.get().copied().flatten().map(|(_, point)| point)
}

/// Monitor `during-step`: the monitor only waits, so when that fault is
/// armed it watches the status until a step has started, then dies.
pub fn when_step_started(run_dir: &std::path::Path) {
    if armed() != Some(Point::DuringStep) {
        return;
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::time::Instant::now() < deadline {
        let started = status::model::read_status(run_dir)
            .ok()
            .flatten()
            .is_some_and(|s| {
                s.steps().iter().any(|step| {
                    step.external_process
                        .as_ref()
                        .is_some_and(|p| p.pid.is_some())
                })
            });
        if started {
            die();
        }
        // Fault-injection only: a 10 ms poll of a file nobody signals us about.
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// The hook handed to the protocol crates: their points go by name.
fn named(name: &str) {
    if let Some(p) = Point::parse(name) {
        point(p);
    }
}

fn die() -> ! {
    if let Some((process, point)) = ARMED.get().copied().flatten() {
        // The one trace a crash test can check: stderr is already open
        // (a terminal, or the run's runner.stderr.log).
        let process = format!("{process:?}").to_lowercase();
        eprintln!("subagents: fault injected: {process}:{}", point.name());
    }
    // SAFETY: kill(2) and getpid(2) have no memory effects.
    unsafe {
        libc::kill(libc::getpid(), libc::SIGKILL);
    }
    // SIGKILL to ourselves is delivered before kill returns; never reached.
    std::process::abort()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_process_and_point_parses_and_nothing_else_does() {
        for (point, name) in Point::ALL {
            assert_eq!(point.name(), name);
            for (text, process) in [
                ("launcher", Process::Launcher),
                ("monitor", Process::Monitor),
                ("runner", Process::Runner),
            ] {
                assert_eq!(parse(&format!("{text}:{name}")), Some((process, point)));
            }
        }
        for bad in [
            "",
            "runner",
            "runner:",
            ":during-step",
            "shell:during-step",
            "runner:later",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }
}
