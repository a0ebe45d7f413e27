//! Golden snapshots of every artifact the crates write (`cargo xtask snapshots`).
//!
//! Each family module drives the real writers of one crate into a scratch
//! directory with a pinned clock, pinned ids and pinned pids, reads the files
//! back and returns them as [`Artifact`]s. [`run`] then compares every one
//! with its insta snapshot in [`SNAPSHOT_DIR`]:
//!
//! * [`Mode::Write`] accepts every change (and deletes snapshots nothing
//!   produces any more);
//! * [`Mode::Check`] changes nothing and fails, printing insta's diff, when a
//!   snapshot drifted, is missing, or is stale;
//! * [`Mode::Review`] writes `.snap.new` files for `cargo insta review`.
//!
//! Adding an artifact family is one module with one `artifacts()` function
//! listed in [`generate`], plus its reader in [`validate`].

mod capacity;
mod dispatch;
mod events;
mod fanout;
mod handshake;
mod list;
mod presets;
mod proof;
mod runs;
mod validate;

use std::cell::Cell;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use insta::internals::Content;

pub use validate::{read_snapshot, validate};

/// The snapshot folder, relative to the repository root. It lies inside the
/// xtask package because `cargo insta review` only looks inside packages.
pub const SNAPSHOT_DIR: &str = "xtask/snapshots";

/// Every `createdAt`, `ts`, `reservedAt`... starts from this instant
/// (2026-01-01T00:00:00Z), so the recorded numbers look like real times.
pub(crate) const T0: u64 = 1_767_225_600_000;

/// The pid recorded wherever a writer would record a real process id.
pub(crate) const PID: u32 = 4242;

/// The repository root (the workspace directory holding `xtask/`).
pub fn repo_root() -> PathBuf {
    let xtask = Path::new(env!("CARGO_MANIFEST_DIR"));
    xtask.parent().unwrap_or(xtask).to_path_buf()
}

/// `<repo root>/xtask/snapshots`.
pub fn snapshot_dir() -> PathBuf {
    repo_root().join(SNAPSHOT_DIR)
}

/// What an artifact is, which decides the reader that must accept it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// `status.json`.
    Status,
    /// `events.jsonl`.
    Events,
    /// `process-terminal-candidate.json`.
    Candidate,
    /// `process-terminal.json` (or a proof projection).
    Proof,
    /// A fan-out budget's `manifest.json`.
    Manifest,
    /// A fan-out claim slot `claims/NNNNNN.json`.
    Claim,
    /// A fan-out descriptor as compact JSON.
    Descriptor,
    /// `run-fanout-budget.json`.
    PersistedDescriptor,
    /// The descriptor's environment encoding (base64url JSON).
    EnvEncoding,
    /// The `RUN_FANOUT_LIMIT` rejection object.
    Rejection,
    /// `runner-startup.json`.
    Startup,
    /// `runner-startup-ack.json`.
    StartupAck,
    /// `runner-startup-proceed.json`.
    StartupProceed,
    /// A capacity slot's `owner.json`.
    CapacityOwner,
    /// A capacity slot's second record of its run, `run.<generation>.<run id>`.
    CapacityRunName,
    /// `run-processes.json`.
    RunProcesses,
    /// `recovery-descriptor.json`.
    Recovery,
    /// `launch-contract.json`.
    LaunchContract,
    /// A session revival lease's `owner.json`.
    LeaseOwner,
    /// `recovery-seal.json` (HMAC of the recovery files under the root key).
    RecoverySeal,
    /// `subagents list` text.
    ListHuman,
    /// `subagents list --json`.
    ListJson,
    /// `listing-index/finished-runs-v2` (stamps and checksum redacted).
    ListIndex,
    /// `dispatch.json` (our extension: the Slurm job of a dispatched run).
    Dispatch,
}

impl Kind {
    /// Every kind, in snapshot order.
    pub const ALL: [Kind; 24] = [
        Kind::Status,
        Kind::Events,
        Kind::Candidate,
        Kind::Proof,
        Kind::Manifest,
        Kind::Claim,
        Kind::Descriptor,
        Kind::PersistedDescriptor,
        Kind::EnvEncoding,
        Kind::Rejection,
        Kind::Startup,
        Kind::StartupAck,
        Kind::StartupProceed,
        Kind::CapacityOwner,
        Kind::CapacityRunName,
        Kind::RunProcesses,
        Kind::Recovery,
        Kind::LaunchContract,
        Kind::LeaseOwner,
        Kind::RecoverySeal,
        Kind::ListHuman,
        Kind::ListJson,
        Kind::ListIndex,
        Kind::Dispatch,
    ];

