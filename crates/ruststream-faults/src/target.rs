//! The brokers the fault service runs on, as the fault tests drive them: a fresh
//! address, messages published to it, the service's lives on it.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ruststream::{Outgoing, Publisher};
use ruststream_kafka::Kafka;
use ruststream_nats::Nats;
use ruststream_nats::async_nats::jetstream::{self, stream};
use ruststream_pulsar::Pulsar;
use ruststream_rabbitmq::{QueueKind, RabbitMq};
use ruststream_redis::Redis;

use crate::{Service, Tally, kafka, settle, unique};

/// A transport the service runs on.
pub struct Target {
    /// The service's program (`env!("CARGO_BIN_EXE_fault-service")` in a test).
    program: &'static str,
    /// The service's transport argument.
    pub transport: &'static str,
    /// Its name in RELIABILITY.md.
    pub label: &'static str,
    /// The broker's address, as the service takes it.
    pub url: String,
    /// A confirmed publisher to the broker.
    pub publisher: Publisher,
    nats: Option<Nats>,
    rabbit: Option<RabbitMq>,
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run the tests with scripts/test, which starts the brokers")
    })
}

/// Its name in RELIABILITY.md.
fn label(transport: &str) -> &'static str {
    match transport {
        "core" => "NATS Core",
        "jetstream" => "NATS JetStream",
        "kafka-auto" => "Kafka Commit::Auto",
        "kafka-transactional" => "Kafka Commit::Transactional",
        "kafka-tracked" => "Kafka Commit::Tracked",
        "pulsar" => "Pulsar Shared",
        "rabbitmq-quorum" => "RabbitMQ quorum queue",
        "rabbitmq-classic" => "RabbitMQ classic queue",
        "redis" => "Redis Streams",
        other => panic!("no target {other}"),
    }
}

async fn target(program: &'static str, transport: &'static str) -> Target {
    let (mut nats, mut rabbit) = (None, None);
    let (url, publisher) = match transport {
        "core" | "jetstream" => {
            let url = env("RUSTSTREAM_NATS_URL");
            let client = Nats::connect(&url)
                .await
                .unwrap_or_else(|e| panic!("the fault tests need nats-server at {url}: {e}"));
            let publisher = Publisher::new(client.publish_handle());
            nats = Some(client);
            (url, publisher)
        }
        "pulsar" => {
            let url = env("RUSTSTREAM_PULSAR_ADDR");
            let relay = ruststream_test_support::pulsar_relay::start(url.clone()).await;
            let pulsar = Pulsar::connect(&format!("pulsar://{relay}"))
                .await
                .unwrap_or_else(|e| panic!("the fault tests need pulsar-lite at {url}: {e}"));
            (url, Publisher::new(Arc::new(pulsar.publisher())))
        }
        "rabbitmq-classic" | "rabbitmq-quorum" => {
            let url = env("RUSTSTREAM_RABBITMQ_URL");
            let client = RabbitMq::connect(&url)
                .await
                .unwrap_or_else(|e| panic!("the fault tests need rabbitmq-server: {e}"));
            let publisher = Publisher::new(client.publish_handle());
            rabbit = Some(client);
            (url, publisher)
        }
        "redis" => {
            let url = env("RUSTSTREAM_REDIS_URL");
            let redis = Redis::connect(&url)
                .await
                .unwrap_or_else(|e| panic!("the fault tests need redis-server: {e}"));
            (url, Publisher::new(redis.publish_handle()))
        }
        _ => {
            let url = kafka::brokers();
            let client = Kafka::connect(&url).expect("Kafka client");
            (url, Publisher::new(Arc::new(client.publisher())))
        }
    };
    Target {
        program,
        transport,
        label: label(transport),
        url,
        publisher,
        nats,
        rabbit,
    }
}

impl Target {
    /// The target `transport` (the service's argument) for `program`; a broker that is
    /// not there fails the test, naming it.
    pub async fn new(program: &'static str, transport: &'static str) -> Self {
        target(program, transport).await
    }

    /// A fresh address (stream, topic, subject) and group.
    pub async fn address(&self) -> (String, String) {
        self.address_over(1).await
    }

