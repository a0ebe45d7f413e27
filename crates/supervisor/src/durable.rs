//! State writes that survive a full or read-only root.
//!
//! A run whose COMMAND exited must not turn `failed` because `status.json`
//! could not be written for a while. The runner therefore:
//!
//! * reserves room for its evidence when it starts ([`reserve_evidence`]):
//!   `events.jsonl` and `runner.stderr.log` get space allocated beyond their
//!   end (`fallocate` with `FALLOC_FL_KEEP_SIZE`), so the step-end events
//!   (exit code per step) and the log lines below still fit on a full disk;
//! * retries every state write that fails with `ENOSPC`/`EDQUOT` (full) or
//!   `EROFS` (the root was remounted read-only) ([`retry`]): backoff from
//!   50 ms doubling to 1 s, for at most `SUBAGENTS_WRITE_RETRY_MS` (default
//!   30 s), logging to its stderr.
//!
//! The monitor finalizes the proof the same way ([`until_proof_written`]).
//! If the root does not come back in time, the runner hands its outcome to
//! its monitor (`crate::handover`) and exits; the monitor writes it when
//! the root takes it. The step-end events stay too (on a full disk), so
//! whoever finalizes the run later (a `reconcile`/`list`/`status` once the
//! root is writable and the monitor gone) restores the outcome from the
//! evidence instead of declaring the run failed.

use std::fmt::Display;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use status::layout::files;

/// Environment override of the retry budget, in milliseconds.
pub const WRITE_RETRY_ENV: &str = "SUBAGENTS_WRITE_RETRY_MS";

/// Bytes reserved beyond the end of each evidence file.
pub const EVIDENCE_RESERVE: i64 = 16 * 1024;

const DEFAULT_BUDGET: Duration = Duration::from_secs(30);
const FIRST_PAUSE: Duration = Duration::from_millis(50);
const MAX_PAUSE: Duration = Duration::from_secs(1);

/// Why the root cannot take a write for now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blocked {
    /// `ENOSPC` or `EDQUOT`.
    Full,
    /// `EROFS`.
    ReadOnly,
}

impl Blocked {
    fn of(e: &std::io::Error) -> Option<Self> {
        match e.raw_os_error()? {
            libc::ENOSPC | libc::EDQUOT => Some(Self::Full),
            libc::EROFS => Some(Self::ReadOnly),
            _ => None,
        }
    }

    /// How the retry log names the outage.
    fn retrying(self) -> &'static str {
        match self {
            Self::Full => "retrying while space is short",
            Self::ReadOnly => "retrying while the root is read-only",
        }
    }

    fn retries(self) -> &'static str {
        match self {
            Self::Full => "full-disk",
            Self::ReadOnly => "read-only",
        }
    }
}

/// An error that can say whether the root was full or read-only, i.e.
/// whether the same write may go through later.
pub trait Unwritable {
    /// The outage behind the error; `None` for any other failure.
    fn blocked(&self) -> Option<Blocked>;
}

impl Unwritable for atomic_file::Error {
    fn blocked(&self) -> Option<Blocked> {
        Blocked::of(&self.source)
    }
}

impl Unwritable for status::Error {
    fn blocked(&self) -> Option<Blocked> {
        match self {
            status::Error::Io(e) => e.blocked(),
            // Opening `.status.lock` (created if missing) is a write on a
            // read-only root; other read failures are not retried.
            status::Error::Read(atomic_file::read::ReadError::Io { source, .. }) => {
                Blocked::of(source)
            }
            _ => None,
        }
    }
}

impl Unwritable for std::io::Error {
    fn blocked(&self) -> Option<Blocked> {
        Blocked::of(self)
    }
}

