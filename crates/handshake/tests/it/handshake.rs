//! Both sides of the handshake with real runner processes: this test binary
//! re-executed as a fake runner (the ignored `fake_runner` test) that either
//! follows the protocol or misbehaves in the way the test names.

extern crate subagents_handshake as handshake;
use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use handshake::{
    ACK_FILE, Binding, CANDIDATE_FILE, HandshakeError, LauncherTimeouts, PROCEED_FILE, Runner,
    RunnerHandshake, RunnerStartupError, RunnerTimeouts, STARTUP_FILE, STATUS_FILE, StartupFailure,
    remove_stale_files, report_startup_failure, run_launcher_side,
};
use process_identity::{Liveness, ProcessIdentity};
use serde_json::{Value, json};
use test_support::mode;

const MODE: &str = "HANDSHAKE_FAKE_RUNNER";
const DIR: &str = "HANDSHAKE_DIR";
const RUN_ID: &str = "HANDSHAKE_RUN_ID";
const INSTANCE: &str = "HANDSHAKE_INSTANCE";
const TOKEN: &str = "HANDSHAKE_TOKEN";
const PROCEED_MS: &str = "HANDSHAKE_PROCEED_MS";
const CONFLICT: &str = "Session file is already owned by run 'abc12345'.";

/// Generous waits for everything a test does not want to time out.
fn patient() -> LauncherTimeouts {
    LauncherTimeouts {
        ready: Duration::from_secs(20),
        acknowledged: Duration::from_secs(20),
        terminate_grace: Duration::from_secs(5),
        kill_grace: Duration::from_secs(5),
    }
}

struct Fixture {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    /// Fake runners started, killed on drop: a test that fails (or a
    /// termination that regressed) must not leave them parked forever.
    started: std::cell::RefCell<Vec<u32>>,
    binding: Binding,
    token: String,
}

impl Fixture {
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run");
        fs::create_dir(&dir).unwrap();
        Self {
            dir,
            _tmp: tmp,
            started: Default::default(),
            binding: Binding {
                run_id: "run12345".into(),
                runner_process_instance_id: uuid::Uuid::new_v4().to_string(),
            },
            token: uuid::Uuid::new_v4().to_string(),
        }
    }

    fn spawn(&self, mode: &str) -> Child {
        self.spawn_with(mode, &[])
    }

    fn spawn_with(&self, mode: &str, env: &[(&str, &str)]) -> Child {
        self.spawn_in(mode, env, true)
    }

    /// `own_group`: the runner leads a process group of its own (as a real
    /// runner does); else it stays in this test's group.
    fn spawn_in(&self, mode: &str, env: &[(&str, &str)], own_group: bool) -> Child {
        remove_stale_files(&self.dir).unwrap();
        let mut command = Command::new(std::env::current_exe().unwrap());
        if own_group {
            command.process_group(0);
        }
        let child = command
            .args([
                "--exact",
                "handshake::fake_runner",
                "--nocapture",
                "--test-threads=1",
            ])
            .arg("--include-ignored")
            .env(MODE, mode)
            .env(DIR, &self.dir)
            .env(RUN_ID, &self.binding.run_id)
            .env(INSTANCE, &self.binding.runner_process_instance_id)
            .env(TOKEN, &self.token)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.started.borrow_mut().push(child.id());
        child
    }

    fn launch(&self, child: &mut Child, timeouts: &LauncherTimeouts) -> Box<StartupFailure> {
        run_launcher_side(
            &self.dir,
            &self.binding,
            Some("session-1"),
            Runner::Child(child),
            timeouts,
        )
        .expect_err("the handshake should fail")
    }

    fn json(&self, name: &str) -> Value {
        let path = self.dir.join(name);
        assert_eq!(mode(&path), 0o600, "{name}");
        serde_json::from_str(&fs::read_to_string(path).unwrap()).unwrap()
    }

    /// Everything a failed handshake must leave: the error, the failure record,
    /// and no runner process.
    fn assert_failed(&self, failure: &StartupFailure, error: &str, identity: &ProcessIdentity) {
        assert_eq!(failure.error.to_string(), error);
        assert_eq!(failure.pid, identity.pid);
        assert_eq!(
            failure.runner_process_instance_id,
            self.binding.runner_process_instance_id
        );
        assert!(failure.termination_observed);
        assert!(failure.startup_did_not_proceed);
        assert!(
            failure.persist_error.is_none(),
            "{:?}",
            failure.persist_error
        );

        let status = self.json(STATUS_FILE);
        assert_eq!(status["state"], "failed");
        assert_eq!(status["error"], error);
        assert_eq!(status["runId"], self.binding.run_id.as_str());
        assert_eq!(status["sessionId"], "session-1");
        assert!(status["lastUpdate"].as_u64().unwrap() > 1_600_000_000_000);
        assert_eq!(
            status["processTerminal"],
            json!({
                "version": 1,
                "state": "not-started",
                "runId": self.binding.run_id,
                "runnerProcessInstanceId": self.binding.runner_process_instance_id,
            })
        );
        assert_eq!(
            fs::read_to_string(self.dir.join(CANDIDATE_FILE)).unwrap(),
            format!(
                "{{\n  \"version\": 1,\n  \"runId\": \"run12345\",\n  \"runnerProcessInstanceId\": \"{}\",\n  \"writers\": {{}},\n  \"expectedWriters\": {{\n    \"0\": 0\n  }}\n}}",
                self.binding.runner_process_instance_id
            )
        );
        assert_eq!(mode(&self.dir.join(CANDIDATE_FILE)), 0o600);
        assert_eq!(identity.liveness(), Liveness::Dead);
        assert!(
            process_identity::group_members(identity.pid)
                .unwrap()
                .is_empty()
        );
    }
}

