//! What the monitor and the runner give back before they wait.
//!
//! Both live as long as their run and spend it blocked (the monitor in
//! `waitpid`, the runner in `poll`). Starting up touched code all over
//! this binary and the C library, and the kernel maps every such page with
//! its neighbours (fault-around, 64 KiB at a time): ~3 MiB of code and
//! constants per process that nothing executes while the process waits.
//! [`release_clean_file_pages`] unmaps the pages of the read-only file
//! mappings that hold no private copy. They stay in the page cache, shared
//! with every other process of the binary; the next wake-up maps back only
//! what it runs. The kernel unmaps such pages the same way when it reclaims
//! memory, so this changes when they go, never what the process reads.

/// A mapping of `/proc/self/smaps` whose pages can be dropped: its start
/// address and length in bytes.
type Range = (usize, usize);

/// Unmaps the resident pages of this process's clean read-only file
/// mappings (see the module documentation). Best effort: without a
/// readable `/proc/self/smaps` nothing is released.
pub fn release_clean_file_pages() {
    let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else {
        return;
    };
    for (start, len) in clean_file_mappings(&smaps) {
        // SAFETY: the range is one whole mapping of this process, private,
        // not writable and file-backed, with no anonymous (copied-on-write)
        // or swapped page: every page dropped is read back from its file
        // unchanged. Nothing here makes a mapping writable between reading
        // smaps and this call (no mprotect; a page a debugger patched
        // meanwhile would only lose its breakpoint).
        unsafe {
            libc::madvise(start as *mut libc::c_void, len, libc::MADV_DONTNEED);
        }
    }
}

/// The mappings of `smaps` that are readable, private, not writable, backed
/// by a file, and resident, and hold no anonymous, swapped or locked page:
/// dropping their pages loses nothing.
pub fn clean_file_mappings(smaps: &str) -> Vec<(usize, usize)> {
    let mut found = Vec::new();
    let mut current: Option<Range> = None;
    for line in smaps.lines() {
        if let Some(candidate) = mapping_header(line) {
            found.extend(current.take());
            current = candidate;
            continue;
        }
        let mut fields = line.split_whitespace();
        let (Some(name), Some(kb)) = (fields.next(), fields.next()) else {
            continue;
        };
        let disqualifies = match name {
            "Anonymous:" | "Swap:" | "Locked:" => kb != "0",
            "Rss:" => kb == "0",
            _ => false,
        };
        if disqualifies {
            current = None;
        }
    }
    found.extend(current);
    found
}

