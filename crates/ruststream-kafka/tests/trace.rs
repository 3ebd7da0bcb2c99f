//! Trace context across two services over a real Kafka (tansu) (issue #14).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{create_topic, topic, unique};
use ruststream::middleware::TraceLayer;
use ruststream::{App, Publisher, on};
use ruststream_kafka::{Commit, Kafka};
use ruststream_test_support::ops::{answer, payload};
use ruststream_test_support::trace::{acks, capture_spans, wait_children};
use tracing::Instrument;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_kafka_delivery_spans_are_children_of_the_producer_span() {
    // Before anything else sets a subscriber.
    let spans = capture_spans();
    let brokers = common::brokers();
    let (producer, consumer) = (
        Kafka::connect(&brokers).expect("client"),
        Kafka::connect(&brokers).expect("client"),
    );
    let name = unique("trace");
    let dead = format!("{name}-dead");
    create_topic(&name, 1).await;
    create_topic(&dead, 1).await;
    let running = App::new()
        .register(
            on(
                topic(&consumer, &name, &unique("g"), Commit::Tracked),
                answer,
            )
            .name("orders")
            .max_attempts(2)
            .dead_letter(dead.clone())
            .layer(TraceLayer),
        )
        .register(
            on(topic(&consumer, &dead, &unique("g"), Commit::Tracked), acks)
                .name("dead")
                .layer(TraceLayer),
        )
        .start()
        .await
        .expect("start");
    let publisher = Publisher::new(Arc::new(producer.publisher()));
    async {
        publisher
            .to(&name)
            .send_bytes(payload("fail"))
            .await
            .expect("publish")
    }
    .instrument(tracing::info_span!("produce"))
    .await;
    // Attempts 1 and 2 (the same record again, K4), then the dead letter's reader.
    wait_children(&spans, "produce", "delivery", 3, Duration::from_secs(60)).await;
    running.stop().await;
}
