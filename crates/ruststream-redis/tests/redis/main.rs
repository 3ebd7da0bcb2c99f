//! Redis Streams against the redis-server the test command starts: SPEC S1-S8 where the
//! behaviour suite does not already show them.
//!
//! The tests are in modules in this directory, by topic; `support` holds what they share.

// The helpers every test binary of this crate shares, in `tests/common/`.
#[path = "../common/mod.rs"]
mod common;
mod support;

mod claims;
mod consumers;
mod dead_letters;
mod retries;
mod start;
