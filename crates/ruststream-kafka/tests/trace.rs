//! Trace context across two services over a real Kafka (tansu) (issue #14).

mod common;

use std::sync::Arc;

use common::{create_topic, topic, unique};
use ruststream::middleware::TraceLayer;
use ruststream::{App, on};
use ruststream_kafka::{Commit, Kafka};
use ruststream_test_support::ops::answer;
use ruststream_test_support::trace::{acks, assert_producer_is_the_parent, capture_spans};

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
    // Attempts 1 and 2 (the same record again, K4), then the dead letter's reader.
    assert_producer_is_the_parent(&spans, running, Arc::new(producer.publisher()), &name).await;
}
