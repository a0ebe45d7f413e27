use super::*;

fn me() -> ProcessIdentity {
    ProcessIdentity {
        pid: 10,
        start_time: 1,
        boot_id: None,
        machine_id: None,
        host: None,
    }
}

fn facts() -> Facts {
    Facts {
        state: RunState::Running,
        proof_final: false,
        monitor: Presence::Dead(me()),
        runner: Presence::Dead(me()),
        launcher: Presence::Dead(me()),
        session: Some(Vec::new()),
    }
}

#[test]
fn a_final_proof_or_a_live_monitor_means_nothing_to_do() {
    let f = Facts {
        proof_final: true,
        ..facts()
    };
    assert_eq!(judge(&f), Verdict::Final);
    let f = Facts {
        monitor: Presence::Alive(me()),
        runner: Presence::Alive(me()),
        ..facts()
    };
    assert_eq!(judge(&f), Verdict::MonitorAlive(10));
}

#[test]
fn a_live_runner_without_its_monitor_is_still_running() {
    let f = Facts {
        runner: Presence::Alive(me()),
        ..facts()
    };
    assert_eq!(judge(&f), Verdict::RunnerAlive(10));
}

#[test]
fn dead_monitor_and_runner_settle() {
    assert_eq!(judge(&facts()), Verdict::Settle);
    let f = Facts {
        monitor: Presence::NotRecorded,
        ..facts()
    };
    assert_eq!(judge(&f), Verdict::Settle);
}

fn elsewhere() -> ProcessIdentity {
    ProcessIdentity {
        machine_id: Some("another-machine-0001".into()),
        host: Some("node-b".into()),
        ..me()
    }
}

fn past_boot() -> ProcessIdentity {
    ProcessIdentity {
        boot_id: Some("00000000-0000-4000-8000-0000000b0070".into()),
        ..me()
    }
}

#[test]
fn a_process_of_another_machine_leaves_the_run_to_that_machine() {
    let host = || Verdict::OtherHost("node-b".into());
    let monitor = Facts {
        monitor: Presence::Foreign(elsewhere()),
        ..facts()
    };
    assert_eq!(judge(&monitor), host());
    let runner = Facts {
        runner: Presence::Foreign(elsewhere()),
        ..facts()
    };
    assert_eq!(judge(&runner), host());
    // Even a queued run whose only record is its launcher's.
    let launcher = Facts {
        state: RunState::Queued,
        monitor: Presence::NotRecorded,
        runner: Presence::NotRecorded,
        launcher: Presence::Foreign(elsewhere()),
        ..facts()
    };
    assert_eq!(judge(&launcher), host());
    // A final proof is final wherever it was written.
    let proven = Facts {
        proof_final: true,
        ..runner
    };
    assert_eq!(judge(&proven), Verdict::Final);
}

#[test]
fn a_run_of_a_past_boot_is_known_as_such_and_names_no_group_here() {
    let f = Facts {
        monitor: Presence::Dead(past_boot()),
        runner: Presence::Dead(past_boot()),
        ..facts()
    };
    assert!(f.of_past_boot());
    assert_eq!(judge(&f), Verdict::Settle);
    assert!(!facts().of_past_boot());
    // Whether or not its number is in use now, a past boot's group is not ours.
    assert!(!group_is_ours(&Presence::Dead(past_boot()), false));
    assert!(!group_is_ours(&Presence::Dead(past_boot()), true));
    assert!(!group_is_ours(&Presence::Foreign(elsewhere()), false));
}

#[test]
fn unreadable_liveness_is_unprovable_and_names_the_process() {
    let f = Facts {
        runner: Presence::Unknown(me()),
        ..facts()
    };
    let Verdict::Unprovable(line) = judge(&f) else {
        panic!("not unprovable")
    };
    assert!(line.contains("runner process 10"), "{line}");
    let f = Facts {
        monitor: Presence::Unknown(me()),
        ..facts()
    };
    assert!(matches!(judge(&f), Verdict::Unprovable(l) if l.contains("monitor process 10")));
}

#[test]
fn never_started_runs_are_abandoned_only_when_their_starters_are_gone() {
    let queued = Facts {
        state: RunState::Queued,
        monitor: Presence::NotRecorded,
        runner: Presence::NotRecorded,
        session: None,
        ..facts()
    };
    assert_eq!(judge(&queued), Verdict::Abandoned);
    let launching = Facts {
        launcher: Presence::Alive(me()),
        ..queued.clone()
    };
    assert_eq!(judge(&launching), Verdict::Launching(10));
    let reference = Facts {
        launcher: Presence::NotRecorded,
        ..queued.clone()
    };
    assert_eq!(judge(&reference), Verdict::Foreign);
    // The monitor died before the runner wrote anything.
    let monitor_gone = Facts {
        monitor: Presence::Dead(me()),
        launcher: Presence::Alive(me()),
        session: Some(Vec::new()),
        ..queued.clone()
    };
    assert_eq!(judge(&monitor_gone), Verdict::Abandoned);
    let starting = Facts {
        session: Some(vec![42]),
        ..monitor_gone.clone()
    };
    assert_eq!(judge(&starting), Verdict::Starting(42));
    let blind = Facts {
        session: None,
        ..monitor_gone
    };
    assert!(matches!(judge(&blind), Verdict::Unprovable(_)));
}

#[test]
fn a_recorded_group_is_ours_only_while_it_cannot_be_someone_elses() {
    assert!(group_is_ours(&Presence::Alive(me()), true));
    assert!(group_is_ours(&Presence::Dead(me()), false));
    assert!(!group_is_ours(&Presence::Dead(me()), true));
    assert!(group_is_ours(&Presence::NotRecorded, false));
    assert!(!group_is_ours(&Presence::Unknown(me()), false));
}

