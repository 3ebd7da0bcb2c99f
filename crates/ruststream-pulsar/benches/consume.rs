//! Consume throughput through ruststream (Shared subscription, ack) next to a raw `pulsar`
//! consumer (decode, `ack`) on the same messages, in one run. Needs pulsar-lite at
//! `RUSTSTREAM_PULSAR_ADDR` (scripts/test starts it); both sides go through the same
//! checksum relay the tests use (see ruststream_test_support::pulsar_relay).
//!
//! Run with `cargo bench -p ruststream-pulsar --bench consume`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use ruststream::{App, HandlerOutcome, Headers, Message, State, on};
use ruststream_pulsar::{Pulsar, SubType};
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
const MESSAGES: usize = 20_000;
const ROUNDS: usize = 3;

#[derive(Default)]
struct Span {
    first: Option<Instant>,
    last: Option<Instant>,
    count: usize,
}

impl Span {
    fn hit(&mut self) {
        let now = Instant::now();
        self.first.get_or_insert(now);
        self.last = Some(now);
        self.count += 1;
    }
    fn rate(&self) -> f64 {
        (self.count - 1) as f64 / (self.last.unwrap() - self.first.unwrap()).as_secs_f64()
    }
}

async fn handle(
    Message(tick): Message<Tick>,
    State(span): State<Arc<Mutex<Span>>>,
) -> HandlerOutcome {
    std::hint::black_box(tick);
    span.lock().unwrap().hit();
    HandlerOutcome::ack()
}

/// Subscriptions made after the messages were sent start from the first one.
fn earliest() -> pulsar::ConsumerOptions {
    pulsar::ConsumerOptions::default()
        .with_initial_position(pulsar::consumer::InitialPosition::Earliest)
}

async fn fill(pulsar: &Pulsar, topic: &str) {
    let publisher = pulsar.publisher();
    for _ in 0..MESSAGES {
        publisher
            .send(topic, None, &Headers::new(), PAYLOAD.to_vec())
            .await
            .expect("sent");
    }
}

async fn raw(pulsar: &Pulsar, topic: &str) -> f64 {
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
    let mut span = Span::default();
    while span.count < MESSAGES {
        let message = consumer.next().await.expect("open").expect("message");
        let tick: Tick = serde_json::from_slice(&message.payload.data).expect("decodes");
        std::hint::black_box(tick);
        consumer.ack(&message).await.expect("ack");
        span.hit();
    }
    let _ = consumer.close().await;
    span.rate()
}

async fn framework(pulsar: &Pulsar, topic: &str) -> f64 {
    let span = Arc::new(Mutex::new(Span::default()));
    let running = App::new()
        .state(Arc::clone(&span))
        .register(on(
            pulsar
                .topic(topic)
                .subscription("framework")
                .options(earliest()),
            handle,
        ))
        .start()
        .await
        .expect("start");
    let deadline = Instant::now() + Duration::from_secs(300);
    while span.lock().unwrap().count < MESSAGES {
        assert!(Instant::now() < deadline, "not all messages handled");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    running.stop().await;
    span.lock().unwrap().rate()
}

#[tokio::main]
async fn main() {
    let broker = std::env::var("RUSTSTREAM_PULSAR_ADDR")
        .expect("RUSTSTREAM_PULSAR_ADDR: run scripts/test or start pulsar-lite");
    let relay = ruststream_test_support::pulsar_relay::start(broker).await;
    let pulsar = Pulsar::connect(&format!("pulsar://{relay}"))
        .await
        .expect("connect");
    let (mut best_raw, mut best_framework) = (0f64, 0f64);
    for round in 0..ROUNDS {
        let topic = format!(
            "persistent://public/default/bench-{}-{round}",
            std::process::id()
        );
        fill(&pulsar, &topic).await;
        // Each side reads the whole topic on a subscription of its own.
        let (r, f) = if round % 2 == 0 {
            let r = raw(&pulsar, &topic).await;
            (r, framework(&pulsar, &topic).await)
        } else {
            let f = framework(&pulsar, &topic).await;
            (raw(&pulsar, &topic).await, f)
        };
        best_raw = best_raw.max(r);
        best_framework = best_framework.max(f);
    }
    println!(
        "pulsar/consume (Shared, ack): raw pulsar {best_raw:.0} msg/s, ruststream {best_framework:.0} msg/s, ratio {:.1}%",
        100.0 * best_framework / best_raw
    );
}
