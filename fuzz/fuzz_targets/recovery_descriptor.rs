//! Fuzz target: recovery-descriptor.json (`recovery::parse_descriptor`); what the reader accepts, the writer re-encodes and the reader accepts again.
//! Any input must be refused or accepted, never panic.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = Path::new("recovery-descriptor.json");
    if let Ok(descriptor) = recovery::parse_descriptor(data, path) {
        let bytes = recovery::encode_descriptor(&descriptor, path)
            .expect("the writer refused what the reader accepted");
        let again = recovery::parse_descriptor(&bytes, path).unwrap();
        assert_eq!(again, descriptor);
    }
});
