//! The session revival lease with real files, real processes and SIGKILL.

extern crate subagents_recovery as recovery;
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};
use test_support::{dead_pid, epoch_ms, mode};

use recovery::lease::{
    LeaseRequest, LeaseState, OWNER_FILE, OwnerRecord, WRITER_TOKEN_ENV, Writer, WriterState,
    acquire_lease, canonical_session, inspect_lease, lease_root, release_lease,
};

const WORKER_ENV: &str = "RECOVERY_LEASE_WORKER";
/// Prefix of the worker's reports on its stdout.
const MARKER: &str = "@@lease-worker@@ ";

struct Fixture {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    session: PathBuf,
}

fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let session = tmp.path().join("child.jsonl");
    fs::write(&session, "{}\n").unwrap();
    fs::create_dir_all(tmp.path().join("state")).unwrap();
    Fixture {
        root: tmp.path().join("state/session-leases"),
        session,
        _tmp: tmp,
    }
}

fn request(session: &Path, run: &str) -> LeaseRequest {
    LeaseRequest {
        session_file: session.to_path_buf(),
        run_id: run.into(),
        source_run_id: "source-1".into(),
        parent_session_id: Some("parent-a".into()),
    }
}

/// A change to a planted owner record.
type Edit = Box<dyn Fn(&mut OwnerRecord)>;

/// Takes the lease, then rewrites its owner record as `edit` says: a holder
/// in whatever state a test needs, with this machine's host name.
fn plant(f: &Fixture, edit: impl FnOnce(&mut OwnerRecord)) -> OwnerRecord {
    let lease = acquire_lease(&f.root, &request(&f.session, "planted")).unwrap();
    let mut owner = lease.owner().clone();
    edit(&mut owner);
    fs::write(
        lease.lease_dir().join(OWNER_FILE),
        serde_json::to_vec_pretty(&owner).unwrap(),
    )
    .unwrap();
    owner
}

fn stale_tombstone(f: &Fixture, token: &str) -> PathBuf {
    let id = canonical_session(&f.session).unwrap().id;
    f.root.join(format!("{id}.stale-{token}"))
}

/// The names in the lease root, sorted.
fn root_entries(f: &Fixture) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(&f.root)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

/// This machine's name as `gethostname(2)` reports it.
fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for writes of its whole length.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    assert_eq!(rc, 0, "gethostname failed");
    let end = buf.iter().position(|b| *b == 0).unwrap();
    String::from_utf8(buf[..end].to_vec()).unwrap()
}

#[test]
fn one_owner_at_a_time_with_private_files() {
    let f = fixture();
    let lease = acquire_lease(&f.root, &request(&f.session, "run-1")).unwrap();
    assert_eq!(mode(&f.root), 0o700);
    assert_eq!(mode(&lease.lease_dir()), 0o700);
    assert_eq!(mode(&lease.lease_dir().join(OWNER_FILE)), 0o600);
    assert_eq!(lease.owner().writer_state, WriterState::None);
    assert_eq!(lease.owner().pid, std::process::id());

    let err = acquire_lease(&f.root, &request(&f.session, "run-2")).unwrap_err();
    let conflict = err.conflict().expect("a conflict");
    assert_eq!(conflict.holder.as_ref().unwrap().run_id, "run-1");
    let canonical = fs::canonicalize(&f.session).unwrap();
    assert_eq!(
        err.to_string(),
        format!(
            "Direct revival of session '{}' is already owned by run 'run-1' (source run 'source-1', parent session 'parent-a', pid {} on {}). Wait for that revival to finish or start a separate continuation without reusing this session file.",
            canonical.display(),
            std::process::id(),
            lease.owner().hostname
        )
    );

    let dir = lease.lease_dir();
    assert!(lease.release().unwrap());
    assert!(!dir.exists());
    let again = acquire_lease(&f.root, &request(&f.session, "run-2")).unwrap();
    assert_eq!(again.owner().run_id, "run-2");
}

