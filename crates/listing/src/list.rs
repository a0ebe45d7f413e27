//! Finding runs: by id or prefix, the active ones from the index, or all.

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;

use atomic_file::read::{DirHandle, Stamp};

use status::layout::{Layout, exact_run_dir, files, is_safe_run_id, run_dir_under};
use status::model::{LISTING_FACTS, RunStatus, read_status};
use status::proof::{Fallback, ProcessTerminal, read_proof, sanitize};
use status::{Result, index, reconcile};

use crate::io_err;

/// A live fan-out snapshot source: given a run directory, the snapshot
/// `{used, limit, remaining}` from its persisted descriptor, if it has one.
/// Summary field (never written to disk) saying why a run's live fan-out
/// snapshot could not be read.
pub(crate) const FANOUT_UNAVAILABLE: &str = "runFanoutBudgetUnavailable";

/// Summary field (never written to disk) of the active listing: the run is
/// over by its status but its process-terminal proof is not final yet (its
/// monitor is frozen, slow, or cannot prove a process gone). Shown as
/// `finishing`.
pub(crate) const FINISHING: &str = "finishing";

/// Whether a summary carries the active listing's `finishing` mark.
pub fn is_finishing(status: &RunStatus) -> bool {
    status.extra.get(FINISHING).and_then(Value::as_bool) == Some(true)
}

/// Whether a status carries final listing facts (see [`LISTING_FACTS`]):
/// over, with a frozen time and a proof that is observed.
pub fn has_frozen_facts(status: &RunStatus) -> bool {
    !status.state.is_active()
        && status
            .extra
            .get(LISTING_FACTS)
            .and_then(|f| f.get("frozenAt"))
            .is_some_and(Value::is_u64)
        && status
            .process_terminal
            .as_ref()
            .and_then(|p| p.get("state"))
            .and_then(Value::as_str)
            == Some("observed")
}

/// The frozen fan-out facts of a status (see [`LISTING_FACTS`]) that a
/// listing checks, by a few `stat`s and no reads, before trusting the
/// frozen counts. `None` from [`FrozenFanout::of`] means the facts are
/// incomplete and the counts are never trusted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct FrozenFanout {
    frozen_at: u64,
    budget: Option<FrozenBudget>,
}

/// The frozen budget counts and where its claims live.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct FrozenBudget {
    used: u64,
    limit: u64,
    claims_dir: PathBuf,
}

impl FrozenFanout {
    pub(crate) fn of(status: &RunStatus) -> Option<Self> {
        let facts = status.extra.get(LISTING_FACTS);
        let frozen_at = facts
            .and_then(|f| f.get("frozenAt"))
            .and_then(Value::as_u64)?;
        let Some(snapshot) = &status.run_fanout_budget else {
            return Some(Self {
                frozen_at,
                budget: None,
            });
        };
        let count = |key: &str| snapshot.get(key).and_then(Value::as_u64);
        let claims_dir = facts
            .and_then(|f| f.get("fanoutClaimsDir"))
            .and_then(Value::as_str)
            .map(PathBuf::from)?;
        Some(Self {
            frozen_at,
            budget: Some(FrozenBudget {
                used: count("used")?,
                limit: count("limit")?,
                claims_dir,
            }),
        })
    }

    /// Whether the frozen counts still hold — the run's persisted descriptor
    /// not replaced since the freeze, the claims directory still there, and
    /// no claim slot file past the frozen count (or the budget full) — and
    /// if so, what was seen of the claims directory: its [`Stamp`] (taken
    /// before the next slot is looked up, so a claim made after the look
    /// changes the directory's times after the stamp), or `None` without a
    /// budget.
    pub(crate) fn check(&self, dir: &Path, scan: Option<(&Scan, &str)>) -> Option<Option<Stamp>> {
        if !self.descriptor_unchanged(dir, scan) {
            return None;
        }
        let Some(budget) = &self.budget else {
            return Some(None);
        };
        let claims = ClaimsLookup::new(budget, scan);
        let stamp = claims.stamp(None).ok().filter(|s| is_dir_mode(s.mode))?;
        let next = format!("{:06}.json", budget.used);
        let no_more = budget.used >= budget.limit
            || matches!(claims.stamp(Some(&next)), Err(e) if e.kind() == std::io::ErrorKind::NotFound);
        no_more.then_some(Some(stamp))
    }

    /// Whether the frozen counts still hold, given the claims directory's
    /// [`Stamp`] recorded by [`FrozenFanout::check`] when they last did: the
    /// descriptor checked as there, and the claims directory's stamp
    /// unchanged. A settled stamp (see `list_index::settled`) that is
    /// unchanged means no entry was added to or removed from the directory
    /// since, so the next slot is still free: one lookup instead of two.
    pub(crate) fn holds_with(
        &self,
        dir: &Path,
        scan: Option<(&Scan, &str)>,
        claims_stamp: Option<&Stamp>,
    ) -> bool {
        if !self.descriptor_unchanged(dir, scan) {
            return false;
        }
        match (&self.budget, claims_stamp) {
            (None, None) => true,
            (Some(budget), Some(recorded)) => ClaimsLookup::new(budget, scan)
                .stamp(None)
                .is_ok_and(|s| s == *recorded),
            _ => false,
        }
    }

