//! The `listing` crate's integration tests, one binary (`list_memory.rs` is
//! its own: its counting global allocator must see no other test's
//! allocations).
extern crate subagents_listing as listing;

mod format_rules;
mod labels;
mod listing_index;
mod lists;
