//! `consumers(n)` on Kafka: n members of the group in one process, the partitions spread
//! over them, each partition's order kept.

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::{create_topic, kafka, unique};
use ruststream::{App, Delivery, HandlerOutcome, Outgoing, Publisher, on};
use ruststream_kafka::rdkafka::Offset;
use ruststream_kafka::{Commit, EosPipeline};
use ruststream_test_support::eventually;
use ruststream_test_support::overlap::{Overlap, keyed_payload, refusals};

/// Three consumers of one registration on a topic of three partitions: two or more
/// handlers run at once although each blocks its thread (the partitions were spread over
/// the members), and every key's messages are handled in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumers_spread_the_partitions_and_keep_each_keys_order() {
    let kafka = kafka().await;
    let topic = unique("consumers");
    create_topic(&topic, 3).await;
    let overlap = Arc::new(Overlap::default());
    let seen = Arc::clone(&overlap);
    let running = App::new()
        .register(
            on(
                kafka
                    .topic(&topic)
                    .group(unique("g"))
                    .commit(Commit::Tracked)
                    .set("session.timeout.ms", "6000")
                    .set("heartbeat.interval.ms", "500"),
                move |d: Delivery| {
                    seen.handle(d.payload(), Duration::from_millis(5));
                    async { HandlerOutcome::ack() }
                },
            )
            .consumers(3),
        )
        .start()
        .await
        .expect("starts");
    // The group forms (three members join) before anything is published, so no
    // partition moves while the messages are handled.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let publisher = Publisher::new(Arc::new(kafka.publisher()));
    let (keys, per_key) = (24, 10);
    for n in 0..per_key {
        for k in 0..keys {
            let key = format!("k{k}");
            let mut message = Outgoing::new(topic.as_str(), Bytes::from(keyed_payload(&key, n)));
            message.key = Some(Bytes::from(key));
            publisher.publish(message).await.expect("published");
        }
    }
    let total = keys * per_key as usize;
    eventually(Duration::from_secs(60), "all handled", || {
        overlap.distinct() >= total
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    running.stop().await;
    // Formed before the messages came, the group moves nothing meanwhile; should it form
    // late, a moved partition is read again from its last commit (K5), in order.
    overlap.assert_each_key_in_order_allowing_replays(keys, per_key);
    assert!(overlap.most() >= 2, "the partitions were not spread");
}

/// E4: several consumers cannot share explicitly assigned partitions (each would read
/// them all), one exactly-once pipeline, or one static group membership: the start is
/// refused, naming each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e4_consumers_on_explicit_partitions_one_pipeline_or_one_static_member_are_refused() {
    let kafka = kafka().await;
    let ack = |_: Delivery| async { HandlerOutcome::ack() };
    let pipeline = EosPipeline::new(&kafka, unique("tx"));
    let started = App::new()
        .register(
            on(
                kafka.partitions([("t", 0, Offset::Beginning)]).group("g"),
                ack,
            )
            .name("assigned")
            .consumers(2),
        )
        .register(
            on(
                kafka
                    .topic("t")
                    .group("g")
                    .commit(Commit::Transactional(pipeline)),
                ack,
            )
            .name("exactly-once")
            .consumers(3),
        )
        .register(
            on(
                kafka
                    .topic("t")
                    .group("g")
                    .set("group.instance.id", "static-1"),
                ack,
            )
            .name("static")
            .consumers(2),
        )
        .start()
        .await;
    let rules = refusals(started);
    assert!(
        rules
            .iter()
            .any(|r| r.starts_with("assigned: consumers(2) on explicitly assigned")),
        "{rules:?}"
    );
    assert!(
        rules
            .iter()
            .any(|r| r.starts_with("exactly-once: consumers(3) under Commit::Transactional")),
        "{rules:?}"
    );
}
