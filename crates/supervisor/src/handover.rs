//! The runner's outcome, handed to its monitor when the root cannot take it.
//!
//! A runner whose final status write is still refused (a read-only or full
//! root) once its retry budget (`SUBAGENTS_WRITE_RETRY_MS`) is spent exits;
//! the outcome it saw (every step's end, the run's verdict, its candidate)
//! would die with it, and its monitor, retrying its own finalization until
//! the root is writable, would end the run `failed`. So before it exits the
//! runner writes that outcome into a pipe its monitor made for it, and the
//! monitor writes it (status, then candidate) before it finalizes the proof.
//!
//! Why a handover rather than a runner that never gives up: every time
//! bound stays as it was (the runner still exits after its budget, the
//! monitor still finalizes within its own), a runner waiting for the root
//! never blocks a `stop` or a SIGKILL for longer than before, a full disk
//! still leaves the step-end events behind for a later `reconcile`, and the
//! outcome lives on in the one process that outlives the runner anyway.
//! A runner killed before it handed anything over leaves the pipe empty:
//! the monitor then repairs the run from the evidence, as before.
//!
//! The pipe is non-blocking at both ends: the runner never waits on its
//! monitor (a write that does not fit is logged and dropped), and the
//! monitor reads only after it reaped the runner, whatever is there.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::process::Command;

use serde::Serialize;
use serde_json::Value;
use status::RunStatus;
use status::model::{parse_status, update_status};
use status::proof::{self, Candidate};

/// The runner's inherited descriptor of the pipe's write end.
pub const OUTCOME_FD_ENV: &str = "SUBAGENTS_OUTCOME_FD";

/// What the runner would have written last.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Outcome {
    /// The final `status.json`.
    pub status: RunStatus,
    /// The process-terminal candidate.
    pub candidate: Candidate,
}

impl Outcome {
    fn parse(bytes: &[u8]) -> Result<Self, String> {
        let value: Value = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        let status = parse_status(
            Path::new("the runner's outcome"),
            &value["status"].to_string(),
        )
        .map_err(|e| e.to_string())?;
        let candidate =
            serde_json::from_value(value["candidate"].clone()).map_err(|e| e.to_string())?;
        Ok(Self { status, candidate })
    }
}

/// The monitor's end of the pipe.
pub struct Receiver {
    read: OwnedFd,
    write: Option<OwnedFd>,
}

impl Receiver {
    /// Makes the pipe (both ends close-on-exec and non-blocking).
    pub fn open() -> std::io::Result<Self> {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: pipe2(2) fills the two descriptors of the array we own.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: both descriptors were just created and are owned by nobody else.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // Left at the default size: the kernel charges a pipe's room to its
        // user for as long as it is open, and past `pipe-user-pages-soft`
        // every new pipe of theirs shrinks, so a roomy pipe per active run
        // would cost the user's other programs. The runner grows it when
        // an outcome needs the room ([`send_to`]).
        Ok(Self {
            read,
            write: Some(write),
        })
    }

    /// Lets the runner spawned by `command` inherit the write end, and tells
    /// it which descriptor that is.
    pub fn hand_to(&self, command: &mut Command) {
        let Some(write) = &self.write else { return };
        let fd = write.as_raw_fd();
        command.env(OUTCOME_FD_ENV, fd.to_string());
        // SAFETY: only clears close-on-exec of our descriptor (fcntl is
        // async-signal-safe) between fork and exec.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(command, move || {
                if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }

    /// The write end's descriptor, for a runner forked without `exec`.
    pub fn write_fd(&self) -> Option<RawFd> {
        self.write.as_ref().map(AsRawFd::as_raw_fd)
    }

    /// Closes our copy of the write end once the runner has its own.
    pub fn spawned(&mut self) {
        self.write = None;
    }