    /// The run's persisted descriptor: not replaced since the freeze, or
    /// still absent when the run had no budget at its end.
    fn descriptor_unchanged(&self, dir: &Path, scan: Option<(&Scan, &str)>) -> bool {
        let descriptor = match scan {
            Some((scan, name)) => scan
                .runs
                .stat(&format!("{name}/{}", files::RUN_FANOUT_BUDGET)),
            None => stat_path(&dir.join(files::RUN_FANOUT_BUDGET)),
        };
        match &self.budget {
            None => matches!(descriptor, Err(e) if e.kind() == std::io::ErrorKind::NotFound),
            Some(_) => descriptor.is_ok_and(|m| m.modified_ms <= self.frozen_at),
        }
    }
}

/// A directory's `st_mode` (`S_IFDIR` under `S_IFMT`).
fn is_dir_mode(mode: u32) -> bool {
    mode & 0o170_000 == 0o040_000
}

/// How a budget's claims directory is reached: below the budgets
/// directory (always, for our own runs) by short lookups through its
/// handle, else by its whole path.
struct ClaimsLookup<'a> {
    claims: &'a Path,
    below: Option<(&'a DirHandle, String)>,
}

impl<'a> ClaimsLookup<'a> {
    fn new(budget: &'a FrozenBudget, scan: Option<(&'a Scan, &str)>) -> Self {
        let claims = budget.claims_dir.as_path();
        let budgets = scan.and_then(|(scan, _)| scan.budgets.as_ref());
        let below = budgets.and_then(|b| {
            let rel = claims.strip_prefix(b.path()).ok()?.to_str()?;
            (!rel.is_empty()).then(|| (b, rel.to_owned()))
        });
        Self { claims, below }
    }

    /// The stamp of the claims directory, or of `child` in it (symlinks
    /// not followed).
    fn stamp(&self, child: Option<&str>) -> std::io::Result<Stamp> {
        match (&self.below, child) {
            (Some((handle, rel)), Some(child)) => handle.stamp(&format!("{rel}/{child}")),
            (Some((handle, rel)), None) => handle.stamp(rel),
            (None, child) => {
                let path = child.map_or_else(|| self.claims.to_path_buf(), |c| self.claims.join(c));
                std::fs::symlink_metadata(path).map(|m| Stamp::of(&m))
            }
        }
    }
}

/// `lstat` of a whole path, as an [`EntryStat`].
fn stat_path(path: &Path) -> std::io::Result<atomic_file::read::EntryStat> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(path)?;
    let ms = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_millis() as u64);
    Ok(atomic_file::read::EntryStat {
        mode: meta.mode(),
        uid: meta.uid(),
        modified_ms: ms,
    })
}

/// The directories a full scan opens once: every run's files are reached
/// from them by short relative lookups (no whole-path walk per file, and
/// no symlink followed below them).
pub(crate) struct Scan {
    pub(crate) runs: DirHandle,
    budgets: Option<DirHandle>,
}

/// A run loaded by a full scan, and whether its summary came from the
/// status alone (frozen facts that still hold: no proof sidecar, no live
/// fan-out count).
pub(crate) struct Scanned {
    pub(crate) summary: RunSummary,
    pub(crate) from_status_alone: Option<Alone>,
}

/// What a summary made from the status alone rests on.
pub(crate) struct Alone {
    /// The stamp of the `status.json` read.
    pub(crate) stamp: Stamp,
    /// Its frozen fan-out facts.
    pub(crate) fanout: FrozenFanout,
    /// The claims directory's stamp when the run has a budget (see
    /// [`FrozenFanout::check`]).
    pub(crate) claims: Option<Stamp>,
}

impl Scan {
    pub(crate) fn open(layout: &Layout) -> Option<Self> {
        Some(Self {
            runs: DirHandle::open(&layout.runs_dir()).ok()?,
            budgets: DirHandle::open(&layout.fanout_budgets_dir()).ok(),
        })
    }

    /// A run met by a full scan: its directory checked with one `fstatat`,
    /// its status read with one `openat2`. A finished run is summarised from
    /// that one read (there is nothing to reconcile); an active one takes
    /// the path that reconciles it.
    fn load(
        &self,
        layout: &Layout,
        name: &str,
        options: &ListOptions<'_>,
        skipped: &mut Vec<String>,
    ) -> Result<Option<RunSummary>> {
        if !self.check_dir(layout, name)? {
            return Ok(None);
        }
        Ok(self
            .load_checked(layout, name, options, skipped)?
            .map(|s| s.summary))
    }

    /// Whether `name` is a run directory to load: a safe name and a real
    /// directory (one `fstatat`), refused when another user could write it.
    pub(crate) fn check_dir(&self, layout: &Layout, name: &str) -> Result<bool> {
        if !is_safe_run_id(name) {
            return Ok(false);
        }
        let Ok(meta) = self.runs.stat(name) else {
            return Ok(false);
        };
        if !meta.is_dir() {
            return Ok(false);
        }
        atomic_file::read::check_private_mode(&layout.run_dir(name), meta.mode, meta.uid)?;
        Ok(true)
    }

