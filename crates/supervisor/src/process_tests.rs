//! The runner and the monitor as real processes.
//!
//! Their code runs only in those processes, so these tests start a copy of
//! this test binary with `__runner` or `__monitor` as its first argument
//! (the role the real binary dispatches on) and the launch config on stdin.
//! The copy plays the process (see `play_a_process_in_a_copy`); the test
//! reads what it left in the run directory.
//! A monitor started this way spawns its runner the same way (`current_exe
//! __runner <run id>`), so the whole process chain is the real one.

use std::io::Write;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use status::RunState;
use status::model::{RunStatus, read_status, write_status};

use crate::config::{GroupConfig, LaunchConfig, StepConfig};

/// Set in a copy that plays a process (read by `play_a_process_in_a_copy`):
/// the most seconds the copy may live.
const CASE_ENV: &str = "SUBAGENTS_PROCESS_TEST";

/// A copy's lifetime: five times the bound `finish` puts on a test's
/// process. A copy outlives its test only when the test binary was killed
/// (cargo-mutants ends a mutant's test run that way, and a runner leads a
/// process group of its own, so nothing else ends it).
const COPY_LIFETIME_S: u32 = 300;

/// A copy that plays a process never reaches the test harness: this
/// constructor runs before `main` and, when `SUBAGENTS_PROCESS_TEST` is set
/// and the first argument is `__runner` or `__monitor`, runs that process's
/// `main` and exits with its code. (Entry points written as `#[test]`s would
/// be counted as tests that check nothing.)
///
/// A runner blocks SIGCHLD and the stop signals in its only thread and
/// reads them from a signalfd; blocking them here, before any thread
/// exists, gives every thread the copy starts the same mask, as in the real
/// binary.
///
/// The copy also arms `alarm` with the lifetime `SUBAGENTS_PROCESS_TEST`
/// names (SIGALRM, neither blocked nor handled, ends it): a copy whose test
/// binary was killed cannot run on for hours. A forked child starts with no
/// alarm, so the runner a monitor copy spawns arms its own in this
/// constructor, and a step's COMMAND has none.
#[used]
#[unsafe(link_section = ".init_array")]
static PLAY_A_PROCESS_IN_A_COPY: extern "C" fn(libc::c_int, *const *const libc::c_char) =
    play_a_process_in_a_copy;

extern "C" fn play_a_process_in_a_copy(argc: libc::c_int, argv: *const *const libc::c_char) {
    // SAFETY: getenv with a static NUL-terminated name, before any thread exists.
    let lifetime = unsafe { libc::getenv(c"SUBAGENTS_PROCESS_TEST".as_ptr()) };
    if lifetime.is_null() || argc < 2 {
        return;
    }
    // SAFETY: glibc passes the process's argc and argv to `.init_array`
    // functions; argv[1] exists (argc >= 2) and is NUL-terminated.
    let role = unsafe { std::ffi::CStr::from_ptr(*argv.add(1)) };
    let main: fn() -> i32 = match role.to_bytes() {
        b"__runner" => crate::runner::main,
        b"__monitor" => crate::monitor::main,
        // A probe a step runs: prints what is left of the alarm it was
        // exec'ed with (alarms survive exec) and exits.
        b"__alarm_left" => {
            // SAFETY: alarm(2) only reads and clears this process's timer.
            let left = unsafe { libc::alarm(0) };
            print!("{left}");
            std::process::exit(0);
        }
        _ => return,
    };
    // SAFETY: sigset operations on a set we own; sigprocmask of our only thread.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in [libc::SIGCHLD, libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut set, sig);
        }
        libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        // What the Rust runtime does before `main`, which has not run yet.
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    // SAFETY: getenv returned a NUL-terminated string, unchanged since.
    let seconds = unsafe { std::ffi::CStr::from_ptr(lifetime) }
        .to_str()
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(COPY_LIFETIME_S);
    // SAFETY: alarm(2) only arms this process's real-time timer.
    unsafe { libc::alarm(seconds) };
    std::process::exit(main());
}

/// A run directory under a temporary state root, with a queued status.
struct Run {
    _root: tempfile::TempDir,
    config: LaunchConfig,
}

/// A step running `sh -c script` in the run directory.
fn sh(agent: &str, script: &str, run_dir: &Path) -> StepConfig {
    StepConfig {
        agent: agent.into(),
        command: vec!["sh".into(), "-c".into(), script.into()],
        cwd: run_dir.to_owned(),
        task_file: None,
        timeout_ms: None,
        fanout_label: None,
        env: Default::default(),
        idle_timeout_ms: None,
        previous_in_task: false,
    }
}

