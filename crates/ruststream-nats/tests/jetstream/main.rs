//! JetStream against a real nats-server: SPEC N1, N4-N7 and the beyond-the-seeds items,
//! observed on the server's side (consumer info, stream contents).
//!
//! The tests are in modules in this directory, by topic; `support` holds what they share.

// The helpers every test binary of this crate shares, in `tests/common/`.
#[path = "../common/mod.rs"]
mod common;
mod support;

mod cap;
mod keepalive;
mod outcomes;
mod publishing;
mod startup;