#[test]
fn the_owner_record_names_this_host_this_process_and_the_time_of_acquisition() {
    let f = fixture();
    assert_eq!(f.root, lease_root(f.root.parent().unwrap()));
    let before = epoch_ms();
    let mut lease = acquire_lease(&f.root, &request(&f.session, "run-1")).unwrap();
    let after = epoch_ms();
    let owner = lease.owner().clone();
    assert_eq!(owner.hostname, host_name());
    let me = process_identity::read_stat(std::process::id()).unwrap();
    assert_eq!(
        owner.process_start_identity,
        Some(format!("linux:{}", me.start_time))
    );
    assert_eq!(owner.boot_id, process_identity::boot_id());
    assert!(
        (before..=after).contains(&owner.acquired_at_ms),
        "acquiredAtMs {} not read between {before} and {after}",
        owner.acquired_at_ms
    );
    assert_eq!(owner.updated_at_ms, owner.acquired_at_ms);
    // `acquiredAt` is the same instant in ISO form: its seconds and
    // milliseconds agree with `acquiredAtMs`.
    let ms = owner.acquired_at_ms;
    let tail = format!(":{:02}.{:03}Z", ms / 1000 % 60, ms % 1000);
    assert!(owner.acquired_at.ends_with(&tail), "{}", owner.acquired_at);

    let before = epoch_ms();
    lease.update_writer(Writer::Spawning).unwrap();
    let after = epoch_ms();
    assert!((before..=after).contains(&lease.owner().updated_at_ms));
    assert_eq!(lease.owner().acquired_at_ms, owner.acquired_at_ms);
}

#[test]
fn a_refused_acquisition_and_a_release_leave_nothing_behind() {
    let f = fixture();
    let id = canonical_session(&f.session).unwrap().id;
    let held = acquire_lease(&f.root, &request(&f.session, "run-1")).unwrap();
    for run in ["run-2", "run-3"] {
        let err = acquire_lease(&f.root, &request(&f.session, run)).unwrap_err();
        assert!(err.conflict().is_some(), "{err}");
    }
    // No candidate directory of the refused attempts is left over.
    assert_eq!(root_entries(&f), [id]);
    assert!(held.release().unwrap());
    assert_eq!(root_entries(&f), Vec::<String>::new());
}

#[test]
fn a_release_clears_a_leftover_of_an_earlier_release_and_names_what_it_cannot() {
    let f = fixture();
    let id = canonical_session(&f.session).unwrap().id;
    let lease = acquire_lease(&f.root, &request(&f.session, "run-1")).unwrap();
    // A release that crashed after its rename leaves a directory under the
    // name the next release moves the lease to.
    let released = f.root.join(format!("{id}.released-{}", lease.token()));
    fs::create_dir(&released).unwrap();
    fs::write(released.join(OWNER_FILE), "{}").unwrap();
    assert!(release_lease(&f.root, &f.session, lease.token()).unwrap());
    assert_eq!(root_entries(&f), Vec::<String>::new());

    // A file there cannot be cleared as a leftover directory: the release
    // fails naming it and leaves the lease held.
    let lease = acquire_lease(&f.root, &request(&f.session, "run-2")).unwrap();
    let released = f.root.join(format!("{id}.released-{}", lease.token()));
    fs::write(&released, "").unwrap();
    let err = release_lease(&f.root, &f.session, lease.token()).unwrap_err();
    assert!(
        err.to_string().starts_with(&format!(
            "failed to remove leftover lease directory '{}': ",
            released.display()
        )),
        "{err}"
    );
    match inspect_lease(&f.root, &f.session).unwrap().state {
        LeaseState::Owned(owner) => assert_eq!(owner.token, lease.token()),
        other => panic!("expected the lease still held, got {other:?}"),
    }
}

#[test]
fn a_lease_directory_without_its_owner_file_is_unreadable_not_free() {
    let f = fixture();
    let lease = acquire_lease(&f.root, &request(&f.session, "run-1")).unwrap();
    fs::remove_file(lease.lease_dir().join(OWNER_FILE)).unwrap();
    assert_eq!(
        inspect_lease(&f.root, &f.session).unwrap().state,
        LeaseState::Unreadable
    );
    let err = acquire_lease(&f.root, &request(&f.session, "run-2")).unwrap_err();
    assert!(err.conflict().is_some_and(|c| c.holder.is_none()), "{err}");
    assert!(lease.lease_dir().is_dir());
}

