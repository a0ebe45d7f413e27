//! Property test: an owner record as the writer stores it (pretty JSON, with
//! or without the first write's trailing newline) reads back equal.

extern crate subagents_capacity as capacity;
use capacity::{Kind, OwnerRecord, session_key};
use process_identity::ProcessIdentity;
use proptest::collection::btree_map;
use proptest::option;
use proptest::prelude::*;
use serde_json::{Map, Value, json};

fn text() -> impl Strategy<Value = String> {
    ("[A-Za-z0-9._-]{1,12}", "[ -~\\u{80}-\\u{10ffff}]{0,6}").prop_map(|(a, b)| a + &b)
}

fn extra() -> impl Strategy<Value = Map<String, Value>> {
    // Unknown keys the reference may add are kept on rewrite.
    btree_map(
        "x[A-Za-z]{1,8}",
        prop_oneof![
            any::<i64>().prop_map(|n| json!(n)),
            ".*".prop_map(|s| json!(s))
        ],
        0..3,
    )
    .prop_map(|m| m.into_iter().collect())
}

prop_compose! {
    fn owner()(
        token in text(), session in text(), slot in 0u64..1000, run_id in text(), source in option::of(text()),
        generation in 0u64..100, workflow in any::<bool>(), async_dir in text(), reserved_at in 0u64..(1 << 53),
        runner in option::of(text()), started in option::of(0u64..(1 << 53)),
        reserved_by in option::of((1u32.., 0u64..(1 << 53), option::of(text()))),
        extra in extra(),
    ) -> OwnerRecord {
        OwnerRecord {
            version: 1,
            reservation_token: token,
            owner_session_key: session_key(&session),
            owner_session_id: session,
            slot,
            run_id,
            source_run_id: source,
            generation,
            kind: if workflow { Kind::Workflow } else { Kind::Runner },
            async_dir,
            reserved_at,
            runner_process_instance_id: runner,
            runner_started_at: started,
            reserved_by_process: reserved_by.map(|(pid, start_time, boot_id)| ProcessIdentity { pid, start_time, boot_id, machine_id: None, host: None }),
            extra,
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_written_owner_reads_back_equal(owner in owner()) {
        let mut bytes = atomic_file::to_pretty_json(&owner);
        prop_assert_eq!(OwnerRecord::parse(&bytes), Some(owner.clone()));
        bytes.push(b'\n');
        prop_assert_eq!(OwnerRecord::parse(&bytes), Some(owner));
    }
}
