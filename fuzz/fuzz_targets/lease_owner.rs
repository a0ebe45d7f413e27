//! Fuzz target: a session lease's owner.json (`recovery::lease::parse_owner`).
//! Any input must be refused or accepted, never panic; what is accepted,
//! our writer stores and the reader reads back equal.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(owner) = recovery::lease::parse_owner(data) {
        let written = atomic_file::to_pretty_json(&owner);
        assert_eq!(recovery::lease::parse_owner(&written), Some(owner));
    }
});