fn group(start: usize, count: usize, concurrency: usize, fail_fast: bool) -> GroupConfig {
    GroupConfig {
        start,
        count,
        concurrency,
        fail_fast,
        parallel: count > 1,
    }
}

impl Run {
    /// `steps` as `(agent, script)`, run in `groups`.
    fn new(steps: &[(&str, &str)], groups: Vec<GroupConfig>) -> Run {
        let root = tempfile::tempdir().unwrap();
        let run_dir = root.path().join("async-subagent-runs").join("run-qz7");
        std::fs::create_dir_all(&run_dir).unwrap();
        let config = LaunchConfig {
            run_id: "run-qz7".into(),
            root: root.path().to_owned(),
            run_dir: run_dir.clone(),
            runner_process_instance_id: "rid-qz7".into(),
            mode: if groups.len() > 1 {
                "chain"
            } else {
                "parallel"
            }
            .into(),
            steps: steps
                .iter()
                .map(|(agent, script)| sh(agent, script, &run_dir))
                .collect(),
            groups,
            timeout_ms: None,
            session_id: None,
            fanout_descriptor: None,
            env: Default::default(),
            capacity_slot: None,
            revival: None,
            session_root: None,
            queue: None,
        };
        Run {
            _root: root,
            config,
        }
    }

    fn dir(&self) -> &Path {
        &self.config.run_dir
    }

    /// Makes the run a revival whose runner exits before proceed: its
    /// session file does not exist, so it gets no lease. The launcher's
    /// handshake waits are `launcher_wait_ms` each.
    fn revive(&mut self, launcher_wait_ms: u64) {
        let root = self._root.path();
        self.config.revival = Some(crate::config::RevivalConfig {
            source_run_id: "run-src".into(),
            session_file: root.join("gone-session.jsonl"),
            lease_root: root.join("session-leases"),
            token: "token-qz7".into(),
            timeouts_ms: (launcher_wait_ms, 600_000),
        });
    }

    /// Writes the queued status the launcher writes before any process.
    fn queue(&self) {
        let queued = crate::transitions::queued(&self.config, None, None, status::now_ms());
        write_status(self.dir(), &queued).unwrap();
    }

    /// Starts a copy of this binary as `role` with the config on stdin.
    fn start(&self, role: &str) -> std::process::Child {
        self.start_from(&std::env::current_exe().unwrap(), role, |_| {})
            .0
    }

    /// Starts `exe` as `role`; `before_config` runs once it has started and
    /// before its config is written. A monitor gets the ready pipe as
    /// descriptor 3, as `spawn` hands it one; its read end is returned.
    fn start_from(
        &self,
        exe: &Path,
        role: &str,
        before_config: impl FnOnce(&std::process::Child),
    ) -> (std::process::Child, Option<std::fs::File>) {
        use std::os::fd::{AsRawFd, OwnedFd};
        use std::os::unix::process::CommandExt;
        let mut command = Command::new(exe);
        command
            .args([role, &self.config.run_id, "--nocapture"])
            .env(CASE_ENV, COPY_LIFETIME_S.to_string())
            .current_dir(self.dir())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut ready = None;
        if role == "__monitor" {
            let (read, write): (OwnedFd, OwnedFd) =
                nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
            let fd = write.as_raw_fd();
            command.env(crate::config::READY_FD_ENV, "3");
            // SAFETY: only dup2/fcntl between fork and exec.
            unsafe {
                command.pre_exec(move || crate::spawn::inherit_as_fd3(fd));
            }
            ready = Some((std::fs::File::from(read), write));
        }
        let mut child = command.spawn().unwrap();
        let ready = ready.map(|(read, write)| {
            drop(write);
            read
        });
        before_config(&child);
        let config = serde_json::to_vec(&self.config).unwrap();
        child.stdin.take().unwrap().write_all(&config).unwrap();
        (child, ready)
    }

    fn status(&self) -> RunStatus {
        read_status(self.dir()).unwrap().unwrap()
    }

    /// Every event, in order, as JSON.
    fn events(&self) -> Vec<Value> {
        std::fs::read_to_string(self.dir().join(status::layout::files::EVENTS))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn event_types(&self) -> Vec<String> {
        self.events()
            .iter()
            .map(|e| e["type"].as_str().unwrap_or_default().to_owned())
            .collect()
    }

    fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir().join(name)).unwrap_or_default()
    }
}

/// Waits (bounded) for `child` to exit; kills it on the bound, which a
/// run that hangs reaches.
fn finish(mut child: std::process::Child) -> (ExitStatus, String) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(exit) = child.try_wait().unwrap() {
            let mut stderr = String::new();
            let _ = std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr);
            return (exit, stderr);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the process never exited");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Polls (bounded) until `done` holds.
