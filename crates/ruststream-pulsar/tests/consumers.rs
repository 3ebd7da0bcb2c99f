//! `consumers(n)` on Pulsar: n consumers of one subscription in one process.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{eventually, pulsar, unique};
use ruststream::{App, Delivery, HandlerOutcome, Headers, on};
use ruststream_pulsar::SubType;
use ruststream_test_support::overlap::{Overlap, keyed_payload, refusals};

/// Two consumers of a `KeyShared` subscription: two handlers run at once although each
/// blocks its thread, and every key's messages are handled once each, in order (the
/// broker gives a key to one consumer at a time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumers_of_a_key_shared_subscription_keep_each_keys_order() {
    let pulsar = pulsar().await;
    let topic = unique("consumers");
    let overlap = Arc::new(Overlap::default());
    let seen = Arc::clone(&overlap);
    let running = App::new()
        .register(
            on(
                pulsar
                    .topic(&topic)
                    .subscription("s")
                    .subscription_type(SubType::KeyShared),
                move |d: Delivery| {
                    seen.handle(d.payload(), Duration::from_millis(5));
                    async { HandlerOutcome::ack() }
                },
            )
            .consumers(2),
        )
        .start()
        .await
        .expect("starts");
    let publisher = pulsar.publisher();
    let (keys, per_key) = (16, 10);
    for n in 0..per_key {
        for k in 0..keys {
            let key = format!("k{k}");
            let payload = keyed_payload(&key, n).into_bytes();
            publisher
                .send(&topic, Some(key.as_bytes()), &Headers::new(), payload)
                .await
                .expect("published");
        }
    }
    let total = keys * per_key as usize;
    eventually(Duration::from_secs(60), "all handled", || {
        overlap.count() >= total
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    running.stop().await;
    overlap.assert_each_key_in_order(keys, per_key);
    assert!(overlap.most() >= 2, "the keys were not spread");
}

/// E4: an `Exclusive` or `Failover` subscription has one active consumer, so several are
/// refused at start, naming each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e4_consumers_of_an_exclusive_or_failover_subscription_are_refused() {
    let pulsar = pulsar().await;
    let topic = unique("consumers");
    let ack = |_: Delivery| async { HandlerOutcome::ack() };
    let mut app = App::new();
    for (name, kind) in [
        ("exclusive", SubType::Exclusive),
        ("failover", SubType::Failover),
    ] {
        let subscription = pulsar
            .topic(&topic)
            .subscription(name)
            .subscription_type(kind);
        app = app.register(on(subscription, ack).name(name).consumers(2));
    }
    let rules = refusals(app.start().await);
    for name in ["exclusive", "failover"] {
        assert!(
            rules
                .iter()
                .any(|r| r.starts_with(&format!("{name}: consumers(2) on a"))
                    && r.contains("use Shared or KeyShared")),
            "{rules:?}"
        );
    }
}
