//! `subagents __monitor`: the runner's parent, and the process that proves
//! the run is over.
//!
//! The reference finalizes a run's proof in whichever process spawned the
//! runner, so a launcher that exits early leaves the proof `pending` forever.
//! Here the launcher spawns this small monitor in a new session; the monitor
//! spawns the runner, waits on it with `waitpid` (a true answer, zombies
//! included), terminates whatever the runner left behind (it is a child
//! subreaper, so orphans come back to it), repairs the status if the runner
//! died before its final write, and then finalizes `process-terminal.json`.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::Pid;
use process_identity::ProcessIdentity;
use status::model::{update_status, update_status_unsynced_dir};
use status::now_ms;
use status::proof::{self, ProcessTerminal, ProofState};

use crate::config::LaunchConfig;
use crate::durable;
use crate::fault::{self, Point};
use crate::handover;
use crate::observer::{self, Role, Witness};
use crate::procs::{Ended, Signals, empty_group};
use crate::spawn::SpawnMode;

/// The monitor's entry point (`__monitor`, config on stdin); returns the
/// process exit code.
pub fn main() -> i32 {
    let config = match read_config() {
        Ok(config) => config,
        Err(e) => {
            eprintln!("subagents: {e}");
            return 1;
        }
    };
    run(config)
}

/// The monitor on its config: started by `exec` ([`main`]) or forked
/// (`spawn`); returns the process exit code.
pub fn run(mut config: LaunchConfig) -> i32 {
    fault::init(fault::Process::Monitor);
    let Ok(mut signals) = Signals::block() else {
        eprintln!(
            "subagents: failed to block signals in the monitor of '{}'",
            config.run_id
        );
        return 1;
    };
    crate::runner::become_subreaper();
    if !register(&config) {
        eprintln!(
            "subagents: run '{}' was given up before its monitor started",
            config.run_id
        );
        return 1;
    }
    // A queued run waits for its slot here, before anything runs.
    let mut slot = match config.queue.clone() {
        Some(queue) => {
            crate::slot_wait::announce(&config);
            let Some(handle) = crate::slot_wait::wait_for_turn(&config, &queue) else {
                return 0;
            };
            config.capacity_slot = Some(handle.owner().slot);
            crate::slot_wait::admitted(&config);
            Some(handle)
        }
        None => None,
    };
    let ready = match slot {
        Some(_) => crate::slot_wait::ready_pipe().ok(),
        None => None,
    };
    fault::point(Point::AfterRunDir);
    let in_job = job_config_file().is_some();
    if in_job {
        record_node(&config);
    }
    let (runner, handed) = match spawn_runner(&config) {
        Ok(spawned) => spawned,
        Err(e) => {
            record_spawn_failure(&config, &e.to_string());
            if let Some(handle) = slot.as_mut() {
                let _ = handle.rollback();
            }
            return 1;
        }
    };
    if let Some(handle) = slot.as_mut() {
        crate::slot_wait::bind(handle, &config, ready);
    }
    fault::when_step_started(&config.run_dir);
    if in_job {
        forward_term_to(runner);
    }
    crate::idle::release_clean_file_pages();
    let (ended, mut reaped) = wait_for(runner);
    let closed_at = now_ms();
    // What a runner that could not write its outcome handed us instead.
    let outcome = handed.and_then(handover::Receiver::take);
    let (_, more) = empty_group(
        &mut signals,
        None,
        Duration::from_secs(2),
        Duration::from_secs(1),
    );
    reaped.extend(more);
    if config.revival.is_some() {
        await_launcher_verdict(&config, &mut signals);
    }
    let groups_gone = empty_unfinished_groups(&config, &mut signals, &mut reaped);
    let witness = Witness {
        role: Role::Monitor,
        reason: None,
        runner_instance_id: config.runner_process_instance_id.clone(),
        runner_end: Some(ended),
        closed_at,
        reaped,
        groups_gone,
        stop_reason: None,
        evidence: None,
    };
    fault::point(Point::AfterCandidate);
    durable::until_proof_written(&config.run_dir, || {
        let restore = || match &outcome {
            Some(outcome) => handover::restore(&config.run_dir, outcome),
            None => Ok(()),
        };
        let finish = || {
            observer::finish_in_slot(
                &config.run_dir,
                &config.run_id,
                &config.root,
                &witness,
                config.capacity_slot,
            );
        };
        finalize_try(restore, finish);
    });
    0
}