fn two_steps() -> RunStatus {
    let mut status = RunStatus::new("r", RunState::Running);
    status.steps = Some(
        ["a", "b"]
            .iter()
            .map(|agent| status::Step {
                agent: (*agent).into(),
                status: "running".into(),
                ..Default::default()
            })
            .collect(),
    );
    status
}

fn step_event(kind: &str, i: u64) -> Value {
    json!({"type": format!("subagent.step.{kind}"), "stepIndex": i})
}

/// The two fields of an event the observer reads (`type`, `stepIndex`),
/// absent, `null`, of the wrong type and empty in the second step's end:
/// that end is then unknown, and with nothing else to go on the outcome is
/// not restored; an index counts for its own step only (step 1 failed, step
/// 0 completed, so reading one index for the other shows).
#[test]
fn an_end_event_without_a_usable_type_or_step_index_ends_no_step() {
    let status = two_steps();
    let restored = outcome_from_events(
        &status,
        &[step_event("completed", 0), step_event("failed", 1)],
    );
    assert_eq!(restored.unwrap().error.as_deref(), Some("Step failed: b"));
    let swapped = [step_event("failed", 0), step_event("completed", 1)];
    let restored = outcome_from_events(&status, &swapped).unwrap();
    assert_eq!(restored.error.as_deref(), Some("Step failed: a"));
    for key in ["type", "stepIndex"] {
        let values = match key {
            "type" => [Value::Null, json!(7), json!(""), json!("subagent.step.")],
            _ => [Value::Null, json!("1"), json!(-1), json!(1.5)],
        };
        let mut changes: Vec<Option<Value>> = vec![None];
        changes.extend(values.into_iter().map(Some));
        for change in changes {
            let mut second = step_event("failed", 1);
            match &change {
                None => {
                    second.as_object_mut().unwrap().remove(key);
                }
                Some(v) => second[key] = v.clone(),
            }
            let events = [step_event("completed", 0), second];
            assert_eq!(
                outcome_from_events(&status, &events),
                None,
                "{key} = {change:?}"
            );
        }
    }
}

#[test]
fn events_restore_the_outcome_only_when_every_step_ended() {
    let status = two_steps();
    let one = [step_event("completed", 0)];
    assert_eq!(outcome_from_events(&status, &one), None);
    let both = [
        json!({"type": "subagent.run.started"}),
        step_event("completed", 0),
        step_event("completed", 1),
    ];
    let restored = outcome_from_events(&status, &both).unwrap();
    assert_eq!(restored.state, RunState::Complete);
    assert_eq!(restored.error, None);
    let failed = [step_event("completed", 0), step_event("failed", 1)];
    let restored = outcome_from_events(&status, &failed).unwrap();
    assert_eq!(restored.state, RunState::Failed);
    assert_eq!(restored.error.as_deref(), Some("Step failed: b"));
    let repaired = restore(two_steps(), &restored, 5);
    assert_eq!(repaired.steps()[0].status, "complete");
    assert_eq!(repaired.steps()[1].status, "failed");
    assert_eq!(repaired.ended_at, Some(5));
}

#[test]
fn the_witnessed_candidate_proves_only_groups_seen_empty() {
    let mut status = two_steps();
    for (i, step) in status.steps.iter_mut().flatten().enumerate() {
        step.external_process = Some(status::model::ExternalProcess {
            pid: Some(100 + i as u32),
            ..Default::default()
        });
    }
    let witness = Witness {
        role: Role::Reconciler,
        reason: Some("test".into()),
        runner_instance_id: "runner-1".into(),
        runner_end: None,
        closed_at: 1,
        reaped: BTreeMap::new(),
        groups_gone: BTreeMap::from([(0, true), (1, false)]),
        stop_reason: None,
        evidence: None,
    };
    let candidate = witnessed_candidate("r", &status, &witness);
    assert_eq!(candidate.expected_writers.as_ref().unwrap()["0"], 1);
    assert!(matches!(
        candidate.writers["0"][0].process_tree,
        ProcessTree::Observed {
            process_group_id: 100,
            ..
        }
    ));
    assert!(matches!(
        candidate.writers["1"][0].process_tree,
        ProcessTree::Unknown { .. }
    ));
}

/// The identity of a process that certainly exited (and was reaped).
fn dead() -> ProcessIdentity {
    // Read while it surely runs: the `procs` tests reap any exited child
    // (`waitpid(-1)`) at the same time, which may also leave our wait ECHILD.
    let mut child = std::process::Command::new("sleep")
        .arg("300")
        .spawn()
        .unwrap();
    let identity = ProcessIdentity::of(child.id()).unwrap();
    child.kill().unwrap();
    let _ = child.wait();
    identity
}

fn run_dir(tmp: &tempfile::TempDir) -> PathBuf {
    let dir = tmp.path().join("async-subagent-runs").join("r");
    atomic_file::ensure_private_dir(&dir).unwrap();
    index::create_marker(&dir).unwrap();
    dir
}

fn orphaned(dir: &Path, monitor: ProcessIdentity) {
    let mut status = two_steps();
    status.lifecycle_artifact_version = Some(status::LIFECYCLE_ARTIFACT_VERSION);
    status.runner_identity = Some(dead());
    status.pid = status.runner_identity.as_ref().map(|r| r.pid);
    status.monitor_identity = Some(monitor);
    status.runner_process_instance_id = Some("runner-1".into());
    status.process_terminal =
        Some(ProcessTerminal::new(ProofState::Pending, "r", "runner-1").to_value());
    status::model::write_status(dir, &status).unwrap();
}

