//! Property tests: what our writers store, our readers give back unchanged
//! (status.json, process-terminal proof, process-terminal candidate).

use proptest::collection::{btree_map, vec};
use proptest::option;
use proptest::prelude::*;
use serde_json::{Value, json};
use status::model::{read_status, write_status};
use status::proof::{
    Candidate, Fallback, ProcessTerminal, ProcessTree, ProofState, WriterRecord, parse_candidate,
    parse_proof, read_candidate, write_candidate,
};
use status::{RunState, RunStatus};

fn text() -> impl Strategy<Value = String> {
    ("[A-Za-z0-9._-]{1,12}", "[ -~\\u{80}-\\u{10ffff}]{0,6}").prop_map(|(a, b)| a + &b)
}

fn ms() -> impl Strategy<Value = u64> {
    0..(1u64 << 53)
}

fn state() -> impl Strategy<Value = RunState> {
    prop_oneof![
        Just(RunState::Queued),
        Just(RunState::Running),
        Just(RunState::Complete),
        Just(RunState::Failed),
        Just(RunState::Paused),
        Just(RunState::Stopped),
        Just(RunState::Rejected),
    ]
}

fn insert_some<T: serde::Serialize>(obj: &mut Value, key: &str, value: Option<T>) {
    if let Some(value) = value {
        obj[key] = json!(value);
    }
}

prop_compose! {
    fn step()(
        agent in text(),
        status in prop_oneof![Just("pending"), Just("running"), Just("complete"), Just("failed")],
        times in (option::of(ms()), option::of(ms()), option::of(ms())),
        exit_code in option::of(-255i64..256),
        error in option::of(".*"),
        flags in (option::of(any::<bool>()), option::of(any::<bool>())),
    ) -> Value {
        let mut s = json!({"agent": agent, "status": status});
        insert_some(&mut s, "startedAt", times.0);
        insert_some(&mut s, "endedAt", times.1);
        insert_some(&mut s, "durationMs", times.2);
        insert_some(&mut s, "exitCode", exit_code);
        insert_some(&mut s, "error", error);
        insert_some(&mut s, "timedOut", flags.0);
        insert_some(&mut s, "stopped", flags.1);
        s
    }
}

prop_compose! {
    fn status()(
        run_id in text(),
        session in option::of(text()),
        mode in option::of(prop_oneof![Just("single"), Just("parallel"), Just("chain")]),
        state in state(),
        error in option::of(".*"),
        times in (option::of(ms()), option::of(ms()), option::of(ms())),
        pid in option::of(1u32..),
        cwd in option::of(".*"),
        steps in option::of(vec(step(), 0..4)),
    ) -> RunStatus {
        let mut s = json!({"runId": run_id, "state": state});
        insert_some(&mut s, "sessionId", session);
        insert_some(&mut s, "mode", mode);
        insert_some(&mut s, "error", error);
        insert_some(&mut s, "startedAt", times.0);
        insert_some(&mut s, "endedAt", times.1);
        insert_some(&mut s, "lastUpdate", times.2);
        insert_some(&mut s, "pid", pid);
        insert_some(&mut s, "cwd", cwd);
        insert_some(&mut s, "steps", steps);
        serde_json::from_value(s).unwrap()
    }
}

fn tree() -> impl Strategy<Value = ProcessTree> {
    prop_oneof![
        (1u32.., ms()).prop_map(|(group, at)| ProcessTree::Observed {
            mechanism: "posix-process-group".into(),
            process_group_id: group,
            verified_at: at,
        }),
        (
            prop_oneof![
                Just("unsupported-platform"),
                Just("signal-failed"),
                Just("verification-failed")
            ],
            option::of(".*")
        )
            .prop_map(|(reason, diagnostic)| ProcessTree::Unknown {
                reason: reason.into(),
                diagnostic,
            }),
    ]
}

prop_compose! {
    fn writer()(
        id in text(),
        attempt in 0u32..10,
        at in ms(),
        exit in option::of(any::<i32>()),
        signal in option::of("SIG[A-Z]{2,6}"),
        tree in tree(),
    ) -> WriterRecord {
        WriterRecord {
            process_instance_id: id,
            kind: "pi-writer".into(),
            attempt,
            close_observed_at: at,
            exit_code: exit,
            signal,
            process_tree: tree,
        }
    }
}

prop_compose! {
    fn candidate()(
        run_id in text(),
        runner in text(),
        writers in btree_map("[0-9]{1,2}", vec(writer(), 0..3), 0..3),
        expected in option::of(btree_map("[0-9]{1,2}", 0u64..10, 0..3)),
        session in option::of(text()),
        token in option::of(text()),
        acknowledged in option::of(any::<bool>()),
    ) -> Candidate {
        Candidate {
            version: 1,
            run_id,
            runner_process_instance_id: runner,
            writers,
            expected_writers: expected,
            session_file: session,
            revival_lease_token: token,
            revival_lease_release_acknowledged: acknowledged,
        }
    }
}

fn proof_state() -> impl Strategy<Value = ProofState> {
    prop_oneof![
        Just(ProofState::Pending),
        Just(ProofState::Observed),
        Just(ProofState::Unknown),
        Just(ProofState::NotStarted),
    ]
}

prop_compose! {
    fn proof()(
        state in proof_state(),
        ids in (text(), text()),
        child in option::of(0usize..8),
        at in ms(),
        writers in vec(writer(), 0..3),
        runner_exit in option::of(any::<i32>()),
        reason in option::of(text()),
        diagnostic in option::of(".*"),
        disposition in option::of(prop_oneof![Just("resumable"), Just("non-resumable"), Just("unavailable")]),
    ) -> ProcessTerminal {
        let (run_id, runner) = ids;
        let mut proof = ProcessTerminal::new(state, &run_id, &runner);
        proof.child_index = child;
        if state == ProofState::Observed {
            let runner_record = json!({
                "kind": "runner", "processInstanceId": runner, "closeObservedAt": at,
                "exitCode": runner_exit, "signal": null,
            });
            let mut instances = vec![runner_record];
            instances.extend(writers.iter().map(|w| serde_json::to_value(w).unwrap()));
            proof.observed_at = Some(at);
            proof.instances = Some(instances);
        }
        proof.reason = reason;
        proof.diagnostic = diagnostic;
        proof.resume_disposition = disposition.map(str::to_owned);
        proof
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn a_written_status_reads_back_equal(status in status()) {
        let dir = tempfile::tempdir().unwrap();
        write_status(dir.path(), &status).unwrap();
        prop_assert_eq!(read_status(dir.path()).unwrap().unwrap(), status);
    }

    #[test]
    fn a_written_candidate_reads_back_equal(candidate in candidate()) {
        let dir = tempfile::tempdir().unwrap();
        write_candidate(dir.path(), &candidate).unwrap();
        prop_assert_eq!(read_candidate(dir.path()).unwrap().unwrap(), candidate.clone());
        let text = String::from_utf8(atomic_file::to_pretty_json(&candidate)).unwrap();
        prop_assert_eq!(parse_candidate(&text, "invalid").unwrap(), candidate);
    }

    #[test]
    fn a_written_proof_reads_back_equal(proof in proof()) {
        let text = String::from_utf8(atomic_file::to_pretty_json(&proof)).unwrap();
        let fallback = Fallback {
            run_id: Some(proof.run_id.clone()),
            runner_process_instance_id: Some(proof.runner_process_instance_id.clone()),
        };
        prop_assert_eq!(parse_proof(&text, "run", &fallback).unwrap(), proof);
    }
}