/// One try at finalizing: the runner's handed outcome first, then the proof.
/// An outcome the root would not take yet (full, read-only) leaves the proof
/// to the next try: decided now, it would miss the runner's candidate and
/// say `unknown` for good, even if the root came back a moment later. Any
/// other failure does not hold the proof up.
fn finalize_try(restore: impl FnOnce() -> status::Result<()>, finish: impl FnOnce()) {
    use durable::Unwritable;
    if restore().is_err_and(|e| e.blocked().is_some()) {
        return;
    }
    finish();
}

/// The argument that makes the monitor a batch job's script: the launch
/// config is the named file (0600, in the run directory; `sbatch` cannot
/// pass stdin on), not stdin.
pub const CONFIG_FILE_ARG: &str = "--config-file";

/// `__monitor RUN --config-file PATH`: the config file's path.
fn job_config_file() -> Option<std::path::PathBuf> {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let at = args.iter().position(|a| a == CONFIG_FILE_ARG)?;
    args.get(at + 1).map(std::path::PathBuf::from)
}

fn read_config() -> Result<LaunchConfig, String> {
    match job_config_file() {
        Some(path) => crate::config::read_config_file(&path),
        None => serde_json::from_reader(std::io::stdin())
            .map_err(|e| format!("failed to read monitor config from stdin: {e}")),
    }
}

/// Inside a Slurm job: the node we run on goes into `dispatch.json`, for
/// `status` and listings on every host.
fn record_node(config: &LaunchConfig) {
    let (Ok(job), Ok(node)) = (
        std::env::var("SLURM_JOB_ID"),
        std::env::var("SLURMD_NODENAME"),
    ) else {
        return;
    };
    if let Err(e) = dispatch::record_node(&config.run_dir, &job, &node) {
        eprintln!("subagents: warning: failed to record the node: {e}");
    }
}

/// Inside a Slurm job, `stop` signals only the batch script — this
/// monitor (`scancel --batch --signal=TERM`); the runner is the one that
/// ends the steps gracefully and records the run `stopped`, so the signal
/// is handed to it. Through a pidfd taken while the runner is our unreaped
/// child, so a recycled pid is never signalled.
fn forward_term_to(runner: u32) {
    // SAFETY: pidfd_open on our own unreaped child; the result is checked.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, runner as libc::pid_t, 0) };
    if pidfd < 0 {
        eprintln!(
            "subagents: warning: no pidfd for the runner: stop reaches it only through Slurm"
        );
        return;
    }
    let pidfd = pidfd as i32;
    std::thread::spawn(move || {
        let mut set = nix::sys::signal::SigSet::empty();
        set.add(nix::sys::signal::Signal::SIGTERM);
        // SIGTERM is blocked in every thread (`Signals::block` ran first),
        // so this thread takes it when it comes.
        while set.wait().is_ok() {
            // SAFETY: a signal sent through a pidfd we own; fails harmlessly once the runner is gone.
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    pidfd,
                    libc::SIGTERM,
                    std::ptr::null::<libc::siginfo_t>(),
                    0,
                )
            };
            if rc < 0 {
                return;
            }
        }
    });
}

/// Records our identity in the queued status before any runner exists, so
/// an observer can tell a monitor that died from one still starting. A run
/// an observer already gave up (no longer queued) is not started at all.
fn register(config: &LaunchConfig) -> bool {
    let Ok(me) = ProcessIdentity::current() else {
        return true;
    };
    let mut given_up = false;
    // Its loss in a crash is harmless (the run then never started, which
    // the observer concludes from the dead launcher), so only the status's
    // content is fsynced, not the run directory.
    let registered = update_status_unsynced_dir(&config.run_dir, |s| {
        let mut s = s?;
        if s.state != status::RunState::Queued {
            given_up = true;
            return None;
        }
        s.monitor_identity = Some(me.clone());
        Some(s)
    });
    // A status we cannot write must not stop the run.
    registered.is_err() || !given_up
}

/// Spawns the runner; returns its pid and the pipe it hands its outcome
/// into when the root cannot take it (`None` when no pipe could be made:
/// the run goes on without that fallback).
fn spawn_runner(config: &LaunchConfig) -> std::io::Result<(u32, Option<handover::Receiver>)> {
    let mut handed = handover::Receiver::open()
        .inspect_err(|e| eprintln!("subagents: warning: failed to create the outcome pipe: {e}"))
        .ok();
    let runner = match SpawnMode::for_child() {
        SpawnMode::Exec => exec_runner(config, handed.as_ref())?,
        SpawnMode::Fork => fork_runner(config, handed.as_ref())?,
    };
    if let Some(handed) = &mut handed {
        handed.spawned();
    }
    // The runner inherited the ready pipe; our copy must close so the
    // launcher sees EOF if the runner dies before reporting. A monitor
    // started as a batch job has no ready pipe (descriptor 3 may then be
    // one of ours).
    if has_ready_pipe() {
        // SAFETY: descriptor 3 is the ready pipe handed to us and no longer used here.
        unsafe {
            libc::close(3);
        }
    }
    Ok((runner, handed))
}