fn identity(child: &Child) -> ProcessIdentity {
    ProcessIdentity::of(child.id()).unwrap()
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn happy_path_commits_and_leaves_no_handshake_files() {
    let fx = Fixture::new();
    let mut child = fx.spawn("follow");
    let pid = child.id();
    let started = run_launcher_side(
        &fx.dir,
        &fx.binding,
        None,
        Runner::Child(&mut child),
        &patient(),
    )
    .unwrap();
    assert_eq!(started.pid, pid);
    assert_eq!(
        started.runner_process_instance_id,
        fx.binding.runner_process_instance_id
    );
    assert!(!fx.dir.join(STARTUP_FILE).exists());
    assert!(child.wait().unwrap().success());
    assert_eq!(
        fs::read_to_string(fx.dir.join("committed")).unwrap(),
        fx.token
    );
    for name in [ACK_FILE, PROCEED_FILE, STATUS_FILE, CANDIDATE_FILE] {
        assert!(!fx.dir.join(name).exists(), "{name} left behind");
    }
}

/// The points the launcher reached, recorded by this process's fault hook.
static LAUNCHER_POINTS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Crash tests kill a side at the fault point `after-ack` through the hook
/// the host installs: both sides call it once the ack is on disk, before
/// the commit (here the hooks only record it).
#[test]
fn both_sides_call_the_installed_fault_hook_after_the_ack() {
    handshake::install_fault_hook(|point| LAUNCHER_POINTS.lock().unwrap().push(point.into()));
    let fx = Fixture::new();
    let mut child = fx.spawn("follow-with-fault-hook");
    run_launcher_side(
        &fx.dir,
        &fx.binding,
        None,
        Runner::Child(&mut child),
        &patient(),
    )
    .unwrap();
    assert!(child.wait().unwrap().success());
    assert!(fx.dir.join("runner-reached-after-ack").exists());
    let points = LAUNCHER_POINTS.lock().unwrap().clone();
    assert!(points.iter().all(|p| p == "after-ack"), "{points:?}");
    assert!(!points.is_empty());
}

#[test]
fn stale_files_of_an_earlier_attempt_are_removed_before_spawn() {
    let fx = Fixture::new();
    for name in [STARTUP_FILE, ACK_FILE, PROCEED_FILE] {
        fs::write(fx.dir.join(name), r#"{"state":"ready","token":"old"}"#).unwrap();
    }
    remove_stale_files(&fx.dir).unwrap();
    for name in [STARTUP_FILE, ACK_FILE, PROCEED_FILE] {
        assert!(!fx.dir.join(name).exists());
    }
    remove_stale_files(&fx.dir).unwrap();
}

#[test]
fn runner_exiting_before_ready_fails_without_waiting_for_the_timeout() {
    let fx = Fixture::new();
    let mut child = fx.spawn("exit-before-ready");
    let id = identity(&child);
    let failure = fx.launch(&mut child, &patient());
    fx.assert_failed(
        &failure,
        "async runner exited before writing the startup state 'ready'",
        &id,
    );
    assert!(matches!(failure.error, HandshakeError::RunnerExited { .. }));
    assert_eq!(child.wait().unwrap().code(), Some(3));
}

#[test]
fn runner_error_record_is_reported_verbatim() {
    let fx = Fixture::new();
    let mut child = fx.spawn("lease-conflict");
    let id = identity(&child);
    let failure = fx.launch(&mut child, &patient());
    fx.assert_failed(&failure, CONFLICT, &id);
    // The runner's record stays for diagnosis.
    assert_eq!(fx.json(STARTUP_FILE)["state"], "error");
}

#[test]
fn a_runner_that_is_not_our_child_is_watched_through_its_identity() {
    let fx = Fixture::new();
    let mut child = fx.spawn("lease-conflict");
    let id = identity(&child);
    let failure = run_launcher_side(
        &fx.dir,
        &fx.binding,
        Some("session-1"),
        Runner::Process(id.clone()),
        &patient(),
    )
    .unwrap_err();
    fx.assert_failed(&failure, CONFLICT, &id);
    assert_eq!(child.wait().unwrap().code(), Some(1));
}

#[test]
fn runner_error_after_ack_is_reported_verbatim() {
    let fx = Fixture::new();
    let mut child = fx.spawn("error-after-ack");
    let id = identity(&child);
    let failure = fx.launch(&mut child, &patient());
    fx.assert_failed(&failure, "boom after ack", &id);
}

#[test]
fn ready_with_another_pid_is_invalid_and_the_runner_is_terminated() {
    let fx = Fixture::new();
    let mut child = fx.spawn("wrong-pid");
    let id = identity(&child);
    let failure = fx.launch(&mut child, &patient());
    let path = fx.dir.join(STARTUP_FILE);
    fx.assert_failed(
        &failure,
        &format!(
            "Async runner wrote an invalid ready startup handshake: {}",
            path.display()
        ),
        &id,
    );
}

#[test]
fn acknowledged_with_another_token_is_invalid() {
    let fx = Fixture::new();
    let mut child = fx.spawn("wrong-token");
    let id = identity(&child);
    let failure = fx.launch(&mut child, &patient());
    let path = fx.dir.join(STARTUP_FILE);
    fx.assert_failed(
        &failure,
        &format!(
            "Async runner wrote an invalid acknowledged startup handshake: {}",
            path.display()
        ),
        &id,
    );
    // The ack was written privately and stays as a trace.
    assert_eq!(fx.json(ACK_FILE)["action"], "ack");
    assert!(!fx.dir.join(PROCEED_FILE).exists());
}

#[test]
fn unparsable_startup_file_is_a_read_failure() {
    let fx = Fixture::new();
    let mut child = fx.spawn("garbage");
    let id = identity(&child);
    let failure = fx.launch(&mut child, &patient());
    let path = fx.dir.join(STARTUP_FILE);
    let HandshakeError::Read { message, .. } = &failure.error else {
        panic!("unexpected error {}", failure.error);
    };
    fx.assert_failed(
        &failure,
        &format!(
            "Failed to read async runner startup handshake '{}': {message}",
            path.display()
        ),
        &id,
    );
}

#[test]
fn termination_waits_for_the_whole_group_not_just_the_runner() {
    let fx = Fixture::new();
    let mut child = fx.spawn("garbage-with-deaf-child");
    let timeouts = LauncherTimeouts {
        terminate_grace: Duration::from_millis(300),
        ..patient()
    };
    let failure = fx.launch(&mut child, &timeouts);
    assert!(
        matches!(failure.error, HandshakeError::Read { .. }),
        "{}",
        failure.error
    );
    assert!(failure.termination_observed);
    let deaf: u32 = fs::read_to_string(fx.dir.join("deaf.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // Gone, not merely a zombie: its parent (the runner) is dead, so init reaps it.
    wait_until("the deaf child's end", || {
        fs::read_to_string(format!("/proc/{deaf}/stat")).map_or(true, |s| {
            s.rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z'))
        })
    });
    assert!(
        process_identity::group_members(child.id())
            .unwrap()
            .is_empty(),
        "the runner's group was left with members"
    );
}

#[test]
fn a_runner_that_leads_no_group_is_signalled_itself() {
    let fx = Fixture::new();
    let mut child = fx.spawn_in("ready-then-park", &[], false);
    let id = identity(&child);
    let failure = fx.launch(
        &mut child,
        &LauncherTimeouts {
            acknowledged: Duration::from_millis(1),
            ..patient()
        },
    );
    assert!(failure.termination_observed, "{}", failure.error);
    assert_eq!(failure.pid, id.pid);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(exit_of(&mut child).signal(), Some(libc::SIGTERM));
}

/// The child's exit status; fails the test if it has not exited within 10 s
/// (a termination that regressed must not hang the suite).
fn exit_of(child: &mut Child) -> std::process::ExitStatus {
    let mut status = None;
    wait_until("the runner's exit", || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    status.unwrap()
}

#[test]
fn silent_runner_times_out_waiting_for_ready() {
    let fx = Fixture::new();
    let mut child = fx.spawn("silent");
    let id = identity(&child);
    let timeouts = LauncherTimeouts {
        ready: Duration::from_millis(300),
        ..patient()
    };
    let failure = fx.launch(&mut child, &timeouts);
    fx.assert_failed(
        &failure,
        "Timed out after 300ms waiting for the async runner startup state 'ready'.",
        &id,
    );
}

#[test]
fn runner_that_never_acknowledges_and_ignores_sigterm_is_killed() {
    let fx = Fixture::new();
    let mut child = fx.spawn("never-ack");
    let id = identity(&child);
    let timeouts = LauncherTimeouts {
        acknowledged: Duration::from_millis(300),
        terminate_grace: Duration::from_millis(200),
        ..patient()
    };
    let failure = fx.launch(&mut child, &timeouts);
    fx.assert_failed(
        &failure,
        "Timed out after 300ms waiting for the async runner startup state 'acknowledged'.",
        &id,
    );
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGKILL));
}

/// The launcher's wait must not wake itself: its own reads of
/// `runner-startup.json` are inotify events too (IN_OPEN), and a wait that
/// took them for news re-read the file in a loop, using a whole CPU until the
/// runner answered, and starving the runner on a loaded machine.
#[test]
fn waiting_for_acknowledged_reads_the_startup_file_a_bounded_number_of_times() {
    use notify::{EventKind, RecursiveMode, Watcher, event::AccessKind};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let fx = Fixture::new();
    let opens = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&opens);
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if let Ok(event) = event
            && matches!(event.kind, EventKind::Access(AccessKind::Open(_)))
            && event.paths.iter().any(|p| p.ends_with(STARTUP_FILE))
        {
            counter.fetch_add(1, Ordering::Relaxed);
        }
    })
    .unwrap();
    watcher.watch(&fx.dir, RecursiveMode::NonRecursive).unwrap();
    let mut child = fx.spawn("ready-then-park");
    let timeouts = LauncherTimeouts {
        acknowledged: Duration::from_secs(2),
        terminate_grace: Duration::from_millis(500),
        ..patient()
    };
    let failure = fx.launch(&mut child, &timeouts);
    assert!(
        matches!(
            failure.error,
            HandshakeError::Timeout {
                state: "acknowledged",
                ..
            }
        ),
        "{}",
        failure.error
    );
    // A read at the start, one per guard slice (1 s), one at the deadline and
    // the failure record's: a handful. The self-waking loop made thousands.
    let opens = opens.load(Ordering::Relaxed);
    assert!(
        opens <= 20,
        "runner-startup.json opened {opens} times in a 2 s wait"
    );
}