    /// What the runner handed over; call once it was reaped. `None` when it
    /// handed nothing (it wrote its outcome itself, or was killed).
    pub fn take(self) -> Option<Outcome> {
        let mut file = File::from(self.read);
        let mut bytes = Vec::new();
        // Non-blocking: a descriptor an escaped process still holds cannot stall us.
        let _ = file.read_to_end(&mut bytes);
        if bytes.is_empty() {
            return None;
        }
        match Outcome::parse(&bytes) {
            Ok(outcome) => Some(outcome),
            Err(e) => {
                eprintln!("subagents: failed to read the runner's outcome: {e}");
                None
            }
        }
    }
}

/// The runner's side: keeps the inherited descriptor from its COMMANDs.
/// Call once at start.
pub fn keep_from_children() {
    if let Some(fd) = inherited() {
        close_on_exec(fd);
    }
}

fn close_on_exec(fd: RawFd) {
    // SAFETY: fcntl(2) on the descriptor our monitor handed us.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
}

/// The descriptor named by [`OUTCOME_FD_ENV`], if it is a pipe.
fn inherited() -> Option<RawFd> {
    pipe_fd(&std::env::var(OUTCOME_FD_ENV).ok()?)
}

/// The descriptor `value` names, if it is an open pipe above stderr.
fn pipe_fd(value: &str) -> Option<RawFd> {
    let fd = value.parse::<RawFd>().ok()?;
    // SAFETY: fstat(2) fills the zeroed struct we own; a bad fd only fails.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    if fd < 3 || unsafe { libc::fstat(fd, &mut stat) } != 0 {
        return None;
    }
    (stat.st_mode & libc::S_IFMT == libc::S_IFIFO).then_some(fd)
}

/// The runner's side: hands `outcome` to the monitor (once; the runner
/// exits after it). Logs to stderr why it could not.
pub fn send(outcome: &Outcome) {
    if let Some(fd) = inherited() {
        send_to(fd, outcome);
    }
}

/// Writes `outcome` into pipe `fd`, which it closes, growing the pipe
/// first if the outcome would not fit.
fn send_to(fd: RawFd, outcome: &Outcome) {
    // SAFETY: the monitor handed us this descriptor for exactly this use; we own it from here.
    let mut pipe = unsafe { File::from_raw_fd(fd) };
    let sent = serde_json::to_vec(outcome)
        .map_err(std::io::Error::other)
        .and_then(|bytes| make_room(&pipe, bytes.len()).map(|()| bytes))
        .and_then(|bytes| pipe.write_all(&bytes));
    match sent {
        Ok(()) => eprintln!("subagents: handed the run's outcome to its monitor"),
        Err(e) => eprintln!("subagents: failed to hand the run's outcome to its monitor: {e}"),
    }
}

/// Grows `pipe` to hold `len` bytes: the write end never blocks, so what
/// does not fit would be lost.
fn make_room(pipe: &File, len: usize) -> std::io::Result<()> {
    let fd = pipe.as_raw_fd();
    // SAFETY: fcntl(2) on a descriptor we own.
    let size = unsafe { libc::fcntl(fd, libc::F_GETPIPE_SZ) };
    if size < 0 || usize::try_from(size).is_ok_and(|size| size >= len) {
        return Ok(());
    }
    let wanted = libc::c_int::try_from(len).unwrap_or(libc::c_int::MAX);
    // SAFETY: as above; the kernel rounds the size up to a power of two pages.
    if unsafe { libc::fcntl(fd, libc::F_SETPIPE_SZ, wanted) } < 0 {
        let cause = std::io::Error::last_os_error();
        return Err(std::io::Error::other(format!(
            "failed to grow the pipe to {len} bytes: {cause}"
        )));
    }
    Ok(())
}

