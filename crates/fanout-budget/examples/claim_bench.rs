//! Measures admission cost.
//!
//! * `claim_bench [N]`: one process claims N single-path batches (default
//!   2000) from a budget of limit N; prints claims per second.
//! * `claim_bench --race P S`: P processes (default 128) race for S slots
//!   (default 64), each claiming one path; prints the wall time from release
//!   to the last exit and the admitted/rejected counts.
//!
//! Run with `cargo run --release -p fanout-budget --example claim_bench`.
//! Budgets are created under `$TMPDIR`.

extern crate subagents_fanout_budget as fanout_budget;
use std::env;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use fanout_budget::{BUDGET_ENV, BUDGET_ROOT_DIR, create_budget, inherited_from_env};

const WORKER_ROOT: &str = "CLAIM_BENCH_WORKER_ROOT";
const REJECTED: i32 = 3;

fn main() -> Result<()> {
    if let Ok(root) = env::var(WORKER_ROOT) {
        std::process::exit(worker(Path::new(&root))?);
    }
    let args: Vec<String> = env::args().skip(1).collect();
    let number = |i: usize, default: u64| -> Result<u64> {
        args.get(i)
            .map_or(Ok(default), |a| a.parse().context("a number"))
    };
    if args.first().map(String::as_str) == Some("--race") {
        race(number(1, 128)?, number(2, 64)?)
    } else {
        sequential(number(0, 2000)?)
    }
}

fn sequential(count: u64) -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let budget = create_budget(&tmp.path().join(BUDGET_ROOT_DIR), "bench", count)?;
    let start = Instant::now();
    for i in 0..count {
        budget.claim(&[format!("tasks[{i}]")])?;
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "sequential: {count} claims in {secs:.3} s = {:.0} claims/s ({:.3} ms each), final {}",
        count as f64 / secs,
        secs * 1000.0 / count as f64,
        budget.snapshot()?
    );
    Ok(())
}

fn race(processes: u64, slots: u64) -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let root = tmp.path().join(BUDGET_ROOT_DIR);
    let budget = create_budget(&root, "race", slots)?;
    let mut children = Vec::new();
    for i in 0..processes {
        let child = Command::new(env::current_exe()?)
            .arg(format!("tasks[{i}]"))
            .env(WORKER_ROOT, &root)
            .env(BUDGET_ENV, budget.descriptor().to_env_value())
            .stdin(Stdio::piped())
            .spawn()?;
        children.push(child);
    }
    let start = Instant::now();
    for child in &mut children {
        drop(child.stdin.take());
    }
    let (mut admitted, mut rejected) = (0, 0);
    for mut child in children {
        match child.wait()?.code() {
            Some(0) => admitted += 1,
            Some(REJECTED) => rejected += 1,
            other => bail!("worker failed with {other:?}"),
        }
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "race: {processes} processes for {slots} slots: {admitted} admitted, {rejected} rejected in {:.1} ms; final {}",
        secs * 1000.0,
        budget.snapshot()?
    );
    Ok(())
}

/// One racer: validate the inherited budget, wait for the start (stdin
/// closed), claim one path. Exit 0 admitted, 3 rejected.
fn worker(root: &Path) -> Result<i32> {
    let budget = inherited_from_env(root)?.context("no inherited budget")?;
    let path = env::args().nth(1).context("a claim path")?;
    std::io::stdin().read_to_end(&mut Vec::new())?;
    match budget.claim(&[path]) {
        Ok(_) => Ok(0),
        Err(e) if e.rejection().is_some() => Ok(REJECTED),
        Err(e) => Err(e.into()),
    }
}