#[test]
fn a_dangling_symlink_in_place_of_the_lease_is_refused_not_an_io_error() {
    let f = fixture();
    let id = canonical_session(&f.session).unwrap().id;
    fs::create_dir_all(&f.root).unwrap();
    std::os::unix::fs::symlink(f.root.join("nowhere"), f.root.join(&id)).unwrap();
    // What blocks an acquirer is never reported free.
    assert_eq!(
        inspect_lease(&f.root, &f.session).unwrap().state,
        LeaseState::Unreadable
    );
    let err = acquire_lease(&f.root, &request(&f.session, "run-1")).unwrap_err();
    assert!(err.conflict().is_some_and(|c| c.holder.is_none()), "{err}");
    assert!(f.root.join(&id).is_symlink());
    assert_eq!(root_entries(&f), [id]);
}

#[test]
fn a_lease_directory_others_could_have_planted_is_unreadable_and_blocks_the_session() {
    // A lease left by a dead holder, which would otherwise be reclaimed.
    let f = fixture();
    let id = canonical_session(&f.session).unwrap().id;
    plant(&f, |o| o.pid = dead_pid());
    let lease = f.root.join(&id);
    fs::set_permissions(&lease, fs::Permissions::from_mode(0o777)).unwrap();
    assert_eq!(
        inspect_lease(&f.root, &f.session).unwrap().state,
        LeaseState::Unreadable
    );
    let err = acquire_lease(&f.root, &request(&f.session, "run-2")).unwrap_err();
    assert!(err.conflict().is_some_and(|c| c.holder.is_none()), "{err}");
    // A symlink to a good lease elsewhere is not followed either.
    fs::set_permissions(&lease, fs::Permissions::from_mode(0o700)).unwrap();
    let elsewhere = f.root.join("elsewhere");
    fs::rename(&lease, &elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &lease).unwrap();
    assert_eq!(
        inspect_lease(&f.root, &f.session).unwrap().state,
        LeaseState::Unreadable
    );
    let err = acquire_lease(&f.root, &request(&f.session, "run-2")).unwrap_err();
    assert!(err.conflict().is_some_and(|c| c.holder.is_none()), "{err}");
    assert!(lease.is_symlink(), "left in place");
    // Put back as a directory, it is reclaimed as the stale lease it is.
    fs::remove_file(&lease).unwrap();
    fs::rename(&elsewhere, &lease).unwrap();
    assert_eq!(attempt(&f.root, &f.session, "run-2"), "acquired run-2");
}

#[test]
fn a_lease_that_cannot_be_looked_at_is_unreadable_not_free() {
    // Only "nothing at that name" is free; here the lease root is a file,
    // so looking up the lease fails with ENOTDIR.
    let f = fixture();
    fs::write(&f.root, "not a directory").unwrap();
    assert_eq!(
        inspect_lease(&f.root, &f.session).unwrap().state,
        LeaseState::Unreadable
    );
    assert!(acquire_lease(&f.root, &request(&f.session, "run-1")).is_err());
}

#[test]
fn a_stale_lease_whose_tombstone_name_is_taken_stays_in_place_as_a_conflict() {
    let f = fixture();
    let holder = plant(&f, |o| o.pid = dead_pid());
    // What a contender that reclaimed the same holder first left behind:
    // moving the lease there must not replace it.
    let tombstone = stale_tombstone(&f, &holder.token);
    fs::create_dir(&tombstone).unwrap();
    fs::write(tombstone.join(OWNER_FILE), "earlier").unwrap();
    let err = acquire_lease(&f.root, &request(&f.session, "run-2")).unwrap_err();
    assert_eq!(
        err.conflict().expect("a conflict").holder.as_ref(),
        Some(&holder),
        "{err}"
    );
    assert_eq!(fs::read(tombstone.join(OWNER_FILE)).unwrap(), b"earlier");
    assert_eq!(
        inspect_lease(&f.root, &f.session).unwrap().state,
        LeaseState::Owned(Box::new(holder))
    );
}

