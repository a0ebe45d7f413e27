//! Property tests: what our writers store, our readers give back unchanged
//! (recovery descriptor, launch contract, recovery seal, lease owner).

extern crate subagents_recovery as recovery;
use std::collections::BTreeMap;

use proptest::collection::{btree_map, vec};
use proptest::option;
use proptest::prelude::*;
use recovery::lease::{OwnerRecord, WriterState, parse_owner};
use recovery::seal::{RootKey, parse_seal};
use recovery::{
    LaunchContract, RecoveryDescriptor, parse_launch_contract, read_descriptor, write_descriptor,
};
use serde_json::{Value, json};

/// A string non-empty after trimming, with arbitrary (escaped) characters around.
fn text() -> impl Strategy<Value = String> {
    ("[ -~\\u{80}-\\u{10ffff}]{0,8}", "[A-Za-z0-9/._-]{1,12}")
        .prop_map(|(noise, core)| format!("{core}{noise}").replace(char::is_whitespace, "_"))
}

fn names() -> impl Strategy<Value = Vec<String>> {
    vec(text(), 0..4)
}

fn safe_integer() -> impl Strategy<Value = u64> {
    0..(1u64 << 53)
}

prop_compose! {
    fn descriptor_json()(
        ids in (text(), text(), text()),
        budget_limit in 1u64..100_000,
        parent_path in option::of(text()),
        lists in (option::of(names()), option::of(names()), option::of(names()), option::of(names())),
        optional in (option::of(text()), option::of(text()), option::of(text()), option::of(".*")),
        modes in (any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>()),
        depth in safe_integer(),
        turns in option::of((1u64..1000, 0u64..100)),
        deadline in option::of(1u64..(1u64 << 53)),
        bridge in option::of((option::of(0usize..3), option::of(".*"), option::of(any::<bool>()))),
    ) -> Value {
        let (run, agent, cwd) = ids;
        let mut d = json!({
            "version": 1,
            "runFanoutBudget": {"version": 1, "rootRunId": run, "directory": format!("/budgets/{run}"), "limit": budget_limit},
            "sourceRunId": run, "agent": agent, "cwd": cwd,
            "systemPromptMode": if modes.0 { "append" } else { "replace" },
            "inheritProjectContext": modes.1, "inheritSkills": modes.2,
            "outputMode": if modes.3 { "inline" } else { "file-only" },
            "maxSubagentDepth": depth, "share": modes.0 && modes.1,
        });
        let obj = d.as_object_mut().unwrap();
        if let Some(p) = parent_path { obj["runFanoutBudget"]["parentPath"] = json!(p); }
        for (key, list) in ["tools", "skills", "extensions", "fallbackModels"].iter().zip([lists.0, lists.1, lists.2, lists.3]) {
            if let Some(list) = list { obj.insert((*key).into(), json!(list)); }
        }
        for (key, value) in [("model", optional.0), ("sessionFile", optional.1), ("launchContractDigest", optional.2), ("systemPrompt", optional.3)] {
            if let Some(value) = value { obj.insert(key.into(), json!(value)); }
        }
        if let Some((max, grace)) = turns { obj.insert("initialTurnBudget".into(), json!({"maxTurns": max, "graceTurns": grace})); }
        if let Some(at) = deadline { obj.insert("absoluteDeadlineAt".into(), json!(at)); }
        if let Some((mode, file, delivery)) = bridge {
            let mut b = serde_json::Map::new();
            if let Some(m) = mode { b.insert("mode".into(), json!(["off", "fork-only", "always"][m])); }
            if let Some(f) = file { b.insert("instructionFile".into(), json!(f)); }
            if let Some(r) = delivery { b.insert("resultDelivery".into(), json!(r)); }
            obj.insert("intercomBridge".into(), Value::Object(b));
        }
        d
    }
}

prop_compose! {
    fn contract()(
        run_id in text(), agent in text(), cwd in text(),
        program in text(), args in vec(".*", 0..4),
        env in btree_map("[A-Z_][A-Z0-9_]{0,8}", ".*", 0..4),
        timeout_ms in option::of(1u64..(1u64 << 53)),
        session_id in option::of(text()),
    ) -> LaunchContract {
        let mut command = vec![program];
        command.extend(args);
        LaunchContract { version: 1, run_id, agent, cwd, command, env: env.into_iter().collect::<BTreeMap<_, _>>(), timeout_ms, session_id }
    }
}

prop_compose! {
    fn lease_owner()(
        strings in vec(text(), 6),
        parent in option::of(text()),
        identities in (option::of(text()), option::of(text())),
        pid in 1u32..,
        writer in 0usize..3,
        writer_pid in 1u32..,
        writer_identity in option::of(text()),
        times in (safe_integer(), safe_integer()),
    ) -> OwnerRecord {
        let running = writer == 2;
        OwnerRecord {
            version: 1,
            token: strings[0].clone(),
            canonical_session_file: strings[1].clone(),
            run_id: strings[2].clone(),
            source_run_id: strings[3].clone(),
            parent_session_id: parent,
            pid,
            hostname: strings[4].clone(),
            process_start_identity: identities.0,
            boot_id: identities.1,
            writer_state: [WriterState::None, WriterState::Spawning, WriterState::Running][writer],
            writer_pid: running.then_some(writer_pid),
            writer_process_start_identity: writer_identity.filter(|_| running),
            acquired_at: strings[5].clone(),
            acquired_at_ms: times.0,
            updated_at_ms: times.1,
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn a_written_descriptor_reads_back_equal(value in descriptor_json()) {
        let descriptor: RecoveryDescriptor = serde_json::from_value(value).unwrap();
        let dir = tempfile::tempdir().unwrap();
        write_descriptor(dir.path(), &descriptor).unwrap();
        prop_assert_eq!(read_descriptor(dir.path()).unwrap().unwrap(), descriptor);
    }

    #[test]
    fn a_written_contract_reads_back_equal(contract in contract()) {
        let path = std::path::Path::new("launch-contract.json");
        let bytes = atomic_file::to_pretty_json(&contract);
        prop_assert_eq!(parse_launch_contract(&bytes, path).unwrap(), contract);
    }

    #[test]
    fn a_written_seal_reads_back_and_verifies(key in any::<[u8; 32]>(), contract in vec(any::<u8>(), 0..64), descriptor in vec(any::<u8>(), 0..64)) {
        let key = RootKey::from_bytes(key);
        let seal = key.seal(&contract, &descriptor);
        let read = parse_seal(&atomic_file::to_pretty_json(&seal)).unwrap();
        prop_assert!(key.verify(&read, &contract, &descriptor));
        prop_assert_eq!(read, seal);
    }

    #[test]
    fn a_written_lease_owner_reads_back_equal(owner in lease_owner()) {
        prop_assert_eq!(parse_owner(&atomic_file::to_pretty_json(&owner)), Some(owner));
    }
}
