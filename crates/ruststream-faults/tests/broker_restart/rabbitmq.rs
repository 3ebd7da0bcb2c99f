//! RabbitMQ (R8): two restarts of a broker of the test's own, with classic and quorum
//! queues.

use std::sync::Arc;

use ruststream::Headers;
use ruststream_faults::unique;
use ruststream_rabbitmq::{QueueKind, RabbitMq};
use ruststream_test_support::rabbit_broker::OwnRabbit;

use crate::support::{Broker, Send, two_restarts};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r8_rabbitmq_classic_two_broker_restarts_lose_no_confirmed_message() {
    rabbit_restarts(
        QueueKind::Classic,
        "RabbitMQ classic queue",
        "rabbitmq-classic",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r8_rabbitmq_quorum_two_broker_restarts_lose_no_confirmed_message() {
    rabbit_restarts(
        QueueKind::Quorum,
        "RabbitMQ quorum queue",
        "rabbitmq-quorum",
    )
    .await;
}

/// A rabbitmq-server of this test's own; a durable queue of `kind`, persistent messages.
async fn rabbit_restarts(kind: QueueKind, label: &str, transport: &str) {
    let broker = OwnRabbit::new();
    broker.start().await;
    let url = broker.url();
    let rabbit = RabbitMq::connect(&url).await.expect("connect");
    let queue = unique("restart");
    rabbit.declare_queue(&queue, kind).await.expect("declared");
    // As a queue older than 3 minutes would be: see `restart_gracefully`.
    broker.restart_gracefully().await;
    let publisher = rabbit.publisher();
    let send: Send = {
        let queue = queue.clone();
        Arc::new(move |id: String| {
            let (publisher, queue) = (publisher.clone(), queue.clone());
            // Confirmed by the broker (publisher confirms); sent again when not.
            Box::pin(async move {
                publisher
                    .send(&queue, &Headers::new(), id.as_bytes())
                    .await
                    .is_ok()
            })
        })
    };
    two_restarts(
        label,
        "rabbitmq-server SIGKILLed and restarted",
        Broker::Rabbit(broker),
        &[transport, &url, &queue, "worker", "ack"],
        send,
        None,
    )
    .await;
}