#[test]
fn a_stale_lease_that_cannot_be_moved_aside_is_an_error_naming_it() {
    let f = fixture();
    // A token too long for a tombstone name (ENAMETOOLONG).
    let holder = plant(&f, |o| {
        o.pid = dead_pid();
        o.token = "t".repeat(250);
    });
    let err = acquire_lease(&f.root, &request(&f.session, "run-2")).unwrap_err();
    assert!(err.conflict().is_none(), "{err}");
    let lease_dir = f.root.join(canonical_session(&f.session).unwrap().id);
    assert!(
        err.to_string().starts_with(&format!(
            "failed to reclaim stale lease '{}': ",
            lease_dir.display()
        )),
        "{err}"
    );
    assert_eq!(
        inspect_lease(&f.root, &f.session).unwrap().state,
        LeaseState::Owned(Box::new(holder))
    );
}

#[test]
fn a_symlink_alias_shares_the_lease_and_other_files_do_not() {
    let f = fixture();
    let alias = f.session.with_file_name("alias.jsonl");
    std::os::unix::fs::symlink(&f.session, &alias).unwrap();
    let other = f.session.with_file_name("other.jsonl");
    fs::write(&other, "").unwrap();

    let held = acquire_lease(&f.root, &request(&alias, "run-1")).unwrap();
    assert!(
        acquire_lease(&f.root, &request(&f.session, "run-2"))
            .unwrap_err()
            .conflict()
            .is_some()
    );
    let second = acquire_lease(&f.root, &request(&other, "run-3")).unwrap();
    assert_ne!(held.lease_dir(), second.lease_dir());
    assert!(
        acquire_lease(
            &f.root,
            &request(&f.session.with_file_name("missing.jsonl"), "x")
        )
        .is_err()
    );
}

#[test]
fn inspect_reports_free_owned_and_unreadable() {
    let f = fixture();
    assert_eq!(
        inspect_lease(&f.root, &f.session).unwrap().state,
        LeaseState::Free
    );
    let lease = acquire_lease(&f.root, &request(&f.session, "run-1")).unwrap();
    match inspect_lease(&f.root, &f.session).unwrap().state {
        LeaseState::Owned(owner) => assert_eq!(owner.token, lease.token()),
        other => panic!("expected owned, got {other:?}"),
    }
    fs::write(lease.lease_dir().join(OWNER_FILE), "{\"version\": 2}").unwrap();
    assert_eq!(
        inspect_lease(&f.root, &f.session).unwrap().state,
        LeaseState::Unreadable
    );
    let err = acquire_lease(&f.root, &request(&f.session, "run-2")).unwrap_err();
    assert!(err.to_string().ends_with("is blocked by an existing lease with unreadable owner metadata. Refusing to reclaim it without proof that the owner is stale."), "{err}");
}

#[test]
fn release_by_a_non_owner_token_is_refused() {
    let f = fixture();
    let lease = acquire_lease(&f.root, &request(&f.session, "run-1")).unwrap();
    assert!(!release_lease(&f.root, &f.session, "not-the-token").unwrap());
    assert!(matches!(
        inspect_lease(&f.root, &f.session).unwrap().state,
        LeaseState::Owned(_)
    ));
    assert!(release_lease(&f.root, &f.session, lease.token()).unwrap());
    assert_eq!(
        inspect_lease(&f.root, &f.session).unwrap().state,
        LeaseState::Free
    );
    // The handle's own release now finds the lease gone and touches nothing.
    assert!(!lease.release().unwrap());
}

#[test]
fn writer_updates_are_recorded_and_detect_lost_ownership() {
    let f = fixture();
    let mut lease = acquire_lease(&f.root, &request(&f.session, "run-1")).unwrap();
    let mut writer = Command::new("sleep").arg("60").spawn().unwrap();
    lease.update_writer(Writer::Spawning).unwrap();
    lease.update_writer(Writer::Running(writer.id())).unwrap();
    let on_disk: OwnerRecord =
        serde_json::from_slice(&fs::read(lease.lease_dir().join(OWNER_FILE)).unwrap()).unwrap();
    assert_eq!(&on_disk, lease.owner());
    assert_eq!(on_disk.writer_state, WriterState::Running);
    assert_eq!(on_disk.writer_pid, Some(writer.id()));
    assert!(
        on_disk
            .writer_process_start_identity
            .unwrap()
            .starts_with("linux:")
    );
    assert_eq!(mode(&lease.lease_dir().join(OWNER_FILE)), 0o600);
    writer.kill().unwrap();
    writer.wait().unwrap();
    lease.update_writer(Writer::None).unwrap();
    assert_eq!(lease.owner().writer_pid, None);

    let mut foreign = lease.owner().clone();
    foreign.token = "someone-else".into();
    fs::write(
        lease.lease_dir().join(OWNER_FILE),
        serde_json::to_vec(&foreign).unwrap(),
    )
    .unwrap();
    let err = lease.update_writer(Writer::Spawning).unwrap_err();
    assert_eq!(
        err.to_string(),
        "Session revival lease ownership changed for run 'run-1'."
    );
}

