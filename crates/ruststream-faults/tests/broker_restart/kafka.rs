//! Kafka: two outages of librdkafka's mock cluster, under `Commit::Tracked` (nothing
//! confirmed lost) and `Commit::Auto` (K2: the loss measured).

use std::sync::Arc;

use ruststream::Headers;
use ruststream_faults::unique;
use ruststream_kafka::Kafka;
use ruststream_kafka::rdkafka::mocking::MockCluster;

use crate::support::{Broker, Lossy, Send, two_restarts};

/// A Kafka sender on the mock cluster.
fn kafka_send(url: &str, topic: &str) -> Send {
    let publisher = Kafka::connect(url).expect("client").publisher();
    let topic = topic.to_owned();
    Arc::new(move |id: String| {
        let (publisher, topic) = (publisher.clone(), topic.clone());
        Box::pin(async move {
            publisher
                .send(&topic, None, &Headers::new(), id.as_bytes(), None)
                .await
                .is_ok()
        })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_tracked_two_broker_outages_lose_no_confirmed_message() {
    kafka_outages("kafka-tracked", "Kafka Commit::Tracked", None).await;
}

/// K2: offsets stored at hand-over; an outage may still lose nothing. Measured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k2_kafka_auto_two_broker_outages_loss_is_measured() {
    kafka_outages(
        "kafka-auto",
        "Kafka Commit::Auto",
        Some("offsets stored at hand-over, K2"),
    )
    .await;
}

async fn kafka_outages(transport: &str, label: &str, lossy: Lossy) {
    let cluster = MockCluster::new(1).expect("mock cluster");
    let topic = unique("restart");
    cluster
        .create_topic(&topic, 1, 1)
        .expect("topic on the mock cluster");
    let url = cluster.bootstrap_servers();
    let send = kafka_send(&url, &topic);
    two_restarts(
        label,
        "the broker (librdkafka mock cluster) taken down and brought up",
        Broker::Mock(cluster),
        &[transport, &url, &topic, &unique("g"), "ack"],
        send,
        lossy,
    )
    .await;
}
