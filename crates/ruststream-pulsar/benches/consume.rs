//! What consuming costs through ruststream (Shared subscription, ack) next to the raw
//! `pulsar` loop (next, decode, `ack`) on the same messages, in one run: CPU time of the
//! consuming thread per message, and the rate (see `ruststream_test_support::bench`). Needs pulsar-lite at
//! `RUSTSTREAM_PULSAR_ADDR` (scripts/test starts it); both sides go through the same
//! checksum relay the tests use (see ruststream_test_support::pulsar_relay).
//!
//! Run with `cargo bench -p ruststream-pulsar --bench consume`.

use std::sync::LazyLock;
use std::time::Duration;

use futures_util::StreamExt;
use ruststream::Headers;
use ruststream_pulsar::{Pulsar, SubType};
use ruststream_test_support::bench::{
    Figures, Side, Span, env_count, in_turn, load_average, own_thread, report, through_app,
};
use serde::Deserialize;

#[derive(Deserialize)]
#[allow(dead_code)]
struct Tick {
    id: u64,
    price: u32,
    qty: u16,
    buy: bool,
}

const PAYLOAD: &[u8] = br#"{"id":123456,"price":4200,"qty":7,"buy":true}"#;
/// Messages per side and rounds; `BENCH_MESSAGES` and `BENCH_ROUNDS` change them (a
/// callgrind run wants fewer: `scripts/bench-callgrind-transport`).
static MESSAGES: LazyLock<usize> = LazyLock::new(|| env_count("BENCH_MESSAGES", 20_000));
static ROUNDS: LazyLock<usize> = LazyLock::new(|| env_count("BENCH_ROUNDS", 3));
const LIMIT: Duration = Duration::from_secs(300);

/// Subscriptions made after the messages were sent start from the first one.
fn earliest() -> pulsar::ConsumerOptions {
    pulsar::ConsumerOptions::default()
        .with_initial_position(pulsar::consumer::InitialPosition::Earliest)
}

async fn fill(pulsar: &Pulsar, topic: &str) {
    let publisher = pulsar.publisher();
    for _ in 0..*MESSAGES {
        publisher
            .send(topic, None, &Headers::new(), PAYLOAD.to_vec())
            .await
            .expect("sent");
    }
}

/// The loop a user would write: next, decode, ack.
async fn raw(pulsar: Pulsar, topic: String) -> Figures {
    own_thread(Side::Raw, move || async move {
        let mut consumer: pulsar::Consumer<Vec<u8>, pulsar::TokioExecutor> = pulsar
            .client()
            .consumer()
            .with_topic(topic)
            .with_subscription("raw")
            .with_subscription_type(SubType::Shared)
            .with_options(earliest())
            .build()
            .await
            .expect("consumer");
        let span = Span::new(*MESSAGES);
        for _ in 0..*MESSAGES {
            let message = consumer.next().await.expect("open").expect("message");
            let tick: Tick = serde_json::from_slice(&message.payload.data).expect("decodes");
            std::hint::black_box(tick);
            consumer.ack(&message).await.expect("ack");
            Span::hit(&span);
        }
        let figures = Span::figures(&span);
        let _ = consumer.close().await;
        figures
    })
    .await
}

async fn framework(pulsar: Pulsar, topic: String) -> Figures {
    through_app(*MESSAGES, LIMIT, move || {
        pulsar
            .topic(topic)
            .subscription("framework")
            .options(earliest())
    })
    .await
}

#[tokio::main]
async fn main() {
    let broker = std::env::var("RUSTSTREAM_PULSAR_ADDR")
        .expect("RUSTSTREAM_PULSAR_ADDR: run scripts/test or start pulsar-lite");
    let relay = ruststream_test_support::pulsar_relay::start(broker).await;
    let pulsar = Pulsar::connect(&format!("pulsar://{relay}"))
        .await
        .expect("connect");
    let load = load_average();
    let (mut raws, mut frameworks) = (Vec::new(), Vec::new());
    for round in 0..*ROUNDS {
        let topic = format!(
            "persistent://public/default/bench-{}-{round}",
            std::process::id()
        );
        fill(&pulsar, &topic).await;
        // Each side reads the whole topic on a subscription of its own.
        let (r, f) = in_turn(
            round,
            || raw(pulsar.clone(), topic.clone()),
            || framework(pulsar.clone(), topic.clone()),
        )
        .await;
        raws.push(r);
        frameworks.push(f);
    }
    println!(
        "{}",
        report(
            &format!("pulsar/consume (Shared, ack, {} messages)", *MESSAGES),
            &raws,
            &frameworks,
            &format!("{load} at start, {} at end", load_average())
        )
    );
}
