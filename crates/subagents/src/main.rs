//! The `subagents` command: the front-ends (command line, `mcp`, `top`)
//! over the `launcher` library, and the entry points of a run's processes.
mod cli;
mod commands;
#[cfg(feature = "mcp")]
mod mcp;
#[cfg(feature = "mcp")]
mod mcp_schema;
#[cfg(feature = "mcp")]
mod mcp_stdio;
mod table;
#[cfg(feature = "top")]
mod top;

fn main() {
    std::process::exit(cli::main());
}
