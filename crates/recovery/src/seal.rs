//! The recovery seal: a keyed MAC over a run's recovery files.
//!
//! `launchContractDigest` is an unkeyed SHA-256: whoever can write a run
//! directory can rewrite the contract and recompute it, so it only catches
//! accidents. The seal (`recovery-seal.json`, next to the descriptor) is an
//! HMAC-SHA256 over the exact bytes of the contract and the descriptor,
//! keyed by a per-root secret ([`RootKey`], `<root>/.recovery-key`) kept
//! outside every run directory. The descriptor keeps the reference's field
//! set, so the reference's strict reader still accepts it.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// File name of the per-root secret, directly under the state root.
pub const ROOT_KEY_FILE: &str = ".recovery-key";

/// File name of the seal inside a run directory.
pub const SEAL_FILE: &str = "recovery-seal.json";

/// The MAC algorithm the seal names.
pub const SEAL_ALGORITHM: &str = "hmac-sha256";

const KEY_LEN: usize = 32;

/// Domain separation: these bytes are never a MAC of anything else.
const MAC_CONTEXT: &[u8] = b"subagents/recovery-seal/v1\0";

type HmacSha256 = Hmac<Sha256>;

/// Why the root key could not be created or trusted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// Reading, creating or inspecting the key file failed.
    #[error("failed to {action} recovery key '{}': {source}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The key file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The key file exists but is not one we can trust.
    #[error("failed to trust recovery key '{}': {detail}", path.display())]
    Untrusted {
        /// The key file.
        path: PathBuf,
        /// What is wrong with it.
        detail: String,
    },
}

/// The per-root secret that keys every seal of that root.
#[derive(Clone)]
pub struct RootKey {
    bytes: [u8; KEY_LEN],
}

impl std::fmt::Debug for RootKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RootKey")
            .field("id", &self.id())
            .finish_non_exhaustive()
    }
}

impl RootKey {
    /// A key from raw bytes (tests, fuzzing); real keys come from [`RootKey::load_or_create`].
    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> Self {
        Self { bytes }
    }

    /// Path of the key of `root`.
    pub fn path(root: &Path) -> PathBuf {
        root.join(ROOT_KEY_FILE)
    }

    /// Loads `<root>/.recovery-key`, creating it with random bytes on first
    /// use. Creation is atomic (a complete temp file is hard-linked into
    /// place; a concurrent creator's key wins and is read back). An existing
    /// file is refused unless it is a regular file, not a symlink, owned by
    /// us, mode 0600, and exactly 32 bytes long.
    pub fn load_or_create(root: &Path) -> Result<Self, KeyError> {
        let path = Self::path(root);
        match Self::load(&path) {
            Err(KeyError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                create(root, &path)?;
                Self::load(&path)
            }
            other => other,
        }
    }

