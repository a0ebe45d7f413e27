//! Project automation, run through the cargo alias `cargo xtask`.
fn main() -> anyhow::Result<()> {
    let task = std::env::args().nth(1);
    match task.as_deref() {
        Some(other) => anyhow::bail!("unknown task '{other}'"),
        None => {
            eprintln!("usage: cargo xtask <task>");
            Ok(())
        }
    }
}
