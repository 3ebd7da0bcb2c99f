//! `send_all` of many messages to a JetStream stream, then on Core NATS, next to the raw client's own
//! pipelined publish (`publish` after `publish`, a window of 1,000 acks in flight), rate compared, in
//! alternating rounds. Needs nats-server with JetStream at `RUSTSTREAM_NATS_URL`.
//!
//! Run with `cargo bench -p ruststream-nats --bench publish`.

use bytes::Bytes;
use ruststream::Publisher;
use ruststream::core::Outgoing;
use ruststream_nats::Nats;
use ruststream_nats::async_nats::jetstream::{self, stream};
use ruststream_test_support::bench::{PAYLOAD, env_count};
use ruststream_test_support::publish_bench::compare;

/// Acks the raw loop keeps in flight.
const WINDOW: usize = 1_000;

#[tokio::main]
async fn main() {
    let url = std::env::var("RUSTSTREAM_NATS_URL")
        .expect("RUSTSTREAM_NATS_URL: run scripts/test or start a broker");
    let nats = Nats::connect(&url).await.expect("nats");
    let n = env_count("BENCH_MESSAGES", 100_000);
    let rounds = env_count("BENCH_ROUNDS", 3);
    // BENCH_ONLY=core or =jetstream runs one side's comparison only.
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    if only != "jetstream" {
        core(&nats, n, rounds).await;
    }
    if only == "core" {
        return;
    }
    let js = jetstream::new(nats.client().clone());
    let name = format!("BENCH_PUBLISH_{}", std::process::id());
    let (raw_subject, fw_subject) = (format!("{name}.raw"), format!("{name}.send_all"));
    js.create_stream(stream::Config {
        name: name.clone(),
        subjects: vec![format!("{name}.>")],
        ..Default::default()
    })
    .await
    .expect("stream");
    let raw = |_round: usize| {
        let (js, subject) = (js.clone(), raw_subject.clone());
        async move {
            // The client holds at most so many acks in flight: a window of them.
            let mut acks: std::collections::VecDeque<jetstream::context::PublishAckFuture> =
                std::collections::VecDeque::with_capacity(WINDOW);
            for _ in 0..n {
                if acks.len() == WINDOW {
                    acks.pop_front()
                        .expect("one in flight")
                        .await
                        .expect("stored");
                }
                let ack = js
                    .publish(subject.clone(), Bytes::from_static(PAYLOAD))
                    .await
                    .expect("sent");
                acks.push_back(ack);
            }
            for ack in acks {
                ack.await.expect("stored");
            }
        }
    };
    let publisher = Publisher::new(nats.publish_handle());
    let framework = |_round: usize| {
        let (publisher, subject) = (publisher.clone(), fw_subject.clone());
        async move {
            // One shared address for all, as a caller sending many to one place makes it.
            let address: std::sync::Arc<str> = std::sync::Arc::from(subject.as_str());
            let messages =
                (0..n).map(move |_| Outgoing::new(std::sync::Arc::clone(&address), PAYLOAD));
            let results = publisher.send_all(messages).await;
            assert!(results.iter().all(Result::is_ok), "every message stored");
        }
    };
    compare("jetstream/publish", n, rounds, raw, framework).await;
    js.delete_stream(&name).await.expect("deleted");
}

/// Core NATS: the raw loop publishes every message, then flushes once (what Core NATS
/// confirms: the client wrote the bytes to its connection); `send_all` likewise.
async fn core(nats: &Nats, n: usize, rounds: usize) {
    let subject = format!("bench.publish.core.{}", std::process::id());
    let raw = |_round: usize| {
        let (client, subject) = (nats.client().clone(), subject.clone());
        async move {
            for _ in 0..n {
                client
                    .publish(subject.clone(), Bytes::from_static(PAYLOAD))
                    .await
                    .expect("sent");
            }
            client.flush().await.expect("flushed");
        }
    };
    let publisher = Publisher::new(nats.publish_handle());
    let framework = |_round: usize| {
        let (publisher, subject) = (publisher.clone(), subject.clone());
        async move {
            // One shared address for all, as a caller sending many to one place makes it.
            let address: std::sync::Arc<str> = std::sync::Arc::from(subject.as_str());
            let messages =
                (0..n).map(move |_| Outgoing::new(std::sync::Arc::clone(&address), PAYLOAD));
            let results = publisher.send_all(messages).await;
            assert!(results.iter().all(Result::is_ok), "every message flushed");
        }
    };
    compare("core/publish", n, rounds, raw, framework).await;
}