    /// Loads an existing key without creating one.
    pub fn load(path: &Path) -> Result<Self, KeyError> {
        let io = |action, source| KeyError::Io {
            action,
            path: path.to_path_buf(),
            source,
        };
        let mut file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path)
            .map_err(|e| io("open", e))?;
        let meta = file.metadata().map_err(|e| io("inspect", e))?;
        check_trusted(&meta, path)?;
        let mut bytes = [0u8; KEY_LEN];
        file.read_exact(&mut bytes).map_err(|e| io("read", e))?;
        Ok(Self { bytes })
    }

    /// A short public identifier of the key (not secret: a hash of it), so
    /// a seal written under another root's key can be told apart.
    pub fn id(&self) -> String {
        let mut hasher = Sha256::new();
        hasher.update(b"subagents/recovery-key-id/v1\0");
        hasher.update(self.bytes);
        hex(&hasher.finalize()[..8])
    }

    fn mac(&self) -> HmacSha256 {
        // HMAC accepts keys of any length; 32 bytes cannot fail.
        let mut mac = HmacSha256::new_from_slice(&self.bytes).expect("hmac takes any key length");
        mac.update(MAC_CONTEXT);
        mac
    }

    /// The MAC over a contract and a descriptor, each length-prefixed so no
    /// two different pairs feed the same bytes.
    fn mac_of(&self, contract: &[u8], descriptor: &[u8]) -> HmacSha256 {
        let mut mac = self.mac();
        for part in [contract, descriptor] {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part);
        }
        mac
    }

    /// Seals the exact bytes of a contract and a descriptor.
    pub fn seal(&self, contract: &[u8], descriptor: &[u8]) -> Seal {
        Seal {
            version: 1,
            algorithm: SEAL_ALGORITHM.to_owned(),
            key_id: self.id(),
            mac: hex(&self.mac_of(contract, descriptor).finalize().into_bytes()),
        }
    }

    /// Whether `seal` was made by this key over exactly these bytes
    /// (constant-time comparison of the MAC).
    pub fn verify(&self, seal: &Seal, contract: &[u8], descriptor: &[u8]) -> bool {
        match unhex(&seal.mac) {
            Some(tag) => self.mac_of(contract, descriptor).verify_slice(&tag).is_ok(),
            None => false,
        }
    }
}

fn check_trusted(meta: &fs::Metadata, path: &Path) -> Result<(), KeyError> {
    let untrusted = |detail: String| KeyError::Untrusted {
        path: path.to_path_buf(),
        detail,
    };
    if !meta.file_type().is_file() {
        return Err(untrusted("not a regular file".into()));
    }
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me {
        return Err(untrusted(format!(
            "owned by uid {}, expected {me}",
            meta.uid()
        )));
    }
    let mode = meta.mode() & 0o7777;
    if mode != 0o600 {
        return Err(untrusted(format!("mode {mode:04o}, expected 0600")));
    }
    if meta.len() != KEY_LEN as u64 {
        return Err(untrusted(format!(
            "{} bytes long, expected {KEY_LEN}",
            meta.len()
        )));
    }
    Ok(())
}

/// Writes a complete random key to a private temp file, then links it into
/// place: the key file appears whole or not at all, and never replaces one.
fn create(root: &Path, path: &Path) -> Result<(), KeyError> {
    let io = |action, source| KeyError::Io {
        action,
        path: path.to_path_buf(),
        source,
    };
    atomic_file::ensure_private_dir(root).map_err(|e| io("create", e.source))?;
    let mut bytes = [0u8; KEY_LEN];
    getrandom::fill(&mut bytes).map_err(|e| io("create", io::Error::other(e.to_string())))?;
    let tmp = root.join(format!(
        "{ROOT_KEY_FILE}.{}.{}.tmp",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    ));
    let written = write_new(&tmp, &bytes).and_then(|()| match fs::hard_link(&tmp, path) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        other => other,
    });
    let _ = fs::remove_file(&tmp);
    written.map_err(|e| io("create", e))?;
    atomic_file::sync_dir(root).map_err(|e| io("create", e.source))
}

fn write_new(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut file: File = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

/// `recovery-seal.json`: which key sealed the recovery files, and the MAC.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Seal {
    /// Schema version, always 1.
    pub version: u32,
    /// Always [`SEAL_ALGORITHM`].
    pub algorithm: String,
    /// [`RootKey::id`] of the sealing key.
    pub key_id: String,
    /// Lowercase hex HMAC-SHA256 (64 chars).
    pub mac: String,
}

