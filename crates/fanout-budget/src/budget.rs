//! A budget directory: creation, validation into an open handle, the
//! manifest and the usage snapshot.

use std::collections::BTreeSet;
use std::fmt;
use std::fs::{self, DirBuilder, File};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use atomic_file::read::STATE_FILE_LIMIT;
use nix::fcntl::{OFlag, open, openat};
use nix::sys::stat::Mode;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::admission::{Listing, pid_alive, temp_owner};
use crate::descriptor::json_limit;
use crate::{CLAIMS_DIR, Descriptor, Error, MANIFEST_FILE, MAX_LIMIT, Result, Sources};

/// Usage of a budget: `{used, limit, remaining}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Number of claim slot files.
    pub used: u64,
    /// The budget limit.
    pub limit: u64,
    /// `max(0, limit - used)`.
    pub remaining: u64,
}

impl Snapshot {
    /// The snapshot of `used` claims against `limit`.
    pub fn new(used: u64, limit: u64) -> Self {
        Self {
            used,
            limit,
            remaining: limit.saturating_sub(used),
        }
    }
}

impl fmt::Display for Snapshot {
    /// `Run fan-out: <used>/<limit> used, <remaining> remaining`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Run fan-out: {}/{} used, {} remaining",
            self.used, self.limit, self.remaining
        )
    }
}

/// `manifest.json`: the identity and limit of a budget, written once.
#[derive(Debug, Clone, PartialEq)]
pub struct Manifest {
    /// Always 1.
    pub version: u32,
    /// Id of the top-level run that created the budget.
    pub root_run_id: String,
    /// The authoritative limit.
    pub limit: u64,
    /// Creation time, ms since the epoch.
    pub created_at: f64,
}

impl Manifest {
    /// Parses manifest text; `dir` names the budget directory in errors.
    pub fn parse(text: &str, dir: &Path) -> Result<Self> {
        let value: Value = serde_json::from_str(text).map_err(|e| Error::ManifestUnreadable {
            dir: dir.to_path_buf(),
            cause: e.to_string(),
        })?;
        Self::from_value(&value).ok_or_else(|| Error::ManifestInvalid {
            dir: dir.to_path_buf(),
            field: Self::first_bad_field(&value),
        })
    }

    /// The first field that breaks a manifest rule, for the error message.
    fn first_bad_field(value: &Value) -> &'static str {
        let Some(map) = value.as_object() else {
            return "the manifest must be a JSON object";
        };
        let checks: [(&'static str, bool); 4] = [
            (
                "version must be 1",
                map.get("version").and_then(Value::as_f64) == Some(1.0),
            ),
            (
                "rootRunId must be a non-empty string",
                map.get("rootRunId")
                    .and_then(Value::as_str)
                    .is_some_and(|s| !s.is_empty()),
            ),
            (
                "limit must be a positive integer",
                map.get("limit").and_then(json_limit).is_some(),
            ),
            (
                "createdAt must be a finite number",
                map.get("createdAt")
                    .and_then(Value::as_f64)
                    .is_some_and(f64::is_finite),
            ),
        ];
        checks
            .into_iter()
            .find(|(_, ok)| !ok)
            .map_or("", |(field, _)| field)
    }

    fn from_value(value: &Value) -> Option<Self> {
        let map = value.as_object()?;
        map.get("version")
            .and_then(Value::as_f64)
            .filter(|v| *v == 1.0)?;
        Some(Self {
            version: 1,
            root_run_id: Some(map.get("rootRunId")?.as_str()?)
                .filter(|s| !s.is_empty())?
                .to_string(),
            limit: json_limit(map.get("limit")?)?,
            created_at: map.get("createdAt")?.as_f64().filter(|t| t.is_finite())?,
        })
    }
}

/// Reads and checks `<budget_dir>/manifest.json` by path (for `validate`).
pub fn read_manifest(budget_dir: &Path) -> Result<Manifest> {
    let text = atomic_file::read::read_to_string(&budget_dir.join(MANIFEST_FILE)).map_err(|e| {
        Error::ManifestUnreadable {
            dir: budget_dir.to_path_buf(),
            cause: e.to_string(),
        }
    })?;
    Manifest::parse(&text, budget_dir)
}

/// The managed budget root (e.g. `<state root>/run-fanout-budgets`) with its
/// real path, resolved once.
#[derive(Debug)]
pub struct BudgetsRoot {
    path: PathBuf,
    /// The real root, or why it did not resolve (kept as an OS error
    /// number where there is one, so every refusal names the same cause).
    real: std::result::Result<PathBuf, (std::io::ErrorKind, Option<i32>)>,
}