/// For the first line of a mapping (`start-end perms offset dev inode
/// path`): `Some` with the range when it is a candidate, `Some(None)` when
/// it is not; `None` for any other line.
fn mapping_header(line: &str) -> Option<Option<Range>> {
    let mut fields = line.split_whitespace();
    let (start, end) = fields.next()?.split_once('-')?;
    let start = usize::from_str_radix(start, 16).ok()?;
    let end = usize::from_str_radix(end, 16).ok()?;
    let perms = fields.next()?.as_bytes();
    let _offset = fields.next()?;
    let _device = fields.next()?;
    let inode = fields.next()?;
    let path = fields.next().unwrap_or_default();
    let clean = perms.len() == 4
        && perms[0] == b'r'
        && perms[1] == b'-'
        && perms[3] == b'p'
        && inode != "0"
        && path.starts_with('/')
        && end > start;
    Some(clean.then_some((start, end - start)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
5581d0a00000-5581d0a70000 r--p 00000000 fd:01 1234 /usr/bin/subagents
Size:                448 kB
Rss:                 448 kB
Anonymous:             0 kB
Swap:                  0 kB
Locked:                0 kB
VmFlags: rd mr mw me sd
5581d0a71000-5581d0cb8000 r-xp 001f0000 fd:01 1234 /usr/bin/subagents
Rss:                2008 kB
Anonymous:             0 kB
Swap:                  0 kB
Locked:                0 kB
VmFlags: rd ex mr mw me sd
5581d0cb8000-5581d0ce4000 r--p 00835000 fd:01 1234 /usr/bin/subagents
Rss:                 176 kB
Anonymous:           176 kB
Swap:                  0 kB
VmFlags: rd mr mw me ac sd
5581d0ce4000-5581d0ce6000 rw-p 00860000 fd:01 1234 /usr/bin/subagents
Rss:                   8 kB
Anonymous:             8 kB
5581d1000000-5581d1021000 rw-p 00000000 00:00 0 [heap]
Rss:                  44 kB
Anonymous:            44 kB
7f0000000000-7f0000010000 r-xp 00000000 fd:01 99 /usr/lib/libdebugged.so
Rss:                  64 kB
Anonymous:             4 kB
7f0000010000-7f0000020000 r-xp 00000000 fd:01 98 /usr/lib/libswapped.so
Rss:                  60 kB
Anonymous:             0 kB
Swap:                  4 kB
7f0000020000-7f0000030000 r-xp 00000000 fd:01 97 /usr/lib/libunused.so
Rss:                   0 kB
Anonymous:             0 kB
7f0000030000-7f0000040000 ---p 00010000 fd:01 97 /usr/lib/libunused.so
Rss:                   0 kB
7f0000040000-7f0000050000 r--s 00000000 fd:01 96 /dev/shm/shared
Rss:                  64 kB
Anonymous:             0 kB
7ffd00000000-7ffd00002000 r-xp 00000000 00:00 0 [vdso]
Rss:                   4 kB
Anonymous:             0 kB
7f0000050000-7f0000060000 r-xp 00000000 fd:01 95 /usr/lib/libc.so.6
Rss:                  64 kB
Anonymous:             0 kB
Swap:                  0 kB
Locked:                0 kB
";

    #[test]
    fn only_clean_private_read_only_file_mappings_are_released() {
        assert_eq!(
            clean_file_mappings(SMAPS),
            vec![
                (0x5581d0a00000, 0x70000),
                (0x5581d0a71000, 0x247000),
                (0x7f0000050000, 0x10000),
            ]
        );
    }

    #[test]
    fn a_locked_mapping_is_kept() {
        let locked = "7f0000050000-7f0000060000 r-xp 00000000 fd:01 95 /lib/x.so\n\
                      Rss: 64 kB\nAnonymous: 0 kB\nLocked: 64 kB\n";
        assert!(clean_file_mappings(locked).is_empty());
    }

    /// Resident kB of this process's read-only, private, file-backed
    /// mappings, read straight off smaps.
    fn read_only_file_rss_kb() -> u64 {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut total = 0;
        let mut counted = false;
        for line in smaps.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.first().is_some_and(|f| f.contains('-')) && fields.len() >= 5 {
                let perms = fields[1];
                counted = perms.starts_with("r-")
                    && perms.ends_with('p')
                    && fields.get(5).is_some_and(|p| p.starts_with('/'));
            } else if counted && fields.first() == Some(&"Rss:") {
                total += fields[1].parse::<u64>().unwrap();
            }
        }
        total
    }

    #[test]
    fn releasing_gives_back_resident_code_pages() {
        let before = read_only_file_rss_kb();
        release_clean_file_pages();
        let after = read_only_file_rss_kb();
        // What the read above and the other test threads run meanwhile
        // comes back at once, but far less than was mapped (here about a
        // third); without the release nothing leaves.
        assert!(
            after < before,
            "resident read-only file pages: {before} kB before, {after} kB after"
        );
    }

    #[test]
    fn this_process_still_runs_after_releasing_its_code() {
        let own = std::fs::read_to_string("/proc/self/smaps").unwrap();
        assert!(
            !clean_file_mappings(&own).is_empty(),
            "no releasable mapping found in this process"
        );
        release_clean_file_pages();
        // Code and constants come back from the page cache on use.
        let text: String = ["re", "leased"].concat();
        assert_eq!(text.len(), 8);
        assert_eq!(format!("{:?}", Some(text)), "Some(\"released\")");
    }
}
