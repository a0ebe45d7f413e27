//! Link options for the `subagents` binary.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if os == "linux" && env == "gnu" {
        // Every run keeps two processes of this binary (monitor and runner)
        // alive for its whole length. A position-independent Rust binary has
        // ~20,000 relative relocations; as RELA entries (24 bytes each) the
        // dynamic loader reads ~0.5 MB of them in every process start, and
        // those pages stay resident. Packed (DT_RELR, glibc 2.36, binutils
        // 2.38) they take a few KB: ~0.25 MiB less RSS per process, same
        // PIE and ASLR. An older linker ignores the option with a warning.
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}