pub(crate) fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "never: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Runs the runner to its end; its exit status and stderr.
fn run_runner(run: &Run) -> (ExitStatus, String) {
    let _serial = crate::procs::tests::serial();
    run.queue();
    finish(run.start("__runner"))
}

fn step_field(s: &RunStatus, i: usize) -> &status::model::Step {
    &s.steps()[i]
}

fn pids_of(s: &RunStatus) -> Vec<Option<u32>> {
    s.steps()
        .iter()
        .map(|st| st.external_process.as_ref().and_then(|p| p.pid))
        .collect()
}

#[test]
fn a_chain_runs_its_steps_in_order_hands_each_its_predecessors_output_and_completes() {
    let mut run = Run::new(
        &[
            ("first", "echo one"),
            ("second", "cat \"$SUBAGENTS_PREVIOUS_OUTPUT\"; echo two"),
        ],
        vec![group(0, 1, 1, false), group(1, 1, 1, false)],
    );
    // A step limit that is never reached must not end a step.
    run.config.steps[0].timeout_ms = Some(60_000);
    let (exit, stderr) = run_runner(&run);
    assert!(exit.success(), "{exit:?} {stderr}");
    let s = run.status();
    assert_eq!(s.state, RunState::Complete, "{stderr}");
    assert_eq!(
        (s.error.as_deref(), s.timed_out, s.stopped),
        (None, None, None)
    );
    for i in 0..2 {
        let step = step_field(&s, i);
        assert_eq!(step.status, "complete");
        assert_eq!((step.exit_code, step.timed_out), (Some(0), None));
        let process = step.external_process.as_ref().unwrap();
        assert!(process.pid.is_some());
        assert_eq!(process.exit_code, Some(0));
    }
    // A COMMAND that wrote nothing to its output file gets its stdout there.
    assert_eq!(run.read("output-0.log"), "one\n");
    assert_eq!(run.read("output-1.log"), "one\ntwo\n");
    assert!(status::index::has_marker(run.dir()));
    assert_eq!(
        run.event_types(),
        [
            "subagent.run.started",
            "subagent.step.started",
            "subagent.step.completed",
            "subagent.step.started",
            "subagent.step.completed",
            "subagent.run.completed",
        ]
    );
    let completed = run.events().pop().unwrap();
    assert_eq!(completed["status"], "complete");
    let candidate = status::proof::read_candidate(run.dir()).unwrap().unwrap();
    for (i, pid) in pids_of(&s).into_iter().enumerate() {
        let writer = &candidate.writers[&i.to_string()][0];
        assert_eq!(writer.exit_code, Some(0));
        assert!(matches!(
            writer.process_tree,
            status::proof::ProcessTree::Observed { process_group_id, .. }
                if Some(process_group_id) == pid
        ));
    }
}

/// Each step of a chain records the output file it was handed and its
/// contents, then prints its own name.
const RECORD_PREVIOUS: &str = "p=\"${SUBAGENTS_PREVIOUS_OUTPUT:-none}\"; \
     { printf '%s\\n' \"${p##*/}\"; cat \"${SUBAGENTS_PREVIOUS_OUTPUT:-/dev/null}\"; } \
     > saw-$SUBAGENTS_STEP_INDEX; echo \"$0\"";

#[test]
fn every_later_chain_step_gets_only_the_output_of_the_group_just_before_it() {
    // Five steps in four groups: one, one, a parallel pair, one. A runner
    // that kept handing on the first step's output (or an older group's)
    // passes a two-step chain; here every step sees a different file.
    let names = ["s0", "s1", "s2a", "s2b", "s3"];
    let scripts: Vec<String> = names
        .iter()
        .map(|n| format!("sh -c '{}' {n}", RECORD_PREVIOUS.replace('\'', "'\\''")))
        .collect();
    let steps: Vec<(&str, &str)> = names
        .iter()
        .zip(&scripts)
        .map(|(n, s)| (*n, s.as_str()))
        .collect();
    let run = Run::new(
        &steps,
        vec![
            group(0, 1, 1, false),
            group(1, 1, 1, false),
            group(2, 2, 2, false),
            group(4, 1, 1, false),
        ],
    );
    let (exit, stderr) = run_runner(&run);
    assert!(exit.success(), "{exit:?} {stderr}");
    assert_eq!(run.status().state, RunState::Complete, "{stderr}");
    assert_eq!(
        run.read("saw-0"),
        "none\n",
        "the first step has no predecessor"
    );
    assert_eq!(run.read("saw-1"), "output-0.log\ns0\n");
    assert_eq!(run.read("saw-2"), "output-1.log\ns1\n");
    assert_eq!(run.read("saw-3"), "output-1.log\ns1\n");
    assert_eq!(
        run.read("saw-4"),
        "output-group-2.log\n=== s2a (step 3) ===\ns2a\n=== s2b (step 4) ===\ns2b\n",
        "the step after a parallel group gets the group's combined output"
    );
}

