//! Shared test support: the real broker, topics, committed offsets, reading topics back,
//! scripted handlers, captured logs.
#![allow(dead_code, unreachable_pub, unused_imports)]

use std::time::{Duration, Instant};

use bytes::Bytes;
use ruststream::Headers;
use ruststream_kafka::Kafka;
use ruststream_kafka::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use ruststream_kafka::rdkafka::client::DefaultClientContext;
use ruststream_kafka::rdkafka::config::ClientConfig;
use ruststream_kafka::rdkafka::consumer::{BaseConsumer, Consumer};
use ruststream_kafka::rdkafka::groups::GroupInfo;
use ruststream_kafka::rdkafka::message::{Headers as _, Message};
use ruststream_kafka::rdkafka::{Offset, TopicPartitionList};
pub use ruststream_test_support::{
    Script, Seen, assert_waited, capture_logs, eventually, forward_later, handler, logs,
    unique_suffix,
};

pub fn brokers() -> String {
    std::env::var("RUSTSTREAM_KAFKA_BROKERS").unwrap_or_else(|_| {
        panic!("RUSTSTREAM_KAFKA_BROKERS is not set: run the tests with scripts/test, which starts tansu")
    })
}

/// The broker the project's test command started. A missing broker fails the test.
pub async fn kafka() -> Kafka {
    capture_logs("debug");
    let brokers = brokers();
    let admin: AdminClient<DefaultClientContext> = admin(&brokers);
    let reachable = blocking(move || {
        admin
            .inner()
            .fetch_metadata(None, Duration::from_secs(5))
            .map(drop)
    })
    .await;
    if let Err(e) = reachable {
        panic!("the Kafka tests need a running broker at {brokers}: {e}");
    }
    Kafka::connect(&brokers).expect("kafka client")
}

fn admin(brokers: &str) -> AdminClient<DefaultClientContext> {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .expect("admin client")
}

/// Runs blocking librdkafka work on a thread of its own; the thread (and whatever client
/// it holds) is never joined, as dropping clients can block (see brokers.md).
pub async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let _ = tx.send(work());
    });
    tokio::time::timeout(Duration::from_secs(60), rx)
        .await
        .expect("blocking Kafka call finished")
        .expect("thread finished")
}

/// A name no other test (or earlier run) uses.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", unique_suffix())
}

