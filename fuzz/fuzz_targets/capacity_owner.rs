//! Fuzz target: a capacity slot's owner.json (`capacity::OwnerRecord::parse`).
//! Any input must be refused or accepted, never panic; what is accepted,
//! our writer stores and the reader reads back equal.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(owner) = capacity::OwnerRecord::parse(data) {
        let written = atomic_file::to_pretty_json(&owner);
        assert_eq!(capacity::OwnerRecord::parse(&written), Some(owner));
    }
});
