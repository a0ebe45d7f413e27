#![doc = include_str!("../README.md")]
//!
//! Process identities that survive pid reuse, and process-group inspection.
//!
//! A bare pid is not an identity: after a process exits the kernel may hand
//! its pid to an unrelated process, and `kill(pid, 0)` then reports the
//! stranger as "alive". Every crate that records "who owns this" (the runner
//! of a run, a lease holder, a capacity slot) records a [`ProcessIdentity`]:
//! the pid plus the process start time in clock ticks since boot (Linux
//! `/proc/<pid>/stat` field 22), the boot id and the machine. A recorded
//! identity is alive only if a process with that pid exists, is not a zombie,
//! and started at the same tick of the same boot of the same machine.
//!
//! Pid, process group and session numbers mean something only within the
//! boot of the machine that handed them out. A record of another boot of this
//! machine is dead (the boot ended every process of it), and a record of
//! another machine is [`Liveness::Foreign`]: nothing about it can be learnt
//! here, and its numbers must never be looked up or signalled on this
//! machine ([`ProcessIdentity::origin`]). A state root shared by several
//! machines (an NFS home directory, a cluster filesystem) holds such records.
//!
//! [`group_members`] lists the live (non-zombie) members of a process group by
//! reading `/proc`, which is how runners prove that a child's whole process
//! group is gone. An empty group (the common case) is recognised by one
//! `kill(-pgid, 0)` and a childless caller by one `waitid`, so the walk over
//! every process on the machine happens only when something is left.
#![warn(missing_docs)]

use std::fs;
use std::io;

use serde::{Deserialize, Serialize};

/// A process as recorded in state files: pid, start time, boot id and
/// machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessIdentity {
    /// Process id.
    pub pid: u32,
    /// Start time in clock ticks since boot (`/proc/<pid>/stat` field 22).
    pub start_time: u64,
    /// `/proc/sys/kernel/random/boot_id`, when readable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    /// The machine the process ran on ([`machine_id`]). Records written
    /// before this field existed have none: they are judged on their boot
    /// id alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_id: Option<String>,
    /// The host name of that machine, for display only ([`host_name`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
}

/// Where a recorded process ran, as seen from this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// This boot of this machine (or a record too old to say otherwise,
    /// whose boot id matches or is absent): its numbers name processes here.
    ThisBoot,
    /// An earlier (or later) boot of this machine: the process is gone, and
    /// its pid, group and session numbers name nothing of it now.
    OtherBoot,
    /// Another machine: nothing about it can be probed here.
    OtherMachine,
}

/// What can be said about whether a recorded process still runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// The very same process (pid, start time, boot) is running.
    Alive,
    /// No such process, a zombie, the pid now belongs to another process, or
    /// the record is of another boot of this machine.
    Dead,
    /// Nothing could be read (for example `/proc` is not mounted).
    Unknown,
    /// The record is of another machine: it is neither probed nor signalled
    /// here, and only that machine can tell whether it lives.
    Foreign,
}

/// Facts about one process read from `/proc/<pid>/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// One-letter state (`R`, `S`, `Z`, ...).
    pub state: char,
    /// Parent pid.
    pub ppid: u32,
    /// Process group id.
    pub pgrp: u32,
    /// Session id.
    pub session: u32,
    /// Start time in clock ticks since boot.
    pub start_time: u64,
}

impl ProcessIdentity {
    /// The identity of the calling process.
    pub fn current() -> io::Result<Self> {
        Self::of(std::process::id())
    }

    /// The identity of a running process, read now.
    pub fn of(pid: u32) -> io::Result<Self> {
        let stat = read_stat(pid)?;
        Ok(Self {
            pid,
            start_time: stat.start_time,
            boot_id: boot_id(),
            machine_id: machine_id(),
            host: host_name(),
        })
    }