/// Creates `topic` with `partitions` partitions.
pub async fn create_topic(topic: &str, partitions: i32) {
    let admin = admin(&brokers());
    let result = admin
        .create_topics(
            &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .expect("create topics");
    for r in result {
        r.unwrap_or_else(|(t, e)| panic!("creating topic {t}: {e}"));
    }
    std::mem::forget(admin);
}

/// The offset `group` resumes `topic`/`partition` from, as the broker has it committed.
pub async fn committed(group: &str, topic: &str, partition: i32) -> Option<i64> {
    let (brokers, group, topic) = (brokers(), group.to_owned(), topic.to_owned());
    blocking(move || {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .set("group.id", &group)
            .set("enable.auto.commit", "false")
            .create()
            .expect("consumer");
        let mut list = TopicPartitionList::new();
        list.add_partition(&topic, partition);
        let offsets = consumer
            .committed_offsets(list, Duration::from_secs(10))
            .expect("committed offsets");
        let offset = offsets
            .find_partition(&topic, partition)
            .map(|e| e.offset());
        std::mem::forget(consumer);
        match offset {
            Some(Offset::Offset(o)) => Some(o),
            _ => None,
        }
    })
    .await
}

/// Polls the committed offset until it equals `expected`.
pub async fn committed_becomes(
    group: &str,
    topic: &str,
    partition: i32,
    expected: i64,
    limit: Duration,
) {
    let deadline = Instant::now() + limit;
    loop {
        let now = committed(group, topic, partition).await;
        if now == Some(expected) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "committed offset of {topic}/{partition} is {now:?}, expected {expected}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the broker lists `group` as `Stable` with `members` members (ListGroups).
/// tansu 0.6.0 keeps a member that leaves during a join as the group's leader, and the
/// group then never forms again (docs/kafka.md): a test that stops a member waits for
/// this first.
pub async fn group_stable(group: &str, members: usize, limit: Duration) {
    let deadline = Instant::now() + limit;
    let admin = std::sync::Arc::new(admin(&brokers()));
    let mut seen = Vec::new();
    loop {
        let (admin_, group_) = (std::sync::Arc::clone(&admin), group.to_owned());
        let states = blocking(move || {
            let list = admin_
                .inner()
                .fetch_group_list(Some(&group_), Duration::from_secs(5));
            let state = |g: &GroupInfo| (g.state().to_owned(), g.members().len());
            list.map(|l| l.groups().iter().map(state).collect::<Vec<_>>())
                .map_err(|e| e.to_string())
        })
        .await;
        if seen.last() != Some(&states) {
            seen.push(states.clone());
        }
        if let Ok(states) = &states
            && states.iter().any(|(s, n)| s == "Stable" && *n == members)
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "group {group} did not become Stable with {members} members: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    std::mem::forget(admin);
}

/// A record read back from a topic.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Bytes>,
    pub payload: Bytes,
    pub headers: Vec<(String, Bytes)>,
}

impl Record {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| std::str::from_utf8(v).ok())
    }
}

/// Reads `topic` from the beginning until `count` records arrived (or `limit` passed).
pub async fn read_topic(
    topic: &str,
    partitions: i32,
    count: usize,
    limit: Duration,
) -> Vec<Record> {
    read(topic, partitions, count, limit, "read_uncommitted").await
}

/// Like [`read_topic`] on one partition, honouring transaction markers.
pub async fn read_committed(topic: &str, count: usize, limit: Duration) -> Vec<Record> {
    // Ask for one more than expected, to see that no extra record follows.
    read(topic, 1, count + 1, limit, "read_committed").await
}

async fn read(
    topic: &str,
    partitions: i32,
    count: usize,
    limit: Duration,
    isolation: &'static str,
) -> Vec<Record> {
    let (brokers, topic) = (brokers(), topic.to_owned());
    blocking(move || {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .set("group.id", unique("reader"))
            .set("enable.auto.commit", "false")
            .set("isolation.level", isolation)
            .create()
            .expect("consumer");
        let mut list = TopicPartitionList::new();
        for p in 0..partitions {
            list.add_partition_offset(&topic, p, Offset::Beginning)
                .unwrap();
        }
        consumer.assign(&list).expect("assign");
        let deadline = Instant::now() + limit;
        let mut records = Vec::new();
        while records.len() < count && Instant::now() < deadline {
            if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
                records.push(Record {
                    partition: m.partition(),
                    offset: m.offset(),
                    key: m.key().map(Bytes::copy_from_slice),
                    payload: Bytes::copy_from_slice(m.payload().unwrap_or_default()),
                    headers: m
                        .headers()
                        .map(|h| {
                            h.iter()
                                .map(|h| {
                                    (
                                        h.key.to_owned(),
                                        Bytes::copy_from_slice(h.value.unwrap_or_default()),
                                    )
                                })
                                .collect()
                        })
                        .unwrap_or_default(),
                });
            }
        }
        std::mem::forget(consumer);
        records
    })
    .await
}

/// Produces one record and returns where it landed.
pub async fn produce(
    kafka: &Kafka,
    topic: &str,
    key: Option<&str>,
    payload: &[u8],
    headers: &Headers,
) -> (i32, i64) {
    let landed = kafka
        .publisher()
        .send(topic, key.map(str::as_bytes), headers, payload, None)
        .await
        .expect("produce");
    (landed.partition, landed.offset)
}

/// A subscription on `topic` as `group` with the settings the tests share: commits every
/// 100 ms, and a session timeout short enough for tansu to form the group quickly.
pub fn topic(
    kafka: &Kafka,
    topic: &str,
    group: &str,
    commit: ruststream_kafka::Commit,
) -> ruststream_kafka::KafkaTopic<ruststream_kafka::Grouped> {
    kafka
        .topic(topic)
        .group(group)
        .commit(commit)
        .set("auto.commit.interval.ms", "100")
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "500")
}