    /// A fresh address and group; a Kafka topic gets `partitions` partitions.
    pub async fn address_over(&self, partitions: i32) -> (String, String) {
        let group = unique("g").replace('-', "_");
        let address = match self.transport {
            "core" => unique("kill"),
            "jetstream" => {
                let name = unique("KILL");
                let nats = self.nats.as_ref().expect("NATS client");
                jetstream::new(nats.client().clone())
                    .create_stream(stream::Config {
                        name: name.clone(),
                        subjects: vec![name.clone()],
                        ..Default::default()
                    })
                    .await
                    .expect("stream created");
                name
            }
            "pulsar" => format!("persistent://public/default/{}", unique("kill")),
            // The service's group creates the stream; published before, read from 0.
            "redis" => unique("kill"),
            "rabbitmq-classic" | "rabbitmq-quorum" => {
                let name = unique("kill");
                let rabbit = self.rabbit.as_ref().expect("RabbitMQ client");
                let kind = if self.transport == "rabbitmq-quorum" {
                    QueueKind::Quorum
                } else {
                    QueueKind::Classic
                };
                rabbit
                    .declare_queue(&name, kind)
                    .await
                    .expect("declare the queue");
                name
            }
            _ => {
                let topic = unique("kill");
                kafka::create_partitioned(&self.url, &[&topic], partitions).await;
                if self.transport == "kafka-transactional" {
                    // The exactly-once service produces each output to `<topic>-out`.
                    kafka::create_partitioned(&self.url, &[&format!("{topic}-out")], 1).await;
                }
                topic
            }
        };
        (address, group)
    }

    /// Publishes `m-0` … `m-{n-1}` (keys spread over 8 values); returns the payloads the
    /// broker confirmed.
    pub async fn publish(&self, address: &str, n: usize) -> BTreeSet<String> {
        self.publish_keyed(address, n, 8).await
    }

    /// Publishes `m-0` … `m-{n-1}` with keys spread over `keys` values, with one wait for
    /// all of them (`send_all`); returns the payloads, every one confirmed by the broker.
    pub async fn publish_keyed(&self, address: &str, n: usize, keys: usize) -> BTreeSet<String> {
        let to: Arc<str> = Arc::from(address);
        let messages = (0..n).map(|i| {
            let mut message = Outgoing::new(Arc::clone(&to), Bytes::from(format!("m-{i}")));
            message.key = Some(Bytes::from(format!("k{}", i % keys)));
            message
        });
        let results = self.publisher.send_all(messages).await;
        for (i, result) in results.iter().enumerate() {
            if let Err(e) = result {
                panic!("publishing m-{i} to {address}: {e}");
            }
        }
        (0..n).map(|i| format!("m-{i}")).collect()
    }

    /// Starts a life of the service on `address` as `group`, in `mode`.
    pub fn service(&self, address: &str, group: &str, mode: &str) -> Service {
        Service::spawn(
            self.program,
            &[self.transport, &self.url, address, group, mode],
        )
    }

    /// Core NATS keeps nothing for a subscriber that is not there yet.
    pub fn publish_after_start(&self) -> bool {
        self.transport == "core"
    }

    /// A fresh address and group, `n` messages published to it, and the service's first
    /// life in `mode`, ready (Core NATS: published once the service listens).
    pub async fn first_life(
        &self,
        n: usize,
        mode: &str,
    ) -> (String, String, BTreeSet<String>, Service) {
        let (address, group) = self.address().await;
        let mut published = BTreeSet::new();
        if !self.publish_after_start() {
            published = self.publish(&address, n).await;
        }
        let mut first = self.service(&address, &group, mode);
        first
            .until(Duration::from_secs(30), "ready", |t| t.ready)
            .await;
        if self.publish_after_start() {
            tokio::time::sleep(Duration::from_millis(300)).await;
            published = self.publish(&address, n).await;
        }
        (address, group, published, first)
    }

    /// Where the spec documents a loss window.
    pub fn lossy(&self) -> bool {
        matches!(self.transport, "core" | "kafka-auto")
    }

    /// Starts the service's second life (acking everything) and lets it finish: until
    /// every published message is acked by one life or the other, or, where the spec
    /// documents a loss window, until a message published after the restart (`end`, read
    /// in order behind anything still to come) is acked. Returns its tally.
    pub async fn restart(
        &self,
        address: &str,
        group: &str,
        published: &BTreeSet<String>,
        first: &Tally,
    ) -> Tally {
        let mut second = self.service(address, group, "ack");
        second
            .until(Duration::from_secs(30), "ready", |t| t.ready)
            .await;
        if self.lossy() {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let mut end = Outgoing::new(address, Bytes::from_static(b"end"));
            end.key = Some(Bytes::from_static(b"k0"));
            self.publisher.publish(end).await.expect("publishing `end`");
            second
                .until(Duration::from_secs(90), "`end` handled", |t| {
                    t.handled().contains("end")
                })
                .await;
            // Anything still in flight behind it.
            tokio::time::sleep(Duration::from_secs(1)).await;
        } else {
            settle(
                &mut second,
                published,
                std::slice::from_ref(first),
                Duration::from_secs(90),
            )
            .await;
        }
        second.kill().await
    }
}
