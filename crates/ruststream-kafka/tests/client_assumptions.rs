//! What the Kafka subscription's immediate fetch (`next_now`) relies on in rdkafka,
//! pinned against a real broker: a record already in the client's queue is handed out
//! by `StreamConsumer::recv` in its first poll, with a waker that wakes no one. If a
//! client update breaks this, `next_now` would find nothing and every record would take
//! the slower waiting fetch: this test says so first.

mod common;

use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use common::{create_topic, kafka, produce, unique};
use ruststream::Headers;
use ruststream_kafka::rdkafka::consumer::{Consumer, StreamConsumer};
use ruststream_kafka::rdkafka::{ClientConfig, Offset, TopicPartitionList};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_recv_hands_out_a_queued_record_in_one_poll_without_a_waker() {
    let kafka = kafka().await;
    let topic = unique("assume");
    create_topic(&topic, 1).await;
    for n in 0..20u8 {
        produce(&kafka, &topic, None, &[n], &Headers::new()).await;
    }
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", common::brokers())
        .set("group.id", unique("assume"))
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut list = TopicPartitionList::new();
    list.add_partition_offset(&topic, 0, Offset::Beginning)
        .unwrap();
    consumer.assign(&list).expect("assign");
    // The first record is waited for; the fetch brings the others into the queue.
    tokio::time::timeout(Duration::from_secs(30), consumer.recv())
        .await
        .expect("the first record within 30 s")
        .expect("a record");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut cx = Context::from_waker(Waker::noop());
    for n in 1..20u8 {
        let Poll::Ready(record) = pin!(consumer.recv()).poll(&mut cx) else {
            panic!("record {n} was queued but recv() was not ready in its first poll");
        };
        let record = record.expect("a record");
        assert_eq!(
            ruststream_kafka::rdkafka::Message::payload(&record),
            Some(&[n][..])
        );
    }
}