#[test]
fn a_failed_chain_step_ends_the_run_and_the_next_never_starts() {
    let run = Run::new(
        &[("first", "exit 3"), ("second", "touch second-ran")],
        vec![group(0, 1, 1, false), group(1, 1, 1, false)],
    );
    let (exit, stderr) = run_runner(&run);
    assert!(exit.success(), "{exit:?} {stderr}");
    let s = run.status();
    assert_eq!(s.state, RunState::Failed);
    assert_eq!(
        s.error.as_deref(),
        Some("first: command ended with exit code 3")
    );
    assert_eq!(step_field(&s, 0).status, "failed");
    assert_eq!(step_field(&s, 0).exit_code, Some(3));
    assert_eq!(step_field(&s, 1).status, "pending");
    assert!(!run.dir().join("second-ran").exists());
    assert!(
        run.event_types()
            .contains(&"subagent.step.failed".to_owned())
    );
}

#[test]
fn a_group_never_runs_more_steps_at_once_than_its_concurrency() {
    // With one at a time, the second step starts only after the first ended.
    let run = Run::new(
        &[
            ("first", "sleep 1; touch first-done"),
            ("second", "test -e first-done"),
        ],
        vec![group(0, 2, 1, false)],
    );
    let (exit, stderr) = run_runner(&run);
    assert!(exit.success(), "{exit:?} {stderr}");
    let s = run.status();
    assert_eq!(s.state, RunState::Complete, "{:?}", s.steps());
}

#[test]
fn a_fail_fast_group_skips_what_it_did_not_start_after_a_failure_and_only_then() {
    let run = Run::new(
        &[("first", "exit 4"), ("second", "touch second-ran")],
        vec![group(0, 2, 1, true)],
    );
    run_runner(&run);
    let s = run.status();
    assert_eq!(s.state, RunState::Failed);
    assert_eq!(step_field(&s, 1).status, "failed");
    assert_eq!(
        step_field(&s, 1).error.as_deref(),
        Some("skipped: a sibling failed (failFast)")
    );
    assert!(!run.dir().join("second-ran").exists());

    let run = Run::new(
        &[("first", "true"), ("second", "true")],
        vec![group(0, 2, 1, true)],
    );
    run_runner(&run);
    assert_eq!(run.status().state, RunState::Complete);
}

#[test]
fn a_step_past_its_limit_is_terminated_and_reported_timed_out_without_its_siblings() {
    // The first step ignores nothing: SIGTERM ends it. The second outlives
    // the first's limit and has none of its own.
    let mut run = Run::new(
        &[("slow", "sleep 30"), ("steady", "sleep 2; echo fine")],
        vec![group(0, 2, 2, false)],
    );
    run.config.steps[0].timeout_ms = Some(300);
    run_runner(&run);
    let s = run.status();
    let slow = step_field(&s, 0);
    assert_eq!(slow.status, "failed");
    assert_eq!(slow.timed_out, Some(true));
    assert_eq!(slow.error.as_deref(), Some("timed out after 300ms"));
    let steady = step_field(&s, 1);
    assert_eq!(
        (steady.status.as_str(), steady.timed_out),
        ("complete", None)
    );
    // A step's limit is not the run's.
    assert_eq!(s.timed_out, None);
    assert_eq!(s.error.as_deref(), Some("slow: timed out after 300ms"));
}

#[test]
fn a_step_limit_counts_from_the_steps_own_start_not_the_runs() {
    // The second step starts 2 s into the run with a 1.5 s limit and needs
    // 0.2 s: counted from the run's start its limit would be spent before
    // it began.
    let mut run = Run::new(
        &[("first", "sleep 2"), ("second", "sleep 0.2; echo done")],
        vec![group(0, 1, 1, false), group(1, 1, 1, false)],
    );
    run.config.steps[1].timeout_ms = Some(1_500);
    let (exit, stderr) = run_runner(&run);
    assert!(exit.success(), "{exit:?} {stderr}");
    let s = run.status();
    let second = step_field(&s, 1);
    assert_eq!(
        (second.status.as_str(), second.timed_out, s.state),
        ("complete", None, RunState::Complete),
        "{:?}",
        second.error
    );
    assert_eq!(run.read("output-1.log"), "done\n");
}

