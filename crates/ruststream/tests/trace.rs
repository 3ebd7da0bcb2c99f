//! Trace context on the memory broker (issue #14): the delivery span of each attempt and
//! of the dead letter is a child of the producer's span.

use std::time::Duration;

use ruststream::core::Outgoing;
use ruststream::memory::MemoryBroker;
use ruststream::middleware::TraceLayer;
use ruststream::{App, on};
use ruststream_test_support::ops::{answer, payload};
use ruststream_test_support::trace::{acks, capture_spans, wait_children};
use tracing::Instrument;

#[tokio::test]
async fn trace_attempts_and_the_dead_letter_continue_the_producer_trace() {
    let spans = capture_spans();
    let broker = MemoryBroker::recording();
    let running = App::new()
        .register(
            on(broker.topic("orders").runtime_retries(), answer)
                .name("orders")
                .max_attempts(2)
                .dead_letter("orders.dead")
                .layer(TraceLayer),
        )
        .register(
            on(broker.topic("orders.dead"), acks)
                .name("dead")
                .layer(TraceLayer),
        )
        .start()
        .await
        .unwrap();
    async {
        broker
            .publisher()
            .to("orders")
            .send_bytes(payload("fail"))
            .await
            .unwrap();
    }
    .instrument(tracing::info_span!("produce"))
    .await;
    // Attempt 1 (the original), attempt 2 (the retry copy), the dead letter's delivery.
    wait_children(&spans, "produce", "delivery", 3, Duration::from_secs(20)).await;
    let original = &broker.published("orders")[0];
    let traceparent = original.headers.get_str("traceparent").expect("injected");
    assert!(traceparent.starts_with("00-"), "{traceparent}");
    let dead = &broker.published("orders.dead")[0];
    assert_eq!(
        dead.headers.get_str("traceparent"),
        Some(traceparent),
        "unchanged"
    );
    running.stop().await;
}

#[tokio::test]
async fn send_all_gives_each_message_the_callers_trace_context_and_keeps_a_messages_own() {
    let _spans = capture_spans();
    let broker = MemoryBroker::recording();
    let publisher = broker.publisher();
    let own = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let mut passed_on = Outgoing::new("orders", &b"b"[..]);
    passed_on.headers.insert("traceparent", own);
    let messages = vec![
        Outgoing::new("orders", &b"a"[..]),
        passed_on,
        Outgoing::new("orders", &b"c"[..]),
    ];
    let results = publisher
        .send_all(messages)
        .instrument(tracing::info_span!("produce"))
        .await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let published = broker.published("orders");
    let traceparent = published[0]
        .headers
        .get_str("traceparent")
        .expect("injected");
    assert!(traceparent.starts_with("00-"), "{traceparent}");
    assert_ne!(traceparent, own);
    assert_eq!(
        published[1].headers.get_str("traceparent"),
        Some(own),
        "kept"
    );
    assert_eq!(
        published[2].headers.get_str("traceparent"),
        Some(traceparent),
        "the same caller's span"
    );
    // Outside any span there is no trace context to give.
    let results = publisher
        .send_all([Outgoing::new("plain", &b"d"[..])])
        .await;
    assert!(results[0].is_ok());
    assert!(broker.published("plain")[0].headers.is_empty());
}