impl BudgetsRoot {
    /// Resolves `root`; a root that does not resolve refuses every budget
    /// with the reason it did not.
    pub fn resolve(root: &Path) -> Self {
        Self {
            path: root.to_path_buf(),
            real: fs::canonicalize(root).map_err(|e| (e.kind(), e.raw_os_error())),
        }
    }

    /// The root as given.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens `dir` and returns the handle with the real path it refers to,
    /// which must lie inside the real root. The path is resolved by the open
    /// itself and read back from the handle, so a path swapped at any moment
    /// cannot pass one directory's check and hand over another.
    pub(crate) fn hold(&self, dir: &Path) -> Result<(OwnedFd, PathBuf)> {
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        let fd =
            open(dir, flags, Mode::empty()).map_err(|e| Error::DirectoryUnavailable(e.into()))?;
        let real_dir = fs::read_link(fd_path(&fd)).map_err(Error::DirectoryUnavailable)?;
        let real_root = self.real.as_ref().map_err(|&(kind, code)| {
            let cause = code.map_or_else(|| kind.into(), std::io::Error::from_raw_os_error);
            Error::DirectoryUnavailable(cause)
        })?;
        if !real_dir.starts_with(real_root) {
            return Err(Error::OutsideRoot);
        }
        Ok((fd, real_dir))
    }
}

/// A validated budget held open by a directory handle.
///
/// Every later file operation (manifest, claims, lock) is relative to the
/// handle, so replacing the directory's path with a symlink after validation
/// cannot redirect them.
#[derive(Debug)]
pub struct OpenBudget {
    pub(crate) descriptor: Descriptor,
    pub(crate) dir: OwnedFd,
}

impl OpenBudget {
    /// Validates `descriptor` against the managed budget `root` (e.g.
    /// `<state root>/run-fanout-budgets`) and opens the budget.
    ///
    /// The real directory must lie inside the real root, and the manifest is
    /// authoritative: a descriptor whose rootRunId or limit differs is refused.
    pub fn open(root: &Path, descriptor: &Descriptor) -> Result<Self> {
        Self::open_in(&BudgetsRoot::resolve(root), descriptor)
    }

    /// [`OpenBudget::open`] against a root resolved once, for a caller that
    /// opens many budgets (a listing opens one per active run).
    pub fn open_in(root: &BudgetsRoot, descriptor: &Descriptor) -> Result<Self> {
        // A descriptor built in code has skipped the JSON field rules.
        if descriptor.version != 1 || descriptor.directory.as_os_str().is_empty() {
            return Err(Error::DescriptorInvalid);
        }
        let (dir, real_dir) = root.hold(&descriptor.directory)?;
        // Checked here, when a budget is used, rather than for every budget
        // of the root at every command (one budget per root run).
        for trusted in [real_dir.clone(), real_dir.join("claims")] {
            atomic_file::read::check_private_dir(&trusted)
                .map_err(|e| Error::DirectoryUnavailable(std::io::Error::other(e.to_string())))?;
        }
        let manifest = read_manifest_at(&dir, &real_dir)?;
        if manifest.root_run_id != descriptor.root_run_id || manifest.limit != descriptor.limit {
            return Err(Error::ManifestMismatch);
        }
        let descriptor = Descriptor {
            directory: real_dir,
            ..descriptor.with_parent_path(descriptor.parent_path.as_deref().unwrap_or(""))
        };
        Ok(Self { descriptor, dir })
    }

    /// The normalised descriptor (directory = real path).
    pub fn descriptor(&self) -> &Descriptor {
        &self.descriptor
    }

    /// Counts the claim slot files (`claims/NNNNNN.json`); takes no lock.
    pub fn snapshot(&self) -> Result<Snapshot> {
        let claims = self.open_claims()?;
        let used = self.taken_slots(&claims)?.len() as u64;
        Ok(Snapshot::new(used, self.descriptor.limit))
    }

    pub(crate) fn claims_path(&self) -> PathBuf {
        self.descriptor.directory.join(CLAIMS_DIR)
    }

    pub(crate) fn open_claims(&self) -> Result<OwnedFd> {
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        openat(&self.dir, CLAIMS_DIR, flags, Mode::empty()).map_err(|e| Error::ClaimsUnreadable {
            path: self.claims_path(),
            source: e.into(),
        })
    }

    /// Slot numbers of the entries named like a slot file.
    pub(crate) fn taken_slots(&self, claims: &OwnedFd) -> Result<BTreeSet<u32>> {
        self.read_claims(claims, |_| false).map(|l| l.slots)
    }