#[test]
fn a_step_that_ignores_sigterm_gets_sigkill_after_the_grace_and_one_that_exits_gets_its_grace() {
    let mut run = Run::new(
        &[
            ("stubborn", "trap '' TERM; sleep 10"),
            ("tidy", "trap 'echo bye; exit 3' TERM; sleep 10 & wait"),
        ],
        vec![group(0, 2, 2, false)],
    );
    run.config.steps[0].timeout_ms = Some(300);
    run.config.steps[1].timeout_ms = Some(300);
    run_runner(&run);
    let s = run.status();
    let stubborn = step_field(&s, 0).external_process.as_ref().unwrap();
    assert_eq!(stubborn.process_signal.as_deref(), Some("SIGKILL"));
    let tidy = step_field(&s, 1).external_process.as_ref().unwrap();
    assert_eq!(
        (tidy.exit_code, tidy.process_signal.as_deref()),
        (Some(3), None)
    );
    assert_eq!(step_field(&s, 1).timed_out, Some(true));
}

#[test]
fn a_run_past_its_limit_ends_the_running_step_and_the_unstarted_ones_and_keeps_the_finished() {
    let mut run = Run::new(
        &[
            ("quick", "true"),
            ("slow", "sleep 5"),
            ("never", "touch never-ran"),
        ],
        vec![
            group(0, 1, 1, false),
            group(1, 1, 1, false),
            group(2, 1, 1, false),
        ],
    );
    run.config.timeout_ms = Some(700);
    run_runner(&run);
    let s = run.status();
    assert_eq!(s.state, RunState::Failed);
    assert_eq!(s.timed_out, Some(true));
    assert_eq!(s.error.as_deref(), Some("timed out after 700ms"));
    assert_eq!(step_field(&s, 0).status, "complete");
    assert_eq!(step_field(&s, 0).timed_out, None);
    for i in [1, 2] {
        assert_eq!(step_field(&s, i).status, "failed");
        assert_eq!(step_field(&s, i).timed_out, Some(true));
    }
    assert!(!run.dir().join("never-ran").exists());
    let timed_out = run
        .events()
        .into_iter()
        .find(|e| e["type"] == "subagent.run.timed_out")
        .expect("a run.timed_out event");
    assert_eq!(timed_out["timeoutMs"], 700);
    assert_eq!(
        timed_out["deadlineAt"].as_u64(),
        s.started_at.map(|t| t + 700)
    );
    assert_eq!(
        run.events().pop().unwrap()["type"],
        "subagent.run.completed"
    );
}

#[test]
fn a_stopped_run_ends_its_step_records_the_stop_and_starts_nothing_more() {
    let run = Run::new(
        &[("first", "sleep 30"), ("second", "touch second-ran")],
        vec![group(0, 1, 1, false), group(1, 1, 1, false)],
    );
    let _serial = crate::procs::tests::serial();
    run.queue();
    let runner = run.start("__runner");
    until("the first step started", || {
        read_status(run.dir())
            .ok()
            .flatten()
            .is_some_and(|s| pids_of(&s)[0].is_some())
    });
    // SAFETY: kill(2) to the runner we started, a positive pid.
    unsafe { libc::kill(runner.id() as i32, libc::SIGTERM) };
    let (exit, stderr) = finish(runner);
    assert!(exit.success(), "{exit:?} {stderr}");
    let s = run.status();
    assert_eq!(s.state, RunState::Stopped);
    assert_eq!(s.stopped, Some(true));
    assert_eq!(step_field(&s, 0).status, "stopped");
    assert_eq!(step_field(&s, 1).status, "stopped");
    assert!(!run.dir().join("second-ran").exists());
    let types = run.event_types();
    assert!(
        types.contains(&"subagent.run.stopped".to_owned()),
        "{types:?}"
    );
}

#[test]
fn a_command_that_cannot_start_fails_its_step_with_the_shells_code() {
    let mut run = Run::new(
        &[("missing", ""), ("denied", "")],
        vec![group(0, 2, 2, false)],
    );
    let not_executable = run.dir().join("not-executable");
    std::fs::write(&not_executable, "#!/bin/sh\n").unwrap();
    run.config.steps[0].command = vec!["/nonexistent/command-qz7".into()];
    run.config.steps[1].command = vec![not_executable.display().to_string()];
    let (exit, stderr) = run_runner(&run);
    assert!(exit.success(), "{exit:?} {stderr}");
    let s = run.status();
    assert_eq!(s.state, RunState::Failed);
    assert_eq!(step_field(&s, 0).exit_code, Some(127));
    assert_eq!(step_field(&s, 1).exit_code, Some(126));
}

