//! Fuzz target: recovery-seal.json (`recovery::seal::parse_seal`).
//! Any input must be refused or accepted, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = recovery::seal::parse_seal(data);
});