    /// Where the recorded process ran. A field this process cannot read for
    /// itself while the record has it counts as different: a machine id
    /// that cannot be compared is never taken for ours.
    pub fn origin(&self) -> Origin {
        if let Some(recorded) = &self.machine_id
            && machine_id().as_ref() != Some(recorded)
        {
            return Origin::OtherMachine;
        }
        match (&self.boot_id, boot_id()) {
            (Some(recorded), Some(now)) if *recorded != now => Origin::OtherBoot,
            _ => Origin::ThisBoot,
        }
    }

    /// Whether the record's pid (and the group or session it leads) names a
    /// process of this boot of this machine, so that it may be looked up in
    /// `/proc` or signalled at all (after an identity check).
    pub fn is_of_this_boot(&self) -> bool {
        self.origin() == Origin::ThisBoot
    }

    /// The machine to name when the record is of another one: its host name,
    /// else (or when it is this machine's host name too, as for containers
    /// told apart by `$SUBAGENTS_MACHINE_ID`) its machine id.
    pub fn foreign_host(&self) -> Option<&str> {
        if self.origin() != Origin::OtherMachine {
            return None;
        }
        let host = self
            .host
            .as_deref()
            .filter(|h| host_name().as_deref() != Some(*h));
        host.or(self.machine_id.as_deref())
    }

    /// Whether this recorded process is still the one running under its pid.
    /// A record of another machine is [`Liveness::Foreign`] without any look
    /// at `/proc`; one of another boot is [`Liveness::Dead`].
    pub fn liveness(&self) -> Liveness {
        match self.origin() {
            Origin::OtherMachine => return Liveness::Foreign,
            Origin::OtherBoot => return Liveness::Dead,
            Origin::ThisBoot => {}
        }
        match read_stat(self.pid) {
            Ok(stat) if stat.state == 'Z' || stat.state == 'X' => Liveness::Dead,
            Ok(stat) if stat.start_time != self.start_time => Liveness::Dead,
            Ok(_) => Liveness::Alive,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Liveness::Dead,
            Err(_) => Liveness::Unknown,
        }
    }
}

/// Liveness of a bare pid, for records that carry no start time (the
/// reference's files): `kill(pid, 0)`; EPERM counts as alive, as in the reference.
pub fn pid_liveness(pid: u32) -> Liveness {
    use nix::errno::Errno;
    let Ok(raw) = i32::try_from(pid) else {
        return Liveness::Unknown;
    };
    if raw <= 0 {
        return Liveness::Unknown;
    }
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(raw), None) {
        Ok(()) | Err(Errno::EPERM) => match read_stat(pid) {
            Ok(stat) if stat.state == 'Z' => Liveness::Dead,
            _ => Liveness::Alive,
        },
        Err(Errno::ESRCH) => Liveness::Dead,
        Err(_) => Liveness::Unknown,
    }
}

/// Reads and parses `/proc/<pid>/stat`.
pub fn read_stat(pid: u32) -> io::Result<ProcStat> {
    let text = read_small(&format!("/proc/{pid}/stat"))?;
    parse_stat(&text).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("malformed /proc/{pid}/stat"),
        )
    })
}

/// Parses the text of a `/proc/<pid>/stat` file.
///
/// The command name (field 2) may hold spaces and parentheses, so fields are
/// counted from the last `)`.
pub fn parse_stat(text: &str) -> Option<ProcStat> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state); field N is fields[N - 3].
    Some(ProcStat {
        state: fields.first()?.chars().next()?,
        ppid: fields.get(1)?.parse().ok()?,
        pgrp: fields.get(2)?.parse().ok()?,
        session: fields.get(3)?.parse().ok()?,
        start_time: fields.get(19)?.parse().ok()?,
    })
}

/// The kernel's boot id, if readable. Read once per process: it cannot
/// change while the process lives.
pub fn boot_id() -> Option<String> {
    static BOOT_ID: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    BOOT_ID
        .get_or_init(|| {
            read_small("/proc/sys/kernel/random/boot_id")
                .ok()
                .map(|s| s.trim().to_owned())
        })
        .clone()
}

