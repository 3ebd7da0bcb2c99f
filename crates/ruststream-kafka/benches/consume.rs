//! Consume throughput through ruststream (`Commit::Tracked`, ack) next to a raw rdkafka
//! consumer (StreamConsumer, decode, `store_offset`) on the same records, in one run.
//! Needs a Kafka-API broker at `RUSTSTREAM_KAFKA_BROKERS` (scripts/test starts tansu).
//!
//! Time is measured from the first record handled to the last, so the group join (a
//! few seconds on tansu) does not count on either side.
//!
//! Run with `cargo bench -p ruststream-kafka --bench consume`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ruststream::{App, HandlerOutcome, Headers, Message, State, on};
use ruststream_kafka::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use ruststream_kafka::rdkafka::client::DefaultClientContext;
use ruststream_kafka::rdkafka::config::ClientConfig;
use ruststream_kafka::rdkafka::consumer::{Consumer, StreamConsumer};
use ruststream_kafka::rdkafka::message::Message as _;
use ruststream_kafka::{Commit, Kafka};
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
const RECORDS: usize = 100_000;
const ROUNDS: usize = 3;

/// First and last handling time, and how many were handled.
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
        let took = self.last.unwrap() - self.first.unwrap();
        (self.count - 1) as f64 / took.as_secs_f64()
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

fn settings(config: &mut ClientConfig) -> &mut ClientConfig {
    config
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "500")
        .set("auto.offset.reset", "earliest")
}

async fn raw(brokers: &str, topic: &str, group: &str) -> f64 {
    let consumer: StreamConsumer = settings(
        ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("group.id", group)
            .set("enable.auto.offset.store", "false"),
    )
    .create()
    .expect("consumer");
    consumer.subscribe(&[topic]).expect("subscribe");
    let mut span = Span::default();
    while span.count < RECORDS {
        let m = consumer.recv().await.expect("record");
        let tick: Tick = serde_json::from_slice(m.payload().unwrap()).expect("decodes");
        std::hint::black_box(tick);
        consumer
            .store_offset(m.topic(), m.partition(), m.offset())
            .expect("store");
        span.hit();
    }
    std::mem::forget(consumer);
    span.rate()
}

async fn framework(kafka: &Kafka, topic: &str, group: &str) -> f64 {
    let span = Arc::new(Mutex::new(Span::default()));
    let running = App::new()
        .state(Arc::clone(&span))
        .register(on(
            kafka
                .topic(topic)
                .group(group)
                .commit(Commit::Tracked)
                .set("session.timeout.ms", "6000")
                .set("heartbeat.interval.ms", "500"),
            handle,
        ))
        .start()
        .await
        .expect("start");
    let deadline = Instant::now() + Duration::from_secs(300);
    while span.lock().unwrap().count < RECORDS {
        assert!(Instant::now() < deadline, "not all records handled");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    running.stop().await;
    span.lock().unwrap().rate()
}

#[tokio::main]
async fn main() {
    let brokers = std::env::var("RUSTSTREAM_KAFKA_BROKERS")
        .expect("RUSTSTREAM_KAFKA_BROKERS: run scripts/test or start a broker");
    let kafka = Kafka::connect(&brokers).expect("client");
    let topic = format!("bench-consume-{}", std::process::id());
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()
        .unwrap();
    admin
        .create_topics(
            &[NewTopic::new(&topic, 1, TopicReplication::Fixed(1))],
            &AdminOptions::new(),
        )
        .await
        .expect("topic");
    let publisher = kafka.publisher();
    let headers = Headers::new();
    let mut sends = Vec::with_capacity(1000);
    for i in 0..RECORDS {
        sends.push(publisher.send(&topic, None, &headers, PAYLOAD, None));
        if sends.len() == 1000 || i + 1 == RECORDS {
            for result in futures_join(std::mem::take(&mut sends)).await {
                result.expect("produced");
            }
        }
    }
    let (mut best_raw, mut best_framework) = (0f64, 0f64);
    for round in 0..ROUNDS {
        // Each side reads the whole topic as a group of its own; alternate who goes first.
        let (r, f) = if round % 2 == 0 {
            let r = raw(&brokers, &topic, &format!("raw-{round}")).await;
            (r, framework(&kafka, &topic, &format!("fw-{round}")).await)
        } else {
            let f = framework(&kafka, &topic, &format!("fw-{round}")).await;
            (raw(&brokers, &topic, &format!("raw-{round}")).await, f)
        };
        best_raw = best_raw.max(r);
        best_framework = best_framework.max(f);
    }
    std::mem::forget(admin);
    println!(
        "kafka/consume (Tracked, ack): raw rdkafka {best_raw:.0} records/s, ruststream {best_framework:.0} records/s, ratio {:.1}%",
        100.0 * best_framework / best_raw
    );
}

/// Awaits every future, in order (sends are already in flight inside librdkafka).
async fn futures_join<F: std::future::Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut out = Vec::with_capacity(futures.len());
    for f in futures {
        out.push(f.await);
    }
    out
}