#[test]
fn a_recycled_pid_counts_as_dead() {
    let f = fixture();
    // Our own live pid, but a start time that is not ours: the recorded
    // process is gone and the pid now names somebody else.
    let holder = plant(&f, |o| o.process_start_identity = Some("linux:1".into()));
    let lease = acquire_lease(&f.root, &request(&f.session, "run-2")).unwrap();
    assert_eq!(lease.owner().run_id, "run-2");
    assert!(stale_tombstone(&f, &holder.token).join(OWNER_FILE).exists());
}

#[test]
fn a_live_holder_or_live_writer_is_never_reclaimed() {
    let f = fixture();
    let mut dead = Command::new("true").spawn().unwrap();
    let dead_pid = dead.id();
    dead.wait().unwrap();
    let mut writer = Command::new("sleep").arg("60").spawn().unwrap();
    let writer_pid = writer.id();
    let writer_identity = process_identity::read_stat(writer_pid).unwrap().start_time;

    let cases: Vec<(&str, Edit)> = vec![
        ("live holder", Box::new(|_| {})),
        (
            "other host",
            Box::new(move |o| {
                o.pid = dead_pid;
                o.hostname = "elsewhere".into();
            }),
        ),
        (
            "spawning writer of a record without bootId",
            Box::new(move |o| {
                o.pid = dead_pid;
                o.boot_id = None;
                o.writer_state = WriterState::Spawning;
            }),
        ),
        (
            "running writer",
            Box::new(move |o| {
                o.pid = dead_pid;
                o.writer_state = WriterState::Running;
                o.writer_pid = Some(writer_pid);
                o.writer_process_start_identity = Some(format!("linux:{writer_identity}"));
            }),
        ),
        (
            "other identity scheme",
            Box::new(|o| o.process_start_identity = Some("runtime:12345".into())),
        ),
    ];
    for (name, edit) in cases {
        let g = fixture();
        plant(&g, edit);
        let err = acquire_lease(&g.root, &request(&g.session, "run-2")).unwrap_err();
        assert!(err.conflict().is_some(), "{name}: {err}");
    }

    // Once the orphaned writer is gone the lease is reclaimable.
    plant(&f, |o| {
        o.pid = dead_pid;
        o.writer_state = WriterState::Running;
        o.writer_pid = Some(writer_pid);
        o.writer_process_start_identity = Some(format!("linux:{writer_identity}"));
    });
    assert!(acquire_lease(&f.root, &request(&f.session, "run-2")).is_err());
    writer.kill().unwrap();
    writer.wait().unwrap();
    acquire_lease(&f.root, &request(&f.session, "run-2")).unwrap();
}

#[test]
fn a_dead_spawning_holder_is_reclaimed_only_when_no_writer_carries_its_token() {
    let f = fixture();
    let mut dead = Command::new("true").spawn().unwrap();
    let dead_pid = dead.id();
    dead.wait().unwrap();
    let holder = plant(&f, |o| {
        o.pid = dead_pid;
        o.writer_state = WriterState::Spawning;
    });
    let mut writer = Command::new("sleep")
        .arg("60")
        .env(WRITER_TOKEN_ENV, &holder.token)
        .spawn()
        .unwrap();
    let err = acquire_lease(&f.root, &request(&f.session, "run-2")).unwrap_err();
    assert!(err.conflict().is_some(), "{err}");
    writer.kill().unwrap();
    writer.wait().unwrap();
    let lease = acquire_lease(&f.root, &request(&f.session, "run-2")).unwrap();
    assert_eq!(lease.writer_env(), (WRITER_TOKEN_ENV, lease.token()));
}