    /// The slots, and the records prepared by claimants that no longer
    /// exist. A record counts as abandoned only when its pid names no
    /// process and it is older than [`crate::STALE_AFTER`] (a live claimant
    /// keeps one for at most the lock timeout; a pid of another pid
    /// namespace must not get a live claimant's record removed).
    pub(crate) fn list_claims(&self, claims: &OwnedFd) -> Result<Listing> {
        let dead = |name: &str| {
            temp_owner(name).is_some_and(|pid| !pid_alive(pid))
                && nix::sys::stat::fstatat(claims, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
                    .is_ok_and(|st| {
                        let now = now_ms() / 1000;
                        let age = now.saturating_sub(st.st_mtime.max(0) as u64);
                        age > crate::STALE_AFTER.as_secs()
                    })
        };
        self.read_claims(claims, dead)
    }

    fn read_claims(&self, claims: &OwnedFd, dead: impl Fn(&str) -> bool) -> Result<Listing> {
        let unreadable = |source: io::Error| Error::ClaimsUnreadable {
            path: self.claims_path(),
            source,
        };
        let mut listing = Listing {
            slots: BTreeSet::new(),
            dead_temps: Vec::new(),
        };
        for entry in fs::read_dir(fd_path(claims)).map_err(unreadable)? {
            let name = entry.map_err(unreadable)?.file_name();
            match name.to_str() {
                Some(text) if dead(text) => listing.dead_temps.push(name),
                Some(text) => listing.slots.extend(parse_slot_name(text)),
                None => {}
            }
        }
        Ok(listing)
    }
}

/// Creates a new budget under the managed `root` for `root_run_id` with
/// `limit`, and returns it opened and validated.
pub fn create_budget(root: &Path, root_run_id: &str, limit: u64) -> Result<OpenBudget> {
    create_budget_with(root, root_run_id, limit, &Sources::system())
}

/// [`create_budget`] taking the manifest's `createdAt` and the directory's
/// UUID from `sources` (golden snapshots pin them).
pub fn create_budget_with(
    root: &Path,
    root_run_id: &str,
    limit: u64,
    sources: &Sources<'_>,
) -> Result<OpenBudget> {
    if limit == 0 {
        return Err(Error::LimitNotPositive);
    }
    if limit > MAX_LIMIT {
        return Err(Error::LimitTooLarge(limit));
    }
    if root_run_id.is_empty() {
        return Err(Error::EmptyRootRunId);
    }
    atomic_file::ensure_private_dir(root)?;
    let dir = make_unique_dir(root, root_run_id, sources)?;
    if let Err(e) = fill_budget_dir(&dir, root_run_id, limit, sources) {
        // Nobody can know this directory yet; leave no half-made budget.
        let _ = fs::remove_dir_all(&dir);
        return Err(e);
    }
    atomic_file::sync_dir(root)?;
    let descriptor = Descriptor {
        version: 1,
        root_run_id: root_run_id.to_string(),
        directory: dir,
        limit,
        parent_path: None,
    };
    OpenBudget::open(root, &descriptor)
}

fn fill_budget_dir(dir: &Path, root_run_id: &str, limit: u64, sources: &Sources<'_>) -> Result<()> {
    let claims = dir.join(CLAIMS_DIR);
    private_dir_builder()
        .create(&claims)
        .map_err(|e| Error::io("create directory", &claims, e))?;
    let manifest = json!({
        "version": 1,
        "rootRunId": root_run_id,
        "limit": limit,
        "createdAt": (sources.now_ms)(),
    });
    let bytes = format!("{manifest}\n");
    atomic_file::create_new_private(&dir.join(MANIFEST_FILE), bytes.as_bytes())?;
    Ok(())
}

fn make_unique_dir(root: &Path, root_run_id: &str, sources: &Sources<'_>) -> Result<PathBuf> {
    loop {
        let dir = root.join(budget_dir_name_with(root_run_id, sources.uuid));
        match private_dir_builder().create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(Error::io("create directory", &dir, e)),
        }
    }
}

fn private_dir_builder() -> DirBuilder {
    let mut builder = DirBuilder::new();
    builder.mode(atomic_file::DIR_MODE);
    builder
}

/// `<safeRootRunId>-<uuid>`: unsafe characters become `_` (one per UTF-16
/// unit, as the reference's regex replaces), at most 120 of them.
pub fn budget_dir_name(root_run_id: &str) -> String {
    budget_dir_name_with(root_run_id, &random_uuid)
}

