//! Project automation, run through the cargo alias `cargo xtask`.

use xtask::snapshots::{self, Mode};

const USAGE: &str = "usage: cargo xtask <task>

tasks:
  snapshots            record the golden snapshots of every artifact (accepts all changes)
  snapshots --check    fail with a diff when a snapshot drifted, is missing or is stale
  snapshots --review   write drifted snapshots as .snap.new for `cargo insta review`";

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args.as_slice() {
        ["snapshots"] => run(Mode::Write),
        ["snapshots", "--check"] => run(Mode::Check),
        ["snapshots", "--review"] => run(Mode::Review),
        [] => {
            eprintln!("{USAGE}");
            Ok(())
        }
        _ => anyhow::bail!("unknown task '{}'\n\n{USAGE}", args.join(" ")),
    }
}

fn run(mode: Mode) -> anyhow::Result<()> {
    let report = snapshots::run(mode)?;
    println!("{}", report.summary());
    if !report.passed() {
        std::process::exit(1);
    }
    Ok(())
}
