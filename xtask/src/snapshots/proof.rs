//! The process-terminal candidate and the proof in every state.
//!
//! Observed and unknown proofs are the `process-terminal.json` files that
//! `status::proof::finalize` writes, one run directory per reason. Pending,
//! not-started and stale-repair proofs only ever live inside `status.json`;
//! they are recorded as the value the status writers put there, serialised
//! the way `process-terminal.json` is.

use std::collections::BTreeMap;
use std::path::PathBuf;

use status::layout::files;
use status::model::{RunState, RunStatus, Step, read_status, write_status};
use status::proof::{
    self, Candidate, LeaseState, ProcessTerminal, ProcessTree, ProofState, RunnerClose,
    WriterRecord,
};
use status::{LIFECYCLE_ARTIFACT_VERSION, reconcile};

use super::{Artifact, Kind, Scratch, T0};

const FAMILY: &str = "proof";
const RUN: &str = "run-7f3a";
const RUNNER: &str = "00000000-0000-4000-8000-00000000a001";

/// The candidates, every proof state and the status a finalize leaves.
pub(super) fn artifacts() -> anyhow::Result<Vec<Artifact>> {
    let scratch = Scratch::new()?;
    let mut out = vec![
        candidate_artifact(&scratch, "candidate-runner", runner_candidate())?,
        candidate_artifact(&scratch, "candidate-revival", revival_candidate(&scratch)?)?,
    ];
    let free = |_: &str| Ok(LeaseState::Free("canonical-session-1".into()));
    let owned = |_: &str| Ok(LeaseState::Owned);
    let unreadable = |_: &str| Ok(LeaseState::Unreadable);
    let mut unacknowledged = revival_candidate(&scratch)?;
    unacknowledged.revival_lease_release_acknowledged = Some(false);
    let mut foreign = runner_candidate();
    foreign.runner_process_instance_id = "00000000-0000-4000-8000-00000000a999".into();
    let mut short = runner_candidate();
    short.expected_writers = Some(BTreeMap::from([("0".into(), 2), ("1".into(), 1)]));
    let mut unverified_tree = runner_candidate();
    unverified_tree
        .writers
        .insert("1".into(), vec![writer(1, false)]);
    let finalized: [(&str, Setup<'_>, proof::LeaseInspector<'_>); 10] = [
        ("observed", Setup::Candidate(runner_candidate()), &free),
        (
            "observed-revival",
            Setup::Candidate(revival_candidate(&scratch)?),
            &free,
        ),
        ("unknown-runner-candidate-missing", Setup::Nothing, &free),
        (
            "unknown-proof-write-failed",
            Setup::Raw(r#"{"version":1,"runId":"run-7f3a","writers":[]}"#),
            &free,
        ),
        (
            "unknown-runner-instance-mismatch",
            Setup::Candidate(foreign),
            &free,
        ),
        (
            "unknown-canonical-session-lease-active",
            Setup::Candidate(revival_candidate(&scratch)?),
            &owned,
        ),
        (
            "unknown-canonical-session-unavailable",
            Setup::Candidate(revival_candidate(&scratch)?),
            &unreadable,
        ),
        (
            "unknown-canonical-session-release-unverified",
            Setup::Candidate(unacknowledged),
            &free,
        ),
        (
            "unknown-writer-close-unverified",
            Setup::Candidate(short),
            &free,
        ),
        (
            "unknown-process-tree-unverified",
            Setup::Candidate(unverified_tree),
            &free,
        ),
    ];
    for (case, setup, leases) in finalized {
        let dir = finalized_run(&scratch, case, setup, leases)?;
        out.push(
            scratch
                .record(FAMILY, case, Kind::Proof, &dir.join(files::PROOF))?
                .note("written by `status::proof::finalize`"),
        );
        if case == "observed" {
            out.push(
                scratch
                    .record(FAMILY, "status-after-finalize", Kind::Status, &dir.join(files::STATUS))?
                    .note("the status `finalize` overlays: run proof and one projection per step (observed, not-started)"),
            );
            let status = read_status(&dir)?.ok_or_else(|| anyhow::anyhow!("no status"))?;
            let not_started = status.steps()[2].process_terminal.clone();
            out.push(projection(
                &scratch,
                "not-started",
                not_started,
                "the projection `finalize` puts on a step that started no writer",
            )?);
        }
    }
    let pending = ProcessTerminal::new(ProofState::Pending, RUN, RUNNER).to_value();
    out.push(projection(
        &scratch,
        "pending",
        Some(pending),
        "the value the runner puts in `status.json` when it starts",
    )?);
    out.push(stale_repair(&scratch)?);
    Ok(out)
}

enum Setup<'a> {
    Nothing,
    Candidate(Candidate),
    Raw(&'a str),
}

fn writer(attempt: u32, tree_observed: bool) -> WriterRecord {
    WriterRecord {
        process_instance_id: format!("00000000-0000-4000-8000-00000000b00{attempt}"),
        kind: "pi-writer".into(),
        attempt,
        close_observed_at: T0 + 4000,
        exit_code: Some(0),
        signal: None,
        process_tree: if tree_observed {
            ProcessTree::Observed {
                mechanism: "posix-process-group".into(),
                process_group_id: 4343,
                verified_at: T0 + 4100,
            }
        } else {
            ProcessTree::Unknown {
                reason: "signal-failed".into(),
                diagnostic: Some("kill(-4343, SIGKILL): EPERM".into()),
            }
        },
    }
}

/// Three steps: two writer attempts of step 0, one of step 1, none of step 2.
fn runner_candidate() -> Candidate {
    Candidate {
        version: 1,
        run_id: RUN.into(),
        runner_process_instance_id: RUNNER.into(),
        writers: BTreeMap::from([
            ("0".into(), vec![writer(0, true)]),
            ("1".into(), vec![writer(1, true)]),
        ]),
        expected_writers: Some(BTreeMap::from([
            ("0".into(), 1),
            ("1".into(), 1),
            ("2".into(), 0),
        ])),
        session_file: None,
        revival_lease_token: None,
        revival_lease_release_acknowledged: None,
    }
}

fn session_file(scratch: &Scratch) -> anyhow::Result<PathBuf> {
    let path = scratch.path().join("sessions").join("session-1.jsonl");
    std::fs::create_dir_all(path.parent().unwrap_or(scratch.path()))?;
    std::fs::write(&path, "{}\n")?;
    Ok(path)
}

fn revival_candidate(scratch: &Scratch) -> anyhow::Result<Candidate> {
    Ok(Candidate {
        session_file: Some(session_file(scratch)?.display().to_string()),
        revival_lease_token: Some("00000000-0000-4000-8000-00000000c001".into()),
        revival_lease_release_acknowledged: Some(true),
        ..runner_candidate()
    })
}

fn candidate_artifact(
    scratch: &Scratch,
    case: &str,
    candidate: Candidate,
) -> anyhow::Result<Artifact> {
    let dir = scratch.path().join(case).join(RUN);
    std::fs::create_dir_all(&dir)?;
    proof::write_candidate(&dir, &candidate)?;
    Ok(scratch
        .record(FAMILY, case, Kind::Candidate, &dir.join(files::CANDIDATE))?
        .note("written by `status::proof::write_candidate`"))
}

/// A completed three-step run finalized after `setup`.
fn finalized_run(
    scratch: &Scratch,
    case: &str,
    setup: Setup<'_>,
    leases: proof::LeaseInspector<'_>,
) -> anyhow::Result<PathBuf> {
    let dir = scratch.path().join(case).join(RUN);
    std::fs::create_dir_all(&dir)?;
    let mut status = RunStatus::new(RUN, RunState::Complete);
    status.lifecycle_artifact_version = Some(LIFECYCLE_ARTIFACT_VERSION);
    status.runner_process_instance_id = Some(RUNNER.into());
    status.steps = Some(
        ["scout", "worker", "reviewer"]
            .iter()
            .map(|agent| Step {
                agent: (*agent).into(),
                status: "complete".into(),
                ..Step::default()
            })
            .collect(),
    );
    write_status(&dir, &status)?;
    match setup {
        Setup::Nothing => {}
        Setup::Candidate(candidate) => proof::write_candidate(&dir, &candidate)?,
        Setup::Raw(text) => std::fs::write(dir.join(files::CANDIDATE), text)?,
    }
    let close = RunnerClose {
        process_instance_id: RUNNER.into(),
        close_observed_at: T0 + 5000,
        exit_code: Some(0),
        signal: None,
        observer: None,
    };
    proof::finalize(&dir, RUN, &close, leases, T0 + 6000);
    Ok(dir)
}

/// A proof value that lives inside `status.json`, as `process-terminal.json` would hold it.
fn projection(
    scratch: &Scratch,
    case: &str,
    value: Option<serde_json::Value>,
    note: &str,
) -> anyhow::Result<Artifact> {
    let value = value.ok_or_else(|| anyhow::anyhow!("no {case} projection"))?;
    // The serialiser of every status writer (`atomic_file::write_json`).
    let text = String::from_utf8(atomic_file::to_pretty_json(&value))?;
    Ok(scratch
        .text(
            FAMILY,
            case,
            Kind::Proof,
            "status.json#processTerminal",
            &text,
        )
        .note(note))
}

/// The `unknown/stale-repair` proof `reconcile` sets on a repaired v3 run.
fn stale_repair(scratch: &Scratch) -> anyhow::Result<Artifact> {
    let dir = scratch.path().join("stale-repair").join(RUN);
    std::fs::create_dir_all(&dir)?;
    let mut status = RunStatus::new(RUN, RunState::Running);
    status.lifecycle_artifact_version = Some(LIFECYCLE_ARTIFACT_VERSION);
    status.runner_identity = Some(super::events::dead_identity());
    status.pid = Some(super::events::dead_pid());
    write_status(&dir, &status)?;
    let outcome = reconcile::reconcile_run(&dir, reconcile::Options::at(T0 + 9000))?;
    let value = outcome.status().and_then(|s| s.process_terminal.clone());
    projection(
        scratch,
        "unknown-stale-repair",
        value,
        "the proof `status::reconcile` sets when it repairs a stale run",
    )
}