#[test]
fn observe_restores_the_outcome_from_events_and_finalizes() {
    // Starts and ends a child (`dead()`): its SIGCHLD must not reach a
    // `procs` test waiting for its own signals.
    let _serial = crate::procs::tests::serial();
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(&tmp);
    let monitor = dead();
    orphaned(&dir, monitor.clone());
    for i in 0..2 {
        events::append(
            &dir,
            "subagent.step.completed",
            "r",
            1,
            json!({"stepIndex": i}),
        )
        .unwrap();
    }
    let observation = observe(&dir, &Options::new(tmp.path()));
    let Observation::Finalized {
        proof,
        repaired,
        reason,
    } = observation
    else {
        panic!("not finalized: {observation:?}")
    };
    assert!(
        reason.starts_with(&format!("monitor {} exited; runner", monitor.pid)),
        "{reason}"
    );
    assert_eq!(proof.state, ProofState::Observed);
    assert!(repaired.unwrap().contains("so the run is complete"));
    let status = read_status(&dir).unwrap().unwrap();
    assert_eq!(status.state, RunState::Complete);
    assert_eq!(status.error, None);
    assert!(!index::has_marker(&dir));
    let runner = &proof.instances.as_ref().unwrap()[0];
    assert_eq!(runner["observer"]["role"], "reconciler");
    // Readers of either implementation accept the proof as written.
    let text = std::fs::read_to_string(dir.join(status::layout::files::PROOF)).unwrap();
    let raw: Value = serde_json::from_str(&text).unwrap();
    assert!(proof::validate_proof(&raw, "test", &proof::Fallback::default()).is_ok());
    // A second pass has nothing left to do.
    assert!(matches!(
        observe(&dir, &Options::new(tmp.path())),
        Observation::Final
    ));
}

#[test]
fn observe_defers_to_a_live_monitor() {
    // Starts and ends a child (`dead()`): its SIGCHLD must not reach a
    // `procs` test waiting for its own signals.
    let _serial = crate::procs::tests::serial();
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(&tmp);
    let me = ProcessIdentity::current().unwrap();
    orphaned(&dir, me.clone());
    assert!(matches!(
        observe(&dir, &Options::new(tmp.path())),
        Observation::MonitorAlive(pid) if pid == me.pid
    ));
    assert_eq!(read_status(&dir).unwrap().unwrap().state, RunState::Running);
    assert!(index::has_marker(&dir));
}

#[test]
fn a_listing_is_handed_back_the_status_it_read_while_the_monitor_lives() {
    // Starts and ends a child (`dead()`): its SIGCHLD must not reach a
    // `procs` test waiting for its own signals.
    let _serial = crate::procs::tests::serial();
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(&tmp);
    let me = ProcessIdentity::current().unwrap();
    orphaned(&dir, me.clone());
    // Another observer holds the run's lock: a live monitor is deferred to
    // without waiting for it or taking it.
    let held = ObserverLock::try_take(&dir).expect("the lock is free");
    let mut read = read_status(&dir).unwrap().unwrap();
    // What the listing read is what it gets back, not the file again.
    read.current_step = Some(7);
    let kept = observe_status(&dir, read.clone(), &Options::new(tmp.path())).unwrap();
    assert_eq!(kept.unwrap().current_step, Some(7));
    assert!(matches!(
        observe(&dir, &Options::new(tmp.path())),
        Observation::MonitorAlive(pid) if pid == me.pid
    ));
    drop(held);
    // Once the monitor is gone the observer finalizes, and the listing gets
    // the status it wrote.
    let monitor = dead();
    orphaned(&dir, monitor);
    for i in 0..2 {
        let fields = json!({"stepIndex": i});
        events::append(&dir, "subagent.step.completed", "r", 1, fields).unwrap();
    }
    let stale = read_status(&dir).unwrap().unwrap();
    assert_eq!(stale.state, RunState::Running);
    let settled = observe_status(&dir, stale, &Options::new(tmp.path())).unwrap();
    assert_eq!(settled.unwrap().state, RunState::Complete);
}

#[test]
fn observe_gives_up_a_queued_run_whose_launcher_died() {
    // Starts and ends a child (`dead()`): its SIGCHLD must not reach a
    // `procs` test waiting for its own signals.
    let _serial = crate::procs::tests::serial();
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(&tmp);
    let mut status = RunStatus::new("r", RunState::Queued);
    let launcher = dead();
    status.launcher_identity = Some(launcher.clone());
    status.runner_process_instance_id = Some("runner-1".into());
    status::model::write_status(&dir, &status).unwrap();
    let observation = observe(&dir, &Options::new(tmp.path()));
    let gone = format!("its launcher {} exited first", launcher.pid);
    assert!(
        matches!(&observation, Observation::Abandoned(m) if m.contains(&gone)),
        "{observation:?}"
    );
    let status = read_status(&dir).unwrap().unwrap();
    assert_eq!(status.state, RunState::Failed);
    let proof = status.process_terminal.unwrap();
    assert_eq!(proof["state"], "not-started");
    assert_eq!(proof["runnerProcessInstanceId"], "runner-1");
    assert!(!index::has_marker(&dir));
    // The proof's durable copy too.
    let file = std::fs::read_to_string(dir.join(status::layout::files::PROOF)).unwrap();
    let file: Value = serde_json::from_str(&file).unwrap();
    assert_eq!(file["state"], "not-started", "{file}");
}