/// Whether descriptor 3 is the ready pipe of whoever started us (a batch
/// job's monitor has none).
fn has_ready_pipe() -> bool {
    std::env::var_os(crate::config::READY_FD_ENV).is_some()
}

/// `exec`s the runner, records both processes, then hands it its config.
fn exec_runner(config: &LaunchConfig, handed: Option<&handover::Receiver>) -> std::io::Result<u32> {
    let mut command = Command::new(std::env::current_exe()?);
    command
        .arg("__runner")
        // Only for `ps`: the run this process belongs to.
        .arg(&config.run_id)
        .current_dir(&config.run_dir)
        .env_remove(handover::OUTCOME_FD_ENV)
        .stdin(Stdio::piped());
    if let Some(handed) = handed {
        handed.hand_to(&mut command);
    }
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    // SAFETY: only resets the signal mask (async-signal-safe) between fork and exec.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(
            &mut command,
            crate::procs::unblock_all_in_child,
        );
    }
    let mut child = command.spawn()?;
    // Before the runner has its config, so before it writes anything.
    if let Ok(monitor) = ProcessIdentity::current() {
        record_processes(config, monitor, child.id());
    }
    let mut stdin = child
        .stdin
        .take()
        .ok_or_else(|| std::io::Error::other("runner has no stdin"))?;
    stdin.write_all(&serde_json::to_vec(config).map_err(std::io::Error::other)?)?;
    Ok(child.id())
}

/// Forks the runner: the child gets what [`exec_runner`] gives an `exec`ed
/// one (own process group, stdin `/dev/null` instead of the config pipe,
/// our stdout and stderr, the ready pipe as descriptor 3, the outcome pipe
/// as descriptor 4 and nothing else, `ps` words `<program> __runner <run
/// id>`), records both processes first — before it writes anything, as the
/// `exec`ed runner's monitor does — and runs it on the config in memory.
/// Signals stay blocked from the monitor until the runner blocks the same
/// ones, so none arriving in between takes its default action.
fn fork_runner(config: &LaunchConfig, handed: Option<&handover::Receiver>) -> std::io::Result<u32> {
    let exe = std::env::current_exe()?;
    let null = std::fs::File::open("/dev/null")?;
    let stdio = [null.as_raw_fd(), 1, 2];
    let outcome = handed.and_then(handover::Receiver::write_fd);
    let mut keep: Vec<(i32, i32)> = has_ready_pipe().then_some((3, 3)).into_iter().collect();
    keep.extend(outcome.map(|fd| (fd, 4)));
    // Ours, read before the fork: a child reading its parent's later could
    // name a reaper if we died meanwhile.
    let monitor = ProcessIdentity::current().ok();
    // SAFETY: the monitor has one thread (`SpawnMode::for_child`); the child
    // never returns into our frames.
    match unsafe { libc::fork() } {
        -1 => Err(std::io::Error::last_os_error()),
        0 => {
            // SAFETY: setpgid(2) on ourselves.
            let grouped = unsafe { libc::setpgid(0, 0) } == 0;
            let code = if grouped && crate::spawn::become_child(stdio, &keep).is_ok() {
                if let Some(monitor) = monitor {
                    record_processes(config, monitor, std::process::id());
                }
                let words = [exe.as_os_str(), "__runner".as_ref(), config.run_id.as_ref()];
                let fd = if outcome.is_some() { "4" } else { "" };
                crate::spawn::enter(
                    config,
                    &words,
                    handover::OUTCOME_FD_ENV,
                    fd,
                    crate::runner::run_config,
                )
            } else {
                127
            };
            crate::spawn::exit_child(code)
        }
        pid => Ok(pid as u32),
    }
}

/// Writes `run-processes.json`: what `stop` and the observer need to end
/// the run and prove it over even when its status gets damaged. No fsync
/// (see `status::processes`); a record that cannot be written only loses
/// that fallback, so the run goes on.
fn record_processes(config: &LaunchConfig, monitor: ProcessIdentity, runner: u32) {
    let Ok(runner) = ProcessIdentity::of(runner) else {
        return;
    };
    let record = status::processes::RunProcesses {
        version: 1,
        run_id: config.run_id.clone(),
        session_id: config.session_id.clone(),
        runner_process_instance_id: config.runner_process_instance_id.clone(),
        monitor,
        runner,
    };
    if let Err(e) = status::processes::write(&config.run_dir, &record) {
        eprintln!("subagents: warning: {e}");
    }
}