#[test]
fn runner_times_out_waiting_for_proceed_and_records_the_error() {
    let fx = Fixture::new();
    let mut child = fx.spawn_with("follow", &[(PROCEED_MS, "300")]);
    // Play a launcher that acknowledges but never authorises.
    let startup = fx.dir.join(STARTUP_FILE);
    wait_until("ready", || {
        fs::read_to_string(&startup).is_ok_and(|t| t.contains("\"ready\""))
    });
    let ready = fx.json(STARTUP_FILE);
    assert_eq!(ready["pid"], child.id());
    assert_eq!(ready["token"], fx.token.as_str());
    assert_eq!(ready["owner"]["pid"], child.id());
    assert_eq!(ready["runId"], "run12345");
    let ack = json!({
        "action": "ack",
        "token": fx.token,
        "runId": fx.binding.run_id,
        "runnerProcessInstanceId": fx.binding.runner_process_instance_id,
    });
    atomic_file::write_json(&fx.dir.join(ACK_FILE), &ack).unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(1));
    let record = fx.json(STARTUP_FILE);
    assert_eq!(
        record["error"],
        "Timed out after 300ms waiting for runner startup control 'proceed'."
    );
    assert_eq!(record["state"], "error");
    assert_eq!(record["pid"], child.id());
    assert!(record.get("token").is_none());
    assert!(fx.dir.join(ACK_FILE).exists(), "ack is kept on failure");
}

