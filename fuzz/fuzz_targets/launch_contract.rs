//! Fuzz target: launch-contract.json (`recovery::parse_launch_contract`); accepted contracts round-trip.
//! Any input must be refused or accepted, never panic.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = Path::new("launch-contract.json");
    if let Ok(contract) = recovery::parse_launch_contract(data, path) {
        let bytes = serde_json::to_vec_pretty(&contract).unwrap();
        assert_eq!(
            recovery::parse_launch_contract(&bytes, path).unwrap(),
            contract
        );
    }
});