    /// [`Scan::load`] of a directory [`Scan::check_dir`] accepted.
    pub(crate) fn load_checked(
        &self,
        layout: &Layout,
        name: &str,
        options: &ListOptions<'_>,
        skipped: &mut Vec<String>,
    ) -> Result<Option<Scanned>> {
        match self.read_status(layout, name, false)? {
            Some((status, stamp)) => self.finish(layout, name, status, stamp, options, skipped),
            None => Ok(None),
        }
    }

    /// The status of a directory [`Scan::check_dir`] accepted, parsed, with
    /// the [`Stamp`] of the file read; `None` when it has none. `listed`: for
    /// a text listing only (see [`status::model::parse_listed_status`]).
    pub(crate) fn read_status(
        &self,
        layout: &Layout,
        name: &str,
        listed: bool,
    ) -> Result<Option<(RunStatus, Stamp)>> {
        let rel = format!("{name}/{}", files::STATUS);
        let (bytes, stamp) = match self
            .runs
            .read_file_stamped(&rel, atomic_file::read::STATE_FILE_LIMIT)
        {
            Ok(read) => read,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let path = layout.run_dir(name).join(files::STATUS);
        let text = String::from_utf8(bytes).map_err(|e| {
            status::Error::from(atomic_file::read::ReadError::Io {
                path: path.clone(),
                source: std::io::Error::new(std::io::ErrorKind::InvalidData, e.utf8_error()),
            })
        })?;
        let status = if listed {
            status::model::parse_listed_status(&path, &text)?
        } else {
            status::model::parse_status(&path, &text)?
        };
        Ok(Some((status, stamp)))
    }

    /// [`Scan::load_checked`] of a status [`Scan::read_status`] read: an
    /// active run reconciled (read again), any other summarised.
    pub(crate) fn finish(
        &self,
        layout: &Layout,
        name: &str,
        status: RunStatus,
        stamp: Stamp,
        options: &ListOptions<'_>,
        skipped: &mut Vec<String>,
    ) -> Result<Option<Scanned>> {
        let dir = layout.run_dir(name);
        if options.reconcile && status.state.is_active() {
            let summary = load_dir(&dir, None, name, true, options.now, &options.hooks, skipped)?;
            return Ok(summary.map(|summary| Scanned {
                summary,
                from_status_alone: None,
            }));
        }
        let frozen = FrozenFanout::of(&status).filter(|_| has_frozen_facts(&status));
        let scan = Some((self, name));
        let (summary, alone, seen) =
            summarize_noting(&dir, name, status, options.hooks.fanout, scan)?;
        // Without a live source nothing was checked: check now.
        let from_status_alone = frozen.filter(|_| alone).and_then(|fanout| {
            let claims = seen.or_else(|| fanout.check(&dir, scan))?;
            Some(Alone {
                stamp,
                fanout,
                claims,
            })
        });
        Ok(Some(Scanned {
            summary,
            from_status_alone,
        }))
    }

    /// What [`Scan::finish`] makes of a finished run's status whose frozen
    /// facts still hold — the summary from the status alone — without
    /// calling a hook or writing anything, so any thread may do it. The
    /// status is handed back when the facts are missing or no longer hold.
    pub(crate) fn finish_frozen(
        &self,
        layout: &Layout,
        name: &str,
        mut status: RunStatus,
        stamp: Stamp,
    ) -> std::result::Result<Scanned, Box<RunStatus>> {
        let frozen = FrozenFanout::of(&status).filter(|_| has_frozen_facts(&status));
        let Some(fanout) = frozen else {
            return Err(Box::new(status));
        };
        let dir = layout.run_dir(name);
        let Some(claims) = fanout.check(&dir, Some((self, name))) else {
            return Err(Box::new(status));
        };
        // As `summarize_noting` does; a finished run keeps its own time.
        status.last_activity_at = status::reference::listed_last_activity(&dir, &status);
        let summary = RunSummary {
            id: run_id_of(&status, name),
            async_dir: dir,
            status,
        };
        Ok(Scanned {
            summary,
            from_status_alone: Some(Alone {
                stamp,
                fanout,
                claims,
            }),
        })
    }
}

/// The live fan-out snapshot of a run directory, or why there is none.
pub type FanoutSource<'a> = &'a dyn Fn(&Path) -> std::result::Result<Option<Value>, String>;

/// One run as listings and `status` show it. In JSON: `id`, `asyncDir`,
/// `label` ([`crate::format::run_label`]) and the status's keys.
#[derive(Debug, Clone)]
pub struct RunSummary {
    /// Run id.
    pub id: String,
    /// Run directory.
    pub async_dir: PathBuf,
    /// The status (with `processTerminal` and `runFanoutBudget` replaced by
    /// the sidecar proof and the live snapshot when those exist).
    pub status: RunStatus,
}

impl Serialize for RunSummary {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Wire<'a> {
            id: &'a str,
            async_dir: &'a Path,
            label: String,
            #[serde(flatten)]
            status: &'a RunStatus,
        }
        Wire {
            id: &self.id,
            async_dir: &self.async_dir,
            label: crate::format::run_label(&self.status),
            status: &shown_steps(&self.status),
        }
        .serialize(serializer)
    }
}