#[test]
fn a_recorded_pid_of_0_or_1_never_names_a_group_or_session_to_signal() {
    assert!(!signallable(0) && !signallable(1) && signallable(2));
    let mut status = two_steps();
    for (i, step) in status.steps.iter_mut().flatten().enumerate() {
        step.external_process = Some(status::model::ExternalProcess {
            pid: Some(i as u32),
            ..Default::default()
        });
    }
    assert_eq!(step_groups(&status), []);
    // A monitor recorded as pid 0: in a pid namespace `/proc` lists pid 1
    // as a member of session 0.
    let facts = Facts {
        monitor: Presence::Dead(ProcessIdentity {
            pid: 0,
            start_time: 1,
            boot_id: None,
            machine_id: None,
            host: None,
        }),
        session: Some(vec![1]),
        ..facts()
    };
    let targets = Targets::of("r", &status, &facts);
    assert_eq!(targets.groups, [] as [u32; 0]);
    assert_eq!(targets.session, None);
}

/// `sh -c script` as the leader of a new session, stdin and stdout piped.
fn session_leader(script: &str) -> std::process::Child {
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};
    let mut command = Command::new("sh");
    command
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    // SAFETY: setsid(2) is async-signal-safe.
    unsafe {
        command.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    command.spawn().unwrap()
}

#[test]
fn what_is_left_in_a_dead_monitors_session_is_ended() {
    use std::io::BufRead;
    let _serial = crate::procs::tests::serial();
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(&tmp);
    // The "monitor" leaves a sleeper in its session, then exits when its
    // stdin closes.
    let mut monitor = session_leader("sleep 300 >/dev/null 2>&1 & echo $!; read _");
    let mut line = String::new();
    std::io::BufReader::new(monitor.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let orphan = ProcessIdentity::of(line.trim().parse().unwrap()).unwrap();
    orphaned(&dir, ProcessIdentity::of(monitor.id()).unwrap());
    drop(monitor.stdin.take());
    monitor.wait().unwrap();
    assert_eq!(orphan.liveness(), Liveness::Alive);
    let observation = observe(&dir, &Options::new(tmp.path()));
    let ended = orphan.liveness() != Liveness::Alive;
    if !ended {
        let _ = nix::sys::signal::kill(Pid::from_raw(orphan.pid as i32), Signal::SIGKILL);
    }
    assert!(
        matches!(observation, Observation::Finalized { .. }),
        "{observation:?}"
    );
    assert!(
        ended,
        "the orphan in the dead monitor's session was left alive"
    );
}

#[test]
fn a_dead_monitors_pid_in_use_again_names_no_session() {
    let _serial = crate::procs::tests::serial();
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(&tmp);
    // A stranger now leads a session under the recorded monitor's pid.
    let mut stranger = session_leader("exec sleep 300");
    let mut recorded = ProcessIdentity::of(stranger.id()).unwrap();
    recorded.start_time += 1;
    orphaned(&dir, recorded);
    let observation = observe(&dir, &Options::new(tmp.path()));
    let untouched = stranger.try_wait().unwrap().is_none();
    let _ = stranger.kill();
    let _ = stranger.wait();
    assert!(
        matches!(observation, Observation::Finalized { .. }),
        "{observation:?}"
    );
    assert!(untouched, "the observer signalled a stranger's session");
}

#[test]
fn only_observations_that_changed_or_retain_a_run_make_a_line() {
    assert_eq!(
        Observation::Unproven("why".into()).line().as_deref(),
        Some("retained: why")
    );
    assert_eq!(
        Observation::Abandoned("gone".into()).line().as_deref(),
        Some("failed (never started): gone")
    );
    let proof = ProcessTerminal::new(ProofState::Observed, "r", "runner-1");
    let finalized = Observation::Finalized {
        proof: Box::new(proof),
        repaired: None,
        reason: "all gone".into(),
    };
    assert_eq!(
        finalized.line().as_deref(),
        Some("process terminal observed: all gone")
    );
    assert_eq!(Observation::Final.line(), None);
    assert_eq!(Observation::MonitorAlive(3).line(), None);
    assert_eq!(
        Observation::OtherHost("node-b".into()).line().as_deref(),
        Some("left to node-b: it runs there")
    );
    assert_eq!(
        Observation::Requeued(4242).line().as_deref(),
        Some("waiting for a capacity slot again: its monitor was gone, monitor 4242 took over")
    );
}

#[test]
fn a_damaged_status_is_stood_in_for_by_the_run_processes_record() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(&tmp);
    std::fs::write(dir.join("status.json"), b"{\"state\": 7").unwrap();
    assert!(read_status(&dir).is_err());
    assert_eq!(
        status_or_stand_in(&dir),
        None,
        "no record: nothing to judge"
    );
    let monitor = ProcessIdentity { pid: 11, ..me() };
    let runner = ProcessIdentity { pid: 12, ..me() };
    let record = status::processes::RunProcesses {
        version: 1,
        run_id: "r".into(),
        session_id: Some("s".into()),
        runner_process_instance_id: "runner-7".into(),
        monitor: monitor.clone(),
        runner: runner.clone(),
    };
    status::processes::write(&dir, &record).unwrap();
    let stood_in = status_or_stand_in(&dir).expect("a stand-in");
    assert_eq!(stood_in.run_id, "r");
    assert_eq!(stood_in.state, RunState::Running);
    assert_eq!(stood_in.session_id.as_deref(), Some("s"));
    assert_eq!(stood_in.pid, Some(12));
    assert_eq!(stood_in.runner_identity, Some(runner));
    assert_eq!(stood_in.monitor_identity, Some(monitor));
    assert_eq!(
        stood_in.runner_process_instance_id.as_deref(),
        Some("runner-7")
    );
}