#[test]
fn a_runner_without_a_readable_config_exits_1() {
    let run = Run::new(&[("a", "true")], vec![group(0, 1, 1, false)]);
    let _serial = crate::procs::tests::serial();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["__runner", "run-qz7", "--nocapture"])
        .env(CASE_ENV, COPY_LIFETIME_S.to_string())
        .current_dir(run.dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"{not json").unwrap();
    let (exit, stderr) = finish(child);
    assert_eq!(exit.code(), Some(1), "{stderr}");
    assert!(stderr.contains("failed to read runner config"), "{stderr}");
}

fn proof_state(run: &Run) -> Option<status::proof::ProofState> {
    status::proof::read_proof(run.dir(), &status::proof::Fallback::default()).map(|p| p.state)
}

/// How the proof records the runner's end: (exit code, signal).
fn runner_end_in_proof(run: &Run) -> (Value, Value) {
    let proof = status::proof::read_proof(run.dir(), &status::proof::Fallback::default()).unwrap();
    let instances = proof.instances.unwrap_or_default();
    let runner = instances
        .iter()
        .find(|i| i["kind"] == "runner")
        .cloned()
        .unwrap_or_default();
    (runner["exitCode"].clone(), runner["signal"].clone())
}

#[test]
fn a_monitor_registers_waits_for_its_runner_and_proves_the_run_over() {
    let run = Run::new(&[("only", "echo done")], vec![group(0, 1, 1, false)]);
    let _serial = crate::procs::tests::serial();
    run.queue();
    let exe = std::env::current_exe().unwrap();
    let (monitor, ready) = run.start_from(&exe, "__monitor", |_| {});
    let pid = monitor.id();
    let (exit, stderr) = finish(monitor);
    assert!(exit.success(), "{exit:?} {stderr}");
    let s = run.status();
    assert_eq!(s.state, RunState::Complete, "{stderr}");
    assert_eq!(s.monitor_identity.map(|m| m.pid), Some(pid));
    // The runner reported ready, with its pid, on the pipe the monitor was handed.
    let line = std::io::read_to_string(ready.unwrap()).unwrap();
    assert!(line.starts_with("ready "), "{line}");
    assert!(line.contains(&format!("{}", s.pid.unwrap())), "{line}");
    assert_eq!(run.read("output-0.log"), "done\n");
    assert_eq!(proof_state(&run), Some(status::proof::ProofState::Observed));
    // The monitor waited on the runner itself: the proof has its exit.
    assert_eq!(runner_end_in_proof(&run), (Value::from(0), Value::Null));
    assert!(!status::index::has_marker(run.dir()));
    // Both processes are on record beside the status, for a `stop` or an
    // observer that meets a damaged one.
    let record = status::processes::read(run.dir())
        .unwrap()
        .expect("run-processes.json");
    assert_eq!(record.monitor.pid, pid);
    assert_eq!(Some(record.runner.pid), s.pid);
    assert_eq!(
        record.runner_process_instance_id,
        s.runner_process_instance_id.unwrap()
    );
}

#[test]
fn a_step_inherits_no_descriptor_of_its_runners_beyond_its_standard_streams() {
    // The monitor hands its runner the write end of the outcome pipe; the
    // runner must keep it from its COMMANDs (an escaped child holding it
    // would hold what the monitor reads).
    // `exec`: the shell keeps no copy of its stdout (dash saves it as fd
    // 10 for a redirection); `ls` then shows its own directory handle.
    let script = "exec ls -l /proc/self/fd > fds.txt";
    let run = Run::new(&[("fds", script)], vec![group(0, 1, 1, false)]);
    let _serial = crate::procs::tests::serial();
    run.queue();
    let exe = std::env::current_exe().unwrap();
    let (monitor, _ready) = run.start_from(&exe, "__monitor", |_| {});
    let (exit, stderr) = finish(monitor);
    assert!(exit.success(), "{exit:?} {stderr}");
    assert_eq!(run.status().state, RunState::Complete, "{stderr}");
    let fds = run.read("fds.txt");
    // Nor any other descriptor: the runner's signalfd, its ready pipe or
    // its files are close-on-exec too.
    let extra: Vec<&str> = fds
        .lines()
        .filter(|l| l.contains(" -> "))
        .filter(|l| !l.contains(" 0 -> ") && !l.contains(" 1 -> ") && !l.contains(" 2 -> "))
        .filter(|l| !(l.contains(" -> /proc/") && l.ends_with("/fd")))
        .collect();
    assert!(fds.contains(" 1 -> "), "{fds}");
    assert_eq!(extra, [] as [&str; 0], "{fds}");
}