/// The status with each step's state as every view shows it
/// ([`crate::format::step_state`]: `skipped` for a step that never ran).
fn shown_steps(status: &RunStatus) -> std::borrow::Cow<'_, RunStatus> {
    let differs =
        |st: &status::model::Step| crate::format::step_state(st, status.state) != st.status;
    if !status.steps().iter().any(differs) {
        return std::borrow::Cow::Borrowed(status);
    }
    let mut shown = status.clone();
    for step in shown.steps.iter_mut().flatten() {
        step.status = crate::format::step_state(step, status.state).to_owned();
    }
    std::borrow::Cow::Owned(shown)
}

impl RunSummary {
    /// The run's proof, as sanitised for display.
    pub fn proof(&self) -> Option<ProcessTerminal> {
        let fallback = Fallback {
            run_id: Some(self.id.clone()),
            runner_process_instance_id: None,
        };
        let label = format!("{}/status.json", self.async_dir.display());
        sanitize(self.status.process_terminal.as_ref(), &fallback, &label)
    }
}

/// A run directory whose files could not be read or validated (a FIFO,
/// device or symlink in place of `status.json`, an oversize or corrupt file,
/// wrong field types, a broken fan-out snapshot). Listings show it instead of
/// failing for the whole root; in JSON it is
/// `{"id", "asyncDir", "state": "unreadable", "error"}`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UnreadableRun {
    /// The run directory's name.
    pub id: String,
    /// Run directory.
    pub async_dir: PathBuf,
    /// Always `"unreadable"`.
    pub state: &'static str,
    /// Why, one line, naming the file.
    pub error: String,
}

impl UnreadableRun {
    /// The entry of an active-index entry `name` that is no marker because
    /// it is a `kind` (directory, FIFO, symbolic link...), not a regular file.
    pub(crate) fn not_a_marker(layout: &Layout, name: &str, kind: &str) -> Self {
        let marker = layout.runs_dir().join(index::INDEX_DIR).join(name);
        Self {
            id: name.to_owned(),
            async_dir: layout.run_dir(name),
            state: "unreadable",
            error: format!(
                "active marker '{}' is not a regular file ({kind})",
                atomic_file::escape_path(&marker)
            ),
        }
    }

    /// An unreadable entry for `dir` with the reader's error.
    pub fn new(id: &str, dir: &Path, error: &status::Error) -> Self {
        Self {
            id: id.to_owned(),
            async_dir: dir.to_path_buf(),
            state: "unreadable",
            error: atomic_file::escape(&error.to_string()),
        }
    }
}

/// What a listing found.
#[derive(Debug, Default)]
pub struct Listing {
    /// The runs, sorted as the reference sorts.
    pub runs: Vec<RunSummary>,
    /// Runs that could not be read, by name.
    pub unreadable: Vec<UnreadableRun>,
    /// Repairs that could not be written (read-only root, disk full): one
    /// line each. The listing shows what it read instead.
    pub skipped_repairs: Vec<String>,
}

/// Callbacks of the launcher that the listing calls on its way.
#[derive(Default, Clone, Copy)]
pub struct Hooks<'a> {
    /// Live fan-out snapshots.
    pub fanout: Option<FanoutSource<'a>>,
    /// Called with every status the listing repaired as stale (e.g. to end
    /// the commands a dead runner left behind).
    pub on_repaired: Option<&'a dyn Fn(&RunStatus)>,
    /// Called before the stale-run check with the status of each run read
    /// live and reconciled (e.g. the launcher's observer, so that an active
    /// listing reads each status once for both): returns the status to go
    /// on with, `None` when the run has no status any more.
    pub observe: Option<ObserveHook<'a>>,
}

/// See [`Hooks::observe`].
pub type ObserveHook<'a> = &'a dyn Fn(&Path, RunStatus) -> Result<Option<RunStatus>>;

/// How to list. The default lists the active runs as they are (no repair,
/// no hooks) at time 0: set `now` to the current time in ms.
#[derive(Default)]
pub struct ListOptions<'a> {
    /// Every run (full scan) instead of the active index.
    pub all: bool,
    /// Only runs of this session.
    pub session: Option<String>,
    /// Keep the first N after sorting.
    pub limit: Option<usize>,
    /// Repair stale runs met on the way.
    pub reconcile: bool,
    /// "Now" in ms.
    pub now: u64,
    /// Launcher callbacks.
    pub hooks: Hooks<'a>,
}

/// Result of resolving a run id or prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolved {
    /// Exactly one run.
    Run(String),
    /// No run matches.
    NotFound,
    /// Several runs match the prefix.
    Ambiguous(Vec<String>),
}

/// Resolves an exact id or a unique prefix to a run directory name.
pub fn resolve(layout: &Layout, id: &str) -> Result<Resolved> {
    if !is_safe_run_id(id) {
        return Ok(Resolved::NotFound);
    }
    if let Some(dir) = exact_run_dir(layout, id) {
        atomic_file::read::check_private_dir(&dir)?;
        return Ok(Resolved::Run(id.to_owned()));
    }
    let mut matches: Vec<String> = run_names(layout)?
        .into_iter()
        .filter(|n| n.starts_with(id) && exact_run_dir(layout, n).is_some())
        .collect();
    Ok(match matches.len() {
        0 => Resolved::NotFound,
        1 => {
            atomic_file::read::check_private_dir(&layout.run_dir(&matches[0]))?;
            Resolved::Run(matches.remove(0))
        }
        _ => Resolved::Ambiguous(matches),
    })
}

