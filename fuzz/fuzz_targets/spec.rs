//! Fuzz target: a `run --spec` file (`launcher::spec::parse_plan_text`).
//! Any input must be refused or accepted, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = launcher::spec::parse_plan_text(text);
    }
});
