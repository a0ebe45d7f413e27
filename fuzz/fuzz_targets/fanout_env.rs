//! Fuzz target: the fan-out descriptor's base64url environment encoding (`fanout_budget::decode_env_descriptor`).
//! Any input must be refused or accepted, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = fanout_budget::decode_env_descriptor(text);
    }
});
