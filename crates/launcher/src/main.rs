//! The `subagents` command: a thin shell over the `launcher` library.
fn main() {
    std::process::exit(launcher::main());
}
