//! The command line a forked monitor or runner shows in `ps` and
//! `/proc/<pid>/cmdline`.
//!
//! A process started by `exec` gets `subagents __monitor <run id>` as its
//! arguments; one forked without `exec` still shows its parent's (`subagents
//! run -- ...`), and its parent's argument area is usually too short for the
//! new words. Those words are not only for people: `procs::runs_as` tells a
//! run's monitor and runner from any other process by them. So a forked
//! process points the kernel's record of its argument area at a buffer of
//! its own (`prctl(PR_SET_MM, PR_SET_MM_MAP)`, which needs no privilege as
//! long as the executable link is left alone), and `/proc/<pid>/cmdline`
//! reads the same NUL-separated words an `exec` would have given. Where the
//! kernel refuses (built without checkpoint/restore, or a filter), nothing
//! forks: [`supported`] says so first.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

/// `struct prctl_mm_map` of `<linux/prctl.h>`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct MmMap {
    start_code: u64,
    end_code: u64,
    start_data: u64,
    end_data: u64,
    start_brk: u64,
    brk: u64,
    start_stack: u64,
    arg_start: u64,
    arg_end: u64,
    env_start: u64,
    env_end: u64,
    auxv: u64,
    auxv_size: u32,
    exe_fd: u32,
}

/// Whether this kernel lets this process replace its command line: the
/// same call with the current values, which changes nothing.
pub fn supported() -> bool {
    current().is_some_and(|map| apply(&map).is_ok())
}

/// Makes `/proc/self/cmdline` read `args`, NUL-separated, and the process
/// name (`comm`) the file name of the first. The buffer lives as long as
/// the process.
pub fn set(args: &[&OsStr]) -> std::io::Result<()> {
    let mut map = current().ok_or_else(|| std::io::Error::other("unreadable /proc/self/stat"))?;
    let mut words = Vec::new();
    for arg in args {
        words.extend_from_slice(arg.as_bytes());
        words.push(0);
    }
    let words: &'static [u8] = Vec::leak(words);
    map.arg_start = words.as_ptr() as u64;
    map.arg_end = map.arg_start + words.len() as u64;
    apply(&map)?;
    if let Some(first) = args.first() {
        set_name(first);
    }
    Ok(())
}

/// `prctl(PR_SET_NAME)`: what an `exec` of that file would have named us.
fn set_name(path: &OsStr) {
    let name = std::path::Path::new(path)
        .file_name()
        .unwrap_or(path)
        .as_bytes();
    // The kernel keeps 15 bytes and a NUL.
    let mut buf = [0u8; 16];
    let len = name.len().min(15);
    buf[..len].copy_from_slice(&name[..len]);
    // SAFETY: prctl reads a NUL-terminated buffer we own.
    unsafe {
        libc::prctl(libc::PR_SET_NAME, buf.as_ptr(), 0, 0, 0);
    }
}

fn apply(map: &MmMap) -> std::io::Result<()> {
    // SAFETY: the kernel reads `size_of::<MmMap>()` bytes of a struct we own.
    let rc = unsafe {
        libc::prctl(
            libc::PR_SET_MM,
            libc::PR_SET_MM_MAP as libc::c_ulong,
            map as *const MmMap as libc::c_ulong,
            std::mem::size_of::<MmMap>() as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// This process's memory layout as the kernel records it, from
/// `/proc/self/stat` and the current program break; no auxiliary vector
/// and no executable change (`exe_fd` -1).
fn current() -> Option<MmMap> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let map = parse_stat(&stat)?;
    // SAFETY: brk(0) changes nothing and returns the current break.
    let brk = unsafe { libc::syscall(libc::SYS_brk, 0usize) };
    Some(MmMap {
        brk: brk as u64,
        ..map
    })
}

/// The layout fields of a `/proc/<pid>/stat` line (1-based field numbers
/// 26–28 and 45–51), `brk` left 0.
fn parse_stat(stat: &str) -> Option<MmMap> {
    // The name (field 2) may hold spaces and parentheses: count after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<u64> = rest
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    // `rest` starts at field 3.
    let field = |n: usize| fields.get(n - 3).copied();
    Some(MmMap {
        start_code: field(26)?,
        end_code: field(27)?,
        start_stack: field(28)?,
        start_data: field(45)?,
        end_data: field(46)?,
        start_brk: field(47)?,
        arg_start: field(48)?,
        arg_end: field(49)?,
        env_start: field(50)?,
        env_end: field(51)?,
        exe_fd: u32::MAX,
        ..MmMap::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_is_read_past_a_name_with_spaces_and_parentheses() {
        let mut line = String::from("42 (a (b) c) S");
        for n in 4..=52 {
            line.push_str(&format!(" {}", n * 10));
        }
        let map = parse_stat(&line).unwrap();
        assert_eq!(
            (map.start_code, map.end_code, map.start_stack),
            (260, 270, 280)
        );
        assert_eq!(
            (map.start_data, map.end_data, map.start_brk),
            (450, 460, 470)
        );
        assert_eq!((map.arg_start, map.arg_end), (480, 490));
        assert_eq!((map.env_start, map.env_end), (500, 510));
        assert_eq!(map.exe_fd, u32::MAX);
    }

    #[test]
    fn a_short_stat_line_is_no_layout() {
        assert!(parse_stat("42 (x) S 1 2 3").is_none());
    }

    /// A forked child sets its words and exits; the parent reads them back.
    #[test]
    fn a_forked_child_shows_the_words_it_set() {
        let _serial = crate::procs::tests::serial();
        assert!(supported(), "PR_SET_MM_MAP refused on this kernel");
        let (set_read, set_write) = nix::unistd::pipe().unwrap();
        let (done_read, done_write) = nix::unistd::pipe().unwrap();
        // SAFETY: the child only calls `set`, writes one byte and waits for
        // the parent's EOF, then `_exit`s (glibc's fork leaves malloc usable).
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            drop(done_write);
            let words = ["/x/subagents", "__runner", "run-7"].map(OsStr::new);
            let ok = set(&words).is_ok();
            let _ = nix::unistd::write(&set_write, &[u8::from(ok)]);
            let mut byte = [0u8];
            let _ = nix::unistd::read(&done_read, &mut byte);
            // SAFETY: ends the child without running the test harness's exit.
            unsafe { libc::_exit(0) };
        }
        drop(set_write);
        let mut byte = [0u8];
        nix::unistd::read(&set_read, &mut byte).unwrap();
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap();
        drop(done_write);
        nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None).unwrap();
        assert_eq!(byte, [1]);
        assert_eq!(cmdline, b"/x/subagents\0__runner\0run-7\0");
        assert_eq!(comm.trim_end(), "subagents");
    }
}
