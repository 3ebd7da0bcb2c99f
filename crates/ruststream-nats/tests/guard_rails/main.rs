//! The guard rails beyond the seeds (SPEC G1-G4) against a real nats-server: a hung
//! handler, a refused dead letter, a retry copy over the server's size limit, a dead
//! letter the registration would read itself.
//!
//! The tests are in modules in this directory, by guard rail.

// The helpers every test binary of this crate shares, in `tests/common/`.
#[path = "../common/mod.rs"]
mod common;

mod hung_handlers;
mod refused_copies;
mod registrations;
mod uncapped;
