//! Trace context across two services over pulsar-lite (issue #14).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{relay, unique};
use ruststream::middleware::TraceLayer;
use ruststream::{App, Publisher, on};
use ruststream_pulsar::{Pulsar, SubType};
use ruststream_test_support::ops::{answer, payload};
use ruststream_test_support::trace::{acks, capture_spans, wait_children};
use tracing::Instrument;

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
    // Attempts 1 and 2 (the broker redelivers), then the dead letter's reader (the
    // broker's dead-letter move keeps the message's properties).
    wait_children(&spans, "produce", "delivery", 3, Duration::from_secs(60)).await;
    running.stop().await;
}
