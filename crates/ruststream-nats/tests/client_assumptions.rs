//! What the NATS subscriptions' immediate forms rely on in async-nats, pinned against a
//! real nats-server: a message already in the client's buffer is handed out by the Core
//! subscriber and by the JetStream pull stream in their first poll, with a waker that
//! wakes no one (`next_now`); a publish into a client queue with room completes in its
//! first poll (JetStream's `settle_now` acknowledgement). If a client update breaks one,
//! the immediate form would always decline and the runtime take the slower path: these
//! tests say so first.

mod common;

use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use common::{create_stream, nats, unique};
use futures_util::{Stream, StreamExt};
use ruststream::Headers;
use ruststream_nats::async_nats::jetstream::{self, consumer::pull};

/// Polls `stream` once with a waker that wakes no one: every item must be there.
fn each_ready_at_once<S: Stream + Unpin>(stream: &mut S, count: usize, what: &str) {
    let mut cx = Context::from_waker(Waker::noop());
    for n in 0..count {
        let Poll::Ready(Some(_)) = stream.poll_next_unpin(&mut cx) else {
            panic!("{what} {n} was in the client's buffer but not ready in its first poll");
        };
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_core_subscriber_hands_out_a_buffered_message_in_one_poll() {
    let nats = nats().await;
    let subject = unique("assume_core");
    let mut subscriber = nats.client().subscribe(subject.clone()).await.unwrap();
    nats.client().flush().await.unwrap();
    for n in 0..20u8 {
        nats.client()
            .publish(subject.clone(), Bytes::from(vec![n]))
            .await
            .unwrap();
    }
    nats.client().flush().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), subscriber.next())
        .await
        .expect("the first message within 10 s");
    tokio::time::sleep(Duration::from_millis(500)).await;
    each_ready_at_once(&mut subscriber, 19, "Core message");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_jetstream_pull_stream_hands_out_a_buffered_message_in_one_poll() {
    let nats = nats().await;
    let name = unique("ASSUME");
    let stream = create_stream(&nats, &name, std::slice::from_ref(&name)).await;
    for n in 0..20u8 {
        nats.publisher()
            .jetstream(&name, &Headers::new(), Bytes::from(vec![n]), None)
            .await
            .expect("publish");
    }
    let consumer: jetstream::consumer::PullConsumer = stream
        .create_consumer(pull::Config {
            durable_name: Some("assume".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut messages = consumer
        .stream()
        .max_messages_per_batch(20)
        .messages()
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), messages.next())
        .await
        .expect("the first message within 10 s");
    tokio::time::sleep(Duration::from_millis(500)).await;
    each_ready_at_once(&mut messages, 19, "JetStream message");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_publish_with_room_in_the_queue_completes_in_one_poll() {
    let nats = nats().await;
    let subject = unique("assume_ack");
    let mut cx = Context::from_waker(Waker::noop());
    for n in 0..100u8 {
        let publish = pin!(nats.client().publish(subject.clone(), Bytes::from(vec![n])));
        let Poll::Ready(published) = publish.poll(&mut cx) else {
            panic!("publish {n} did not complete in its first poll with room in the queue");
        };
        published.expect("published");
        // Room again: the connection task drains the queue meanwhile.
        if n % 10 == 9 {
            nats.client().flush().await.unwrap();
        }
    }
}
