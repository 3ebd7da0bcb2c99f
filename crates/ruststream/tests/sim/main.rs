//! Seeded fault schedules (`testing::sim`): the same seed replays the same steps; each
//! profile injects only what its broker may do; a handler that is not idempotent is
//! caught under every at-least-once profile and passes once it dedupes by message id;
//! Core NATS loses messages as its spec says.
//!
//! The tests are in modules in this directory, by topic; `support` holds what they share.
#![cfg(feature = "sim")]

mod support;

mod idempotence;
mod ordering;
mod profiles;
mod publishing;
mod replay;