/// Entry point of the worker processes the tests below start; not a test
/// of its own (it checks nothing when run without `RECOVERY_LEASE_WORKER`).
#[test]
#[ignore = "worker entry point, run by Worker::spawn with --ignored --exact"]
fn lease_worker() {
    let go_file = std::env::var(WORKER_ENV).expect("run only as a worker");
    let root = PathBuf::from(std::env::var("RECOVERY_LEASE_ROOT").unwrap());
    let session = PathBuf::from(std::env::var("RECOVERY_LEASE_SESSION").unwrap());
    let run = std::env::var("RECOVERY_LEASE_RUN").unwrap();
    wait_for(|| Path::new(&go_file).exists(), "the go file");
    let mut out = std::io::stdout();
    match acquire_lease(&root, &request(&session, &run)) {
        Ok(lease) => {
            writeln!(out, "{MARKER}acquired {}", lease.token()).unwrap();
            out.flush().unwrap();
            // Hold until the parent closes our stdin (or kills us).
            let _ = std::io::stdin().read_to_end(&mut Vec::new());
            writeln!(out, "{MARKER}released {}", lease.release().unwrap()).unwrap();
        }
        Err(e) => writeln!(out, "{MARKER}conflict {e}").unwrap(),
    }
    out.flush().unwrap();
}

fn wait_for(mut done: impl FnMut() -> bool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

struct Worker {
    child: Child,
    lines: BufReader<ChildStdout>,
}

impl Worker {
    fn spawn(f: &Fixture, run: &str, go_file: &Path) -> Worker {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "lease::lease_worker",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(WORKER_ENV, go_file)
            .env("RECOVERY_LEASE_ROOT", &f.root)
            .env("RECOVERY_LEASE_SESSION", &f.session)
            .env("RECOVERY_LEASE_RUN", run)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap());
        Worker { child, lines }
    }

    /// The next worker report, without its marker.
    fn report(&mut self) -> String {
        let mut line = String::new();
        loop {
            line.clear();
            assert!(
                self.lines.read_line(&mut line).unwrap() > 0,
                "worker ended without a report"
            );
            // libtest may print "test lease_worker ... " on the same line.
            if let Some((_, report)) = line.trim_end().split_once(MARKER) {
                return report.to_owned();
            }
        }
    }
}

#[test]
fn two_processes_race_and_exactly_one_wins() {
    let f = fixture();
    let go = f.root.with_file_name("go");
    let mut a = Worker::spawn(&f, "run-a", &go);
    let mut b = Worker::spawn(&f, "run-b", &go);
    fs::write(&go, "").unwrap();
    let (ra, rb) = (a.report(), b.report());
    let (mut winner, winner_run, loser_report) =
        match (ra.starts_with("acquired"), rb.starts_with("acquired")) {
            (true, false) => (a, "run-a", rb),
            (false, true) => (b, "run-b", ra),
            _ => panic!("expected exactly one winner: {ra:?} / {rb:?}"),
        };
    assert!(
        loser_report.contains(&format!("already owned by run '{winner_run}'")),
        "{loser_report}"
    );
    drop(winner.child.stdin.take());
    assert_eq!(winner.report(), "released true");
    assert!(winner.child.wait().unwrap().success());
    acquire_lease(&f.root, &request(&f.session, "run-c")).unwrap();
}

#[test]
fn a_sigkilled_holder_is_reclaimed_by_the_next_acquirer() {
    let f = fixture();
    let go = f.root.with_file_name("go");
    fs::write(&go, "").unwrap();
    let mut holder = Worker::spawn(&f, "run-killed", &go);
    let report = holder.report();
    let token = report
        .strip_prefix("acquired ")
        .expect("holder acquired")
        .to_owned();
    assert!(
        acquire_lease(&f.root, &request(&f.session, "run-2"))
            .unwrap_err()
            .conflict()
            .is_some()
    );

    holder.child.kill().unwrap(); // SIGKILL: nothing is released
    holder.child.wait().unwrap();
    let lease = acquire_lease(&f.root, &request(&f.session, "run-2")).unwrap();
    assert_eq!(lease.owner().run_id, "run-2");
    assert!(stale_tombstone(&f, &token).exists());
    assert!(lease.release().unwrap());
}