#[test]
fn an_error_record_of_another_run_is_not_taken_for_this_one() {
    let fx = Fixture::new();
    let other = Binding {
        run_id: "other-run".into(),
        ..fx.binding.clone()
    };
    report_startup_failure(&fx.dir, &other, CONFLICT).unwrap();
    // A plain process stands in for a runner that never writes anything.
    let mut child = Command::new("sleep")
        .arg("60")
        .process_group(0)
        .spawn()
        .unwrap();
    let id = identity(&child);
    let failure = fx.launch(&mut child, &patient());
    let path = fx.dir.join(STARTUP_FILE);
    fx.assert_failed(
        &failure,
        &format!(
            "Async runner wrote an invalid ready startup handshake: {}",
            path.display()
        ),
        &id,
    );
}

/// A directory where the launcher wants to write makes its atomic rename fail.
fn block_path(fx: &Fixture, name: &str) -> PathBuf {
    let path = fx.dir.join(name);
    fs::create_dir(&path).unwrap();
    fs::write(path.join("occupied"), "").unwrap();
    path
}

#[test]
fn failing_to_write_the_ack_is_reported_and_the_runner_terminated() {
    let fx = Fixture::new();
    let mut child = fx.spawn("ready-then-park");
    let ack = block_path(&fx, ACK_FILE);
    let id = identity(&child);
    let failure = fx.launch(&mut child, &patient());
    let HandshakeError::Acknowledge(cause) = &failure.error else {
        panic!("unexpected error {}", failure.error);
    };
    assert_eq!(cause.path, ack);
    fx.assert_failed(
        &failure,
        &format!("Failed to acknowledge async runner startup: {cause}"),
        &id,
    );
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(exit_of(&mut child).signal(), Some(libc::SIGTERM));
}

