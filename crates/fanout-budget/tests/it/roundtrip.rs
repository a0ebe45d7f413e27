//! Property tests: a budget's manifest and its descriptor, as our writers
//! store them (manifest file, compact JSON, base64url environment value),
//! read back equal.

extern crate subagents_fanout_budget as fanout_budget;
use std::path::PathBuf;

use fanout_budget::{
    Descriptor, MAX_LIMIT, Sources, create_budget_with, decode_env_descriptor, read_manifest,
};
use proptest::option;
use proptest::prelude::*;

fn text() -> impl Strategy<Value = String> {
    ("[A-Za-z0-9._-]{1,12}", "[ -~\\u{80}-\\u{10ffff}]{0,6}").prop_map(|(a, b)| a + &b)
}

prop_compose! {
    fn descriptor()(root_run_id in text(), directory in text(), limit in 1..=MAX_LIMIT, parent_path in option::of(text())) -> Descriptor {
        Descriptor { version: 1, root_run_id, directory: PathBuf::from(format!("/budgets/{directory}")), limit, parent_path }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn a_descriptor_survives_json_and_the_env_encoding(descriptor in descriptor()) {
        prop_assert_eq!(Descriptor::from_json(&descriptor.to_json()).unwrap(), descriptor.clone());
        prop_assert_eq!(decode_env_descriptor(&descriptor.to_env_value()).unwrap(), descriptor);
    }

    #[test]
    fn a_created_manifest_reads_back_equal(root_run_id in text(), limit in 1..=MAX_LIMIT, created_at in 0u64..(1 << 53)) {
        let root = tempfile::tempdir().unwrap();
        let now = move || created_at;
        let uuid = || uuid_like();
        let sources = Sources { now_ms: &now, uuid: &uuid };
        let budget = create_budget_with(root.path(), &root_run_id, limit, &sources).unwrap();
        let manifest = read_manifest(&budget.descriptor().directory).unwrap();
        prop_assert_eq!(manifest.root_run_id, root_run_id);
        prop_assert_eq!(manifest.limit, limit);
        prop_assert_eq!(manifest.created_at, created_at as f64);
        prop_assert_eq!(budget.descriptor().limit, limit);
    }
}

fn uuid_like() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!(
        "00000000-0000-4000-8000-{:012x}",
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}