#[test]
fn a_monitor_starts_nothing_for_a_run_already_given_up() {
    let run = Run::new(&[("only", "touch ran")], vec![group(0, 1, 1, false)]);
    let _serial = crate::procs::tests::serial();
    run.queue();
    let mut given_up = run.status();
    given_up.state = RunState::Failed;
    write_status(run.dir(), &given_up).unwrap();
    let (exit, stderr) = finish(run.start("__monitor"));
    assert_eq!(exit.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("was given up before its monitor started"),
        "{stderr}"
    );
    assert_eq!(run.status().state, RunState::Failed);
    assert!(!run.dir().join("ran").exists());
}

#[test]
fn a_monitor_whose_runner_is_killed_ends_the_step_and_records_the_signal() {
    // The runner dies in the second step: the monitor proves both steps'
    // groups empty before the proof claims them.
    let run = Run::new(
        &[("quick", "true"), ("slow", "sleep 10")],
        vec![group(0, 1, 1, false), group(1, 1, 1, false)],
    );
    let _serial = crate::procs::tests::serial();
    run.queue();
    let monitor = run.start("__monitor");
    let mut step = 0;
    until("the second step started", || {
        let s = read_status(run.dir()).ok().flatten();
        step = s.as_ref().and_then(|s| pids_of(s)[1]).unwrap_or(0);
        step > 1
    });
    let runner = run.status().pid.unwrap();
    assert!(runner > 1);
    // SAFETY: kill(2) to the runner our monitor started, a pid above 1.
    unsafe { libc::kill(runner as i32, libc::SIGKILL) };
    let (exit, stderr) = finish(monitor);
    assert!(exit.success(), "{exit:?} {stderr}");
    let s = run.status();
    assert_eq!(s.state, RunState::Failed);
    let error = s.error.unwrap_or_default();
    assert!(
        error.starts_with(
            "Async runner process exited with signal SIGKILL before writing a final status."
        ),
        "{error}"
    );
    // The step's group was proven empty: the proof is observed.
    assert_eq!(proof_state(&run), Some(status::proof::ProofState::Observed));
    assert_eq!(
        runner_end_in_proof(&run),
        (Value::Null, Value::from("SIGKILL"))
    );
    assert!(
        process_identity::group_members(step)
            .unwrap_or_default()
            .is_empty()
    );
}

#[test]
fn a_monitor_that_cannot_spawn_its_runner_fails_the_run_as_never_started() {
    // A monitor whose executable was deleted cannot start a runner from it.
    let run = Run::new(&[("only", "touch ran")], vec![group(0, 1, 1, false)]);
    let bin = tempfile::tempdir().unwrap();
    let copy = bin.path().join("monitor-copy");
    std::fs::copy(std::env::current_exe().unwrap(), &copy).unwrap();
    let _serial = crate::procs::tests::serial();
    run.queue();
    let (monitor, _ready) = run.start_from(&copy, "__monitor", |_| {
        std::fs::remove_file(&copy).unwrap();
    });
    let (exit, stderr) = finish(monitor);
    assert_eq!(exit.code(), Some(1), "{stderr}");
    let s = run.status();
    assert_eq!(s.state, RunState::Failed);
    assert!(
        s.error
            .as_deref()
            .is_some_and(|e| e.starts_with("failed to spawn runner: ")),
        "{:?}",
        s.error
    );
    assert_eq!(s.process_terminal.as_ref().unwrap()["state"], "not-started");
    assert!(!run.dir().join("ran").exists());
}

/// Whether `pid` sleeps in poll(2), where `Signals::wait` waits; a process
/// that spins, or waits elsewhere (`waitpid`), does not.
fn sleeps_in_poll(pid: u32) -> bool {
    let syscall = std::fs::read_to_string(format!("/proc/{pid}/syscall")).unwrap_or_default();
    let number = syscall
        .split_whitespace()
        .next()
        .and_then(|n| n.parse::<libc::c_long>().ok());
    #[cfg(target_arch = "x86_64")]
    let polls = [libc::SYS_poll, libc::SYS_ppoll];
    #[cfg(not(target_arch = "x86_64"))]
    let polls = [libc::SYS_ppoll];
    number.is_some_and(|n| polls.contains(&n))
}