/// The variable that names this machine instead of `/etc/machine-id`: for
/// hosts that share one machine id (containers started from one image, cloned
/// virtual machines) and for tests that play another machine.
pub const MACHINE_ID_ENV: &str = "SUBAGENTS_MACHINE_ID";

/// This machine's identity, read once per process: `$SUBAGENTS_MACHINE_ID`
/// when set and not empty, else `/etc/machine-id`, else the host name.
pub fn machine_id() -> Option<String> {
    static MACHINE_ID: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    MACHINE_ID
        .get_or_init(|| {
            let named = std::env::var(MACHINE_ID_ENV).ok();
            let file = || read_small("/etc/machine-id").ok();
            [named, file(), host_name()]
                .into_iter()
                .flatten()
                .map(|id| id.trim().to_owned())
                .find(|id| !id.is_empty())
        })
        .clone()
}

/// This machine's host name (`/proc/sys/kernel/hostname`), read once.
pub fn host_name() -> Option<String> {
    static HOST: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    HOST.get_or_init(|| {
        read_small("/proc/sys/kernel/hostname")
            .ok()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
    })
    .clone()
}

/// Reads a small `/proc` file with one `read` where it fits in 1 KiB
/// (`/proc` reports size 0, so a generic reader probes in tiny steps).
fn read_small(path: &str) -> io::Result<String> {
    use std::io::Read;
    let mut file = fs::File::open(path)?;
    let mut buf = [0u8; 1024];
    let mut text = Vec::new();
    loop {
        match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => text.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    String::from_utf8(text).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Pids of the live (non-zombie) processes in process group `pgid`.
///
/// An empty group is answered by one `kill(-pgid, 0)`; only a group that
/// still has members (live or zombie) costs a walk over `/proc`.
pub fn group_members(pgid: u32) -> io::Result<Vec<u32>> {
    if !group_exists(pgid) {
        return Ok(Vec::new());
    }
    processes_matching(|stat| stat.pgrp == pgid)
}

/// Pids of the live (non-zombie) processes in session `sid`.
///
/// A pid stays reserved while any process uses it as its session id, so
/// when the session leader is gone (and its pid not reused) every member
/// found here descends from that leader.
pub fn session_members(sid: u32) -> io::Result<Vec<u32>> {
    processes_matching(|stat| stat.session == sid)
}

/// Pids of the live processes (other than the caller) whose initial
/// environment holds exactly `name=value`.
///
/// Only processes of this user can be read; others are skipped. Meant for
/// rare clean-up paths: it reads every such process's environment.
pub fn processes_with_env(name: &str, value: &str) -> io::Result<Vec<u32>> {
    let wanted = format!("{name}={value}").into_bytes();
    let carries = |environ: &[u8]| {
        environ
            .split(|b| *b == 0)
            .any(|entry| entry == wanted.as_slice())
    };
    let me = std::process::id();
    let mut pids = Vec::new();
    let mut blank = Vec::new();
    for pid in processes_matching(|_| true)?
        .into_iter()
        .filter(|p| *p != me)
    {
        let Ok(environ) = fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        if environ.is_empty() {
            blank.push(pid);
        } else if carries(&environ) {
            pids.push(pid);
        }
    }
    // A process in the middle of `exec` shows an empty environment until
    // the kernel has placed the new one (its parent may already have been
    // told it started): such processes are read again once the scan is
    // over. One still empty has an empty environment.
    for pid in blank {
        if fs::read(format!("/proc/{pid}/environ")).is_ok_and(|e| carries(&e)) {
            pids.push(pid);
        }
    }
    pids.sort_unstable();
    Ok(pids)
}

/// Whether any process (a zombie included) is in group `pgid`. Unsure
/// answers (pgid 0, EPERM) are "yes", which only costs the caller a scan.
pub fn group_exists(pgid: u32) -> bool {
    let Some(negated) = i32::try_from(pgid).ok().filter(|g| *g > 0).map(|g| -g) else {
        return true;
    };
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(negated), None)
        != Err(nix::errno::Errno::ESRCH)
}

/// Pids of the live (non-zombie) children of `ppid`.
///
/// For the calling process, having no children at all is answered by one
/// `waitid` (ECHILD) without walking `/proc`.
pub fn children_of(ppid: u32) -> io::Result<Vec<u32>> {
    if ppid == std::process::id() && !has_children() {
        return Ok(Vec::new());
    }
    processes_matching(|stat| stat.ppid == ppid)
}

/// Whether the calling process has any child, live or not yet reaped.
/// Nothing is reaped (`WNOWAIT`).
fn has_children() -> bool {
    // SAFETY: waitid(2) with a zeroed siginfo it fills; WNOHANG never blocks
    // and WNOWAIT leaves any exited child for its real reaper.
    let rc = unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        libc::waitid(
            libc::P_ALL,
            0,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        )
    };
    !(rc < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD))
}

