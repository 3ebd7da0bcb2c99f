//! Shared test support: the real broker, topics, committed offsets, reading topics back,
//! scripted handlers, captured logs.
#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ruststream::{Delivery, HandlerOutcome, Headers};
use ruststream_kafka::Kafka;
use ruststream_kafka::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use ruststream_kafka::rdkafka::client::DefaultClientContext;
use ruststream_kafka::rdkafka::config::ClientConfig;
use ruststream_kafka::rdkafka::consumer::{BaseConsumer, Consumer};
use ruststream_kafka::rdkafka::message::{Headers as _, Message};
use ruststream_kafka::rdkafka::{Offset, TopicPartitionList};

pub fn brokers() -> String {
    std::env::var("RUSTSTREAM_KAFKA_BROKERS").unwrap_or_else(|_| {
        panic!("RUSTSTREAM_KAFKA_BROKERS is not set: run the tests with scripts/test, which starts tansu")
    })
}

/// The broker the project's test command started. A missing broker fails the test.
pub async fn kafka() -> Kafka {
    capture_logs();
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
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "{prefix}-{}-{}-{}",
        std::process::id(),
        nanos % 1_000_000_000,
        N.fetch_add(1, Ordering::Relaxed)
    )
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

/// One handler call as a test sees it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub attempt: u32,
    pub partition: Option<i32>,
    pub offset: Option<i64>,
    pub topic: String,
    pub key: Option<Bytes>,
    pub headers: Headers,
    pub payload: Bytes,
    pub at: Instant,
}

/// A handler whose outcome a test decides, recording every call.
pub struct Script {
    pub calls: Mutex<Vec<Seen>>,
    decide: Box<dyn Fn(&Delivery) -> HandlerOutcome + Send + Sync>,
}

impl Script {
    pub fn new(decide: impl Fn(&Delivery) -> HandlerOutcome + Send + Sync + 'static) -> Arc<Self> {
        Arc::new(Self {
            calls: Mutex::new(Vec::new()),
            decide: Box::new(decide),
        })
    }

    pub fn calls(&self) -> Vec<Seen> {
        self.calls.lock().unwrap().clone()
    }

    pub fn count(&self) -> usize {
        self.calls.lock().unwrap().len()
    }

    pub fn record(&self, delivery: &Delivery) {
        self.calls.lock().unwrap().push(Seen {
            attempt: delivery.attempt().number(),
            partition: delivery.metadata().partition,
            offset: delivery.metadata().offset,
            topic: delivery.address().to_owned(),
            key: delivery.key().cloned(),
            headers: delivery.headers().clone(),
            payload: delivery.payload().clone(),
            at: Instant::now(),
        });
    }
}

/// A handler (an async closure) running `script`.
pub fn handler(
    script: Arc<Script>,
) -> impl Fn(Delivery) -> std::pin::Pin<Box<dyn Future<Output = HandlerOutcome> + Send>>
+ Clone
+ Send
+ Sync
+ 'static {
    move |delivery: Delivery| {
        let script = Arc::clone(&script);
        Box::pin(async move {
            script.record(&delivery);
            (script.decide)(&delivery)
        })
    }
}

/// Polls `condition` until it holds, failing the test after `limit`.
pub async fn eventually(limit: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !condition() {
        assert!(Instant::now() < deadline, "not within {limit:?}: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Everything logged in this test process (each nextest test is its own process).
pub fn logs() -> String {
    String::from_utf8_lossy(&LOG.get_or_init(Default::default).lock().unwrap()).into_owned()
}

static LOG: OnceLock<Mutex<Vec<u8>>> = OnceLock::new();

struct Capture;

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOG.get_or_init(Default::default)
            .lock()
            .unwrap()
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn capture_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("debug")
        .with_ansi(false)
        .with_writer(|| Capture)
        .try_init();
}