/// Names of every run directory under the root, sorted.
pub fn run_names(layout: &Layout) -> Result<Vec<String>> {
    let dir = layout.runs_dir();
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err("list async runs in", &dir, e)),
    };
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n != index::INDEX_DIR)
        .collect();
    names.sort();
    Ok(names)
}

/// Loads one run's summary, reconciling it first when asked. A repair that
/// cannot be written is skipped (see [`load_noting`]).
pub fn load(
    layout: &Layout,
    id: &str,
    reconcile: bool,
    now: u64,
    hooks: &Hooks<'_>,
) -> Result<Option<RunSummary>> {
    load_noting(layout, id, reconcile, now, hooks, &mut Vec::new())
}

/// [`load`] that pushes one line to `skipped` for a stale repair that could
/// not be written (read-only root, disk full); the run is then shown as read.
pub fn load_noting(
    layout: &Layout,
    id: &str,
    reconcile: bool,
    now: u64,
    hooks: &Hooks<'_>,
    skipped: &mut Vec<String>,
) -> Result<Option<RunSummary>> {
    match exact_run_dir(layout, id) {
        Some(dir) => load_dir(&dir, None, id, reconcile, now, hooks, skipped),
        None => Ok(None),
    }
}

/// [`load`] of a run directory already resolved by [`exact_run_dir`].
fn load_dir(
    dir: &Path,
    meta: Option<&std::fs::Metadata>,
    id: &str,
    reconcile: bool,
    now: u64,
    hooks: &Hooks<'_>,
    skipped: &mut Vec<String>,
) -> Result<Option<RunSummary>> {
    // Another user could have planted the files of a shared run directory.
    match meta {
        Some(meta) => atomic_file::read::check_private_meta(dir, meta)?,
        None => atomic_file::read::check_private_dir(dir)?,
    }
    let status = if reconcile {
        let Some(read) = read_status(dir)? else {
            return Ok(None);
        };
        let read = match hooks.observe {
            Some(observe) => match observe(dir, read)? {
                Some(status) => status,
                None => return Ok(None),
            },
            None => read,
        };
        match reconcile::reconcile_read(dir, read, reconcile::Options::at(now)) {
            Ok(outcome) => {
                if let (reconcile::Outcome::Repaired { status, .. }, Some(hook)) =
                    (&outcome, hooks.on_repaired)
                {
                    hook(status);
                }
                outcome.status().cloned()
            }
            // The status reads but the repair could not be written: a
            // read-only command must not need a writable root.
            Err(write) => {
                let status = read_status(dir)?;
                skipped.push(format!(
                    "skipped the stale-run repair of '{}': {}",
                    atomic_file::escape(id),
                    atomic_file::escape(&write.to_string())
                ));
                status
            }
        }
    } else {
        read_status(dir)?
    };
    status
        .map(|s| summarize(dir, id, s, hooks.fanout, None))
        .transpose()
}

fn summarize(
    dir: &Path,
    id: &str,
    status: RunStatus,
    fanout: Option<FanoutSource<'_>>,
    scan: Option<(&Scan, &str)>,
) -> Result<RunSummary> {
    summarize_noting(dir, id, status, fanout, scan).map(|(summary, _, _)| summary)
}

/// [`summarize`], saying whether the summary came from the status alone:
/// frozen facts whose fan-out counts still hold, so neither the proof
/// sidecar nor a live fan-out count was read; and, when the fan-out check
/// ran and held, what [`FrozenFanout::check`] saw.
fn summarize_noting(
    dir: &Path,
    id: &str,
    mut status: RunStatus,
    fanout: Option<FanoutSource<'_>>,
    scan: Option<(&Scan, &str)>,
) -> Result<(RunSummary, bool, Option<Option<Stamp>>)> {
    // Our own record of the runner id first: a repaired status may carry the
    // placeholder id `observer-unavailable` in its proof projection.
    let runner = status.runner_process_instance_id.clone().or_else(|| {
        let proof = status.process_terminal.as_ref()?;
        proof
            .get("runnerProcessInstanceId")?
            .as_str()
            .map(str::to_owned)
    });
    let frozen = has_frozen_facts(&status);
    let fallback = Fallback {
        run_id: Some(run_id_of(&status, id)),
        runner_process_instance_id: runner,
    };
    if !frozen && let Some(proof) = read_proof(dir, &fallback) {
        status.process_terminal = Some(proof.to_value());
    }
    status.last_activity_at = status::reference::listed_last_activity(dir, &status);
    let mut alone = frozen;
    let mut seen = None;
    if fanout.is_some() {
        seen = FrozenFanout::of(&status)
            .filter(|_| frozen)
            .and_then(|f| f.check(dir, scan));
    }
    if let Some(source) = fanout
        && seen.is_none()
    {
        alone = false;
        // One run's missing or corrupt budget must not fail the listing of
        // every other run (the reference throws here): its fan-out line says
        // "unavailable" and why, and the stale snapshot is not shown.
        match source(dir) {
            Ok(Some(live)) => status.run_fanout_budget = Some(live),
            Ok(None) => {}
            Err(reason) => {
                status.run_fanout_budget = None;
                status
                    .extra
                    .insert(FANOUT_UNAVAILABLE.into(), Value::String(reason));
            }
        }
    }
    let summary = RunSummary {
        id: run_id_of(&status, id),
        async_dir: dir.to_path_buf(),
        status,
    };
    Ok((summary, alone, seen))
}

