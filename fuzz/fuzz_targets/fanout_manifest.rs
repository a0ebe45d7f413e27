//! Fuzz target: a fan-out budget manifest (`fanout_budget::Manifest::parse`).
//! Any input must be refused or accepted, never panic.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = fanout_budget::Manifest::parse(text, Path::new("budget"));
    }
});