#[test]
fn a_job_still_running_past_the_bound_after_its_run_ended_is_called_stuck() {
    // The bound is the default (60 s): no test sets the variable.
    let job = |state: &str| crate::slurm::JobRecord {
        job_id: "12".into(),
        state: state.into(),
        exit_code: None,
        reason: None,
        node: None,
        source: "scontrol",
    };
    let status = |state, updated_ago: Option<u64>| {
        let mut status = RunStatus::new("r", state);
        status.started_at = Some(now_ms() - 600_000);
        status.last_update = updated_ago.map(|ago| now_ms() - ago);
        status
    };
    let stuck = stuck_for(&status(RunState::Complete, Some(120_000)), &job("RUNNING"));
    assert!(
        stuck.is_some_and(|ms| (120_000..180_000).contains(&ms)),
        "{stuck:?}"
    );
    let cases = [
        (
            RunState::Complete,
            Some(5_000),
            "RUNNING",
            "within the bound",
        ),
        (
            RunState::Running,
            Some(120_000),
            "RUNNING",
            "the run still active",
        ),
        (
            RunState::Complete,
            Some(120_000),
            "COMPLETING",
            "the job not running",
        ),
        (RunState::Complete, None, "RUNNING", "no last update"),
    ];
    for (state, ago, job_state, why) in cases {
        assert_eq!(
            stuck_for(&status(state, ago), &job(job_state)),
            None,
            "{why}"
        );
    }
}

#[test]
fn a_dead_monitor_of_a_past_boot_has_its_session_never_looked_for() {
    use std::io::BufRead;
    let _serial = crate::procs::tests::serial();
    // A session whose leader exited and whose member lives on.
    let mut leader = session_leader("sleep 300 >/dev/null 2>&1 & echo $!");
    let mut line = String::new();
    std::io::BufReader::new(leader.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let member: u32 = line.trim().parse().unwrap();
    let member_stat = process_identity::read_stat(member).unwrap();
    let _ = leader.wait();
    let leader_pid = leader.id();
    assert_eq!(member_stat.session, leader_pid);
    let gathered = |monitor: ProcessIdentity| {
        let mut status = RunStatus::new("r", RunState::Running);
        status.monitor_identity = Some(monitor);
        gather(Path::new("/nonexistent"), &status).session
    };
    let of_this_boot = gathered(ProcessIdentity {
        pid: leader_pid,
        ..ProcessIdentity::of(std::process::id()).unwrap()
    });
    let of_past_boot = gathered(ProcessIdentity {
        pid: leader_pid,
        ..past_boot()
    });
    // Our own grandchild, checked by its session above.
    if process_identity::read_stat(member).is_ok_and(|s| s.session == leader_pid) {
        let _ = nix::sys::signal::kill(Pid::from_raw(member as i32), Signal::SIGKILL);
    }
    assert_eq!(
        of_this_boot,
        Some(vec![member]),
        "the fixture's session has a member"
    );
    assert_eq!(
        of_past_boot,
        Some(Vec::new()),
        "a past boot's numbers name nothing"
    );
}

#[test]
fn every_run_of_the_active_index_is_observed() {
    // Starts and ends a child (`dead()`): its SIGCHLD must not reach a
    // `procs` test waiting for its own signals.
    let _serial = crate::procs::tests::serial();
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(&tmp);
    let me = ProcessIdentity::current().unwrap();
    orphaned(&dir, me.clone());
    let seen = observe_active(&Layout::new(tmp.path()), &Options::new(tmp.path()));
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].0, "r");
    assert!(matches!(seen[0].1, Observation::MonitorAlive(pid) if pid == me.pid));
}

#[test]
fn a_half_persisted_proof_is_completed_when_its_monitor_is_dead() {
    // `dead()` starts and ends a child: its SIGCHLD must not reach a
    // `procs` test's signalfd.
    let _serial = crate::procs::tests::serial();
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(&tmp);
    orphaned(&dir, dead());
    for i in 0..2 {
        events::append(
            &dir,
            "subagent.step.completed",
            "r",
            1,
            json!({"stepIndex": i}),
        )
        .unwrap();
    }
    let observation = observe(&dir, &Options::new(tmp.path()));
    let Observation::Finalized { proof, .. } = observation else {
        panic!("not finalized: {observation:?}")
    };
    // The proof names the runner instance the status recorded.
    assert_eq!(
        proof.instances.as_ref().unwrap()[0]["processInstanceId"],
        "runner-1"
    );
    // A finalizer that died after writing the proof left its marker release undone.
    index::create_marker(&dir).unwrap();
    assert!(matches!(
        observe(&dir, &Options::new(tmp.path())),
        Observation::Final
    ));
    assert!(!index::has_marker(&dir));
}

#[test]
fn a_run_given_up_before_it_started_is_final() {
    // `dead()` starts and ends a child: its SIGCHLD must not reach a
    // `procs` test's signalfd.
    let _serial = crate::procs::tests::serial();
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(&tmp);
    let mut status = RunStatus::new("r", RunState::Failed);
    status.launcher_identity = Some(dead());
    status.process_terminal =
        Some(ProcessTerminal::new(ProofState::NotStarted, "r", "runner-1").to_value());
    status::model::write_status(&dir, &status).unwrap();
    assert!(matches!(
        observe(&dir, &Options::new(tmp.path())),
        Observation::Final
    ));
}

#[test]
fn a_listing_that_read_a_run_before_another_observer_gave_it_up_finds_it_final() {
    // `dead()` starts and ends a child: its SIGCHLD must not reach a
    // `procs` test's signalfd.
    let _serial = crate::procs::tests::serial();
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(&tmp);
    let launcher = dead();
    // What the listing read: queued, its launcher gone.
    let mut read = RunStatus::new("r", RunState::Queued);
    read.launcher_identity = Some(launcher.clone());
    // What is on disk by the time this observer holds the lock: another
    // observer gave the run up (failed, `not-started`).
    let mut given_up = RunStatus::new("r", RunState::Failed);
    given_up.launcher_identity = Some(launcher);
    given_up.process_terminal =
        Some(ProcessTerminal::new(ProofState::NotStarted, "r", "runner-1").to_value());
    status::model::write_status(&dir, &given_up).unwrap();
    assert!(matches!(
        observe_read(&dir, &read, &Options::new(tmp.path())),
        Observation::Final
    ));
    let listed = observe_status(&dir, read, &Options::new(tmp.path())).unwrap();
    assert_eq!(listed.unwrap().state, RunState::Failed);
}