fn run_id_of(status: &RunStatus, dir_name: &str) -> String {
    if status.run_id.is_empty() {
        dir_name.to_owned()
    } else {
        status.run_id.clone()
    }
}

/// Lists runs: the active index by default (never reading finished runs'
/// history), every run with `all`. Sorted as the reference sorts.
///
/// One run that cannot be read never fails the listing: it lands in
/// [`Listing::unreadable`]. Marker releases and stale repairs that cannot be
/// written land in [`Listing::skipped_repairs`].
pub fn list(layout: &Layout, options: &ListOptions<'_>) -> Result<Listing> {
    let rows = list_rows(layout, options, |summary| summary)?;
    Ok(Listing {
        runs: rows.rows,
        unreadable: rows.unreadable,
        skipped_repairs: rows.skipped_repairs,
    })
}

/// What [`list_rows`] found: one `T` per listed run, in listing order.
#[derive(Debug)]
pub struct Rows<T> {
    /// The rows, sorted as the reference sorts.
    pub rows: Vec<T>,
    /// Runs that could not be read, by name.
    pub unreadable: Vec<UnreadableRun>,
    /// Repairs that could not be written, one line each.
    pub skipped_repairs: Vec<String>,
}

/// [`list`] that turns every kept run into a row as soon as it is read, so
/// a caller that needs only a rendered line (or a name) per run never holds
/// every run's whole status at once.
pub fn list_rows<T>(
    layout: &Layout,
    options: &ListOptions<'_>,
    mut row: impl FnMut(RunSummary) -> T,
) -> Result<Rows<T>> {
    let mut unreadable = Vec::new();
    let names = if options.all {
        run_names(layout)?
    } else {
        let index = index::read_index_entries(&layout.runs_dir())?;
        // A damaged marker still names a run that may be going: show it.
        for (name, kind) in &index.not_markers {
            unreadable.push(UnreadableRun::not_a_marker(layout, name, kind));
        }
        index.markers
    };
    let mut keyed: Vec<(u8, std::cmp::Reverse<u64>, T)> = Vec::new();
    let mut skipped = Vec::new();
    let scan = Scan::open(layout);
    for name in names {
        let loaded = match &scan {
            // A full scan's names are directories (by the directory entry's type).
            Some(scan) if options.all => {
                let loaded = scan.load(layout, &name, options, &mut skipped);
                (loaded, layout.run_dir(&name))
            }
            Some(_) => match run_dir_under(layout, &name) {
                Some((dir, meta)) => {
                    let loaded = load_dir(
                        &dir,
                        Some(&meta),
                        &name,
                        options.reconcile,
                        options.now,
                        &options.hooks,
                        &mut skipped,
                    );
                    (loaded, dir)
                }
                None => (Ok(None), layout.run_dir(&name)),
            },
            None => (Ok(None), layout.run_dir(&name)),
        };
        let (loaded, dir) = loaded;
        let mut summary = match loaded {
            Ok(Some(summary)) => summary,
            Ok(None) => {
                if !options.all {
                    release(&dir, &name, &mut skipped);
                }
                continue;
            }
            Err(e) => {
                unreadable.push(UnreadableRun::new(&name, &dir, &e));
                continue;
            }
        };
        let over = !summary.status.state.is_active();
        if !options.all && over && is_observed(&summary) {
            // A monitor that died between its proof and the release leaves
            // the marker behind; the observed proof still releases it.
            release(&dir, &name, &mut skipped);
        }
        // Over by its status, but not proven over (a frozen or slow monitor):
        // it still holds its marker and slot, so the active listing shows it.
        let finishing = !options.all && over && !is_final(&summary);
        if finishing {
            summary
                .status
                .extra
                .insert(FINISHING.into(), Value::Bool(true));
        }
        if keep(&summary, options)
            || (finishing && keep_by(&summary, true, options.session.as_deref()))
        {
            let rank = state_rank(&summary.status);
            let time = std::cmp::Reverse(summary.status.sort_time());
            keyed.push((rank, time, row(summary)));
        }
    }
    // Stable: runs of equal rank and time stay in name order.
    keyed.sort_by_key(|(rank, time, _)| (*rank, *time));
    if let Some(limit) = options.limit {
        keyed.truncate(limit);
    }
    Ok(Rows {
        rows: keyed.into_iter().map(|(_, _, row)| row).collect(),
        unreadable,
        skipped_repairs: skipped,
    })
}

/// Whether the run's proof is final: observed, or the observer's
/// `not-started` record.
fn is_final(summary: &RunSummary) -> bool {
    is_observed(summary)
        || summary
            .proof()
            .is_some_and(|p| p.state == status::proof::ProofState::NotStarted)
}