    /// The name recorded in a snapshot's `info.kind`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Status => "status",
            Kind::Events => "events",
            Kind::Candidate => "candidate",
            Kind::Proof => "proof",
            Kind::Manifest => "manifest",
            Kind::Claim => "claim",
            Kind::Descriptor => "descriptor",
            Kind::PersistedDescriptor => "persisted-descriptor",
            Kind::EnvEncoding => "env-encoding",
            Kind::Rejection => "rejection",
            Kind::Startup => "startup",
            Kind::StartupAck => "startup-ack",
            Kind::StartupProceed => "startup-proceed",
            Kind::CapacityOwner => "capacity-owner",
            Kind::CapacityRunName => "capacity-run-name",
            Kind::RunProcesses => "run-processes",
            Kind::Recovery => "recovery",
            Kind::LaunchContract => "launch-contract",
            Kind::LeaseOwner => "lease-owner",
            Kind::RecoverySeal => "recovery-seal",
            Kind::ListHuman => "list-human",
            Kind::ListJson => "list-json",
            Kind::ListIndex => "list-index",
            Kind::Dispatch => "dispatch",
        }
    }

    /// The `subagents validate --kind` that reads this kind, where it has one
    /// (for switching the snapshot-folder test to the command). Descriptors
    /// are checked there against their live budget, which a snapshot's
    /// `<root>` path does not name, so they keep the shape check here.
    pub fn validate_kind(self) -> Option<&'static str> {
        match self {
            Kind::Status => Some("status"),
            Kind::Candidate => Some("terminal-candidate"),
            Kind::Proof => Some("process-terminal"),
            Kind::Manifest => Some("fanout-manifest"),
            Kind::Startup | Kind::StartupAck | Kind::StartupProceed => Some("startup"),
            Kind::CapacityOwner => Some("capacity-owner"),
            Kind::LaunchContract => Some("launch-contract"),
            _ => None,
        }
    }

    /// The kind named `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }
}

/// One recorded artifact: the bytes a writer produced, as text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Artifact {
    /// Snapshot name: `<family>__<case>` (the file is `<name>.snap`).
    pub name: String,
    /// What it is.
    pub kind: Kind,
    /// The file name the writer used (or the channel, for non-files).
    pub file: String,
    /// The bytes, with the scratch directory replaced by `<root>`.
    pub text: String,
    /// One sentence on the case (which inputs, which writer).
    pub note: String,
    /// Whether `<root>` replaced a scratch path somewhere in `text`.
    pub normalised: bool,
}

impl Artifact {
    /// An artifact of `kind` named `<family>__<case>`.
    pub(crate) fn new(family: &str, case: &str, kind: Kind, file: &str, text: String) -> Self {
        Self {
            name: format!("{family}__{case}"),
            kind,
            file: file.to_owned(),
            text,
            note: String::new(),
            normalised: false,
        }
    }

    /// Sets the note.
    pub(crate) fn note(mut self, note: impl Into<String>) -> Self {
        self.note = note.into();
        self
    }

    /// The snapshot description: insta trims trailing whitespace from the
    /// body, so the final newline and the path substitution are stated here,
    /// and a change of either fails `--check` like a change of the body.
    pub fn description(&self) -> String {
        let newline = if self.text.ends_with('\n') {
            "ends with a newline"
        } else {
            "no final newline"
        };
        let mut text = format!("{} `{}` ({newline})", self.kind.name(), self.file);
        if self.normalised {
            text.push_str("; the scratch directory is shown as <root>");
        }
        if !self.note.is_empty() {
            text.push_str(". ");
            text.push_str(&self.note);
        }
        text
    }

    fn info(&self) -> serde_json::Value {
        serde_json::json!({
            "kind": self.kind.name(),
            "file": self.file,
            "endsWithNewline": self.text.ends_with('\n'),
        })
    }
}

/// A family's generator: every artifact of one crate or file family.
type Family = fn() -> anyhow::Result<Vec<Artifact>>;

/// Every artifact of every family, in a stable order.
pub fn generate() -> anyhow::Result<Vec<Artifact>> {
    let families: [(&str, Family); 9] = [
        ("events", events::artifacts),
        ("proof", proof::artifacts),
        ("handshake", handshake::artifacts),
        ("fanout", fanout::artifacts),
        ("capacity", capacity::artifacts),
        ("list", list::artifacts),
        ("runs", runs::artifacts),
        ("presets", presets::artifacts),
        ("dispatch", dispatch::artifacts),
    ];
    let mut all = Vec::new();
    for (family, artifacts) in families {
        all.extend(artifacts().with_context(|| format!("snapshot family '{family}'"))?);
    }
    let mut names = BTreeSet::new();
    for artifact in &all {
        if !names.insert(artifact.name.as_str()) {
            bail!("two artifacts are named '{}'", artifact.name);
        }
    }
    Ok(all)
}

/// A scratch directory for one family's writers, and the substitution of
/// its path by `<root>` in what they wrote.
pub(crate) struct Scratch {
    dir: tempfile::TempDir,
    real: PathBuf,
}

