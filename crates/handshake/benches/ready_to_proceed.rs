//! Handshake latency, ready → proceed: from the runner writing `ready` to the
//! runner reading `proceed`, with the launcher's side in another thread.
//!
//! Both sides are this crate's real code on a real directory (inotify
//! wake-ups, the four record files); only the process boundary is missing.
//! The runner's pid in the records is a sleeping child, so a failed round
//! would terminate that child, never the benchmark itself.
//!
//! `cargo bench -p handshake --bench ready_to_proceed`

extern crate subagents_handshake as handshake;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::OnceLock;
use std::thread::JoinHandle;

use handshake::{
    Binding, LauncherTimeouts, Runner, RunnerHandshake, RunnerTimeouts, run_launcher_side,
};
use process_identity::ProcessIdentity;

fn main() {
    divan::main();
    if let Some(stand_in) = STAND_IN.get() {
        let _ = Command::new("kill").arg(stand_in.id().to_string()).status();
    }
}

/// The process the records name as the runner (see the module comment).
static STAND_IN: OnceLock<Child> = OnceLock::new();

fn stand_in() -> &'static Child {
    STAND_IN.get_or_init(|| {
        Command::new("sleep")
            .arg("3600")
            .spawn()
            .expect("spawn the stand-in runner")
    })
}

/// One handshake ready to start: the runner side prepared (its watch set up,
/// as a runner does before `ready`) and the launcher side already waiting.
struct Round {
    dir: tempfile::TempDir,
    runner: RunnerHandshake,
    launcher: JoinHandle<bool>,
}

fn round() -> Round {
    let pid = stand_in().id();
    let dir = tempfile::tempdir().expect("temp dir");
    let binding = Binding {
        run_id: "bench".to_owned(),
        runner_process_instance_id: "00000000-0000-4000-8000-000000000000".to_owned(),
    };
    let runner = RunnerHandshake::new(
        dir.path(),
        binding.clone(),
        "lease-token".to_owned(),
        RunnerTimeouts::default(),
    )
    .with_pid(pid);
    let path: PathBuf = dir.path().to_path_buf();
    let launcher = std::thread::spawn(move || {
        let runner = Runner::Process(ProcessIdentity::of(pid).expect("stand-in identity"));
        run_launcher_side(&path, &binding, None, runner, &LauncherTimeouts::default()).is_ok()
    });
    Round {
        dir,
        runner,
        launcher,
    }
}

#[divan::bench(sample_count = 300, sample_size = 1)]
fn ready_to_proceed(bencher: divan::Bencher<'_, '_>) {
    let owner = serde_json::json!({"token": "lease-token"});
    bencher.with_inputs(round).bench_local_values(|r| {
        r.runner.startup(&owner).expect("runner side");
        assert!(r.launcher.join().expect("launcher thread"), "launcher side");
        // Dropped outside the timing.
        r.dir
    });
}