#[test]
fn failing_to_write_proceed_is_reported_and_the_runner_terminated() {
    let fx = Fixture::new();
    let mut child = fx.spawn("ack-then-park");
    let proceed = block_path(&fx, PROCEED_FILE);
    let id = identity(&child);
    let failure = fx.launch(&mut child, &patient());
    let HandshakeError::Authorize(cause) = &failure.error else {
        panic!("unexpected error {}", failure.error);
    };
    assert_eq!(cause.path, proceed);
    fx.assert_failed(
        &failure,
        &format!("Failed to authorize async runner startup: {cause}"),
        &id,
    );
}

fn control(fx: &Fixture, name: &str, action: &str, token: &str) {
    let record = json!({
        "action": action,
        "token": token,
        "runId": fx.binding.run_id,
        "runnerProcessInstanceId": fx.binding.runner_process_instance_id,
    });
    atomic_file::write_json(&fx.dir.join(name), &record).unwrap();
}

fn runner_side(fx: &Fixture, ack_ms: u64) -> RunnerHandshake {
    let timeouts = RunnerTimeouts {
        ack: Duration::from_millis(ack_ms),
        proceed: Duration::from_millis(ack_ms),
    };
    RunnerHandshake::new(&fx.dir, fx.binding.clone(), fx.token.clone(), timeouts)
}

