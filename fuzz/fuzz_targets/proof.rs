//! Fuzz target: process-terminal.json (`status::proof::parse_proof`).
//! Any input must be refused or accepted, never panic; what is accepted,
//! our writer stores and the reader reads back equal.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let fallback = status::proof::Fallback::default();
    if let Ok(text) = std::str::from_utf8(data)
        && let Ok(proof) = status::proof::parse_proof(text, "run", &fallback)
    {
        let written = String::from_utf8(atomic_file::to_pretty_json(&proof)).unwrap();
        assert_eq!(
            status::proof::parse_proof(&written, "run", &fallback).unwrap(),
            proof
        );
    }
});