fn is_observed(summary: &RunSummary) -> bool {
    if has_frozen_facts(&summary.status) {
        return true;
    }
    summary
        .proof()
        .is_some_and(|p| p.state == status::proof::ProofState::Observed)
}

/// Releases a marker, noting (not failing on) a release that cannot be written.
pub(crate) fn release(dir: &Path, name: &str, skipped: &mut Vec<String>) {
    if let Err(e) = index::release_marker(dir) {
        skipped.push(format!(
            "skipped releasing the active marker of '{}': {}",
            atomic_file::escape(name),
            atomic_file::escape(&e.to_string())
        ));
    }
}

pub(crate) fn keep(summary: &RunSummary, options: &ListOptions<'_>) -> bool {
    keep_by(summary, options.all, options.session.as_deref())
}

/// [`keep`] given what it asks of the options.
pub(crate) fn keep_by(summary: &RunSummary, all: bool, session: Option<&str>) -> bool {
    let status = &summary.status;
    if status.display_dismissed_at.is_some() || (!all && !status.state.is_active()) {
        return false;
    }
    session.is_none_or(|s| s.is_empty() || status.session_id.as_deref() == Some(s))
}

pub(crate) fn state_rank(status: &RunStatus) -> u8 {
    use status::RunState::*;
    match status.state {
        Running => 0,
        Queued => 1,
        Failed | Stopped | Paused => 2,
        Complete => 3,
        Rejected => 4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use status::model::{RunState, write_status};

    #[test]
    fn only_a_directory_mode_is_a_directory() {
        assert!(is_dir_mode(0o040_700));
        assert!(is_dir_mode(0o040_000));
        for other in [0o100_600, 0o120_777, 0o010_600, 0o140_755, 0o060_600] {
            assert!(!is_dir_mode(other), "{other:o}");
        }
    }

    fn run(layout: &Layout, id: &str, state: RunState, marker: bool, update: u64) {
        let dir = layout.run_dir(id);
        atomic_file::ensure_private_dir(&dir).unwrap();
        let mut status = RunStatus::new(id, state);
        status.last_update = Some(update);
        write_status(&dir, &status).unwrap();
        if marker {
            index::create_marker(&dir).unwrap();
        }
    }

    fn options(all: bool) -> ListOptions<'static> {
        ListOptions {
            all,
            session: None,
            limit: None,
            reconcile: false,
            now: 0,
            hooks: Hooks::default(),
        }
    }

    #[test]
    fn active_listing_reads_only_markers() {
        let tmp = tempfile::tempdir().unwrap();
        let layout = Layout::new(tmp.path());
        for i in 0..200 {
            run(&layout, &format!("done-{i}"), RunState::Complete, false, i);
        }
        std::fs::write(layout.run_dir("done-7").join("status.json"), "{broken").unwrap();
        run(&layout, "live", RunState::Running, true, 5);
        let runs = list(&layout, &options(false)).unwrap().runs;
        assert_eq!(
            runs.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
            vec!["live"]
        );
        let all = list(&layout, &options(true)).unwrap();
        assert_eq!(all.runs.len(), 200, "the full scan lists every other run");
        assert_eq!(all.unreadable.len(), 1, "and meets the broken file");
        assert_eq!(all.unreadable[0].id, "done-7");
    }

    #[test]
    fn one_unreadable_run_does_not_hide_the_others() {
        let tmp = tempfile::tempdir().unwrap();
        let layout = Layout::new(tmp.path());
        run(&layout, "fifo", RunState::Running, true, 1);
        run(&layout, "corrupt", RunState::Running, true, 1);
        run(&layout, "types", RunState::Running, true, 1);
        run(&layout, "big", RunState::Running, true, 1);
        run(&layout, "good", RunState::Running, true, 2);
        let fifo = layout.run_dir("fifo").join("status.json");
        std::fs::remove_file(&fifo).unwrap();
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.unwrap().success());
        std::fs::write(layout.run_dir("corrupt").join("status.json"), "{").unwrap();
        std::fs::write(
            layout.run_dir("types").join("status.json"),
            r#"{"state":"running","steps":"x"}"#,
        )
        .unwrap();
        let big = std::fs::File::create(layout.run_dir("big").join("status.json")).unwrap();
        big.set_len(atomic_file::read::STATE_FILE_LIMIT + 1)
            .unwrap();
        for all in [false, true] {
            let mut options = options(all);
            options.reconcile = true;
            let listing = list(&layout, &options).unwrap();
            assert_eq!(
                listing
                    .runs
                    .iter()
                    .map(|r| r.id.as_str())
                    .collect::<Vec<_>>(),
                vec!["good"]
            );
            let errors: Vec<(&str, &str)> = listing
                .unreadable
                .iter()
                .map(|u| (u.id.as_str(), u.error.as_str()))
                .collect();
            assert_eq!(errors.len(), 4, "{errors:?}");
            assert!(errors[0].0 == "big" && errors[0].1.contains("exceeds the 16 MiB limit"));
            assert!(errors[1].0 == "corrupt" && errors[1].1.contains("failed to parse"));
            assert!(errors[2].0 == "fifo" && errors[2].1.contains("not a regular file (FIFO)"));
            assert!(errors[3].0 == "types" && errors[3].1.contains("steps"));
            let json = serde_json::to_value(&listing.unreadable[2]).unwrap();
            assert_eq!(json["state"], "unreadable");
            assert!(json["asyncDir"].as_str().unwrap().ends_with("fifo"));
            assert!(listing.unreadable.iter().all(|u| !u.error.contains('\n')));
            assert!(layout.run_dir("fifo").join("status.json").exists());
        }
    }

    #[test]
    fn sorted_running_first_then_newest() {
        let tmp = tempfile::tempdir().unwrap();
        let layout = Layout::new(tmp.path());
        run(&layout, "a", RunState::Complete, false, 9);
        run(&layout, "b", RunState::Failed, false, 1);
        run(&layout, "c", RunState::Running, true, 1);
        run(&layout, "d", RunState::Failed, false, 5);
        let ids: Vec<_> = list(&layout, &options(true))
            .unwrap()
            .runs
            .into_iter()
            .map(|r| r.id)
            .collect();
        assert_eq!(ids, vec!["c", "d", "b", "a"]);
    }

    /// A finished run whose listing facts were frozen with `used` claims of
    /// a budget of 4 whose claims directory is `claims`.
    fn frozen_run(layout: &Layout, id: &str, claims: &Path, used: u64) {
        let dir = layout.run_dir(id);
        atomic_file::ensure_private_dir(&dir).unwrap();
        atomic_file::ensure_private_dir(claims).unwrap();
        atomic_file::write_private(&dir.join(files::RUN_FANOUT_BUDGET), b"{}").unwrap();
        let mut status = RunStatus::new(id, RunState::Complete);
        status.process_terminal = Some(serde_json::json!({"state": "observed", "runId": id}));
        status.run_fanout_budget =
            Some(serde_json::json!({"used": used, "limit": 4, "remaining": 4 - used}));
        let facts =
            serde_json::json!({"frozenAt": status::now_ms() + 1000, "fanoutClaimsDir": claims});
        status.extra.insert(LISTING_FACTS.into(), facts);
        write_status(&dir, &status).unwrap();
    }

    #[test]
    fn frozen_facts_are_used_until_a_later_claim_or_a_replaced_descriptor() {
        let tmp = tempfile::tempdir().unwrap();
        let layout = Layout::new(tmp.path());
        let claims = tmp.path().join("budget/claims");
        frozen_run(&layout, "f", &claims, 1);
        let asked = std::cell::Cell::new(0);
        let live = |_: &Path| {
            asked.set(asked.get() + 1);
            Ok(Some(
                serde_json::json!({"used": 2, "limit": 4, "remaining": 2}),
            ))
        };
        let listed = || {
            let mut options = options(true);
            options.hooks.fanout = Some(&live);
            let runs = list(&layout, &options).unwrap().runs;
            runs[0].status.run_fanout_budget.as_ref().unwrap()["used"]
                .as_u64()
                .unwrap()
        };
        assert_eq!(listed(), 1, "frozen: taken from the status");
        assert_eq!(asked.get(), 0, "and the budget not counted");
        // A nested run claimed slot 1 after the freeze: counted live again.
        std::fs::write(claims.join("000001.json"), "{}").unwrap();
        assert_eq!(listed(), 2);
        assert_eq!(asked.get(), 1);
        std::fs::remove_file(claims.join("000001.json")).unwrap();
        assert_eq!(listed(), 1);
        assert_eq!(asked.get(), 1);
        // The budget directory is gone: live (which says why).
        std::fs::remove_dir_all(&claims).unwrap();
        assert_eq!(listed(), 2);
        assert_eq!(asked.get(), 2);
        // A descriptor rewritten after the freeze: live too.
        atomic_file::ensure_private_dir(&claims).unwrap();
        let descriptor = layout.run_dir("f").join(files::RUN_FANOUT_BUDGET);
        let later = std::time::SystemTime::now() + std::time::Duration::from_secs(60);
        std::fs::File::options()
            .write(true)
            .open(&descriptor)
            .unwrap()
            .set_modified(later)
            .unwrap();
        assert_eq!(listed(), 2);
        assert_eq!(asked.get(), 3);
    }

    #[test]
    fn resolves_prefixes() {
        let tmp = tempfile::tempdir().unwrap();
        let layout = Layout::new(tmp.path());
        run(&layout, "abc1", RunState::Complete, false, 1);
        run(&layout, "abc2", RunState::Complete, false, 1);
        assert_eq!(
            resolve(&layout, "abc1").unwrap(),
            Resolved::Run("abc1".into())
        );
        assert!(matches!(resolve(&layout, "abc").unwrap(), Resolved::Ambiguous(v) if v.len() == 2));
        assert_eq!(resolve(&layout, "zzz").unwrap(), Resolved::NotFound);
        assert_eq!(resolve(&layout, "../etc").unwrap(), Resolved::NotFound);
    }

    #[test]
    fn symlinked_run_dir_out_of_root_is_not_a_run() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let layout = Layout::new(tmp.path());
        atomic_file::ensure_private_dir(&layout.runs_dir()).unwrap();
        std::os::unix::fs::symlink(outside.path(), layout.run_dir("evil")).unwrap();
        assert_eq!(resolve(&layout, "evil").unwrap(), Resolved::NotFound);
    }
}
