//! What the RabbitMQ subscription's immediate fetch (`next_now`) relies on in lapin,
//! pinned against a real broker: a delivery already in the consumer's buffer is handed
//! out in its first poll, with a waker that wakes no one. If a client update breaks this,
//! every delivery would take the slower waiting fetch: this test says so first.

mod common;

use std::task::{Context, Poll, Waker};
use std::time::Duration;

use common::{declare, rabbit};
use futures_util::StreamExt;
use lapin::options::{BasicConsumeOptions, BasicQosOptions};
use lapin::types::{FieldTable, ShortString};
use ruststream::Headers;
use ruststream_rabbitmq::lapin;
use ruststream_test_support::unique_suffix;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_consumer_hands_out_a_buffered_delivery_in_one_poll() {
    let rabbit = rabbit().await;
    let queue = format!("assume-{}", unique_suffix());
    declare(&rabbit, &queue, &[]).await;
    for n in 0..20u8 {
        rabbit
            .publisher()
            .send(&queue, &Headers::new(), &[n])
            .await
            .expect("publish");
    }
    let channel = rabbit.connection().create_channel().await.expect("channel");
    channel
        .basic_qos(50, BasicQosOptions::default())
        .await
        .expect("qos");
    let mut consumer = channel
        .basic_consume(
            ShortString::from(queue.as_str()),
            ShortString::from(""),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume");
    tokio::time::timeout(Duration::from_secs(10), consumer.next())
        .await
        .expect("the first delivery within 10 s");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut cx = Context::from_waker(Waker::noop());
    for n in 1..20 {
        let Poll::Ready(Some(Ok(_))) = consumer.poll_next_unpin(&mut cx) else {
            panic!("delivery {n} was in the consumer's buffer but not ready in its first poll");
        };
    }
}
