//! Fuzz target: process-terminal-candidate.json (`status::proof::parse_candidate`).
//! Any input must be refused or accepted, never panic; what is accepted,
//! our writer stores and the reader reads back equal.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data)
        && let Ok(candidate) = status::proof::parse_candidate(text, "Invalid candidate.")
    {
        let written = String::from_utf8(atomic_file::to_pretty_json(&candidate)).unwrap();
        assert_eq!(
            status::proof::parse_candidate(&written, "Invalid candidate.").unwrap(),
            candidate
        );
    }
});