fn budget() -> Duration {
    std::env::var(WRITE_RETRY_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(DEFAULT_BUDGET, Duration::from_millis)
}

/// When the current full-disk outage began, as this process saw it: all
/// writes of one outage share one budget, so a disk that stays full costs
/// the budget once, not once per write.
static OUTAGE: Mutex<Option<Instant>> = Mutex::new(None);

fn outage_deadline() -> Instant {
    let mut outage = OUTAGE.lock().unwrap_or_else(|e| e.into_inner());
    *outage.get_or_insert_with(Instant::now) + budget()
}

fn outage_over() {
    *OUTAGE.lock().unwrap_or_else(|e| e.into_inner()) = None;
}

/// Runs `write`; while it fails because the root is full or read-only,
/// logs to stderr and tries again with backoff, within the retry budget of
/// the current outage. Other errors, and the last such error once the budget
/// is spent, are returned.
pub fn retry<T, E: Unwritable + Display>(
    what: &str,
    mut write: impl FnMut() -> Result<T, E>,
) -> Result<T, E> {
    let mut pause = FIRST_PAUSE;
    let mut failures = 0u32;
    let mut last = None;
    loop {
        match write() {
            Ok(value) => {
                if let Some(blocked) = last {
                    let kind = Blocked::retries(blocked);
                    eprintln!("subagents: wrote {what} after {failures} {kind} retries");
                }
                outage_over();
                return Ok(value);
            }
            Err(e) => {
                let Some(blocked) = e.blocked() else {
                    return Err(e);
                };
                if Instant::now() + pause > outage_deadline() {
                    eprintln!(
                        "subagents: failed to write {what}: {e}; giving up after {failures} retries"
                    );
                    return Err(e);
                }
                if failures == 0 {
                    eprintln!(
                        "subagents: failed to write {what}: {e}; {}",
                        blocked.retrying()
                    );
                }
                failures += 1;
                last = Some(blocked);
                // Backoff between attempts; nothing signals that the root is back.
                std::thread::sleep(pause);
                pause = (pause * 2).min(MAX_PAUSE);
            }
        }
    }
}

/// The monitor's side: runs `finalize` (which repairs the status and
/// writes the proof and what follows it, best effort) and runs it again,
/// with the backoff of [`retry`], while `process-terminal.json` is still
/// missing or `status.json` still active, and the run's file system is
/// short of space or read-only. `finalize` must be idempotent (the proof
/// finalizer and the repair are).
pub fn until_proof_written(run_dir: &Path, finalize: impl FnMut()) {
    until_finalized(run_dir, finalize, blocked_at);
}

/// [`until_proof_written`] with the file system's state told by `blocked`.
/// A try made while the root was blocked counts as blocked even if the
/// root is back by the time it is judged: it failed for the outage, and
/// only the next try can write (the root may come back during a try).
fn until_finalized(
    run_dir: &Path,
    mut finalize: impl FnMut(),
    mut blocked: impl FnMut(&Path) -> Option<Blocked>,
) {
    let _ = retry("process-terminal.json", || {
        let before = blocked(run_dir);
        finalize();
        if finalized(run_dir) {
            return Ok(());
        }
        match blocked(run_dir).or(before) {
            None => Ok(()),
            Some(Blocked::Full) => Err(std::io::Error::from_raw_os_error(libc::ENOSPC)),
            Some(Blocked::ReadOnly) => Err(std::io::Error::from_raw_os_error(libc::EROFS)),
        }
    });
}

/// The proof is on disk and the status no longer active.
fn finalized(run_dir: &Path) -> bool {
    let settled = status::model::read_status(run_dir)
        .ok()
        .flatten()
        .is_none_or(|s| !s.state.is_active());
    settled && run_dir.join(files::PROOF).exists()
}

/// Whether the file system of `dir` is mounted read-only or has less than
/// 64 KiB available to us (`None` also when that cannot be told).
fn blocked_at(dir: &Path) -> Option<Blocked> {
    let stat = statvfs(dir)?;
    if stat.f_flag & libc::ST_RDONLY != 0 {
        return Some(Blocked::ReadOnly);
    }
    below_floor(stat.f_bavail, stat.f_frsize).then_some(Blocked::Full)
}

fn statvfs(dir: &Path) -> Option<libc::statvfs> {
    let path = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: statvfs(3) fills the zeroed struct we own from a valid C string.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(path.as_ptr(), &mut stat) } != 0 {
        return None;
    }
    Some(stat)
}

/// What [`blocked_at`] calls short of space: less than 64 KiB.
const SPACE_FLOOR: u64 = 64 * 1024;

/// `blocks` available blocks of `block_size` bytes are under [`SPACE_FLOOR`].
fn below_floor(blocks: u64, block_size: u64) -> bool {
    blocks.saturating_mul(block_size) < SPACE_FLOOR
}