#[test]
fn runner_rejects_an_ack_with_another_token_and_records_it() {
    let fx = Fixture::new();
    control(&fx, ACK_FILE, "ack", "another-lease");
    let err = runner_side(&fx, 20_000)
        .startup(&json!({"pid": 1}))
        .unwrap_err();
    assert!(matches!(err, RunnerStartupError::TokenMismatch));
    let record = fx.json(STARTUP_FILE);
    assert_eq!(
        record["error"],
        "Runner startup control token does not match the acquired session lease."
    );
}

#[test]
fn runner_rejects_an_invalid_action_and_an_unreadable_control() {
    let fx = Fixture::new();
    control(&fx, ACK_FILE, "launch", &fx.token);
    let err = runner_side(&fx, 20_000).await_commit().unwrap_err();
    assert_eq!(err.to_string(), "Runner startup control action is invalid.");

    fs::write(fx.dir.join(ACK_FILE), "{").unwrap();
    let err = runner_side(&fx, 20_000).await_commit().unwrap_err();
    let prefix = format!(
        "Failed to read runner startup control '{}': ",
        fx.dir.join(ACK_FILE).display()
    );
    assert!(err.to_string().starts_with(&prefix), "{err}");
}

#[test]
fn runner_rejects_a_control_bound_to_another_run() {
    let fx = Fixture::new();
    let record = json!({"action": "ack", "token": fx.token, "runId": "other", "runnerProcessInstanceId": "x"});
    atomic_file::write_json(&fx.dir.join(ACK_FILE), &record).unwrap();
    let err = runner_side(&fx, 20_000).await_commit().unwrap_err();
    assert!(matches!(err, RunnerStartupError::OtherRun { .. }), "{err}");
}

#[test]
fn runner_keeps_waiting_on_a_valid_but_other_action() {
    let fx = Fixture::new();
    // `proceed` in the ack file is not an ack: the runner waits and times out.
    control(&fx, ACK_FILE, "proceed", &fx.token);
    let err = runner_side(&fx, 200).await_commit().unwrap_err();
    assert_eq!(
        err.to_string(),
        "Timed out after 200ms waiting for runner startup control 'ack'."
    );
}

#[test]
fn startup_failure_report_has_the_reference_shape() {
    let fx = Fixture::new();
    report_startup_failure(&fx.dir, &fx.binding, CONFLICT).unwrap();
    let record = fx.json(STARTUP_FILE);
    assert_eq!(
        record,
        json!({
            "state": "error",
            "pid": std::process::id(),
            "error": CONFLICT,
            "runId": fx.binding.run_id,
            "runnerProcessInstanceId": fx.binding.runner_process_instance_id,
        })
    );
}