/// [`budget_dir_name`] with the UUIDs taken from `uuid`.
pub fn budget_dir_name_with(root_run_id: &str, uuid: &dyn Fn() -> String) -> String {
    let safe: String = root_run_id
        .chars()
        .flat_map(|c| {
            let keep = c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
            let (ch, n) = if keep { (c, 1) } else { ('_', c.len_utf16()) };
            std::iter::repeat_n(ch, n)
        })
        .take(120)
        .collect();
    let id = uuid();
    if safe.is_empty() {
        format!("{}-{id}", uuid())
    } else {
        format!("{safe}-{id}")
    }
}

/// Slot file name `NNNNNN.json` for a slot number.
pub(crate) fn slot_name(slot: u32) -> String {
    format!("{slot:06}.json")
}

/// The slot number of a name matching `^\d{6}\.json$`.
fn parse_slot_name(name: &str) -> Option<u32> {
    let digits = name.strip_suffix(".json")?;
    let six = digits.len() == 6 && digits.bytes().all(|b| b.is_ascii_digit());
    six.then(|| digits.parse().ok()).flatten()
}

fn read_manifest_at(dir: &OwnedFd, real_dir: &Path) -> Result<Manifest> {
    let unreadable = |cause: String| Error::ManifestUnreadable {
        dir: real_dir.to_path_buf(),
        cause,
    };
    // O_NONBLOCK: a FIFO in place of the manifest is refused, not waited on.
    let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
    let fd =
        openat(dir, MANIFEST_FILE, flags, Mode::empty()).map_err(|e| unreadable(e.to_string()))?;
    let path = real_dir.join(MANIFEST_FILE);
    let bytes = atomic_file::read::read_opened(File::from(fd), &path, STATE_FILE_LIMIT)
        .map_err(|e| unreadable(e.to_string()))?;
    let text = String::from_utf8(bytes).map_err(|e| unreadable(e.to_string()))?;
    Manifest::parse(&text, real_dir)
}

/// `/proc/self/fd/<fd>`: a path that resolves through the handle, which lets
/// path-based helpers (`atomic-file`, `read_dir`) work relative to it.
pub(crate) fn fd_path(fd: &OwnedFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// A random (v4) UUID, the production source of budget and claim ids.
pub(crate) fn random_uuid() -> String {
    uuid::Uuid::new_v4().to_string()
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_names() {
        assert_eq!(slot_name(7), "000007.json");
        assert_eq!(parse_slot_name("000007.json"), Some(7));
        assert_eq!(parse_slot_name("999999.json"), Some(999_999));
        for bad in [
            "00007.json",
            "0000007.json",
            "00000a.json",
            "000007.json.tmp",
            ".000007.json.1.tmp",
        ] {
            assert_eq!(parse_slot_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn dir_names_are_sanitised_and_truncated() {
        let name = budget_dir_name("a/b c\u{1F600}");
        assert!(name.starts_with("a_b_c__-"), "{name}");
        assert_eq!(name.len(), "a_b_c__-".len() + 36);
        let long = budget_dir_name(&"x".repeat(200));
        assert_eq!(long.len(), 120 + 1 + 36);
        let empty = budget_dir_name("");
        assert_eq!(empty.len(), 36 + 1 + 36);
        // One `_` per UTF-16 unit of each unsafe character, as the
        // reference's regex replaces: python3 -c "import re; s='run/é😀x';
        // print(''.join(c if re.match(r'[A-Za-z0-9._-]', c)
        //   else '_' * (len(c.encode('utf-16-le')) // 2) for c in s))"
        let fixed = budget_dir_name_with("run/é😀x", &|| "u".into());
        assert_eq!(fixed, "run____x-u");
    }

    #[test]
    fn snapshot_display() {
        assert_eq!(
            Snapshot::new(3, 64).to_string(),
            "Run fan-out: 3/64 used, 61 remaining"
        );
        assert_eq!(Snapshot::new(5, 2).remaining, 0);
    }

    #[test]
    fn manifest_rules() {
        let dir = Path::new("/b");
        let ok = Manifest::parse(
            r#"{"version":1,"rootRunId":"r","limit":2,"createdAt":5,"x":1}"#,
            dir,
        )
        .unwrap();
        assert_eq!((ok.root_run_id.as_str(), ok.limit), ("r", 2));
        let invalid = Manifest::parse(
            r#"{"version":1,"rootRunId":"","limit":2,"createdAt":5}"#,
            dir,
        )
        .unwrap_err();
        assert_eq!(
            invalid.to_string(),
            "Run fan-out budget manifest is invalid at '/b': rootRunId must be a non-empty string."
        );
        let unreadable = Manifest::parse("{", dir).unwrap_err();
        assert!(
            unreadable
                .to_string()
                .starts_with("Run fan-out budget manifest is unreadable at '/b': "),
            "{unreadable}"
        );
    }
}
