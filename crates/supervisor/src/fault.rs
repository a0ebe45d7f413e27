//! Fault injection for crash tests: `SUBAGENTS_FAULT=<process>:<point>`.
//!
//! Off unless the variable is set. When it names this process and a point
//! it reaches, the process sends itself SIGKILL there — no clean-up, no
//! destructors, exactly like an OOM kill or a power cut of that one process.
//! The crash-matrix test (`crates/subagents/tests/it/crash_matrix.rs`) drives
//! every cell.
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
//! The variable is read once per process role (a monitor or runner forked
//! without `exec` declares its role again). The runner removes it from every
//! COMMAND's environment, so a nested run is not affected. An unknown value
//! is reported once on stderr and otherwise ignored.

use std::sync::Mutex;

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

/// The point armed for this process, once `init` said which process we
/// are. A lock rather than a once-cell: a monitor or runner forked from
/// its parent without `exec` starts with the parent's value and declares
/// its own.
static ARMED: Mutex<Option<(Process, Point)>> = Mutex::new(None);

/// Declares which process this is and arms its fault, if any. Call once at
/// the start of each process, before its first state write.
pub fn init(me: Process) {
    let armed = std::env::var(FAULT_ENV).ok().and_then(|value| {
        let Some((process, point)) = parse(&value) else {
            eprintln!("subagents: ignoring unknown {FAULT_ENV}='{value}'");
            return None;
        };
        (process == me).then_some((process, point))
    });
    *ARMED.lock().unwrap_or_else(|e| e.into_inner()) = armed;
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

fn armed_process() -> Option<(Process, Point)> {
    *ARMED.lock().unwrap_or_else(|e| e.into_inner())
}

fn armed() -> Option<Point> {
    armed_process().map(|(_, point)| point)
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
    if let Some((process, point)) = armed_process() {
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

    /// Names the case [`faulted_process`] plays in a copy of this test binary.
    const CASE_ENV: &str = "SUBAGENTS_FAULT_TEST_CASE";

    /// Not a test of its own: the body of the copy of this test binary that
    /// [`an_armed_fault_kills_only_its_own_process_at_its_own_point`] starts
    /// (a fault SIGKILLs the process it fires in, and `init` arms a process
    /// once). Without the case variable it returns at once.
    #[test]
    fn faulted_process() {
        let Ok(case) = std::env::var(CASE_ENV) else {
            return;
        };
        let run_dir = std::path::PathBuf::from(std::env::var("RUN_DIR").unwrap());
        let mut status = status::model::RunStatus::new("r", status::RunState::Running);
        match case.as_str() {
            "point" => {
                init(Process::Runner);
                point(Point::AfterReady);
                println!("passed after-ready");
                point(Point::DuringStep);
            }
            "other-process" => {
                init(Process::Monitor);
                point(Point::DuringStep);
            }
            "status-write" => {
                init(Process::Monitor);
                println!("passed init");
                status::model::write_status(&run_dir, &status).unwrap();
            }
            "step-started" => {
                init(Process::Monitor);
                status.steps = Some(vec![status::model::Step {
                    external_process: Some(status::model::ExternalProcess {
                        pid: Some(4242),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]);
                status::model::write_status(&run_dir, &status).unwrap();
                println!("passed the status write");
                when_step_started(&run_dir);
            }
            other => panic!("unknown case {other}"),
        }
        println!("survived");
    }

    /// Runs [`faulted_process`] as `case` with `SUBAGENTS_FAULT=fault`:
    /// whether SIGKILL ended it, its stdout and its stderr.
    fn run_case(case: &str, fault: &str) -> (bool, String, String) {
        use std::os::unix::process::ExitStatusExt;
        // The process tests reap any child; ours must not be taken.
        let _serial = crate::procs::tests::serial();
        let run_dir = tempfile::tempdir().unwrap();
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "fault::tests::faulted_process", "--nocapture"])
            .env(CASE_ENV, case)
            .env(FAULT_ENV, fault)
            .env("RUN_DIR", run_dir.path())
            .output()
            .unwrap();
        (
            out.status.signal() == Some(libc::SIGKILL),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    #[test]
    fn an_armed_fault_kills_only_its_own_process_at_its_own_point() {
        let (killed, stdout, stderr) = run_case("point", "runner:during-step");
        assert!(killed, "{stdout}{stderr}");
        assert!(stdout.contains("passed after-ready"), "{stdout}");
        assert!(!stdout.contains("survived"), "{stdout}");
        assert!(
            stderr.contains("subagents: fault injected: runner:during-step"),
            "{stderr}"
        );

        let (killed, stdout, stderr) = run_case("other-process", "runner:during-step");
        assert!(!killed, "{stdout}{stderr}");
        assert!(stdout.contains("survived"), "{stdout}");
        assert!(!stderr.contains("fault injected"), "{stderr}");
    }

    #[test]
    fn a_fault_inside_the_status_writer_fires_through_its_hook() {
        let (killed, stdout, stderr) = run_case("status-write", "monitor:mid-status-write");
        assert!(killed, "{stdout}{stderr}");
        assert!(stdout.contains("passed init"), "{stdout}");
        assert!(!stdout.contains("survived"), "{stdout}");
        assert!(
            stderr.contains("subagents: fault injected: monitor:mid-status-write"),
            "{stderr}"
        );
    }

    #[test]
    fn the_monitors_during_step_fault_fires_once_the_status_shows_a_started_step() {
        let (killed, stdout, stderr) = run_case("step-started", "monitor:during-step");
        assert!(killed, "{stdout}{stderr}");
        assert!(stdout.contains("passed the status write"), "{stdout}");
        assert!(!stdout.contains("survived"), "{stdout}");
        assert!(
            stderr.contains("subagents: fault injected: monitor:during-step"),
            "{stderr}"
        );
    }
}