/// Blocks until the runner exits, reaping any orphan met on the way.
fn wait_for(runner: u32) -> (Ended, BTreeMap<u32, Ended>) {
    let mut reaped = BTreeMap::new();
    loop {
        match waitpid(Pid::from_raw(-1), None) {
            Ok(WaitStatus::Exited(pid, code)) => {
                let ended = Ended::Exited(code);
                if pid.as_raw() as u32 == runner {
                    return (ended, reaped);
                }
                reaped.insert(pid.as_raw() as u32, ended);
            }
            Ok(WaitStatus::Signaled(pid, sig, _)) => {
                let ended = Ended::Signaled(sig);
                if pid.as_raw() as u32 == runner {
                    return (ended, reaped);
                }
                reaped.insert(pid.as_raw() as u32, ended);
            }
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            // No children at all: the runner is gone without a status we could read.
            Err(_) => return (Ended::Exited(-1), reaped),
        }
    }
}

/// A runner that died before its final write left no candidate: every
/// step's COMMAND group must be proven empty before anything is claimed.
/// Step index → verified empty (nothing when the runner wrote a candidate).
fn empty_unfinished_groups(
    config: &LaunchConfig,
    signals: &mut Signals,
    reaped: &mut BTreeMap<u32, Ended>,
) -> BTreeMap<usize, bool> {
    let dir = &config.run_dir;
    let mut gone = BTreeMap::new();
    if proof::read_candidate(dir).ok().flatten().is_some() {
        return gone;
    }
    let Ok(Some(current)) = status::model::read_status(dir) else {
        return gone;
    };
    for (i, pid) in observer::step_groups(&current) {
        let (alive, more) = empty_group(
            signals,
            Some(pid),
            Duration::from_secs(2),
            Duration::from_secs(1),
        );
        reaped.extend(more);
        gone.insert(i, alive.is_empty());
    }
    gone
}

/// The runner never existed: the run failed, and no process can be left.
fn record_spawn_failure(config: &LaunchConfig, error: &str) {
    let message = format!("failed to spawn runner: {error}");
    eprintln!("subagents: {message}");
    let now = now_ms();
    let proof = ProcessTerminal::new(
        ProofState::NotStarted,
        &config.run_id,
        &config.runner_process_instance_id,
    );
    let written = update_status(&config.run_dir, |s| {
        let mut s = s?;
        s.state = status::RunState::Failed;
        s.error = Some(message.clone());
        s.last_update = Some(now);
        s.ended_at = Some(now);
        s.process_terminal = Some(proof.to_value());
        Some(s)
    });
    if written.is_ok() {
        let _ = observer::write_not_started(&config.run_dir, &proof);
    }
}

/// A revival runner that exits before proceed is the launcher's to record
/// (status failed, proof not-started); give it the handshake's time to do
/// so before judging the run ourselves.
fn await_launcher_verdict(config: &LaunchConfig, signals: &mut Signals) {
    let deadline = std::time::Instant::now() + verdict_wait(config);
    let queued = || {
        status::model::read_status(&config.run_dir)
            .ok()
            .flatten()
            .is_some_and(|s| s.state == status::RunState::Queued)
    };
    while queued() && std::time::Instant::now() < deadline {
        let tick = std::time::Instant::now() + Duration::from_millis(25);
        // The monitor acts on no stop request: it finishes the proof whatever
        // happens. One read here is dropped; kept (`defer_stop`), it made
        // every later wait return at once, and this loop spin.
        let _ = signals.wait(Some(tick.min(deadline)));
    }
}

/// How long the launcher may take to record that verdict: its two
/// handshake waits (ready, then acknowledged), and 2 s to end the runner
/// and write.
fn verdict_wait(config: &LaunchConfig) -> Duration {
    let waits = config.revival.as_ref().map_or(0, |r| r.timeouts_ms.0);
    Duration::from_millis(waits * 2 + 2_000)
}

#[cfg(test)]
mod tests {
    use nix::sys::signal::Signal;
    use status::RunStatus;
    use status::model::{ExternalProcess, Step};
    use status::proof::ProcessTree;

    use super::*;
    use crate::observer::{Role, Witness, step_groups, witnessed_candidate};