const CONTENDER_ENV: &str = "RECOVERY_LEASE_CONTENDER_DIR";
const CASE_ENV: &str = "RECOVERY_LEASE_CONTENDER_CASE";

/// Plants, under `root`, a holder of `session` that died while spawning its
/// writer; returns its token.
fn plant_dead_spawning_holder(root: &Path, session: &Path) -> String {
    let lease = acquire_lease(root, &request(session, "planted")).unwrap();
    let mut owner = lease.owner().clone();
    owner.pid = dead_pid();
    owner.writer_state = WriterState::Spawning;
    fs::write(
        lease.lease_dir().join(OWNER_FILE),
        serde_json::to_vec_pretty(&owner).unwrap(),
    )
    .unwrap();
    owner.token
}

fn attempt(root: &Path, session: &Path, run: &str) -> String {
    match acquire_lease(root, &request(session, run)) {
        Ok(lease) => format!("acquired {}", lease.owner().run_id),
        Err(e) => format!("conflict {e}"),
    }
}

/// Entry point of the contender the two tests below start (as `nobody`
/// when they run as root); not a test of its own.
#[test]
#[ignore = "worker entry point, run by contend() with --ignored --exact"]
fn lease_contender_worker() {
    let dir = PathBuf::from(std::env::var(CONTENDER_ENV).expect("run only as a worker"));
    let session = dir.join("child.jsonl");
    fs::write(&session, "{}\n").unwrap();
    let root = dir.join("session-leases");
    let token = plant_dead_spawning_holder(&root, &session);
    let mut reports = Vec::new();
    match std::env::var(CASE_ENV).unwrap().as_str() {
        "foreign" => {
            // Precondition: a live process whose environment we may not read
            // (the test that started us, as another user).
            let pid = std::env::var("RECOVERY_LEASE_FOREIGN_PID").unwrap();
            let err = fs::read(format!("/proc/{pid}/environ")).unwrap_err();
            assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied);
            reports.push(attempt(&root, &session, "run-2"));
        }
        "unreadable-writer" => {
            let mut carrier = start_carrier(&token);
            // Precondition: our own writer, whose environment we may not read.
            let pid = carrier.child.id();
            let err = fs::read(format!("/proc/{pid}/environ")).unwrap_err();
            assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied);
            reports.push(attempt(&root, &session, "run-2"));
            drop(carrier.child.stdin.take());
            assert!(carrier.child.wait().unwrap().success());
            reports.push(attempt(&root, &session, "run-3"));
        }
        "older-unreadable" => {
            // Our own process whose environment we may not read, started
            // before the holder: it cannot be a writer the holder started.
            let mut carrier = start_carrier("a token of an earlier lease");
            let carrier_pid = carrier.child.id();
            let err = fs::read(format!("/proc/{carrier_pid}/environ")).unwrap_err();
            assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied);
            let carrier_start = process_identity::read_stat(carrier_pid).unwrap().start_time;
            let (pid, start) = dead_process_started_after(carrier_start);
            let owner_file = root
                .join(canonical_session(&session).unwrap().id)
                .join(OWNER_FILE);
            let mut owner: serde_json::Value =
                serde_json::from_slice(&fs::read(&owner_file).unwrap()).unwrap();
            owner["pid"] = pid.into();
            owner["processStartIdentity"] = format!("linux:{start}").into();
            fs::write(&owner_file, serde_json::to_vec_pretty(&owner).unwrap()).unwrap();
            reports.push(attempt(&root, &session, "run-2"));
            drop(carrier.child.stdin.take());
            assert!(carrier.child.wait().unwrap().success());
        }
        other => panic!("unknown case {other}"),
    }
    for report in reports {
        println!("{MARKER}{report}");
    }
}

/// Starts `lease_carrier_worker` with `token` and waits for its `ready`.
fn start_carrier(token: &str) -> Worker {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "lease::lease_carrier_worker",
            "--ignored",
            "--nocapture",
        ])
        .env(WRITER_TOKEN_ENV, token)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut carrier = Worker {
        child,
        lines: BufReader::new(stdout),
    };
    assert_eq!(carrier.report(), "ready");
    carrier
}

