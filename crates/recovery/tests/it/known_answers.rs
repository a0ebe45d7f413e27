//! Known-answer tests: every digest and seal this crate writes, pinned to
//! values computed outside this code base (Python's `hmac` and `hashlib`),
//! so that a seal or a digest written by another build still verifies. A
//! change to the MAC's input (its context, its length prefixes, the order of
//! the two files) passes every round-trip test of one build; it fails these.

extern crate subagents_recovery as recovery;

use recovery::seal::{RootKey, parse_seal};
use recovery::sha256_hex;

/// The key 00 01 02 … 1f.
fn counting_key() -> RootKey {
    let mut bytes = [0u8; 32];
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = i as u8;
    }
    RootKey::from_bytes(bytes)
}

const CONTRACT: &[u8] = b"{\"version\":1}\n";
const DESCRIPTOR: &[u8] = b"{\"version\":1,\"runId\":\"r\"}\n";

/// HMAC-SHA256 under the counting key of
/// `"subagents/recovery-seal/v1\0" ‖ be64(len c) ‖ c ‖ be64(len d) ‖ d`.
const MAC: &str = "9fbdb8bf3efabbf733bd729a111e1b3378afce7f39e9d062402f84298b9cf5c2";

/// The first 8 bytes, in hex, of SHA-256 of `"subagents/recovery-key-id/v1\0" ‖ key`.
const KEY_ID: &str = "43cb265c7d06d3ff";

#[test]
fn the_seal_of_fixed_bytes_under_a_fixed_key_is_a_fixed_mac() {
    let seal = counting_key().seal(CONTRACT, DESCRIPTOR);
    assert_eq!(seal.mac, MAC);
    assert_eq!(seal.key_id, KEY_ID);
    assert_eq!((seal.version, seal.algorithm.as_str()), (1, "hmac-sha256"));
}

#[test]
fn each_file_is_length_prefixed_on_its_own() {
    let key = counting_key();
    // Both empty: only the context and two zero lengths are MACed.
    assert_eq!(
        key.seal(b"", b"").mac,
        "520c3362db182fe3cf7a4c3fa360ddc6075ffbafd8513cc8680788c8a2130f37"
    );
    // The same bytes all in the contract: another MAC.
    let joined = [CONTRACT, DESCRIPTOR].concat();
    assert_eq!(
        key.seal(&joined, b"").mac,
        "ea9551cdcc7f41e220032b1329741fbece6a7ec42c95ac012b10be17d3dc741e"
    );
}

#[test]
fn a_seal_file_written_by_an_earlier_build_still_verifies() {
    // The text of `recovery-seal.json` as this version writes it, kept
    // verbatim: its field names and the MAC are the on-disk contract.
    let text =
        format!(r#"{{"version":1,"algorithm":"hmac-sha256","keyId":"{KEY_ID}","mac":"{MAC}"}}"#);
    let seal = parse_seal(text.as_bytes()).unwrap();
    let key = counting_key();
    assert!(key.verify(&seal, CONTRACT, DESCRIPTOR));
    assert!(
        !key.verify(&seal, DESCRIPTOR, CONTRACT),
        "the order of the files counts"
    );
    let written = serde_json::to_string(&key.seal(CONTRACT, DESCRIPTOR)).unwrap();
    assert_eq!(written, text);
}

#[test]
fn the_contract_digest_is_plain_lowercase_sha256() {
    assert_eq!(
        sha256_hex(b""),
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    );
    assert_eq!(
        sha256_hex(b"abc"),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
}

#[test]
fn a_session_lease_is_named_by_the_sha256_of_the_real_path() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("session.jsonl");
    std::fs::write(&file, b"").unwrap();
    let link = dir.path().join("link.jsonl");
    std::os::unix::fs::symlink(&file, &link).unwrap();
    let real = std::fs::canonicalize(&file).unwrap();
    let session = recovery::lease::canonical_session(&link).unwrap();
    assert_eq!(session.path, real);
    assert_eq!(session.id, sha256_hex(real.as_os_str().as_encoded_bytes()));
}