    #[test]
    fn no_proof_is_decided_in_a_try_whose_handed_outcome_the_root_refused() {
        let io = |errno| {
            status::Error::Io(atomic_file::Error {
                op: "write",
                path: "status.json".into(),
                source: std::io::Error::from_raw_os_error(errno),
            })
        };
        let finished = |restored: status::Result<()>| {
            let mut finished = false;
            finalize_try(|| restored, || finished = true);
            finished
        };
        assert!(!finished(Err(io(libc::EROFS))), "read-only: next try");
        assert!(!finished(Err(io(libc::ENOSPC))), "full: next try");
        assert!(finished(Ok(())));
        // A failure no later try can mend does not hold the proof up.
        assert!(finished(Err(io(libc::EACCES))));
        let damaged = status::Error::Invalid {
            what: "status",
            path: "status.json".into(),
            reason: "state: not a string".into(),
        };
        assert!(finished(Err(damaged)));
    }

    /// What a monitor witnessed: these reaped children and these groups gone.
    fn witness(reaped: BTreeMap<u32, Ended>, groups_gone: BTreeMap<usize, bool>) -> Witness {
        Witness {
            role: Role::Monitor,
            reason: None,
            runner_instance_id: "rid".into(),
            runner_end: Some(Ended::Exited(0)),
            closed_at: 42,
            reaped,
            groups_gone,
            stop_reason: None,
            evidence: None,
        }
    }

    /// A status whose steps 0 and 2 were started (pids 100 and 300), step 1 not.
    fn status() -> RunStatus {
        let started = |pid| Step {
            external_process: Some(ExternalProcess {
                pid: Some(pid),
                ..ExternalProcess::default()
            }),
            ..Step::default()
        };
        let mut status = RunStatus::new("r", status::RunState::Running);
        status.ended_at = Some(42);
        status.steps = Some(vec![started(100), Step::default(), started(300)]);
        status
    }

    #[test]
    fn the_launcher_gets_both_its_handshake_waits_and_2_s_for_its_verdict() {
        let mut config = crate::config::tests::launch_config(std::path::Path::new("/nonexistent"));
        config.revival = Some(crate::config::RevivalConfig {
            source_run_id: "r0".into(),
            session_file: "/sessions/s.jsonl".into(),
            lease_root: "/leases".into(),
            token: "t".into(),
            timeouts_ms: (3_000, 7),
        });
        assert_eq!(verdict_wait(&config), Duration::from_millis(8_000));
        config.revival = None;
        assert_eq!(verdict_wait(&config), Duration::from_millis(2_000));
    }

    #[test]
    fn only_started_steps_have_groups() {
        assert_eq!(step_groups(&status()), [(0, 100), (2, 300)]);
    }

    #[test]
    fn the_witnessed_candidate_claims_only_what_the_monitor_saw() {
        let reaped = BTreeMap::from([
            (100, Ended::Exited(3)),
            (300, Ended::Signaled(Signal::SIGKILL)),
        ]);
        let gone = BTreeMap::from([(0, true), (2, false)]);
        let candidate = witnessed_candidate("r", &status(), &witness(reaped, gone));
        assert_eq!(candidate.run_id, "r");
        assert_eq!(
            candidate.expected_writers,
            Some(BTreeMap::from([
                ("0".into(), 1),
                ("1".into(), 0),
                ("2".into(), 1)
            ]))
        );
        let first = &candidate.writers["0"][0];
        assert_eq!(first.process_instance_id, "rid-writer-0");
        assert_eq!(first.exit_code, Some(3));
        assert_eq!(first.signal, None);
        assert_eq!(first.close_observed_at, 42);
        assert!(matches!(
            first.process_tree,
            ProcessTree::Observed {
                process_group_id: 100,
                ..
            }
        ));
        let third = &candidate.writers["2"][0];
        assert_eq!(third.exit_code, None);
        assert_eq!(third.signal.as_deref(), Some("SIGKILL"));
        // A group not proven empty is never claimed observed.
        assert!(matches!(
            &third.process_tree,
            ProcessTree::Unknown { reason, .. } if reason == "verification-failed"
        ));
        assert!(!candidate.writers.contains_key("1"));
    }

    #[test]
    fn an_exit_the_monitor_did_not_reap_is_not_invented() {
        let gone = BTreeMap::from([(0, true), (2, true)]);
        let candidate = witnessed_candidate("r", &status(), &witness(BTreeMap::new(), gone));
        for writer in ["0", "2"] {
            let record = &candidate.writers[writer][0];
            assert_eq!((record.exit_code, record.signal.as_deref()), (None, None));
        }
    }
}
