//! RabbitMQ against the rabbitmq-server the test command starts: SPEC R1-R7 where the
//! behaviour suite does not already show them.
//!
//! The tests are in modules in this directory, by topic; `support` holds what they share.

// The helpers every test binary of this crate shares, in `tests/common/`.
#[path = "../common/mod.rs"]
mod common;
mod support;

mod acks;
mod connecting;
mod publishing;
mod retries;
mod topology;