/// Reserves [`EVIDENCE_RESERVE`] bytes beyond the end of `events.jsonl` and
/// `runner.stderr.log` (best effort: a file system without `fallocate`
/// simply gets no reservation).
pub fn reserve_evidence(run_dir: &Path) {
    for name in [files::EVENTS, files::RUNNER_STDERR] {
        let _ = reserve_tail(&run_dir.join(name), EVIDENCE_RESERVE);
    }
}

fn reserve_tail(path: &Path, bytes: i64) -> std::io::Result<()> {
    let file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(atomic_file::FILE_MODE)
        .open(path)?;
    let end = file.metadata()?.len() as i64;
    // SAFETY: fallocate(2) on a descriptor we own; KEEP_SIZE leaves the
    // visible length (and so every reader) unchanged.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), libc::FALLOC_FL_KEEP_SIZE, end, bytes) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_a_full_disk_until_the_write_succeeds() {
        let mut attempts = 0;
        let result: Result<u32, std::io::Error> = retry("status", || {
            attempts += 1;
            if attempts < 3 {
                Err(std::io::Error::from_raw_os_error(libc::ENOSPC))
            } else {
                Ok(7)
            }
        });
        assert_eq!(result.unwrap(), 7);
        assert_eq!(attempts, 3);
    }

    #[test]
    fn other_errors_are_not_retried() {
        let mut attempts = 0;
        let result: Result<(), std::io::Error> = retry("status", || {
            attempts += 1;
            Err(std::io::Error::from_raw_os_error(libc::EACCES))
        });
        assert_eq!(result.unwrap_err().raw_os_error(), Some(libc::EACCES));
        assert_eq!(attempts, 1);
    }

    #[test]
    fn the_reservation_keeps_the_visible_length() {
        let dir = tempfile_dir();
        std::fs::write(dir.join(files::EVENTS), b"{}\n").unwrap();
        reserve_evidence(&dir);
        assert_eq!(std::fs::read(dir.join(files::EVENTS)).unwrap(), b"{}\n");
        assert_eq!(
            std::fs::metadata(dir.join(files::RUNNER_STDERR))
                .unwrap()
                .len(),
            0
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_full_disk_a_quota_or_a_read_only_root_block_and_nothing_else() {
        let io = |code| std::io::Error::from_raw_os_error(code);
        let file = |code| atomic_file::Error {
            op: "write",
            path: "/x".into(),
            source: io(code),
        };
        for (code, blocked) in [
            (libc::ENOSPC, Blocked::Full),
            (libc::EDQUOT, Blocked::Full),
            (libc::EROFS, Blocked::ReadOnly),
        ] {
            assert_eq!(io(code).blocked(), Some(blocked));
            assert_eq!(file(code).blocked(), Some(blocked));
            assert_eq!(status::Error::Io(file(code)).blocked(), Some(blocked));
        }
        assert_eq!(io(libc::EACCES).blocked(), None);
        assert_eq!(file(libc::EIO).blocked(), None);
        assert_eq!(status::Error::Io(file(libc::EIO)).blocked(), None);
        // The status lock cannot be opened on a read-only root.
        let lock = |code| {
            status::Error::Read(atomic_file::read::ReadError::Io {
                path: "/x/.status.lock".into(),
                source: io(code),
            })
        };
        assert_eq!(lock(libc::EROFS).blocked(), Some(Blocked::ReadOnly));
        assert_eq!(lock(libc::ENOENT).blocked(), None);
        let invalid = status::Error::Invalid {
            what: "status",
            path: "/x".into(),
            reason: "bad".into(),
        };
        assert_eq!(invalid.blocked(), None);
    }

    #[test]
    fn space_is_short_below_64_kib() {
        assert!(below_floor(15, 4096));
        assert!(!below_floor(16, 4096));
        assert!(below_floor(0, 4096));
        assert!(!below_floor(u64::MAX, 4096));
        // A file system that has room, and a path that cannot be checked.
        assert_eq!(blocked_at(&std::env::temp_dir()), None);
        assert_eq!(blocked_at(Path::new("/nonexistent/durable-test")), None);
    }

    #[test]
    fn the_reservation_allocates_room_beyond_the_end() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let events = dir.path().join(files::EVENTS);
        std::fs::write(&events, b"{}\n").unwrap();
        reserve_evidence(dir.path());
        for name in [files::EVENTS, files::RUNNER_STDERR] {
            let meta = std::fs::metadata(dir.path().join(name)).unwrap();
            // 16 KiB: room for the step-end events of a run (module docs).
            assert!(
                meta.blocks() * 512 >= meta.len() + 16 * 1024,
                "{name}: {} bytes allocated",
                meta.blocks() * 512
            );
        }
        // An allocation that was made says so, and one that cannot be made too.
        assert!(reserve_tail(&events, 16).is_ok());
        assert!(reserve_tail(Path::new("/dev/null"), 16).is_err());
    }

    /// Names the case [`retrying_process`] plays in a copy of this binary.
    const CASE_ENV: &str = "SUBAGENTS_DURABLE_TEST_CASE";

    /// Not a test of its own: the body of a copy of this test binary started
    /// by the tests below with a retry budget of its own in its environment
    /// (the budget and the outage are per process). Prints what it saw.
    #[test]
    fn retrying_process() {
        let Ok(case) = std::env::var(CASE_ENV) else {
            return;
        };
        let full = || std::io::Error::from_raw_os_error(libc::ENOSPC);
        // Fails `n` times for lack of space, then succeeds (never for `None`).
        let failing = |n: Option<u32>| {
            let mut attempts = 0u32;
            let result = retry("status.json", || {
                attempts += 1;
                match n {
                    Some(n) if attempts > n => Ok(()),
                    _ => Err(full()),
                }
            });
            (result.is_ok(), attempts)
        };
        match case.as_str() {
            "log" => {
                println!("{:?}", failing(Some(1)));
                println!("{:?}", failing(Some(0)));
            }
            "read-only" => {
                let mut attempts = 0u32;
                let result = retry("status.json", || {
                    attempts += 1;
                    match attempts {
                        1 => Err(std::io::Error::from_raw_os_error(libc::EROFS)),
                        _ => Ok(()),
                    }
                });
                println!("{:?}", (result.is_ok(), attempts));
            }
            "budget" => println!("{:?}", failing(None)),
            "outage" => {
                println!("{:?}", failing(Some(4)));
                println!("{:?}", failing(None));
            }
            "proof" => {
                let dir = tempfile::tempdir().unwrap();
                let mut calls = 0;
                until_proof_written(dir.path(), || calls += 1);
                println!("{calls}");
            }
            "proof-blocked" => {
                // `/proc` reports no block available: a root short of space
                // where the proof can never be written.
                let mut calls = 0;
                until_proof_written(Path::new("/proc"), || calls += 1);
                println!("{calls}");
            }
            other => panic!("unknown case {other}"),
        }
    }

    /// Runs [`retrying_process`] as `case` with a retry budget of `budget_ms`:
    /// its stdout lines and its stderr lines from `subagents`.
    fn run_case(case: &str, budget_ms: u64) -> (Vec<String>, Vec<String>) {
        // The process tests reap any child; ours must not be taken.
        let _serial = crate::procs::tests::serial();
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "durable::tests::retrying_process", "--nocapture"])
            .env(CASE_ENV, case)
            .env(WRITE_RETRY_ENV, budget_ms.to_string())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stdout}{stderr}");
        // What the case printed (results, call counts), without libtest's lines.
        let results = stdout
            .lines()
            .filter(|l| l.starts_with('(') || l.parse::<u32>().is_ok())
            .map(str::to_owned)
            .collect();
        let log = stderr
            .lines()
            .filter(|l| l.starts_with("subagents:"))
            .map(str::to_owned)
            .collect();
        (results, log)
    }

    #[test]
    fn a_full_disk_is_logged_when_it_starts_and_when_the_write_goes_through() {
        let (results, log) = run_case("log", 30_000);
        assert_eq!(results, ["(true, 2)", "(true, 1)"]);
        assert_eq!(
            log,
            [
                "subagents: failed to write status.json: No space left on device (os error 28); retrying while space is short",
                "subagents: wrote status.json after 1 full-disk retries",
            ]
        );
    }

    #[test]
    fn a_read_only_root_is_retried_and_logged_as_such() {
        let (results, log) = run_case("read-only", 30_000);
        assert_eq!(results, ["(true, 2)"]);
        assert_eq!(
            log,
            [
                "subagents: failed to write status.json: Read-only file system (os error 30); retrying while the root is read-only",
                "subagents: wrote status.json after 1 read-only retries",
            ]
        );
    }

    #[test]
    fn a_retry_never_sleeps_past_its_budget() {
        // 120 ms: the first pause (50 ms) fits, the second (100 ms) does not.
        let (results, log) = run_case("budget", 120);
        assert_eq!(results, ["(false, 2)"]);
        assert_eq!(
            log.last().map(String::as_str),
            Some(
                "subagents: failed to write status.json: No space left on device (os error 28); giving up after 1 retries"
            )
        );
        // No budget: the first full disk is the last.
        let (results, _) = run_case("budget", 0);
        assert_eq!(results, ["(false, 1)"]);
    }

    #[test]
    fn a_write_that_goes_through_ends_the_outage_and_the_next_gets_the_whole_budget() {
        // The first outage spends 750 ms of the second's 1 s budget; ended,
        // it leaves the next outage all of it: pauses of 50, 100, 200 and
        // 400 ms fit, 800 ms does not.
        let (results, _) = run_case("outage", 1_000);
        assert_eq!(results, ["(true, 5)", "(false, 5)"]);
    }

    #[test]
    fn the_monitor_finalizes_once_when_space_is_not_short() {
        let (results, _) = run_case("proof", 120);
        assert_eq!(results, ["1"]);
    }

    #[test]
    fn the_monitor_finalizes_again_while_the_root_is_short_and_the_proof_missing() {
        // 120 ms: a second try after the first 50 ms pause, no third.
        let (results, _) = run_case("proof-blocked", 120);
        assert_eq!(results, ["2"]);
    }

    #[test]
    fn a_try_that_met_the_outage_is_tried_again_when_the_root_came_back_meanwhile() {
        let dir = tempfile::tempdir().unwrap();
        let proof = dir.path().join(files::PROOF);
        // Read-only before the first try, writable by the time it failed.
        let mut looks = 0;
        let blocked = |_: &Path| {
            looks += 1;
            (looks == 1).then_some(Blocked::ReadOnly)
        };
        let mut tries = 0;
        let finalize = || {
            tries += 1;
            if tries == 2 {
                std::fs::write(&proof, "{}").unwrap();
            }
        };
        until_finalized(dir.path(), finalize, blocked);
        assert_eq!(tries, 2, "the second try writes the proof");
        assert!(proof.exists());
        // Never blocked: one try, whatever it did.
        let other = tempfile::tempdir().unwrap();
        let mut tries = 0;
        until_finalized(other.path(), || tries += 1, |_| None);
        assert_eq!(tries, 1);
    }

    #[test]
    fn a_file_system_without_space_is_full_and_a_roomy_one_is_not_blocked() {
        assert_eq!(blocked_at(Path::new("/proc")), Some(Blocked::Full));
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(blocked_at(dir.path()), None);
        // A directory that does not exist cannot be told about: not blocked.
        assert_eq!(blocked_at(&dir.path().join("gone")), None);
    }

    #[test]
    fn a_run_is_finalized_once_its_proof_is_written_and_its_status_settled() {
        use status::model::{RunState, RunStatus, write_status};
        let dir = tempfile::tempdir().unwrap();
        let proof = dir.path().join(files::PROOF);
        // No status and no proof; then a proof and still no status.
        assert!(!finalized(dir.path()));
        std::fs::write(&proof, "{}").unwrap();
        assert!(finalized(dir.path()));
        // An active status holds it back; a settled one does not.
        write_status(dir.path(), &RunStatus::new("r1", RunState::Running)).unwrap();
        assert!(!finalized(dir.path()));
        write_status(dir.path(), &RunStatus::new("r1", RunState::Complete)).unwrap();
        assert!(finalized(dir.path()));
        // A settled status without its proof is not finalized.
        std::fs::remove_file(&proof).unwrap();
        assert!(!finalized(dir.path()));
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("durable-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
