//! Terminating a runner that never proceeded (docs/protocol/handshake.md §6.2, with the fixes of §10): the
//! signals go to its process group, and "gone" is decided by `waitpid` for our
//! own child (so its zombie does not count as alive) or by the pid-reuse-safe
//! identity otherwise, plus an empty process group.

use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

use crate::launcher::Runner;
use crate::wake::Waiter;

/// How often to look at the process group once the runner itself is gone.
const GROUP_POLL: Duration = Duration::from_millis(20);

/// SIGTERM, then SIGKILL, each followed by up to its grace period of waiting.
/// Returns whether the runner and its process group were seen gone.
pub(crate) fn terminate(
    runner: &mut Runner<'_>,
    waiter: &Waiter,
    term_grace: Duration,
    kill_grace: Duration,
) -> bool {
    for (signal, grace) in [(Signal::SIGTERM, term_grace), (Signal::SIGKILL, kill_grace)] {
        if is_gone(runner) {
            return true;
        }
        send(runner, signal);
        let deadline = Instant::now() + grace;
        while !is_gone(runner) && Instant::now() < deadline {
            if runner.has_exited() {
                waiter.wait_at_most(deadline, GROUP_POLL);
            } else {
                waiter.wait(deadline);
            }
        }
    }
    is_gone(runner)
}

fn is_gone(runner: &mut Runner<'_>) -> bool {
    runner.has_exited() && group_is_empty(runner.pid())
}

fn group_is_empty(pgid: u32) -> bool {
    // Without /proc the runner's own exit is all that can be observed.
    process_identity::group_members(pgid).map_or(true, |members| members.is_empty())
}

/// Signals the runner's process group; the runner alone when it leads none.
fn send(runner: &mut Runner<'_>, signal: Signal) {
    let Ok(raw) = i32::try_from(runner.pid()) else {
        return;
    };
    let pid = Pid::from_raw(raw);
    // The group id stays reserved while any member lives, so it cannot name a
    // stranger; the pid alone is only signalled while the runner provably runs.
    if killpg(pid, signal) == Err(Errno::ESRCH) && !runner.has_exited() {
        let _ = kill(pid, signal);
    }
}