#[test]
fn observe_gives_up_a_queued_run_whose_monitor_died_before_its_runner() {
    // `dead()` starts and ends a child: its SIGCHLD must not reach a
    // `procs` test's signalfd.
    let _serial = crate::procs::tests::serial();
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(&tmp);
    let mut status = RunStatus::new("r", RunState::Queued);
    let monitor = dead();
    status.monitor_identity = Some(monitor.clone());
    status.launcher_identity = Some(dead());
    status::model::write_status(&dir, &status).unwrap();
    let observation = observe(&dir, &Options::new(tmp.path()));
    let gone = format!("its monitor {} exited first", monitor.pid);
    assert!(
        matches!(&observation, Observation::Abandoned(m) if m.contains(&gone)),
        "{observation:?}"
    );
}

#[test]
fn a_process_of_the_run_that_left_its_session_and_groups_is_found_by_its_tag() {
    use std::os::unix::process::CommandExt;
    let _serial = crate::procs::tests::serial();
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(&tmp);
    orphaned(&dir, dead());
    // A run id no other process on the machine carries.
    let run_id = format!("tagged-{}", std::process::id());
    let mut status = read_status(&dir).unwrap().unwrap();
    status.run_id = run_id.clone();
    status::model::write_status(&dir, &status).unwrap();
    let mut command = std::process::Command::new("sleep");
    command.arg("300").env(RUN_ID_ENV, &run_id);
    // SAFETY: setsid(2) is async-signal-safe.
    unsafe {
        command.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut daemon = command.spawn().unwrap();
    let observation = observe(&dir, &Options::new(tmp.path()));
    let ended = daemon.try_wait().unwrap().is_some();
    let _ = daemon.kill();
    let _ = daemon.wait();
    assert!(
        matches!(observation, Observation::Finalized { .. }),
        "{observation:?}"
    );
    assert!(ended, "a process tagged with the run was left alive");
}

#[test]
fn an_observer_inside_the_run_will_not_end_it() {
    let me = process_identity::read_stat(std::process::id()).unwrap();
    let targets = |groups: Vec<u32>, session: Option<u32>| Targets {
        groups,
        session,
        run_id: "not-this-run".into(),
        this_boot: true,
    };
    let inside = targets(Vec::new(), Some(me.session)).includes_self();
    assert_eq!(
        inside,
        Some(format!(
            "this process ({}) belongs to the run and will not end it",
            std::process::id()
        ))
    );
    assert!(targets(vec![me.pgrp], None).includes_self().is_some());
    assert_eq!(targets(Vec::new(), None).includes_self(), None);
    let others = targets(vec![me.pgrp + 1], Some(me.session + 1));
    assert_eq!(others.includes_self(), None);
}

/// Names the case [`observer_tagged_with_a_run`] plays in a copy of this binary.
const TAGGED_CASE_ENV: &str = "SUBAGENTS_OBSERVER_TEST_CASE";

/// Not a test of its own: the body of the copy of this test binary that
/// [`an_observer_tagged_with_the_run_will_not_end_it`] starts with
/// `SUBAGENTS_RUN_ID` set. Without the case variable it returns at once.
#[test]
fn observer_tagged_with_a_run() {
    if std::env::var_os(TAGGED_CASE_ENV).is_none() {
        return;
    }
    let run_id = std::env::var(RUN_ID_ENV).unwrap();
    let targets = |run_id: &str| Targets {
        groups: Vec::new(),
        session: None,
        run_id: run_id.into(),
        this_boot: true,
    };
    assert!(targets(&run_id).includes_self().is_some());
    assert_eq!(targets("another-run").includes_self(), None);
    // A run of a past boot names no group or session here, yet the tag
    // still tells a caller carrying it that the run is its own.
    let past = Facts {
        monitor: Presence::Dead(past_boot()),
        runner: Presence::Dead(past_boot()),
        ..facts()
    };
    let status = RunStatus::new(run_id.as_str(), RunState::Running);
    let of_past_boot = Targets::of(&run_id, &status, &past);
    assert!(of_past_boot.includes_self().is_some());
}

#[test]
fn an_observer_tagged_with_the_run_will_not_end_it() {
    // The process tests reap any child; ours must not be taken.
    let _serial = crate::procs::tests::serial();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "observer::tests::observer_tagged_with_a_run"])
        .env(TAGGED_CASE_ENV, "1")
        .env(RUN_ID_ENV, "the-run")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

fn monitor_witness(runner_end: Option<Ended>, stop_reason: Option<&str>) -> Witness {
    Witness {
        role: Role::Monitor,
        reason: None,
        runner_instance_id: "runner-1".into(),
        runner_end,
        closed_at: 5,
        reaped: BTreeMap::new(),
        groups_gone: BTreeMap::new(),
        stop_reason: stop_reason.map(str::to_owned),
        evidence: None,
    }
}

fn repair_events(dir: &Path) -> Vec<Value> {
    events::read_all(dir)
        .into_iter()
        .filter(|e| e["type"] == "subagent.run.repaired_stale")
        .collect()
}