/// The pid and start time (clock ticks) of a process that started in a
/// later clock tick than `after` and has exited since.
fn dead_process_started_after(after: u64) -> (u32, u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut child = Command::new("sleep").arg("60").spawn().unwrap();
        let start = process_identity::read_stat(child.id()).unwrap().start_time;
        child.kill().unwrap();
        child.wait().unwrap();
        if start > after {
            return (child.id(), start);
        }
        assert!(Instant::now() < deadline, "the clock tick never advanced");
    }
}

/// A writer that carries the lease token and forbids reading its
/// environment (not dumpable), until its stdin closes; not a test of its own.
#[test]
#[ignore = "worker entry point, run by lease_contender_worker with --ignored --exact"]
fn lease_carrier_worker() {
    std::env::var(WRITER_TOKEN_ENV).expect("run only as a carrier");
    // SAFETY: PR_SET_DUMPABLE takes plain integers.
    let rc = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    assert_eq!(rc, 0, "prctl failed");
    println!("{MARKER}ready");
    std::io::stdout().flush().unwrap();
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
}

/// Runs `lease_contender_worker` for `case` and returns its reports. As
/// root, the contender runs as `nobody` (from a copy of this test binary it
/// can execute), so that root's processes belong to another user and its
/// own processes get no privilege over each other.
fn contend(case: &str) -> Vec<String> {
    use std::os::unix::process::CommandExt;
    // One contender at a time: a contender counts every process of its user
    // (`nobody`) whose environment it cannot read as a possible writer, so
    // the non-dumpable writer of one case would block the other's reclaim.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().unwrap();
    fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let work = tmp.path().join("work");
    fs::create_dir(&work).unwrap();
    let exe = tmp.path().join("lease-test");
    fs::copy(std::env::current_exe().unwrap(), &exe).unwrap();
    let mut cmd = Command::new(&exe);
    cmd.args([
        "--exact",
        "lease::lease_contender_worker",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CONTENDER_ENV, &work)
    .env(CASE_ENV, case);
    if nix::unistd::geteuid().is_root() {
        const NOBODY: u32 = 65534;
        std::os::unix::fs::chown(&work, Some(NOBODY), Some(NOBODY)).unwrap();
        cmd.uid(NOBODY)
            .gid(NOBODY)
            .env("RECOVERY_LEASE_FOREIGN_PID", std::process::id().to_string());
    } else {
        assert_ne!(
            case, "foreign",
            "needs root to start a process of another user"
        );
    }
    // Another test's fork may still hold the copy open for writing (the
    // descriptor `fs::copy` wrote it through, until that child execs): exec
    // then fails with ETXTBSY for a moment.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let out = loop {
        match cmd.output() {
            Err(e)
                if e.raw_os_error() == Some(nix::errno::Errno::ETXTBSY as i32)
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            other => break other.unwrap(),
        }
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "contender failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .filter_map(|l| l.split_once(MARKER).map(|(_, r)| r.to_owned()))
        .collect()
}

#[test]
fn a_process_of_another_user_does_not_block_a_reclaim() {
    // The writer scan counts an unreadable environment as a possible writer
    // only for processes of the contender's own user.
    if !nix::unistd::geteuid().is_root() {
        // Without root there is no process of another user to start; the
        // contender then runs as ourselves, and root's processes are the
        // other user's.
        let tmp = tempfile::tempdir().unwrap();
        let session = tmp.path().join("child.jsonl");
        fs::write(&session, "{}\n").unwrap();
        let root = tmp.path().join("session-leases");
        plant_dead_spawning_holder(&root, &session);
        assert_eq!(attempt(&root, &session, "run-2"), "acquired run-2");
        return;
    }
    assert_eq!(contend("foreign"), ["acquired run-2"]);
}

#[test]
fn an_own_unreadable_process_older_than_the_holder_does_not_block_a_reclaim() {
    assert_eq!(contend("older-unreadable"), ["acquired run-2"]);
}

#[test]
fn an_own_writer_whose_environment_cannot_be_read_blocks_a_reclaim() {
    let reports = contend("unreadable-writer");
    assert_eq!(reports.len(), 2, "{reports:?}");
    assert!(
        reports[0].starts_with("conflict Direct revival of session"),
        "{reports:?}"
    );
    assert_eq!(reports[1], "acquired run-3");
}
