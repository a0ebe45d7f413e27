//! `dispatch.json` as the launcher writes it when Slurm accepted a run, and
//! once its monitor recorded the node it started on.

use super::{Artifact, Kind, Scratch, T0};

const FAMILY: &str = "dispatch";

/// submitted (no node) → started on a node.
pub(super) fn artifacts() -> anyhow::Result<Vec<Artifact>> {
    let scratch = Scratch::new()?;
    let dir = scratch.path().join("async-subagent-runs").join("run-7f3a");
    std::fs::create_dir_all(&dir)?;
    let record =
        dispatch::Dispatch::slurm("4711", Some("main".into()), Some("lab".into()), T0 + 500);
    dispatch::write(&dir, &record)?;
    let path = dir.join(dispatch::FILE);
    let mut out = vec![
        scratch
            .record(FAMILY, "submitted", Kind::Dispatch, &path)?
            .note(
                "sbatch accepted job 4711 of cluster lab in partition main; the job is still held",
            ),
    ];
    dispatch::record_node(&dir, "4711", "n2")?;
    out.push(
        scratch
            .record(FAMILY, "started", Kind::Dispatch, &path)?
            .note("the run's monitor, started by the job on node n2, recorded its node"),
    );
    out.extend(observed_from_slurm(&scratch)?);
    Ok(out)
}

/// The status of a run submitted to Slurm (`executor`, our key) and the
/// `observed` proof an observer writes from Slurm's record once the job's
/// monitor was killed: the runner record's observer names the job, its
/// state and exit code (`evidence`). Both read by today's readers.
pub(super) fn observed_from_slurm(scratch: &Scratch) -> anyhow::Result<Vec<Artifact>> {
    use status::layout::files;
    use status::model::{RunState, RunStatus, Step, write_status};
    use status::proof::{self, RunnerClose};

    let dir = scratch.path().join("observed-from-slurm").join("run-7f3a");
    std::fs::create_dir_all(&dir)?;
    let mut status = RunStatus::new("run-7f3a", RunState::Failed);
    status.lifecycle_artifact_version = Some(status::LIFECYCLE_ARTIFACT_VERSION);
    status.runner_process_instance_id = Some("00000000-0000-4000-8000-00000000a001".into());
    status.steps = Some(vec![Step {
        agent: "worker".into(),
        status: "failed".into(),
        ..Step::default()
    }]);
    status.extra.insert(
        status::reconcile::EXECUTOR_KEY.into(),
        serde_json::json!("slurm"),
    );
    write_status(&dir, &status)?;
    let job = supervisor::slurm::JobRecord {
        job_id: "4711".into(),
        state: "FAILED".into(),
        exit_code: Some("0:9".into()),
        reason: None,
        node: Some("n2".into()),
        source: "scontrol",
    };
    let reason = format!("{}: every process of the job is gone", job.describe());
    let close = RunnerClose {
        process_instance_id: "00000000-0000-4000-8000-00000000a001".into(),
        close_observed_at: T0 + 5000,
        exit_code: None,
        signal: None,
        observer: Some(serde_json::json!({
            "role": "reconciler",
            "pid": super::PID,
            "reason": reason,
            "evidence": job.evidence(),
        })),
    };
    // The candidate the observer writes from what Slurm witnessed: the job's
    // cgroup (so the step's group) is empty.
    let runner = "00000000-0000-4000-8000-00000000a001";
    let record = proof::WriterRecord {
        process_instance_id: format!("{runner}-writer-0"),
        kind: "pi-writer".into(),
        attempt: 0,
        close_observed_at: T0 + 4800,
        exit_code: None,
        signal: None,
        process_tree: proof::ProcessTree::Observed {
            mechanism: "posix-process-group".into(),
            process_group_id: super::PID + 2,
            verified_at: T0 + 4900,
        },
    };
    let candidate = proof::Candidate {
        version: 1,
        run_id: "run-7f3a".into(),
        runner_process_instance_id: runner.into(),
        writers: [("0".to_owned(), vec![record])].into_iter().collect(),
        expected_writers: Some([("0".to_owned(), 1)].into_iter().collect()),
        session_file: None,
        revival_lease_token: None,
        revival_lease_release_acknowledged: None,
    };
    proof::write_candidate(&dir, &candidate)?;
    let free = |_: &str| Ok(proof::LeaseState::Free("canonical-session-1".into()));
    proof::finalize(&dir, "run-7f3a", &close, &free, T0 + 6000);
    Ok(vec![
        scratch
            .record(
                FAMILY,
                "observed-proof",
                Kind::Proof,
                &dir.join(files::PROOF),
            )?
            .note("an observed proof from Slurm's record of job 4711 (its monitor was SIGKILLed)"),
        scratch
            .record(
                FAMILY,
                "status-with-executor",
                Kind::Status,
                &dir.join(files::STATUS),
            )?
            .note("the status of a run held by Slurm, after that proof"),
    ])
}
