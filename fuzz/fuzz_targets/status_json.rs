//! Fuzz target: status.json (`status::model::parse_status`).
//! Any input must be refused or accepted, never panic; what is accepted,
//! our writer stores and the reader reads back equal.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = Path::new("status.json");
    if let Ok(text) = std::str::from_utf8(data)
        && let Ok(status) = status::model::parse_status(path, text)
    {
        let written = String::from_utf8(atomic_file::to_pretty_json(&status)).unwrap();
        assert_eq!(status::model::parse_status(path, &written).unwrap(), status);
    }
});
