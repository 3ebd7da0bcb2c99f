//! Shared test support: pulsar-lite through the frame relay, unique names, scripted
//! handlers, captured logs.
#![allow(dead_code, unreachable_pub, unused_imports)]

pub use ruststream_test_support::pulsar_relay as relay;

use ruststream_pulsar::Pulsar;
pub use ruststream_test_support::{
    Script, Seen, assert_waited, capture_logs, eventually, forward_later, handler, logs,
    unique_suffix,
};

/// pulsar-lite, reached through a relay that adds the checksum section its message
/// frames leave out (see `ruststream_test_support::pulsar_relay`). A missing broker fails the test.
pub async fn pulsar() -> Pulsar {
    let relay = relay::start(broker().await).await;
    connect(relay).await
}

/// Like [`pulsar`], through a relay that notes the commands the client sends.
pub async fn pulsar_watched() -> (Pulsar, relay::Sent) {
    let (relay, sent) = relay::start_watched(broker().await).await;
    (connect(relay).await, sent)
}

async fn broker() -> String {
    capture_logs("debug,pulsar=info");
    let broker = std::env::var("RUSTSTREAM_PULSAR_ADDR").unwrap_or_else(|_| {
        panic!("RUSTSTREAM_PULSAR_ADDR is not set: run the tests with scripts/test, which starts pulsar-lite")
    });
    if tokio::net::TcpStream::connect(&broker).await.is_err() {
        panic!("the Pulsar tests need pulsar-lite listening at {broker}");
    }
    broker
}

async fn connect(relay: std::net::SocketAddr) -> Pulsar {
    Pulsar::connect(&format!("pulsar://{relay}"))
        .await
        .unwrap_or_else(|e| panic!("connecting through the relay: {e}"))
}

/// A topic name no other test (or earlier run) uses.
pub fn unique(prefix: &str) -> String {
    format!("persistent://public/default/{prefix}-{}", unique_suffix())
}
