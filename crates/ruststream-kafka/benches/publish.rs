//! `send_all` of many messages next to the raw client's own pipelined publish (every
//! record handed to the `FutureProducer`, the delivery reports awaited together), rate
//! compared, in alternating rounds. Needs a Kafka-API broker at `RUSTSTREAM_KAFKA_BROKERS`.
//!
//! Run with `cargo bench -p ruststream-kafka --bench publish`.

use std::time::Duration;

use ruststream::Publisher;
use ruststream::core::Outgoing;
use ruststream_kafka::Kafka;
use ruststream_kafka::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use ruststream_kafka::rdkafka::client::DefaultClientContext;
use ruststream_kafka::rdkafka::producer::{FutureProducer, FutureRecord};
use ruststream_test_support::bench::{PAYLOAD, env_count};
use ruststream_test_support::publish_bench::compare;

#[tokio::main]
async fn main() {
    let brokers = std::env::var("RUSTSTREAM_KAFKA_BROKERS")
        .expect("RUSTSTREAM_KAFKA_BROKERS: run scripts/test or start a broker");
    let kafka = Kafka::connect(&brokers).expect("client");
    let n = env_count("BENCH_RECORDS", 100_000);
    let rounds = env_count("BENCH_ROUNDS", 3);
    let topic = format!("bench-publish-{}", std::process::id());
    let admin: AdminClient<DefaultClientContext> = kafka.client_config().create().unwrap();
    admin
        .create_topics(
            &[NewTopic::new(&topic, 1, TopicReplication::Fixed(1))],
            &AdminOptions::new(),
        )
        .await
        .expect("topic");
    let producer: FutureProducer = kafka.client_config().create().expect("producer");
    let raw = |_round: usize| {
        let (producer, topic) = (producer.clone(), topic.clone());
        async move {
            let mut reports = Vec::with_capacity(n);
            for _ in 0..n {
                let record = FutureRecord::<(), [u8]>::to(&topic).payload(PAYLOAD);
                reports.push(
                    producer
                        .send_result(record)
                        .map_err(|(e, _)| e)
                        .expect("queued"),
                );
            }
            for report in reports {
                report.await.expect("reported").expect("delivered");
            }
        }
    };
    let publisher = Publisher::new(kafka.publish_handle());
    let framework = |_round: usize| {
        let (publisher, topic) = (publisher.clone(), topic.clone());
        async move {
            // One shared address for all, as a caller sending many to one place makes it.
            let address: std::sync::Arc<str> = std::sync::Arc::from(topic.as_str());
            let messages =
                (0..n).map(move |_| Outgoing::new(std::sync::Arc::clone(&address), PAYLOAD));
            let results = publisher.send_all(messages).await;
            assert!(results.iter().all(Result::is_ok), "every record delivered");
        }
    };
    compare("kafka/publish", n, rounds, raw, framework).await;
    admin
        .delete_topics(&[&topic], &AdminOptions::new())
        .await
        .expect("topic deleted");
    std::mem::forget(admin);
    tokio::time::sleep(Duration::from_millis(10)).await;
}