#[test]
fn a_monitor_repairs_with_how_its_runner_ended_and_records_no_observer() {
    // `dead()` starts and ends a child: its SIGCHLD must not reach a
    // `procs` test's signalfd.
    let _serial = crate::procs::tests::serial();
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(&tmp);
    orphaned(&dir, dead());
    let killed = monitor_witness(Some(Ended::Signaled(Signal::SIGKILL)), None);
    let (proof, repaired) = finish(&dir, "r", tmp.path(), &killed);
    let repaired = repaired.unwrap();
    assert!(
        repaired.starts_with(
            "Async runner process exited with signal SIGKILL before writing a final status."
        ),
        "{repaired}"
    );
    assert_eq!(proof.state, ProofState::Observed);
    let status = read_status(&dir).unwrap().unwrap();
    assert_eq!(status.state, RunState::Failed);
    assert_eq!(status.error.as_deref(), Some(repaired.as_str()));
    // The listing facts are frozen with the proof.
    assert!(status.extra[status::model::LISTING_FACTS]["frozenAt"].is_u64());
    let events = repair_events(&dir);
    assert_eq!(events.len(), 1);
    assert!(events[0].get("observer").is_none(), "{}", events[0]);
}

#[test]
fn a_stop_that_arrived_turns_the_repair_into_stopped_and_keeps_other_failures() {
    // `dead()` starts and ends a child: its SIGCHLD must not reach a
    // `procs` test's signalfd.
    let _serial = crate::procs::tests::serial();
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(&tmp);
    orphaned(&dir, dead());
    let mut status = read_status(&dir).unwrap().unwrap();
    let first = &mut status.steps.as_mut().unwrap()[0];
    first.status = "failed".into();
    first.error = Some("command ended with exit code 3".into());
    status::model::write_status(&dir, &status).unwrap();
    let stop = monitor_witness(Some(Ended::Exited(0)), Some("Stopped by the test."));
    let (_, repaired) = finish(&dir, "r", tmp.path(), &stop);
    assert_eq!(repaired.as_deref(), Some("Stopped by the test."));
    let status = read_status(&dir).unwrap().unwrap();
    assert_eq!(status.state, RunState::Stopped);
    assert_eq!(status.stopped, Some(true));
    assert_eq!(status.error.as_deref(), Some("Stopped by the test."));
    let steps = status.steps();
    assert_eq!(
        (steps[0].status.as_str(), steps[0].stopped),
        ("failed", None)
    );
    assert_eq!(
        steps[0].error.as_deref(),
        Some("command ended with exit code 3")
    );
    assert_eq!(
        (steps[1].status.as_str(), steps[1].stopped),
        ("stopped", Some(true))
    );
    assert_eq!(steps[1].error.as_deref(), Some("Stopped by the test."));
}

#[test]
fn each_step_end_is_taken_from_the_events_then_the_status_then_the_candidate() {
    let mut status = two_steps();
    status.steps.as_mut().unwrap()[0].status = "complete".into();
    let writer = |code| proof::WriterRecord {
        process_instance_id: "runner-1-writer-1".into(),
        kind: "pi-writer".into(),
        attempt: 0,
        close_observed_at: 1,
        exit_code: code,
        signal: None,
        process_tree: ProcessTree::Unknown {
            reason: "verification-failed".into(),
            diagnostic: None,
        },
    };
    let mut candidate = witnessed_candidate("r", &status, &monitor_witness(None, None));
    candidate.writers = BTreeMap::from([("1".to_owned(), vec![writer(Some(3))])]);
    // Step 0 from the status, step 1 from the candidate's exit code 3.
    let restored = outcome_from_evidence(&status, &[], Some(&candidate)).unwrap();
    assert_eq!(restored.state, RunState::Failed);
    assert_eq!(restored.error.as_deref(), Some("Step failed: b"));
    assert_eq!(
        restored.source,
        "status.json and process-terminal-candidate.json"
    );
    // An event outranks both.
    let events = [step_event("completed", 1)];
    let restored = outcome_from_evidence(&status, &events, Some(&candidate)).unwrap();
    assert_eq!((restored.state, restored.error), (RunState::Complete, None));
    assert_eq!(restored.source, "status.json and events.jsonl");
    // An exit the candidate does not know (a signal) is no end.
    candidate.writers = BTreeMap::from([("1".to_owned(), vec![writer(None)])]);
    assert_eq!(outcome_from_evidence(&status, &[], Some(&candidate)), None);
    assert_eq!(outcome_from_evidence(&status, &[], None), None);
}

/// `orphaned` with both steps recorded `complete` in the status.
fn orphaned_with_recorded_ends(dir: &Path) {
    orphaned(dir, dead());
    status::model::update_status(dir, |s| {
        let mut s = s?;
        for step in s.steps.iter_mut().flatten() {
            step.status = "complete".into();
        }
        Some(s)
    })
    .unwrap();
}

fn assert_finalized_complete(dir: &Path, observation: Observation, source: &str) {
    let Observation::Finalized { repaired, .. } = &observation else {
        panic!("not finalized: {observation:?}")
    };
    let message = repaired.as_deref().unwrap_or_default();
    assert!(
        message.contains(&format!(
            "every step's end is in {source}, so the run is complete"
        )),
        "{message}"
    );
    let status = read_status(dir).unwrap().unwrap();
    assert_eq!(status.state, RunState::Complete, "{observation:?}");
    assert_eq!(status.error, None);
    assert!(!index::has_marker(dir));
}

#[test]
fn the_step_ends_recorded_in_the_status_restore_the_outcome_without_events() {
    // A root that turned read-only after the runner wrote each step's end
    // and before their events and the final status.
    let _serial = crate::procs::tests::serial();
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(&tmp);
    orphaned_with_recorded_ends(&dir);
    let observation = observe(&dir, &Options::new(tmp.path()));
    assert_finalized_complete(&dir, observation, "status.json");
}

