//! Fuzz target: a fan-out descriptor (`fanout_budget::Descriptor::from_json`); accepted descriptors round-trip through JSON and the env encoding.
//! Any input must be refused or accepted, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data)
        && let Ok(descriptor) = fanout_budget::Descriptor::from_json(text)
    {
        let again = fanout_budget::Descriptor::from_json(&descriptor.to_json()).unwrap();
        assert_eq!(again, descriptor);
        let decoded = fanout_budget::decode_env_descriptor(&descriptor.to_env_value()).unwrap();
        assert_eq!(decoded, descriptor);
    }
});
