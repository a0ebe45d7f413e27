//! Fuzz target: a capacity slot's owner.json (`capacity::OwnerRecord::parse`).
//! Any input must be refused or accepted, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = capacity::OwnerRecord::parse(data);
});
