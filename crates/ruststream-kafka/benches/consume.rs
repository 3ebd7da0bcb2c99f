//! What consuming costs through ruststream (`Commit::Tracked`, ack) next to the raw
//! rdkafka loop a user would write (StreamConsumer, decode, `store_offset_from_message`)
//! on the same records, in one run: CPU time of the consuming thread per record, and the
//! rate (see `ruststream_test_support::bench`).
//! Needs a Kafka-API broker at `RUSTSTREAM_KAFKA_BROKERS` (scripts/test starts tansu).
//!
//! Time is measured from the first record handled to the last, so the group join (a
//! few seconds on tansu) does not count on either side.
//!
//! Run with `cargo bench -p ruststream-kafka --bench consume`.

use std::sync::Arc;

use ruststream_test_support::bench::{
    Figures, Side, Span, env_count, in_turn, load_average, own_thread, register, report,
};
use std::time::{Duration, Instant};

use ruststream::{App, Headers};
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
/// Records per side and rounds; `BENCH_RECORDS` and `BENCH_ROUNDS` change them (a
/// callgrind run of the framework side wants fewer).
static RECORDS: std::sync::LazyLock<usize> =
    std::sync::LazyLock::new(|| env_count("BENCH_RECORDS", 100_000));
static ROUNDS: std::sync::LazyLock<usize> =
    std::sync::LazyLock::new(|| env_count("BENCH_ROUNDS", 3));

fn settings(config: &mut ClientConfig) -> &mut ClientConfig {
    config
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "500")
        .set("auto.offset.reset", "earliest")
}

/// The loop a user would write: receive, decode, store the offset through the message.
async fn raw(brokers: String, topic: String, group: String) -> Figures {
    own_thread(Side::Raw, move || async move {
        let consumer: StreamConsumer = settings(
            ClientConfig::new()
                .set("bootstrap.servers", &brokers)
                .set("group.id", &group)
                .set("enable.auto.offset.store", "false"),
        )
        .create()
        .expect("consumer");
        consumer.subscribe(&[&topic]).expect("subscribe");
        let span = Span::new(*RECORDS);
        while Span::count(&span) < *RECORDS {
            let m = consumer.recv().await.expect("record");
            let tick: Tick = serde_json::from_slice(m.payload().unwrap()).expect("decodes");
            std::hint::black_box(tick);
            consumer.store_offset_from_message(&m).expect("store");
            Span::hit(&span);
        }
        std::mem::forget(consumer);
        Span::figures(&span)
    })
    .await
}

async fn framework(kafka: Kafka, topic: String, group: String) -> Figures {
    own_thread(Side::Ruststream, move || async move {
        let span = Span::new(*RECORDS);
        let topic = kafka
            .topic(topic)
            .group(group)
            .commit(Commit::Tracked)
            .set("session.timeout.ms", "6000")
            .set("heartbeat.interval.ms", "500");
        // `on(topic, handle)`, or `on_batch` with BENCH_BATCH=n.
        let running = register(App::new().state(Arc::clone(&span)), topic)
            .start()
            .await
            .expect("start");
        let deadline = Instant::now() + Duration::from_secs(300);
        while Span::count(&span) < *RECORDS {
            assert!(Instant::now() < deadline, "not all records handled");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        running.stop().await;
        Span::figures(&span)
    })
    .await
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
    // Sent 1,000 at a time, concurrently (each send waits for its delivery report).
    let mut sends = tokio::task::JoinSet::new();
    for i in 0..*RECORDS {
        let (publisher, topic) = (kafka.publisher(), topic.clone());
        sends.spawn(async move {
            publisher
                .send(&topic, None, &Headers::new(), PAYLOAD, None)
                .await
                .map(drop)
        });
        if sends.len() == 1000 || i + 1 == *RECORDS {
            while let Some(sent) = sends.join_next().await {
                sent.expect("a send task").expect("produced");
            }
        }
    }
    eprintln!("{} records produced", *RECORDS);
    let load = load_average();
    let (mut raws, mut frameworks) = (Vec::new(), Vec::new());
    for round in 0..*ROUNDS {
        // Each side reads the whole topic as a group of its own; alternate who goes first.
        let raw_side = || raw(brokers.clone(), topic.clone(), format!("raw-{round}"));
        let framework_side = || framework(kafka.clone(), topic.clone(), format!("fw-{round}"));
        let (r, f) = in_turn(round, raw_side, framework_side).await;
        eprintln!("round {round}: raw {r:?}, ruststream {f:?}");
        raws.push(r);
        frameworks.push(f);
    }
    std::mem::forget(admin);
    println!(
        "{}",
        report(
            &format!("kafka/consume (Tracked, ack, {} records)", *RECORDS),
            &raws,
            &frameworks,
            &format!("{load} at start, {} at end", load_average())
        )
    );
}
