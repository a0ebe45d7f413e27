//! Fuzz target: a startup record: ready/acknowledged/error or an ack/proceed control file (`handshake::validate_record`).
//! Any input must be refused or accepted, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) {
        let _ = handshake::validate_record(&value);
    }
});
