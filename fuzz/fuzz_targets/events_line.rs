//! Fuzz target: one events.jsonl line (`status::events::parse_line`).
//! Any input must be refused or accepted, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        for line in text.lines() {
            let _ = status::events::parse_line(line);
        }
    }
});
