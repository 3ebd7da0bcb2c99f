//! Consume-transform-produce throughput: the same handler (decode, produce one output,
//! ack) under `Commit::Transactional` with an `EosPipeline` (commit_interval 100 ms) and
//! under `Commit::Tracked` with the plain producer, 16 lanes each, in one run. Needs a
//! Kafka-API broker at `RUSTSTREAM_KAFKA_BROKERS` (scripts/test starts tansu).
//!
//! Run with `cargo bench -p ruststream-kafka --bench eos`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ruststream::{App, Delivery, HandlerOutcome, Headers, Publisher, on};
use ruststream_kafka::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use ruststream_kafka::rdkafka::client::DefaultClientContext;
use ruststream_kafka::rdkafka::config::ClientConfig;
use ruststream_kafka::{Commit, EosPipeline, Kafka};

const RECORDS: usize = 20_000;
const PAYLOAD: &[u8] = br#"{"id":123456,"price":4200,"qty":7,"buy":true}"#;

#[derive(Default)]
struct Span {
    first: Option<Instant>,
    last: Option<Instant>,
    count: usize,
}

async fn run(kafka: &Kafka, input: &str, output: &str, transactional: bool) -> f64 {
    let span = Arc::new(Mutex::new(Span::default()));
    let handler = {
        let (span, output) = (Arc::clone(&span), output.to_owned());
        move |d: Delivery, publisher: Publisher| {
            let (span, output) = (Arc::clone(&span), output.clone());
            async move {
                let value: serde_json::Value =
                    serde_json::from_slice(d.payload()).expect("decodes");
                if publisher.to(&output).send(&value).await.is_err() {
                    return HandlerOutcome::retry();
                }
                let mut s = span.lock().unwrap();
                let now = Instant::now();
                s.first.get_or_insert(now);
                s.last = Some(now);
                s.count += 1;
                HandlerOutcome::ack()
            }
        }
    };
    let group = format!(
        "{}-{}",
        if transactional { "eos" } else { "tracked" },
        std::process::id()
    );
    let mut topic = kafka
        .topic(input)
        .group(&group)
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "500");
    if transactional {
        let pipeline = EosPipeline::new(kafka, format!("bench-{}", std::process::id()))
            .commit_interval(Duration::from_millis(100));
        topic = topic.commit(Commit::Transactional(pipeline));
    } else {
        topic = topic.commit(Commit::Tracked);
    }
    let running = App::new()
        .register(on(topic, handler).lanes(16))
        .start()
        .await
        .expect("start");
    let deadline = Instant::now() + Duration::from_secs(600);
    while span.lock().unwrap().count < RECORDS {
        assert!(Instant::now() < deadline, "not all records handled");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    running.stop().await;
    let s = span.lock().unwrap();
    (s.count - 1) as f64 / (s.last.unwrap() - s.first.unwrap()).as_secs_f64()
}

#[tokio::main]
async fn main() {
    let brokers = std::env::var("RUSTSTREAM_KAFKA_BROKERS")
        .expect("RUSTSTREAM_KAFKA_BROKERS: run scripts/test or start a broker");
    let kafka = Kafka::connect(&brokers).expect("client");
    let id = std::process::id();
    let (input, out_eos, out_tracked) = (
        format!("bench-eos-in-{id}"),
        format!("bench-eos-out-{id}"),
        format!("bench-tracked-out-{id}"),
    );
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()
        .unwrap();
    admin
        .create_topics(
            &[&input, &out_eos, &out_tracked]
                .map(|t| NewTopic::new(t, 1, TopicReplication::Fixed(1))),
            &AdminOptions::new(),
        )
        .await
        .expect("topics");
    let publisher = kafka.publisher();
    let no_headers = Headers::new();
    for chunk in 0..RECORDS / 1000 {
        let sends: Vec<_> = (0..1000)
            .map(|_| publisher.send(&input, None, &no_headers, PAYLOAD, None))
            .collect();
        for send in sends {
            send.await.expect("produced");
        }
        let _ = chunk;
    }
    let tracked = run(&kafka, &input, &out_tracked, false).await;
    let eos = run(&kafka, &input, &out_eos, true).await;
    std::mem::forget(admin);
    println!(
        "kafka/transform (16 lanes, one output per input): Tracked {tracked:.0} records/s, Transactional (commit_interval 100 ms) {eos:.0} records/s, ratio {:.1}%",
        100.0 * eos / tracked
    );
}
