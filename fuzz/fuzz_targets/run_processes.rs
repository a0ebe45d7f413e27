//! Fuzz target: a run's `run-processes.json` (`status::processes::parse`).
//! Any input must be refused or accepted, never panic; what is accepted,
//! our writer stores and the reader reads back equal.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = Path::new("run-processes.json");
    if let Ok(record) = status::processes::parse(path, data) {
        let written = atomic_file::to_pretty_json(&record);
        assert_eq!(status::processes::parse(path, &written).ok(), Some(record));
    }
});
