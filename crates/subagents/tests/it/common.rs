//! The helpers of `subagents-test-support`, with [`Env`] bound to this
//! package's binary.

pub use test_support::*;

/// [`test_support::Env`] for the `subagents` binary built for these tests.
pub struct Env(test_support::Env);

impl Env {
    pub fn new() -> Self {
        Self(test_support::Env::new(env!("CARGO_BIN_EXE_subagents")))
    }
}

impl std::ops::Deref for Env {
    type Target = test_support::Env;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}
