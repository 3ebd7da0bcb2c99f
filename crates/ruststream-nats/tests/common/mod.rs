//! Shared test support: the real server, unique names, scripted handlers, captured logs.
#![allow(dead_code, unreachable_pub, unused_imports)]

use ruststream_nats::Nats;
use ruststream_nats::async_nats::jetstream::{self, stream};
pub use ruststream_test_support::{
    Script, Seen, assert_waited, capture_logs, eventually, forward_later, handler, logs,
    unique_suffix,
};

/// The server the project's test command started. A missing server fails the test.
pub async fn nats() -> Nats {
    capture_logs("debug,async_nats=info");
    let url = std::env::var("RUSTSTREAM_NATS_URL").unwrap_or_else(|_| {
        panic!("RUSTSTREAM_NATS_URL is not set: run the tests with scripts/test, which starts nats-server")
    });
    Nats::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("the NATS tests need a running nats-server: {e}"))
}

/// A name no other test (or earlier run) uses (subject tokens and stream names alike).
pub fn unique(prefix: &str) -> String {
    format!("{prefix}_{}", unique_suffix().replace('-', "_"))
}

/// Creates stream `name` capturing `subjects`.
pub async fn create_stream(
    nats: &Nats,
    name: &str,
    subjects: &[String],
) -> jetstream::stream::Stream {
    jetstream::new(nats.client().clone())
        .create_stream(stream::Config {
            name: name.to_owned(),
            subjects: subjects.to_vec(),
            ..Default::default()
        })
        .await
        .expect("create stream")
}
