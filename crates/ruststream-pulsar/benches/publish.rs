//! `send_all` of many messages next to the raw client's own pipelined publish (one
//! producer that waits for room in its queue, every message handed to `send_non_blocking`,
//! the receipts awaited together),
//! rate compared, in alternating rounds. Needs pulsar-lite at `RUSTSTREAM_PULSAR_ADDR`
//! (scripts/test starts it); both sides go through the checksum relay the tests use.
//!
//! Run with `cargo bench -p ruststream-pulsar --bench publish`.

use ruststream::Publisher;
use ruststream::core::Outgoing;
use ruststream_pulsar::Pulsar;
use ruststream_test_support::bench::{PAYLOAD, env_count};
use ruststream_test_support::publish_bench::compare;

#[tokio::main]
async fn main() {
    let broker = std::env::var("RUSTSTREAM_PULSAR_ADDR")
        .expect("RUSTSTREAM_PULSAR_ADDR: run scripts/test or start pulsar-lite");
    let relay = ruststream_test_support::pulsar_relay::start(broker).await;
    let pulsar = Pulsar::connect(&format!("pulsar://{relay}"))
        .await
        .expect("connect");
    let n = env_count("BENCH_MESSAGES", 20_000);
    let rounds = env_count("BENCH_ROUNDS", 3);
    let topic = |side: &str| {
        format!(
            "persistent://public/default/bench-publish-{side}-{}",
            std::process::id()
        )
    };
    let (raw_topic, fw_topic) = (topic("raw"), topic("send-all"));
    let raw = |_round: usize| {
        let (client, topic) = (pulsar.client().clone(), raw_topic.clone());
        async move {
            // Waits for room in the client's outbound queue instead of `SlowDown`.
            let options = ruststream_pulsar::pulsar::producer::ProducerOptions {
                block_queue_if_full: true,
                ..Default::default()
            };
            let mut producer = client
                .producer()
                .with_topic(topic)
                .with_options(options)
                .build()
                .await
                .expect("producer");
            let mut receipts = Vec::with_capacity(n);
            for _ in 0..n {
                let receipt = producer
                    .send_non_blocking(PAYLOAD.to_vec())
                    .await
                    .expect("sent");
                receipts.push(receipt);
            }
            for receipt in receipts {
                receipt.await.expect("stored");
            }
        }
    };
    let publisher = Publisher::new(pulsar.publish_handle());
    let framework = |_round: usize| {
        let (publisher, topic) = (publisher.clone(), fw_topic.clone());
        async move {
            // One shared address for all, as a caller sending many to one place makes it.
            let address: std::sync::Arc<str> = std::sync::Arc::from(topic.as_str());
            let messages =
                (0..n).map(move |_| Outgoing::new(std::sync::Arc::clone(&address), PAYLOAD));
            let results = publisher.send_all(messages).await;
            assert!(results.iter().all(Result::is_ok), "every message stored");
        }
    };
    compare("pulsar/publish", n, rounds, raw, framework).await;
}