/// The monitor's side: writes what the runner could not, as the runner
/// would have: its final status over a status still active (a stop request
/// recorded meanwhile is kept: it changes no outcome already seen), then
/// its candidate when there is none. The caller retries while the root is
/// full or read-only, and decides no proof before the outcome is written.
pub fn restore(run_dir: &Path, outcome: &Outcome) -> status::Result<()> {
    update_status(run_dir, |current| {
        let current = current?;
        if !current.state.is_active() {
            return None;
        }
        let mut next = outcome.status.clone();
        next.stop_reason = next.stop_reason.or(current.stop_reason);
        Some(next)
    })?;
    if proof::read_candidate(run_dir).ok().flatten().is_none() {
        proof::write_candidate(run_dir, &outcome.candidate)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use status::RunState;

    use super::*;

    fn outcome() -> Outcome {
        let mut status = RunStatus::new("r1", RunState::Complete);
        status.ended_at = Some(17);
        Outcome {
            status,
            candidate: Candidate {
                version: 1,
                run_id: "r1".into(),
                runner_process_instance_id: "rid".into(),
                writers: BTreeMap::new(),
                expected_writers: Some(BTreeMap::from([("0".into(), 1)])),
                session_file: None,
                revival_lease_token: None,
                revival_lease_release_acknowledged: None,
            },
        }
    }

    #[test]
    fn an_outcome_sent_into_the_pipe_comes_out_whole() {
        let outcome = outcome();
        let bytes = serde_json::to_vec(&outcome).unwrap();
        assert_eq!(Outcome::parse(&bytes).unwrap(), outcome);
        assert!(Outcome::parse(&bytes[..bytes.len() - 1]).is_err());
    }

    #[test]
    fn the_final_status_replaces_only_an_active_one_and_keeps_a_stop_request() {
        let dir = tempfile::tempdir().unwrap();
        let mut running = RunStatus::new("r1", RunState::Running);
        running.stop_reason = Some("asked".into());
        status::model::write_status(dir.path(), &running).unwrap();
        restore(dir.path(), &outcome()).unwrap();
        let written = status::model::read_status(dir.path()).unwrap().unwrap();
        assert_eq!(written.state, RunState::Complete);
        assert_eq!(written.ended_at, Some(17));
        assert_eq!(written.stop_reason.as_deref(), Some("asked"));
        assert_eq!(
            proof::read_candidate(dir.path()).unwrap(),
            Some(outcome().candidate)
        );
        // A status already final is not touched.
        let failed = RunStatus::new("r1", RunState::Failed);
        status::model::write_status(dir.path(), &failed).unwrap();
        restore(dir.path(), &outcome()).unwrap();
        let kept = status::model::read_status(dir.path()).unwrap().unwrap();
        assert_eq!(kept.state, RunState::Failed);
    }

    fn flag(fd: RawFd, get: libc::c_int, bit: libc::c_int) -> bool {
        // SAFETY: fcntl(2) reads the flags of a descriptor the test owns.
        unsafe { libc::fcntl(fd, get) & bit != 0 }
    }

    #[test]
    fn both_ends_are_non_blocking_close_on_exec_and_the_pipe_of_default_size() {
        let receiver = Receiver::open().unwrap();
        let write = receiver.write_fd().expect("a write end before the spawn");
        assert_eq!(write, receiver.write.as_ref().unwrap().as_raw_fd());
        for fd in [receiver.read.as_raw_fd(), write] {
            assert!(flag(fd, libc::F_GETFL, libc::O_NONBLOCK), "fd {fd} blocks");
            assert!(
                flag(fd, libc::F_GETFD, libc::FD_CLOEXEC),
                "fd {fd} is inherited"
            );
        }
        // SAFETY: as above.
        let size = unsafe { libc::fcntl(write, libc::F_GETPIPE_SZ) };
        assert!(
            size <= 64 << 10,
            "a pipe of {size} bytes charged from the start"
        );
    }

    #[test]
    fn an_outcome_larger_than_the_pipe_grows_it_and_arrives_whole() {
        let mut big = outcome();
        big.status.error = Some("e".repeat(200 << 10));
        let mut receiver = Receiver::open().unwrap();
        let write = receiver.write.take().unwrap();
        send_to(std::os::fd::IntoRawFd::into_raw_fd(write), &big);
        assert_eq!(receiver.take(), Some(big));
    }

    #[test]
    fn a_pipe_that_cannot_grow_enough_is_an_error_naming_the_size() {
        let receiver = Receiver::open().unwrap();
        let write = File::from(receiver.write.unwrap());
        make_room(&write, 10).unwrap();
        // 2 GiB of pipe: past `pipe-max-size`, and a ring too large to
        // allocate even for a user the limits do not bind.
        let e = make_room(&write, usize::MAX).unwrap_err().to_string();
        assert!(e.starts_with("failed to grow the pipe to "), "{e}");
    }

    #[test]
    fn a_child_handed_the_write_end_hands_back_its_outcome() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("outcome.json");
        std::fs::write(&file, serde_json::to_vec(&outcome()).unwrap()).unwrap();
        let mut receiver = Receiver::open().unwrap();
        let mut child = Command::new("sh");
        // Through /proc: dash reads `>&N` only for a one-digit N, and a
        // test process beside others holds descriptors past 9.
        child.args([
            "-c",
            r#"cat "$1" >"/proc/self/fd/$SUBAGENTS_OUTCOME_FD""#,
            "sh",
        ]);
        child.arg(&file);
        receiver.hand_to(&mut child);
        let mut child = child.spawn().unwrap();
        receiver.spawned();
        assert_eq!(
            receiver.write_fd(),
            None,
            "our copy of the write end is closed"
        );
        assert!(child.wait().unwrap().success());
        assert_eq!(receiver.take(), Some(outcome()));
    }

    #[test]
    fn a_child_that_handed_nothing_or_garbage_leaves_nothing_to_take() {
        for script in [
            "true",
            r#"printf '{"status":' >"/proc/self/fd/$SUBAGENTS_OUTCOME_FD""#,
        ] {
            let mut receiver = Receiver::open().unwrap();
            let mut child = Command::new("sh");
            child.args(["-c", script]);
            receiver.hand_to(&mut child);
            let mut child = child.spawn().unwrap();
            receiver.spawned();
            assert!(child.wait().unwrap().success(), "{script}");
            assert_eq!(receiver.take(), None, "{script}");
        }
    }

    #[test]
    fn the_runner_writes_its_outcome_into_the_pipe_it_was_handed() {
        let mut receiver = Receiver::open().unwrap();
        let write = receiver.write.take().unwrap();
        // SAFETY: clears close-on-exec of a descriptor the test owns.
        unsafe { libc::fcntl(write.as_raw_fd(), libc::F_SETFD, 0) };
        close_on_exec(write.as_raw_fd());
        assert!(flag(write.as_raw_fd(), libc::F_GETFD, libc::FD_CLOEXEC));
        send_to(std::os::fd::IntoRawFd::into_raw_fd(write), &outcome());
        assert_eq!(receiver.take(), Some(outcome()));
    }

    #[test]
    fn only_an_open_pipe_above_stderr_is_taken_for_the_outcome_pipe() {
        let receiver = Receiver::open().unwrap();
        let write = receiver.write_fd().unwrap();
        assert_eq!(pipe_fd(&write.to_string()), Some(write));
        let dir = tempfile::tempdir().unwrap();
        let file = File::create(dir.path().join("f")).unwrap();
        assert_eq!(pipe_fd(&file.as_raw_fd().to_string()), None, "a file");
        drop(file);
        assert_eq!(pipe_fd("1048575"), None, "not open");
        assert_eq!(pipe_fd("x"), None);
        // In a child whose stdin is a pipe, fd 0 is still refused.
        let mut child = Command::new("true");
        child.stdin(std::process::Stdio::piped());
        // SAFETY: fstat(2) and a parse, both async-signal-safe, between fork and exec.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut child, || {
                let mut stat: libc::stat = std::mem::zeroed();
                if libc::fstat(0, &mut stat) != 0 || stat.st_mode & libc::S_IFMT != libc::S_IFIFO {
                    return Err(std::io::Error::from_raw_os_error(libc::ENOTTY));
                }
                match pipe_fd("0") {
                    Some(_) => Err(std::io::Error::from_raw_os_error(libc::EEXIST)),
                    None => Ok(()),
                }
            });
        }
        let spawned = child.spawn().map(|mut c| c.wait());
        assert!(spawned.is_ok(), "fd 0 a pipe and refused: {spawned:?}");
    }
}
