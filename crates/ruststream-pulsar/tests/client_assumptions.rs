//! What the Pulsar subscription's immediate forms rely on in the `pulsar` client, pinned
//! against a real broker: a message already in the consumer's receive queue is handed out
//! in its first poll, with a waker that wakes no one (`next_now`), and an ack completes in
//! its first poll (`settle_now`: the client puts it on an unbounded channel to its
//! connection's task). If a client update breaks the second, every ack would be reported
//! failed and the message delivered again: this test says so first.

mod common;

use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use common::{pulsar, unique};
use futures_util::StreamExt;
use ruststream::Headers;
use ruststream_pulsar::SubType;
use ruststream_pulsar::pulsar::consumer::Consumer;
use ruststream_pulsar::pulsar::{ConsumerOptions, TokioExecutor};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_consumer_hands_out_a_queued_message_and_acks_in_one_poll() {
    let pulsar = pulsar().await;
    let topic = unique("assume");
    let mut consumer: Consumer<Vec<u8>, TokioExecutor> =
        pulsar
            .client()
            .consumer()
            .with_topic(&topic)
            .with_subscription("assume")
            .with_subscription_type(SubType::Shared)
            .with_options(ConsumerOptions::default().with_initial_position(
                ruststream_pulsar::pulsar::consumer::InitialPosition::Earliest,
            ))
            .build()
            .await
            .expect("consumer");
    for n in 0..20u8 {
        pulsar
            .publisher()
            .send(&topic, None, &Headers::new(), vec![n])
            .await
            .expect("publish");
    }
    let first = tokio::time::timeout(Duration::from_secs(10), consumer.next())
        .await
        .expect("the first message within 10 s")
        .expect("a message")
        .expect("no error");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut cx = Context::from_waker(Waker::noop());
    let mut ids = vec![first.message_id.id.clone()];
    for n in 1..20 {
        let Poll::Ready(Some(Ok(message))) = consumer.poll_next_unpin(&mut cx) else {
            panic!("message {n} was in the receive queue but not ready in its first poll");
        };
        ids.push(message.message_id.id.clone());
    }
    for (n, id) in ids.into_iter().enumerate() {
        let ack = pin!(consumer.ack_with_id(&topic, id));
        let Poll::Ready(acked) = ack.poll(&mut cx) else {
            panic!("ack {n} did not complete in its first poll");
        };
        acked.expect("acked");
    }
}
