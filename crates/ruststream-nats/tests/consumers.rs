//! `consumers(n)` on NATS: members of one queue group (Core), pullers of one durable
//! consumer (JetStream).

mod common;

use std::time::Duration;

use common::{create_stream, nats, unique};
use ruststream::{App, Delivery, HandlerOutcome, on};
use ruststream_nats::async_nats::jetstream;
use ruststream_test_support::overlap::refusals;

/// E4: Core consumers share a subject only as members of a queue group; without one,
/// each would receive every message, so the start is refused, naming the fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e4_core_consumers_without_a_queue_group_are_refused() {
    let nats = nats().await;
    let ack = |_: Delivery| async { HandlerOutcome::ack() };
    let started = App::new()
        .register(on(nats.subject("orders"), ack).name("plain").consumers(2))
        .register(
            on(nats.subject("orders").queue_group("workers"), ack)
                .name("grouped")
                .consumers(2),
        )
        .start()
        .await;
    let rules = refusals(started);
    assert_eq!(rules.len(), 1, "{rules:?}");
    assert!(
        rules[0].starts_with("plain: consumers(2) on `orders` without a queue group")
            && rules[0].contains(".queue_group(name)"),
        "{rules:?}"
    );
}

/// Two pullers on one durable consumer: the server's `max_ack_pending` is what both hold
/// at most together, `max_in_flight` each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_consumers_share_the_durables_ack_pending_bound() {
    let nats = nats().await;
    let stream = unique("CONSUMERS");
    create_stream(&nats, &stream, std::slice::from_ref(&stream)).await;
    let running = App::new()
        .register(
            on(nats.consumer(&stream, "pullers"), |_: Delivery| async {
                HandlerOutcome::ack()
            })
            .consumers(2)
            .max_in_flight(50),
        )
        .start()
        .await
        .expect("starts");
    let mut consumer: jetstream::consumer::PullConsumer = jetstream::new(nats.client().clone())
        .get_stream(&stream)
        .await
        .expect("stream")
        .get_consumer("pullers")
        .await
        .expect("the durable consumer");
    let info = consumer.info().await.expect("info");
    assert_eq!(info.config.max_ack_pending, 100);
    tokio::time::timeout(Duration::from_secs(20), running.stop())
        .await
        .expect("stops");
}
