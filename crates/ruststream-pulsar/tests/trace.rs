//! Trace context across two services over pulsar-lite (issue #14).

mod common;

use std::sync::Arc;

use common::{relay, unique};
use ruststream::middleware::TraceLayer;
use ruststream::{App, on};
use ruststream_pulsar::{Pulsar, SubType};
use ruststream_test_support::ops::answer;
use ruststream_test_support::trace::{acks, assert_producer_is_the_parent, capture_spans};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_pulsar_delivery_spans_are_children_of_the_producer_span() {
    // Before anything else sets a subscriber.
    let spans = capture_spans();
    let broker =
        std::env::var("RUSTSTREAM_PULSAR_ADDR").expect("RUSTSTREAM_PULSAR_ADDR (scripts/test)");
    let relay = relay::start(broker).await;
    let url = format!("pulsar://{relay}");
    let (producer, consumer) = (
        Pulsar::connect(&url).await.expect("connect"),
        Pulsar::connect(&url).await.expect("connect"),
    );
    let name = unique("trace");
    let dead = format!("{name}-dead");
    let subscription = |topic: &str| {
        consumer
            .topic(topic)
            .subscription("s")
            .subscription_type(SubType::Shared)
    };
    let running = App::new()
        .register(
            on(subscription(&name), answer)
                .name("orders")
                .max_attempts(2)
                .dead_letter(dead.clone())
                .layer(TraceLayer),
        )
        .register(on(subscription(&dead), acks).name("dead").layer(TraceLayer))
        .start()
        .await
        .expect("start");
    // Attempts 1 and 2 (the broker redelivers), then the dead letter's reader (the
    // broker's dead-letter move keeps the message's properties).
    assert_producer_is_the_parent(&spans, running, Arc::new(producer.publisher()), &name).await;
}
