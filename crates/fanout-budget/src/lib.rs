//! The run fan-out budget: how many children one root run may start in total.
//!
//! This crate will own the budget directory (`run-fanout-budgets/<dir>/`
//! with `manifest.json` and `claims/`), the descriptor inherited through the
//! environment, and admission under a file lock, as specified in
//! `shared/spec/fanout-budget.md`. It is filled by the fan-out issue.
#![warn(missing_docs)]
