//! What the Kafka subscription's consumer (`src/queue.rs`) relies on in rdkafka's
//! `BaseConsumer`, pinned against a real broker. If a client update breaks one of these,
//! the subscription would wait for records already queued, or never wake: these tests
//! say so first.
//!
//! - `poll(Duration::ZERO)` hands out a queued record without waiting;
//! - the queue's non-empty callback fires when a record arrives in an empty queue;
//! - a poll that serves an event (a rebalance, a commit's result) answers `None`, like an
//!   empty queue, and the event reaches the consumer's context during that poll, which is
//!   how the subscription tells the two apart.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{create_topic, kafka, produce, unique};
use ruststream::Headers;
use ruststream_kafka::rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use ruststream_kafka::rdkafka::error::KafkaResult;
use ruststream_kafka::rdkafka::{ClientConfig, ClientContext, Message, Offset, TopicPartitionList};

/// Counts the events polls serve through the context, as the subscription's does.
#[derive(Default)]
struct Counting {
    rebalances: AtomicU64,
    commits: AtomicU64,
}

impl ClientContext for Counting {}

impl ConsumerContext for Counting {
    fn pre_rebalance(&self, _: &BaseConsumer<Self>, _: &Rebalance<'_>) {
        self.rebalances.fetch_add(1, Ordering::SeqCst);
    }

    fn commit_callback(&self, _: KafkaResult<()>, _: &TopicPartitionList) {
        self.commits.fetch_add(1, Ordering::SeqCst);
    }
}

fn config(group: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", common::brokers())
        .set("group.id", group)
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "500")
        .set("auto.offset.reset", "earliest");
    config
}

/// Polls without waiting until `f` says done, for at most 30 s.
fn poll_until<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    what: &str,
    mut f: impl FnMut(Option<KafkaResult<Vec<u8>>>) -> bool,
) {
    let limit = Instant::now() + Duration::from_secs(30);
    loop {
        let polled = consumer
            .poll(Duration::ZERO)
            .map(|r| r.map(|m| m.payload().unwrap_or_default().to_vec()));
        if f(polled) {
            return;
        }
        assert!(Instant::now() < limit, "{what} within 30 s");
        std::thread::sleep(Duration::from_millis(5));
    }
}

async fn topic_with(records: u8) -> String {
    let kafka = kafka().await;
    let topic = unique("assume");
    create_topic(&topic, 1).await;
    for n in 0..records {
        produce(&kafka, &topic, None, &[n], &Headers::new()).await;
    }
    topic
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_poll_hands_out_a_queued_record_without_waiting() {
    let topic = topic_with(20).await;
    let consumer: BaseConsumer = config(&unique("assume"))
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut list = TopicPartitionList::new();
    list.add_partition_offset(&topic, 0, Offset::Beginning)
        .unwrap();
    consumer.assign(&list).expect("assign");
    // The first record is waited for; the fetch brings the others into the queue.
    let first = consumer
        .poll(Duration::from_secs(30))
        .expect("the first record within 30 s")
        .expect("a record");
    assert_eq!(first.payload(), Some(&[0][..]));
    drop(first);
    std::thread::sleep(Duration::from_secs(1));
    for n in 1..20u8 {
        let record = consumer
            .poll(Duration::ZERO)
            .unwrap_or_else(|| panic!("record {n} was queued but poll(ZERO) gave nothing"))
            .expect("a record");
        assert_eq!(record.payload(), Some(&[n][..]));
    }
    std::mem::forget(consumer);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_queue_calls_back_when_a_record_arrives_in_an_empty_queue() {
    let kafka = kafka().await;
    let topic = topic_with(1).await;
    let mut consumer: BaseConsumer = config(&unique("assume"))
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let calls = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&calls);
    consumer.set_nonempty_callback(move || {
        counted.fetch_add(1, Ordering::SeqCst);
    });
    let mut list = TopicPartitionList::new();
    list.add_partition_offset(&topic, 0, Offset::Beginning)
        .unwrap();
    consumer.assign(&list).expect("assign");
    poll_until(&consumer, "the first record", |p| {
        p.is_some_and(|r| r.is_ok())
    });
    // Emptied: nothing more for a while.
    poll_until(&consumer, "an empty queue", |p| p.is_none());
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        consumer.poll(Duration::ZERO).is_none(),
        "the queue is empty"
    );
    let before = calls.load(Ordering::SeqCst);
    produce(&kafka, &topic, None, &[1], &Headers::new()).await;
    let limit = Instant::now() + Duration::from_secs(30);
    while calls.load(Ordering::SeqCst) == before {
        assert!(Instant::now() < limit, "the callback within 30 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let record = consumer
        .poll(Duration::ZERO)
        .expect("the record the callback announced")
        .expect("a record");
    assert_eq!(record.payload(), Some(&[1][..]));
    drop(record);
    std::mem::forget(consumer);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_poll_that_serves_an_event_answers_nothing_and_tells_the_context() {
    let topic = topic_with(3).await;
    let consumer: BaseConsumer<Counting> = config(&unique("assume"))
        .set("enable.auto.commit", "true")
        .set("auto.commit.interval.ms", "100")
        .create_with_context(Counting::default())
        .expect("consumer");
    consumer.subscribe(&[&topic]).expect("subscribe");
    let context = Arc::clone(consumer.context());
    // The assignment is served inside a poll that answers nothing.
    let mut seen = 0;
    poll_until(&consumer, "the assignment", |polled| {
        let served = context.rebalances.load(Ordering::SeqCst) > 0;
        if let Some(Ok(_)) = &polled {
            seen += 1;
        }
        if served {
            assert!(
                polled.is_none(),
                "the poll that served the rebalance answered nothing"
            );
        }
        served
    });
    poll_until(&consumer, "the 3 records", |polled| {
        if let Some(Ok(_)) = polled {
            seen += 1;
        }
        seen == 3
    });
    // A commit's result is served inside a poll that answers nothing.
    poll_until(&consumer, "a commit's result", |polled| {
        let served = context.commits.load(Ordering::SeqCst) > 0;
        if served {
            assert!(
                polled.is_none(),
                "the poll that served the commit answered nothing"
            );
        }
        served
    });
    std::mem::forget(consumer);
}
