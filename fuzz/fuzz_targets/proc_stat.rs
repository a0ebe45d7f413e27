//! Fuzz target: a `/proc/<pid>/stat` line (`process_identity::parse_stat`),
//! which every liveness proof rests on. Any input must be refused or
//! accepted, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = process_identity::parse_stat(text);
    }
});
