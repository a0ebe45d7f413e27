//! Measures the handshake round trip: from the runner having written `ready`
//! to the runner seeing `proceed`, over real runner processes (this example
//! re-executed). Prints min/median/p95/max over `RUNS` launches (default 200).
//!
//! `cargo run --release -p handshake --example roundtrip`

extern crate subagents_handshake as handshake;
use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use handshake::{
    Binding, LauncherTimeouts, Runner, RunnerHandshake, RunnerTimeouts, remove_stale_files,
    run_launcher_side,
};

const ROLE: &str = "ROUNDTRIP_RUNNER_DIR";

fn main() {
    match std::env::var_os(ROLE) {
        Some(dir) => runner(PathBuf::from(dir)),
        None => launcher(),
    }
}

fn binding() -> Binding {
    Binding {
        run_id: "roundtrip".into(),
        runner_process_instance_id: "instance".into(),
    }
}

/// Runner: one handshake, then print the round trip in microseconds.
fn runner(dir: PathBuf) {
    let hs = RunnerHandshake::new(&dir, binding(), "token".into(), RunnerTimeouts::default());
    hs.announce_ready(&serde_json::json!({})).expect("ready");
    let ready_written = Instant::now();
    hs.await_commit().expect("commit");
    print!("{}", ready_written.elapsed().as_micros());
}

fn launcher() {
    let runs: usize = std::env::var("RUNS").map_or(200, |v| v.parse().expect("RUNS"));
    let tmp = tempfile::tempdir().expect("temp dir");
    let exe = std::env::current_exe().expect("current exe");
    let mut round_trips = Vec::with_capacity(runs);
    let mut launches = Vec::with_capacity(runs);
    for _ in 0..runs {
        remove_stale_files(tmp.path()).expect("remove stale files");
        let started = Instant::now();
        let mut child = Command::new(&exe)
            .env(ROLE, tmp.path())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn runner");
        let result = run_launcher_side(
            tmp.path(),
            &binding(),
            None,
            Runner::Child(&mut child),
            &LauncherTimeouts::default(),
        );
        launches.push(started.elapsed());
        if let Err(failure) = result {
            panic!("handshake failed: {}", failure.error);
        }
        let mut out = String::new();
        child
            .stdout
            .take()
            .expect("stdout")
            .read_to_string(&mut out)
            .expect("read runner output");
        assert!(child.wait().expect("wait").success());
        round_trips.push(Duration::from_micros(out.parse().expect("micros")));
    }
    report("ready written -> proceed seen (runner)", &mut round_trips);
    report("spawn -> launcher side returned", &mut launches);
}

fn report(what: &str, samples: &mut [Duration]) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    println!(
        "{what}: n={} min={:?} median={:?} p95={:?} max={:?}",
        samples.len(),
        samples[0],
        at(0.5),
        at(0.95),
        samples[samples.len() - 1]
    );
}