/// Whether a SIGTERM sent to `pid` has not been read yet.
fn term_pending(pid: u32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let bit = 1u64 << (libc::SIGTERM - 1);
    status
        .lines()
        .filter_map(|l| l.strip_prefix("ShdPnd:").or(l.strip_prefix("SigPnd:")))
        .any(|mask| u64::from_str_radix(mask.trim(), 16).is_ok_and(|m| m & bit != 0))
}

#[test]
fn a_revival_monitor_sleeps_until_the_launchers_verdict_even_when_asked_to_stop_and_keeps_it() {
    // The launcher's waits are 10 min: only the verdict ends the monitor's wait.
    let mut run = Run::new(&[("only", "touch ran")], vec![group(0, 1, 1, false)]);
    run.revive(600_000);
    let _serial = crate::procs::tests::serial();
    run.queue();
    let mut monitor = run.start("__monitor");
    let pid = monitor.id();
    // Sleeping in poll, the monitor is past its waitpid on the runner.
    until("the monitor sleeps awaiting the verdict", || {
        let exited = monitor.try_wait().unwrap();
        assert!(exited.is_none(), "it did not wait: {:?}", run.status());
        sleeps_in_poll(pid)
    });
    assert_eq!(run.status().state, RunState::Queued);
    assert_eq!(proof_state(&run), None);
    let startup = run.read("runner-startup.json");
    assert!(startup.contains("\"error\""), "{startup}");

    // A stop request neither ends the wait nor makes it spin.
    // SAFETY: kill(2) to the monitor we started, a positive pid.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    until("the stop read and the monitor asleep again", || {
        !term_pending(pid) && sleeps_in_poll(pid)
    });
    assert_eq!(run.status().state, RunState::Queued);
    assert_eq!(proof_state(&run), None);

    let verdict = "runner exited before proceed (the test's verdict)";
    let binding = handshake::Binding {
        run_id: run.config.run_id.clone(),
        runner_process_instance_id: run.config.runner_process_instance_id.clone(),
    };
    handshake::persist_pre_proceed_failure(run.dir(), &binding, None, verdict).unwrap();
    let (exit, stderr) = finish(monitor);
    assert!(exit.success(), "{exit:?} {stderr}");
    // The monitor kept the launcher's verdict and proved the run over.
    let s = run.status();
    assert_eq!(s.state, RunState::Failed);
    assert_eq!(s.error.as_deref(), Some(verdict));
    assert_eq!(proof_state(&run), Some(status::proof::ProofState::Observed));
    assert!(!run.dir().join("ran").exists());
}

#[test]
fn a_revival_monitor_that_gets_no_verdict_judges_the_run_itself_after_the_launchers_time() {
    // The launcher died before its verdict; with no handshake wait, the
    // monitor gives it 2 s.
    let mut run = Run::new(&[("only", "touch ran")], vec![group(0, 1, 1, false)]);
    run.revive(0);
    let _serial = crate::procs::tests::serial();
    run.queue();
    let (exit, stderr) = finish(run.start("__monitor"));
    assert!(exit.success(), "{exit:?} {stderr}");
    let s = run.status();
    assert_eq!(s.state, RunState::Failed);
    let error = s.error.unwrap_or_default();
    assert!(
        error.starts_with("Async runner process exited with exit code 1 before writing"),
        "{error}"
    );
    assert_eq!(proof_state(&run), Some(status::proof::ProofState::Observed));
    assert!(!run.dir().join("ran").exists());
}

#[test]
fn a_copy_left_waiting_ends_by_itself_at_its_lifetime() {
    use std::os::unix::process::ExitStatusExt;
    // A runner copy with 1 s to live waits for a config that never comes.
    let _serial = crate::procs::tests::serial();
    let mut copy = Command::new(std::env::current_exe().unwrap())
        .args(["__runner", "run-qz7", "--nocapture"])
        .env(CASE_ENV, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let _open = copy.stdin.take();
    let (exit, stderr) = finish(copy);
    assert_eq!(exit.signal(), Some(libc::SIGALRM), "{exit:?} {stderr}");
}

#[test]
fn a_step_of_a_copy_starts_with_no_alarm() {
    // A copy in the `__alarm_left` role prints what was left of the alarm
    // of the process it was exec'ed in: here the step's shell.
    let exe = std::env::current_exe().unwrap();
    let probe = format!("exec '{}' __alarm_left", exe.display());
    let run = Run::new(&[("probe", probe.as_str())], vec![group(0, 1, 1, false)]);
    let (exit, stderr) = run_runner(&run);
    assert!(exit.success(), "{exit:?} {stderr}");
    assert_eq!(run.status().state, RunState::Complete, "{stderr}");
    assert_eq!(run.read("output-0.log"), "0");
}
