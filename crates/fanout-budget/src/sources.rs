//! Where the budget writers get the time and fresh ids.
//!
//! Production always uses [`Sources::system`]; the `_with`/`_using` variants
//! of the writers exist so golden snapshots can record byte-stable files.

use crate::budget::{now_ms, random_uuid};

/// The clock and id source of the manifest and claim writers.
#[derive(Clone, Copy)]
pub struct Sources<'a> {
    /// Milliseconds since the epoch (`createdAt`, `claimedAt`).
    pub now_ms: &'a dyn Fn() -> u64,
    /// A fresh UUID string (budget directory suffix, `claimId`). It must not
    /// repeat: a directory name that already exists is retried with the next one.
    pub uuid: &'a dyn Fn() -> String,
}

impl Sources<'static> {
    /// The system clock and random v4 UUIDs.
    pub fn system() -> Self {
        Self {
            now_ms: &now_ms,
            uuid: &random_uuid,
        }
    }
}

impl std::fmt::Debug for Sources<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sources").finish_non_exhaustive()
    }
}