impl Scratch {
    pub(crate) fn new() -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("xtask-snapshots-")
            .tempdir()?;
        let real = dir.path().canonicalize()?;
        Ok(Self { dir, real })
    }

    /// The scratch root (its real path, so canonicalising writers agree).
    pub(crate) fn path(&self) -> &Path {
        &self.real
    }

    /// `text` with the scratch root replaced by `<root>`.
    pub(crate) fn normalise(&self, text: &str) -> (String, bool) {
        let mut out = text.to_owned();
        for root in [self.real.as_path(), self.dir.path()] {
            out = out.replace(&*root.to_string_lossy(), "<root>");
        }
        let changed = out != text;
        (out, changed)
    }

    /// Reads a file a writer left and records it as an artifact.
    pub(crate) fn record(
        &self,
        family: &str,
        case: &str,
        kind: Kind,
        path: &Path,
    ) -> anyhow::Result<Artifact> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("read the artifact '{}'", path.display()))?;
        let file = path.file_name().unwrap_or_default().to_string_lossy();
        Ok(self.text(family, case, kind, &file, &text))
    }

    /// Records `text` (output that is not a file) as an artifact.
    pub(crate) fn text(
        &self,
        family: &str,
        case: &str,
        kind: Kind,
        file: &str,
        text: &str,
    ) -> Artifact {
        let (text, normalised) = self.normalise(text);
        Artifact {
            normalised,
            ..Artifact::new(family, case, kind, file, text)
        }
    }
}

/// A deterministic UUID source: `00000000-0000-4000-8000-<n>` for n = 1, 2, ...
#[derive(Default)]
pub(crate) struct Uuids(Cell<u64>);

impl Uuids {
    pub(crate) fn next(&self) -> String {
        let n = self.0.get() + 1;
        self.0.set(n);
        format!("00000000-0000-4000-8000-{n:012}")
    }
}

/// A deterministic clock: `T0`, `T0 + 1000`, ... one second per reading.
#[derive(Default)]
pub(crate) struct Ticks(Cell<u64>);

impl Ticks {
    pub(crate) fn now(&self) -> u64 {
        let n = self.0.get();
        self.0.set(n + 1);
        T0 + n * 1000
    }
}

/// What to do with drifted snapshots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Accept everything: write changed and new snapshots, delete stale ones.
    Write,
    /// Change nothing; fail on any drift, missing or stale snapshot.
    Check,
    /// Write drifted and new snapshots as `.snap.new` for `cargo insta review`.
    Review,
}

/// The outcome of [`run`].
#[derive(Debug)]
pub struct Report {
    /// The mode run.
    pub mode: Mode,
    /// Number of artifacts generated.
    pub total: usize,
    /// Names whose snapshot drifted or is missing (not accepted in this mode).
    pub drifted: Vec<String>,
    /// Snapshot files that no artifact produces.
    pub stale: Vec<PathBuf>,
}

impl Report {
    /// Whether the run leaves the snapshots in agreement with the writers.
    pub fn passed(&self) -> bool {
        self.mode == Mode::Write || (self.drifted.is_empty() && self.stale.is_empty())
    }

    /// A few lines for the terminal.
    pub fn summary(&self) -> String {
        let mut lines = Vec::new();
        for path in &self.stale {
            let verb = if self.mode == Mode::Write {
                "deleted"
            } else {
                "no artifact produces"
            };
            let shown = path.strip_prefix(repo_root()).unwrap_or(path);
            lines.push(format!("stale snapshot: {verb} {}", shown.display()));
        }
        let drifted = self.drifted.len();
        if self.mode == Mode::Write {
            lines.extend(self.drifted.iter().map(|name| format!("updated: {name}")));
        }
        lines.push(match self.mode {
            Mode::Write => format!(
                "snapshots: {} artifacts recorded in {SNAPSHOT_DIR}/ ({drifted} changed or new)",
                self.total
            ),
            Mode::Check if self.passed() => {
                format!("snapshots: all {} artifacts match", self.total)
            }
            Mode::Check => {
                let mut problems = vec![format!(
                    "{drifted} of {} artifacts drifted or have no snapshot",
                    self.total
                )];
                if drifted > 0 {
                    problems[0].push_str(&format!(" ({})", self.drifted.join(", ")));
                }
                if !self.stale.is_empty() {
                    problems.push(format!("{} stale snapshot file(s)", self.stale.len()));
                }
                format!(
                    "snapshots: {}; run `cargo xtask snapshots` to accept all, or \
                     `cargo xtask snapshots --review` then `cargo insta review` to pick",
                    problems.join(", ")
                )
            }
            Mode::Review => {
                format!("snapshots: {drifted} pending .snap.new files; run `cargo insta review`")
            }
        });
        lines.join("\n")
    }
}

