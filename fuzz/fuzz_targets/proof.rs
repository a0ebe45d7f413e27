//! Fuzz target: process-terminal.json (`status::proof::parse_proof`).
//! Any input must be refused or accepted, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = status::proof::parse_proof(text, "run", &status::proof::Fallback::default());
    }
});