/// The fake runner. Started only by the tests above, as a separate process.
#[test]
#[ignore = "worker process started by the other tests"]
fn fake_runner() {
    let mode = std::env::var(MODE).expect("run only as a worker");
    let env = |key: &str| std::env::var(key).unwrap();
    let dir = PathBuf::from(env(DIR));
    let binding = Binding {
        run_id: env(RUN_ID),
        runner_process_instance_id: env(INSTANCE),
    };
    let token = env(TOKEN);
    let proceed_ms = std::env::var(PROCEED_MS).map_or(20_000, |v| v.parse().unwrap());
    let timeouts = RunnerTimeouts {
        ack: Duration::from_secs(20),
        proceed: Duration::from_millis(proceed_ms),
    };
    let owner = json!({"pid": std::process::id(), "token": token});
    let hs = RunnerHandshake::new(&dir, binding.clone(), token.clone(), timeouts);
    let pid = std::process::id();
    let startup = dir.join(STARTUP_FILE);
    match mode.as_str() {
        "follow" => match hs.startup(&owner) {
            Ok(()) => fs::write(dir.join("committed"), &token).unwrap(),
            Err(_) => std::process::exit(1),
        },
        "follow-with-fault-hook" => {
            handshake::install_fault_hook(|point| {
                let dir = PathBuf::from(std::env::var(DIR).unwrap());
                fs::write(dir.join(format!("runner-reached-{point}")), "").unwrap();
            });
            hs.startup(&owner).unwrap();
        }
        "exit-before-ready" => std::process::exit(3),
        "lease-conflict" => {
            report_startup_failure(&dir, &binding, CONFLICT).unwrap();
            std::process::exit(1);
        }
        "error-after-ack" => {
            hs.announce_ready(&owner).unwrap();
            wait_for_file(&dir.join(ACK_FILE));
            report_startup_failure(&dir, &binding, "boom after ack").unwrap();
            std::process::exit(1);
        }
        "wrong-pid" => {
            let mut record = ready_record(&token, pid, &binding);
            record["pid"] = json!(pid + 1);
            atomic_file::write_json(&startup, &record).unwrap();
            park();
        }
        "wrong-token" => {
            hs.announce_ready(&owner).unwrap();
            wait_for_file(&dir.join(ACK_FILE));
            let mut record = ready_record("another-token", pid, &binding);
            record["state"] = json!("acknowledged");
            atomic_file::write_json(&startup, &record).unwrap();
            park();
        }
        "garbage" => {
            fs::write(&startup, "{\"state\": ").unwrap();
            park();
        }
        "never-ack" => {
            // SAFETY: ignoring a signal installs no handler code.
            unsafe {
                nix::sys::signal::signal(
                    nix::sys::signal::Signal::SIGTERM,
                    nix::sys::signal::SigHandler::SigIgn,
                )
            }
            .unwrap();
            hs.announce_ready(&owner).unwrap();
            park();
        }
        "ready-then-park" => {
            hs.announce_ready(&owner).unwrap();
            park();
        }
        "ack-then-park" => {
            hs.announce_ready(&owner).unwrap();
            wait_for_file(&dir.join(ACK_FILE));
            let mut record = ready_record(&token, pid, &binding);
            record["state"] = json!("acknowledged");
            atomic_file::write_json(&startup, &record).unwrap();
            park();
        }
        "silent" => park(),
        "garbage-with-deaf-child" => {
            // A child in the runner's process group that ignores SIGTERM;
            // never waited on: it must outlive us until the group is killed.
            let script = r#"trap "" TERM; echo $$ > deaf.pid; while :; do sleep 1; done"#;
            #[allow(clippy::zombie_processes)]
            let _deaf = Command::new("sh")
                .args(["-c", script])
                .current_dir(&dir)
                .stdin(Stdio::null())
                .spawn()
                .unwrap();
            wait_until("the deaf child", || {
                fs::read_to_string(dir.join("deaf.pid")).is_ok_and(|t| t.ends_with('\n'))
            });
            fs::write(&startup, "{\"state\": ").unwrap();
            park();
        }
        other => panic!("unknown fake runner mode {other}"),
    }
}

fn ready_record(token: &str, pid: u32, binding: &Binding) -> Value {
    json!({
        "state": "ready",
        "token": token,
        "pid": pid,
        "owner": {},
        "runId": binding.run_id,
        "runnerProcessInstanceId": binding.runner_process_instance_id,
    })
}

fn wait_for_file(path: &Path) {
    wait_until("a control file", || path.exists());
}

/// Blocks until the launcher terminates this process.
fn park() -> ! {
    loop {
        std::thread::park();
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let exe = std::env::current_exe().unwrap_or_default();
        for pid in self.started.borrow().iter() {
            // Only a fake runner of ours that still lives (its pid is its
            // group, and the pid may have been reused once it was reaped).
            let ours = fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|e| e == exe);
            // A group whose leader is gone keeps its id reserved while any
            // member lives, so signalling it cannot reach a stranger.
            let orphaned_group = !Path::new(&format!("/proc/{pid}")).exists()
                && process_identity::group_members(*pid).is_ok_and(|m| !m.is_empty());
            if orphaned_group {
                // SAFETY: kill(2) has no memory effects.
                unsafe {
                    libc::kill(-(*pid as i32), libc::SIGKILL);
                }
            }
            if ours {
                // SAFETY: kill(2) has no memory effects.
                unsafe {
                    libc::kill(-(*pid as i32), libc::SIGKILL);
                    libc::kill(*pid as i32, libc::SIGKILL);
                }
            }
        }
    }
}