/// Generates every artifact and compares it with its snapshot in [`snapshot_dir`].
///
/// Sets insta's environment variables for `mode`, so it must run before the
/// process starts any thread (xtask's `main` calls it first).
pub fn run(mode: Mode) -> anyhow::Result<Report> {
    let update = match mode {
        Mode::Write => "force",
        Mode::Check => "no",
        Mode::Review => "new",
    };
    let root = repo_root();
    // SAFETY: called from `main` before any thread exists; insta reads these
    // once, at its first assertion.
    unsafe {
        std::env::set_var("INSTA_UPDATE", update);
        std::env::set_var("INSTA_FORCE_PASS", "0");
        // Accepting needs no diff on the terminal: `git diff snapshots/` shows it.
        let output = if mode == Mode::Write { "none" } else { "diff" };
        std::env::set_var("INSTA_OUTPUT", output);
        std::env::set_var("INSTA_WORKSPACE_ROOT", &root);
    }
    let artifacts = generate()?;
    let dir = snapshot_dir();
    std::fs::create_dir_all(&dir)?;
    // insta reports a drift by panicking after printing the diff; the
    // default hook would only add a backtrace hint to that.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let mut drifted = Vec::new();
    for artifact in &artifacts {
        let file = dir.join(format!("{}.snap", artifact.name));
        let before = std::fs::read(&file).ok();
        let outcome = std::panic::catch_unwind(|| assert_matches(artifact, &dir));
        let rewritten =
            mode == Mode::Write && (before.is_none() || before != std::fs::read(&file).ok());
        if outcome.is_err() || rewritten {
            drifted.push(artifact.name.clone());
        }
    }
    std::panic::set_hook(hook);
    let produced: BTreeSet<String> = artifacts.iter().map(|a| a.name.clone()).collect();
    let stale = stale_snapshots(&dir, &produced)?;
    if mode == Mode::Write {
        for path in &stale {
            std::fs::remove_file(path)?;
        }
        remove_pending(&dir)?;
    }
    Ok(Report {
        mode,
        total: artifacts.len(),
        drifted,
        stale,
    })
}

/// `.snap` files (and, in write mode's eyes, leftover `.snap.new` files)
/// whose name no artifact has.
fn stale_snapshots(dir: &Path, produced: &BTreeSet<String>) -> anyhow::Result<Vec<PathBuf>> {
    let mut stale = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let stem = name.strip_suffix(".snap");
        if stem.is_some_and(|s| !produced.contains(s)) {
            stale.push(path);
        }
    }
    stale.sort();
    Ok(stale)
}

/// Deletes `.snap.new` files: after accepting everything none is pending.
fn remove_pending(dir: &Path) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.to_string_lossy().ends_with(".snap.new") {
            std::fs::remove_file(&path)?;
        }
    }
    Ok(())
}

fn assert_matches(artifact: &Artifact, dir: &Path) {
    let mut settings = insta::Settings::new();
    settings.set_snapshot_path(dir);
    settings.set_prepend_module_to_snapshot(false);
    settings.set_omit_expression(true);
    settings.set_description(artifact.description());
    settings.set_info(&artifact.info());
    settings.set_comparator(Box::new(BodyAndDescription));
    settings.bind(|| insta::assert_snapshot!(artifact.name.as_str(), artifact.text.as_str()));
}

/// insta's default comparison plus the description, which carries the facts
/// insta's text normalisation would hide (the final newline).
#[derive(Clone)]
struct BodyAndDescription;

impl insta::Comparator for BodyAndDescription {
    fn matches(&self, reference: &insta::Snapshot, test: &insta::Snapshot) -> bool {
        insta::DefaultComparator.matches(reference, test)
            && reference.metadata().description() == test.metadata().description()
    }

    fn dyn_clone(&self) -> Box<dyn insta::Comparator> {
        Box::new(self.clone())
    }
}

/// The string value of `key` in an insta info map.
pub(crate) fn info_str<'a>(info: &'a Content, key: &str) -> Option<&'a str> {
    match info.resolve_inner() {
        Content::Map(entries) => entries
            .iter()
            .find(|(k, _)| k.as_str() == Some(key))
            .and_then(|(_, v)| v.as_str()),
        Content::Struct(_, fields) => fields
            .iter()
            .find(|(k, _)| *k == key)
            .and_then(|(_, v)| v.as_str()),
        _ => None,
    }
}

/// The boolean value of `key` in an insta info map.
pub(crate) fn info_bool(info: &Content, key: &str) -> Option<bool> {
    match info.resolve_inner() {
        Content::Map(entries) => entries
            .iter()
            .find(|(k, _)| k.as_str() == Some(key))
            .and_then(|(_, v)| v.as_bool()),
        _ => None,
    }
}
