//! Trace context across two services over a real nats-server (issue #14): the consumer's
//! delivery spans (each attempt, and the dead letter's reader) are children of the
//! producer's span.

mod common;

use std::sync::Arc;

use common::{create_stream, unique};
use ruststream::middleware::TraceLayer;
use ruststream::{App, on};
use ruststream_nats::Nats;
use ruststream_test_support::ops::answer;
use ruststream_test_support::trace::{acks, assert_producer_is_the_parent, capture_spans};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_jetstream_delivery_spans_are_children_of_the_producer_span() {
    // Before anything else sets a subscriber.
    let spans = capture_spans();
    let url = std::env::var("RUSTSTREAM_NATS_URL").expect("RUSTSTREAM_NATS_URL (scripts/test)");
    let (producer, consumer) = (
        Nats::connect(&url).await.expect("connect"),
        Nats::connect(&url).await.expect("connect"),
    );
    let name = unique("TRACE");
    let dead = format!("{name}.dead");
    create_stream(&consumer, &name, std::slice::from_ref(&name)).await;
    create_stream(
        &consumer,
        &format!("{name}_DEAD"),
        std::slice::from_ref(&dead),
    )
    .await;
    let running = App::new()
        .register(
            on(consumer.consumer(&name, "traced"), answer)
                .name("orders")
                .max_attempts(2)
                .dead_letter(dead.clone())
                .layer(TraceLayer),
        )
        .register(on(consumer.consumer(format!("{name}_DEAD"), "dead"), acks).layer(TraceLayer))
        .start()
        .await
        .expect("start");
    // Attempts 1 and 2 (the server redelivers the same message), then the dead letter.
    assert_producer_is_the_parent(&spans, running, Arc::new(producer.publisher()), &name).await;
}
