//! Kafka against a real Kafka-API broker (tansu): SPEC K2-K5, K7-K9, observed on the
//! broker's side (committed offsets read back, records on the retry and dead-letter
//! topics with their partition, key and headers).
//!
//! The tests are in modules in this directory, by topic; `support` holds what they share.

// The helpers every test binary of this crate shares, in `tests/common/`.
#[path = "../common/mod.rs"]
mod common;
mod support;

mod auto_commit;
mod kept_whole;
mod publisher;
mod rebalance;
mod retry_copies;
mod retry_destinations;
mod stop;
mod tracked;