/// Parses seal bytes strictly; `Err` holds `(field, detail)`.
pub fn parse_seal(bytes: &[u8]) -> Result<Seal, (String, String)> {
    // A wrong type names its field (`mac`), not only a line and column.
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let seal: Seal = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let field = e.path().to_string();
        let field = if field == "." { String::new() } else { field };
        (field, format!("{}.", e.inner()))
    })?;
    de.end().map_err(|e| (String::new(), format!("{e}.")))?;
    if seal.version != 1 {
        return Err(("version".into(), "version must be 1.".into()));
    }
    if seal.algorithm != SEAL_ALGORITHM {
        return Err((
            "algorithm".into(),
            format!("algorithm must be '{SEAL_ALGORITHM}'."),
        ));
    }
    if unhex(&seal.mac).is_none_or(|tag| tag.len() != 32) {
        return Err(("mac".into(), "mac must be 64 lowercase hex digits.".into()));
    }
    Ok(seal)
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    let digits = text.as_bytes();
    if !digits.len().is_multiple_of(2) {
        return None;
    }
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    digits
        .chunks(2)
        .map(|pair| Some(nibble(pair[0])? << 4 | nibble(pair[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_seal_verifies_only_the_bytes_and_key_it_was_made_with() {
        let key = RootKey::from_bytes([7; KEY_LEN]);
        let seal = key.seal(b"contract", b"descriptor");
        assert!(key.verify(&seal, b"contract", b"descriptor"));
        assert!(!key.verify(&seal, b"contrac", b"tdescriptor"));
        assert!(!key.verify(&seal, b"contract", b"descriptor "));
        assert!(!RootKey::from_bytes([8; KEY_LEN]).verify(&seal, b"contract", b"descriptor"));
        let bytes = serde_json::to_vec(&seal).unwrap();
        assert_eq!(parse_seal(&bytes).unwrap(), seal);
    }

    #[test]
    fn the_key_is_created_once_private_and_refused_when_loosened() {
        let root = tempfile::tempdir().unwrap();
        let first = RootKey::load_or_create(root.path()).unwrap();
        let again = RootKey::load_or_create(root.path()).unwrap();
        assert_eq!(first.bytes, again.bytes);
        let path = RootKey::path(root.path());
        let meta = fs::symlink_metadata(&path).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o600);
        let leftovers = fs::read_dir(root.path()).unwrap().count();
        assert_eq!(leftovers, 1, "no temp file is left behind");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let err = RootKey::load_or_create(root.path()).unwrap_err();
        assert!(
            err.to_string().contains("mode 0644, expected 0600"),
            "{err}"
        );
        fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(root.path().join("elsewhere"), &path).unwrap();
        assert!(RootKey::load_or_create(root.path()).is_err());
    }

    #[test]
    fn a_symlinked_key_is_refused_even_when_it_points_at_a_good_key() {
        let root = tempfile::tempdir().unwrap();
        let good = root.path().join("good-key");
        write_new(&good, &[9; KEY_LEN]).unwrap();
        assert_eq!(RootKey::load(&good).unwrap().bytes, [9; KEY_LEN]);
        std::os::unix::fs::symlink(&good, RootKey::path(root.path())).unwrap();
        let err = RootKey::load_or_create(root.path()).unwrap_err();
        assert!(
            err.to_string().starts_with("failed to open recovery key"),
            "{err}"
        );
    }

    #[test]
    fn a_root_that_is_not_a_directory_fails_to_open_the_key_not_to_create_it() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        fs::write(&root, b"").unwrap();
        let err = RootKey::load_or_create(&root).unwrap_err();
        assert!(
            err.to_string().starts_with(&format!(
                "failed to open recovery key '{}': ",
                RootKey::path(&root).display()
            )),
            "{err}"
        );
    }

    #[test]
    fn malformed_seals_are_refused_naming_the_field() {
        let bad = br#"{"version":1,"algorithm":"hmac-sha256","keyId":"x","mac":"zz"}"#;
        assert_eq!(parse_seal(bad).unwrap_err().0, "mac");
        let bad = br#"{"version":2,"algorithm":"hmac-sha256","keyId":"x","mac":""}"#;
        assert_eq!(parse_seal(bad).unwrap_err().0, "version");
        assert!(parse_seal(b"\xff").is_err());
    }
}