fn processes_matching(keep: impl Fn(&ProcStat) -> bool) -> io::Result<Vec<u32>> {
    let mut pids = Vec::new();
    for entry in fs::read_dir("/proc")? {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        // A process may exit between listing and reading: skip it.
        if let Ok(stat) = read_stat(pid)
            && stat.state != 'Z'
            && stat.state != 'X'
            && keep(&stat)
        {
            pids.push(pid);
        }
    }
    Ok(pids)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn parses_a_name_with_spaces_and_parens() {
        let text = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 777 1000 10";
        let stat = parse_stat(text).unwrap();
        assert_eq!(
            stat,
            ProcStat {
                state: 'S',
                ppid: 1,
                pgrp: 42,
                session: 42,
                start_time: 777
            }
        );
    }

    #[test]
    fn current_process_is_alive_and_a_changed_start_time_is_dead() {
        let me = ProcessIdentity::current().unwrap();
        assert_eq!(me.liveness(), Liveness::Alive);
        let recycled = ProcessIdentity {
            start_time: me.start_time + 1,
            ..me.clone()
        };
        assert_eq!(recycled.liveness(), Liveness::Dead);
        let other_boot = ProcessIdentity {
            boot_id: Some("another-boot".into()),
            ..me
        };
        assert_eq!(other_boot.liveness(), Liveness::Dead);
    }

    #[test]
    fn an_identity_names_this_machine_and_its_host() {
        let me = ProcessIdentity::current().unwrap();
        assert!(me.machine_id.as_deref().is_some_and(|m| !m.is_empty()));
        assert_eq!(me.machine_id, machine_id());
        assert_eq!(me.host, host_name());
        assert_eq!(me.origin(), Origin::ThisBoot);
        assert!(me.is_of_this_boot());
        assert_eq!(me.foreign_host(), None);
        let json = serde_json::to_value(&me).unwrap();
        assert_eq!(json["machineId"].as_str(), me.machine_id.as_deref());
        assert_eq!(json["host"].as_str(), me.host.as_deref());
    }

    #[test]
    fn a_live_process_recorded_in_another_boot_is_dead_and_not_of_this_boot() {
        // The very pid and start time of a live process: only the boot
        // differs, as after a reboot that handed out the same numbers.
        let me = ProcessIdentity::current().unwrap();
        let past = ProcessIdentity {
            boot_id: Some("00000000-0000-4000-8000-0000000b0070".into()),
            ..me.clone()
        };
        assert_eq!(past.origin(), Origin::OtherBoot);
        assert_eq!(past.liveness(), Liveness::Dead);
        assert!(!past.is_of_this_boot());
        assert_eq!(past.foreign_host(), None);
        // An old record (no machine id) is judged on its boot id alone.
        let old_past = ProcessIdentity {
            machine_id: None,
            host: None,
            ..past
        };
        assert_eq!(old_past.liveness(), Liveness::Dead);
        assert!(!old_past.is_of_this_boot());
        let old_here = ProcessIdentity {
            machine_id: None,
            host: None,
            ..me
        };
        assert_eq!(old_here.liveness(), Liveness::Alive);
        assert!(old_here.is_of_this_boot());
    }

    #[test]
    fn a_live_process_recorded_on_another_machine_is_foreign_whatever_its_boot() {
        let me = ProcessIdentity::current().unwrap();
        let elsewhere = ProcessIdentity {
            machine_id: Some("another-machine-0001".into()),
            host: Some("node-b".into()),
            ..me.clone()
        };
        // Same pid, start time and even boot id: still not ours to probe.
        assert_eq!(elsewhere.origin(), Origin::OtherMachine);
        assert_eq!(elsewhere.liveness(), Liveness::Foreign);
        assert!(!elsewhere.is_of_this_boot());
        assert_eq!(elsewhere.foreign_host(), Some("node-b"));
        let unnamed = ProcessIdentity {
            host: None,
            ..elsewhere.clone()
        };
        assert_eq!(unnamed.foreign_host(), Some("another-machine-0001"));
        // Same host name, another machine id (containers of one host told
        // apart by $SUBAGENTS_MACHINE_ID): the machine id says which.
        let same_name = ProcessIdentity {
            host: host_name(),
            ..elsewhere
        };
        assert_eq!(same_name.foreign_host(), Some("another-machine-0001"));
    }

    #[test]
    fn an_old_record_without_the_new_fields_still_reads() {
        let old: ProcessIdentity =
            serde_json::from_str(r#"{"pid":7,"startTime":9,"bootId":"b"}"#).unwrap();
        assert_eq!((old.machine_id, old.host), (None, None));
        let text = serde_json::to_string(&ProcessIdentity {
            pid: 7,
            start_time: 9,
            boot_id: Some("b".into()),
            machine_id: None,
            host: None,
        })
        .unwrap();
        assert_eq!(text, r#"{"pid":7,"startTime":9,"bootId":"b"}"#);
    }

    #[test]
    fn an_exited_process_is_dead() {
        let mut child = Command::new("true").spawn().unwrap();
        let id = ProcessIdentity::of(child.id()).unwrap();
        child.wait().unwrap();
        assert_eq!(id.liveness(), Liveness::Dead);
        assert_eq!(pid_liveness(child.id()), Liveness::Dead);
    }

    #[test]
    fn a_zombie_is_dead_and_not_a_group_member() {
        use std::os::unix::process::CommandExt;
        let mut child = Command::new("sleep")
            .arg("0.2")
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = child.id();
        // The real identity, taken while the child runs: only the zombie
        // check can make it dead below.
        let id = ProcessIdentity::of(pid).unwrap();
        assert_eq!(id.liveness(), Liveness::Alive);
        // Wait until it has exited but is not reaped yet.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while read_stat(pid).map(|s| s.state != 'Z').unwrap_or(false) {
            assert!(
                std::time::Instant::now() < deadline,
                "child never became a zombie"
            );
            std::thread::yield_now();
        }
        assert_eq!(id.liveness(), Liveness::Dead);
        assert!(group_members(pid).unwrap().is_empty());
        child.wait().unwrap();
    }

    #[test]
    fn lists_group_members() {
        use std::os::unix::process::CommandExt;
        let mut child = Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = child.id();
        assert_eq!(group_members(pid).unwrap(), vec![pid]);
        let own_session = read_stat(std::process::id()).unwrap().session;
        assert!(session_members(own_session).unwrap().contains(&pid));
        assert!(children_of(std::process::id()).unwrap().contains(&pid));
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn finds_processes_by_an_exact_environment_entry() {
        let tag = format!("tagged-{}", std::process::id());
        let mut tagged = Command::new("sleep")
            .arg("30")
            .env("PROCESS_IDENTITY_TEST_TAG", &tag)
            .spawn()
            .unwrap();
        let mut prefixed = Command::new("sleep")
            .arg("30")
            .env("PROCESS_IDENTITY_TEST_TAG", format!("{tag}-other"))
            .spawn()
            .unwrap();
        // Until `sleep` has finished its exec, /proc shows no environment
        // for it (see `processes_with_env`): wait for the tagged one.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let found = loop {
            let found = processes_with_env("PROCESS_IDENTITY_TEST_TAG", &tag).unwrap();
            if found.contains(&tagged.id()) || std::time::Instant::now() > deadline {
                break found;
            }
            std::thread::yield_now();
        };
        assert_eq!(found, vec![tagged.id()]);
        for child in [&mut tagged, &mut prefixed] {
            child.kill().unwrap();
            child.wait().unwrap();
        }
        assert!(
            processes_with_env("PROCESS_IDENTITY_TEST_TAG", &tag)
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn an_empty_group_and_a_childless_caller_need_no_scan() {
        use std::os::unix::process::CommandExt;
        let mut child = Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = child.id();
        assert!(group_exists(pid));
        assert!(has_children());
        child.kill().unwrap();
        child.wait().unwrap();
        // Reaped: the group is gone, and kill(-pgid, 0) says so.
        assert!(!group_exists(pid));
        assert!(group_members(pid).unwrap().is_empty());
    }

    #[test]
    fn a_bare_pid_is_alive_dead_or_unknown() {
        assert_eq!(pid_liveness(std::process::id()), Liveness::Alive);
        assert_eq!(pid_liveness(0), Liveness::Unknown);
        assert_eq!(pid_liveness(u32::MAX), Liveness::Unknown);
        // An exited child not reaped yet still has its pid: a zombie is dead.
        let mut child = Command::new("true").spawn().unwrap();
        let pid = child.id();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while read_stat(pid).map(|s| s.state != 'Z').unwrap_or(false) {
            assert!(std::time::Instant::now() < deadline, "no zombie");
            std::thread::yield_now();
        }
        assert_eq!(pid_liveness(pid), Liveness::Dead);
        child.wait().unwrap();
    }

    #[test]
    fn the_boot_id_is_the_kernels() {
        let kernel = fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
        assert_eq!(boot_id().as_deref(), Some(kernel.trim()));
        assert_eq!(boot_id().unwrap().len(), 36);
    }

    #[test]
    fn a_read_error_other_than_an_interruption_is_returned() {
        // Reading a directory fails (EISDIR) every time: retrying would
        // never end, so the read runs on a thread with a deadline.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(read_small("/proc/self").map_err(|e| e.kind()));
        });
        let outcome = rx
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("a failing read must not be retried forever");
        assert_eq!(outcome, Err(io::ErrorKind::IsADirectory));
    }

    #[test]
    fn a_group_outlives_its_leader() {
        use std::io::BufRead;
        use std::os::unix::process::CommandExt;
        // The leader starts a member in its group, prints its pid and exits.
        let mut leader = Command::new("sh")
            .args(["-c", "sleep 30 & echo $!"])
            .process_group(0)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let pgid = leader.id();
        let mut line = String::new();
        std::io::BufReader::new(leader.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let member: u32 = line.trim().parse().unwrap();
        assert!(member > 1, "{line:?}");
        leader.wait().unwrap();
        let exists = group_exists(pgid);
        let members = group_members(pgid).unwrap();
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(member as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        assert!(exists, "the group lives while a member does");
        assert_eq!(members, vec![member]);
    }

    #[test]
    fn a_caller_with_a_child_is_not_taken_for_childless_by_a_stale_errno() {
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        // A successful waitid leaves errno as it was: an ECHILD from an
        // earlier call must not make a live child invisible.
        // SAFETY: writes this thread's errno, an int it owns.
        unsafe { *libc::__errno_location() = libc::ECHILD };
        let children = children_of(std::process::id()).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(children.contains(&child.id()), "{children:?}");
    }

    #[test]
    fn identity_json_is_camel_case() {
        let id = ProcessIdentity {
            pid: 7,
            start_time: 9,
            boot_id: None,
            machine_id: None,
            host: None,
        };
        assert_eq!(
            serde_json::to_string(&id).unwrap(),
            r#"{"pid":7,"startTime":9}"#
        );
    }
}
