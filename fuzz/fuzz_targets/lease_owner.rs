//! Fuzz target: a session lease's owner.json (`recovery::lease::parse_owner`).
//! Any input must be refused or accepted, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = recovery::lease::parse_owner(data);
});