#[test]
fn a_candidate_under_a_status_still_running_does_not_skip_the_repair() {
    let _serial = crate::procs::tests::serial();
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(&tmp);
    orphaned(&dir, dead());
    let status = read_status(&dir).unwrap().unwrap();
    let mut candidate = witnessed_candidate("r", &status, &monitor_witness(None, None));
    for i in ["0", "1"] {
        let record = proof::WriterRecord {
            process_instance_id: format!("runner-1-writer-{i}"),
            kind: "pi-writer".into(),
            attempt: 0,
            close_observed_at: 1,
            exit_code: Some(0),
            signal: None,
            process_tree: ProcessTree::Observed {
                mechanism: "posix-process-group".into(),
                process_group_id: 4242,
                verified_at: 1,
            },
        };
        candidate.writers.insert(i.into(), vec![record]);
    }
    candidate.expected_writers = Some(BTreeMap::from([("0".into(), 1), ("1".into(), 1)]));
    proof::write_candidate(&dir, &candidate).unwrap();
    let observation = observe(&dir, &Options::new(tmp.path()));
    assert_finalized_complete(&dir, observation, "process-terminal-candidate.json");
}

#[test]
fn a_final_proof_under_a_status_still_running_is_repaired_once_its_processes_are_gone() {
    // The finalizer wrote the proof but not the repair (the root filled up
    // or turned read-only in between) and released the marker.
    let _serial = crate::procs::tests::serial();
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(&tmp);
    orphaned_with_recorded_ends(&dir);
    let status = read_status(&dir).unwrap().unwrap();
    let witness = Witness {
        role: Role::Reconciler,
        ..monitor_witness(None, None)
    };
    let candidate = witnessed_candidate("r", &status, &witness);
    proof::write_candidate(&dir, &candidate).unwrap();
    let close = RunnerClose {
        process_instance_id: "runner-1".into(),
        close_observed_at: 1,
        exit_code: None,
        signal: None,
        observer: None,
    };
    let leases = |_: &str| Err("no lease".to_owned());
    let proof = proof::finalize(&dir, "r", &close, &leases, 2);
    assert_eq!(proof.state, ProofState::Observed);
    assert!(!index::has_marker(&dir));
    assert_eq!(read_status(&dir).unwrap().unwrap().state, RunState::Running);
    let observation = observe(&dir, &Options::new(tmp.path()));
    assert_finalized_complete(&dir, observation, "status.json");
}

#[test]
fn every_step_end_event_names_its_step_status() {
    let ends = ["completed", "failed", "stopped", "paused", "rejected"].map(end_of_event);
    assert_eq!(
        ends,
        ["complete", "failed", "stopped", "paused", "rejected"].map(Some)
    );
    assert!(ends.iter().flatten().all(|end| is_end_status(end)));
    assert_eq!(end_of_event("started"), None);
    assert_eq!(end_of_event("output"), None);
}

#[test]
fn a_restored_error_names_the_step_only_when_the_run_has_several() {
    let step = |agent: &str, reason: Option<&str>| {
        let mut step = status::model::Step {
            agent: agent.into(),
            status: "failed".into(),
            ..Default::default()
        };
        if let Some(reason) = reason {
            step.extra.insert("reason".into(), json!(reason));
        }
        step
    };
    let mut single = RunStatus::new("r", RunState::Failed);
    single.steps = Some(vec![step("writer", Some("timed out after 5s"))]);
    assert_eq!(restored_error(&single, 0), "timed out after 5s");
    let mut chain = RunStatus::new("r", RunState::Failed);
    chain.steps = Some(vec![
        step("scout", None),
        step("writer", Some("timed out after 5s")),
    ]);
    assert_eq!(restored_error(&chain, 1), "writer: timed out after 5s");
    assert_eq!(restored_error(&chain, 0), "Step failed: scout");
}

#[test]
fn an_observed_proof_frees_the_runs_capacity_slot_also_when_only_its_persistence_was_left() {
    let _serial = crate::procs::tests::serial();
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(&tmp);
    orphaned_with_recorded_ends(&dir);
    status::model::update_status(&dir, |s| {
        let mut s = s?;
        s.session_id = Some("s".into());
        Some(s)
    })
    .unwrap();
    let pools = capacity::Capacity::new(Layout::new(tmp.path()).capacity_dir());
    let hold = || {
        let acquire = capacity::Acquire {
            session_id: "s",
            limit: Some(4),
            run_id: "r",
            kind: capacity::Kind::Runner,
            async_dir: &dir,
            live_workflows: &std::collections::HashSet::new(),
        };
        let mut slot = pools.acquire(&acquire).unwrap().expect("a slot");
        // Bound to the run's runner, as the monitor binds it.
        slot.mark_started("runner-1").unwrap();
        drop(slot);
        assert_eq!(pools.used("s").unwrap(), 1);
    };
    hold();
    let observation = observe(&dir, &Options::new(tmp.path()));
    assert_finalized_complete(&dir, observation, "status.json");
    assert_eq!(pools.used("s").unwrap(), 0, "the finalizer frees the slot");
    // A finalizer that died after the proof, before its overlay and the
    // release: the next observer finishes both.
    hold();
    status::model::update_status(&dir, |s| {
        let mut s = s?;
        s.process_terminal =
            Some(ProcessTerminal::new(ProofState::Pending, "r", "runner-1").to_value());
        Some(s)
    })
    .unwrap();
    let observation = observe(&dir, &Options::new(tmp.path()));
    assert!(matches!(observation, Observation::Final), "{observation:?}");
    let status = read_status(&dir).unwrap().unwrap();
    assert_eq!(status.process_terminal.unwrap()["state"], "observed");
    assert_eq!(
        pools.used("s").unwrap(),
        0,
        "the persisting observer frees it"
    );
}
