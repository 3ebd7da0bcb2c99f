//! SIGKILL the service (a separate process, `fault-service`) while its handlers run and
//! while `retry_after` waits, restart it, and count: every published message must end
//! acked, except where the spec documents a loss window (Core NATS, Kafka `Commit::Auto`),
//! which is measured and reported instead of asserted.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ruststream::{Outgoing, Publisher};
use ruststream_faults::{HOLD, Report, Service, Tally, assert_waited, kafka, settle, soak, unique};
use ruststream_kafka::Kafka;
use ruststream_nats::Nats;
use ruststream_nats::async_nats::jetstream::{self, stream};
use ruststream_pulsar::Pulsar;
use ruststream_rabbitmq::{QueueKind, RabbitMq};
use ruststream_redis::Redis;

const SERVICE: &str = env!("CARGO_BIN_EXE_fault-service");

/// A transport the service runs on.
struct Target {
    /// The service's transport argument.
    transport: &'static str,
    /// Its name in RELIABILITY.md.
    label: &'static str,
    url: String,
    publisher: Publisher,
    nats: Option<Nats>,
    rabbit: Option<RabbitMq>,
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run the tests with scripts/test, which starts the brokers")
    })
}

async fn target(transport: &'static str) -> Target {
    let (label, url, publisher, nats) = match transport {
        "core" | "jetstream" => {
            let url = env("RUSTSTREAM_NATS_URL");
            let nats = Nats::connect(&url)
                .await
                .unwrap_or_else(|e| panic!("the fault tests need nats-server at {url}: {e}"));
            let label = if transport == "core" {
                "NATS Core"
            } else {
                "NATS JetStream"
            };
            (
                label,
                url,
                Publisher::new(nats.publish_handle()),
                Some(nats),
            )
        }
        "kafka-tracked" | "kafka-auto" | "kafka-transactional" => {
            let url = kafka::brokers();
            let client = Kafka::connect(&url).expect("Kafka client");
            let label = match transport {
                "kafka-auto" => "Kafka Commit::Auto",
                "kafka-transactional" => "Kafka Commit::Transactional",
                _ => "Kafka Commit::Tracked",
            };
            (
                label,
                url,
                Publisher::new(Arc::new(client.publisher())),
                None,
            )
        }
        "pulsar" => {
            let url = env("RUSTSTREAM_PULSAR_ADDR");
            let relay = ruststream_test_support::pulsar_relay::start(url.clone()).await;
            let pulsar = Pulsar::connect(&format!("pulsar://{relay}"))
                .await
                .unwrap_or_else(|e| panic!("the fault tests need pulsar-lite at {url}: {e}"));
            (
                "Pulsar Shared",
                url,
                Publisher::new(Arc::new(pulsar.publisher())),
                None,
            )
        }
        "rabbitmq-classic" | "rabbitmq-quorum" => {
            let url = env("RUSTSTREAM_RABBITMQ_URL");
            let rabbit = RabbitMq::connect(&url)
                .await
                .unwrap_or_else(|e| panic!("the fault tests need rabbitmq-server: {e}"));
            let label = if transport == "rabbitmq-quorum" {
                "RabbitMQ quorum queue"
            } else {
                "RabbitMQ classic queue"
            };
            let publisher = Publisher::new(rabbit.publish_handle());
            return Target {
                transport,
                label,
                url,
                publisher,
                nats: None,
                rabbit: Some(rabbit),
            };
        }
        "redis" => {
            let url = env("RUSTSTREAM_REDIS_URL");
            let redis = Redis::connect(&url)
                .await
                .unwrap_or_else(|e| panic!("the fault tests need redis-server: {e}"));
            (
                "Redis Streams",
                url,
                Publisher::new(redis.publish_handle()),
                None,
            )
        }
        other => panic!("no target {other}"),
    };
    Target {
        transport,
        label,
        url,
        publisher,
        nats,
        rabbit: None,
    }
}

impl Target {
    /// A fresh address (stream, topic, subject) and group.
    async fn address(&self) -> (String, String) {
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
                kafka::create_topics(&self.url, &[&topic]).await;
                topic
            }
        };
        (address, group)
    }

    /// Publishes `m-0` … `m-{n-1}` (keys spread over 8 values); returns the payloads the
    /// broker confirmed.
    async fn publish(&self, address: &str, n: usize) -> BTreeSet<String> {
        let mut published = BTreeSet::new();
        for i in 0..n {
            let payload = format!("m-{i}");
            let mut message = Outgoing::new(address, Bytes::from(payload.clone()));
            message.key = Some(Bytes::from(format!("k{}", i % 8)));
            self.publisher
                .publish(message)
                .await
                .unwrap_or_else(|e| panic!("publishing {payload} to {address}: {e}"));
            published.insert(payload);
        }
        published
    }

    fn service(&self, address: &str, group: &str, mode: &str) -> Service {
        Service::spawn(SERVICE, &[self.transport, &self.url, address, group, mode])
    }

    /// Core NATS keeps nothing for a subscriber that is not there yet.
    fn publish_after_start(&self) -> bool {
        self.transport == "core"
    }

    /// A fresh address and group, `n` messages published to it, and the service's first
    /// life in `mode`, ready (Core NATS: published once the service listens).
    async fn first_life(
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
    fn lossy(&self) -> bool {
        matches!(self.transport, "core" | "kafka-auto")
    }

    /// Starts the service's second life (acking everything) and lets it finish: until
    /// every published message is acked by one life or the other, or, where the spec
    /// documents a loss window, until a message published after the restart (`end`, read
    /// in order behind anything still to come) is acked. Returns its tally.
    async fn restart(
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

/// Kills the service after a quarter of the messages were handled (handlers work 50 ms
/// each in 4 lanes, so several are running), restarts it, and reports. Returns the lost
/// count.
async fn kill_while_handlers_run(transport: &'static str, why_lost: &str) -> usize {
    kill_while_running(transport, "slow", why_lost).await
}

/// [`kill_while_handlers_run`] for a batch registration (`max_batch(20)`, 4 lanes, 50 ms
/// per batch call): killed while batches run.
async fn kill_while_batches_run(transport: &'static str) -> usize {
    kill_while_running(transport, "batch", "").await
}

async fn kill_while_running(transport: &'static str, mode: &str, why_lost: &str) -> usize {
    let target = target(transport).await;
    let n = 200 * soak();
    let (address, group, published, mut first) = target.first_life(n, mode).await;
    first
        .until(Duration::from_secs(90), "a quarter handled", |t| {
            t.done.len() >= n / 4
        })
        .await;
    let first = first.kill().await;
    let running = first.started.len() - first.done.len();

    let second = target.restart(&address, &group, &published, &first).await;
    let report = Report {
        published,
        lives: vec![first, second],
    };
    report.print(
        target.label,
        &format!(
            "{n} messages{}, service SIGKILLed after {} acks with handlers running: {running}, restarted",
            if mode == "batch" { " to a batch handler" } else { "" },
            report.lives[0].done.len()
        ),
        why_lost,
    );
    report.lost()
}

/// Every message's first attempt asks `retry_after(3 s)`; the service is killed during
/// the wait and restarted. Returns the lost count.
async fn kill_during_retry_after(transport: &'static str, why_lost: &str) -> usize {
    let target = target(transport).await;
    let n = 10 * soak();
    let (address, group, published, mut first) = target.first_life(n, "hold").await;
    first
        .until(Duration::from_secs(90), "every message held", |t| {
            t.held.len() >= n
        })
        .await;
    // Let the settlements the holds make right away (a NAK with delay) reach the broker.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let first = first.kill().await;

    let second = target.restart(&address, &group, &published, &first).await;
    if target.transport == "jetstream" {
        // The server holds the wait (`-NAK` with a delay), so it outlives the process.
        assert_waited(&first.held, &second.done, HOLD);
    }
    let report = Report {
        published,
        lives: vec![first, second],
    };
    report.print(
        target.label,
        &format!(
            "{n} messages, service SIGKILLed while each waited in retry_after(3 s), restarted"
        ),
        why_lost,
    );
    report.lost()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n1_jetstream_sigkill_while_handlers_run_loses_nothing() {
    assert_eq!(kill_while_handlers_run("jetstream", "").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n1_jetstream_sigkill_during_retry_after_loses_nothing() {
    // The delay is held by the server (`-NAK` with a delay), not by the process.
    assert_eq!(kill_during_retry_after("jetstream", "").await, 0);
}

/// Core NATS is at-most-once (N2): what the killed process had received and not finished
/// is gone. Measured, not asserted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n2_core_sigkill_while_handlers_run_loss_is_measured() {
    kill_while_handlers_run("core", "at-most-once by design, N2").await;
}

/// N8: the copy waits in the process; a kill loses it. Measured, not asserted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n8_core_sigkill_during_retry_after_loss_is_measured() {
    kill_during_retry_after("core", "the copies waited in the killed process, N8").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k3_tracked_sigkill_while_handlers_run_loses_nothing() {
    assert_eq!(kill_while_handlers_run("kafka-tracked", "").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k7_d2_tracked_sigkill_during_retry_after_loses_nothing() {
    // The offset waits for the copy, so the records are read again after the restart.
    assert_eq!(kill_during_retry_after("kafka-tracked", "").await, 0);
}

/// K2: librdkafka stored the offsets when it handed the records over. Measured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k2_auto_sigkill_while_handlers_run_loss_is_measured() {
    kill_while_handlers_run(
        "kafka-auto",
        "offsets stored at hand-over and auto-committed, K2",
    )
    .await;
}

/// K7: under Auto the copy waits in the process and the offset has moved on. Measured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k7_auto_sigkill_during_retry_after_loss_is_measured() {
    kill_during_retry_after("kafka-auto", "the copies waited in the killed process, K7").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p1_pulsar_sigkill_while_handlers_run_loses_nothing() {
    assert_eq!(kill_while_handlers_run("pulsar", "").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p7_pulsar_sigkill_during_retry_after_loses_nothing() {
    // The held message was never acknowledged; the broker redelivers it once the
    // connection is gone.
    assert_eq!(kill_during_retry_after("pulsar", "").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k6_transactional_sigkill_while_handlers_run_loses_nothing() {
    // The killed window never committed its offsets: it is read again after the restart.
    assert_eq!(kill_while_handlers_run("kafka-transactional", "").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k7_d2_transactional_sigkill_during_retry_after_loses_nothing() {
    // A record waiting for its retry copy holds the window's position back.
    assert_eq!(kill_during_retry_after("kafka-transactional", "").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r2_rabbitmq_classic_sigkill_while_handlers_run_loses_nothing() {
    // Unacknowledged deliveries go back to the queue when the connection dies.
    assert_eq!(kill_while_handlers_run("rabbitmq-classic", "").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r4_rabbitmq_classic_sigkill_during_retry_after_loses_nothing() {
    // The original stays unacknowledged until its copy is confirmed (R4).
    assert_eq!(kill_during_retry_after("rabbitmq-classic", "").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r2_rabbitmq_quorum_sigkill_while_handlers_run_loses_nothing() {
    assert_eq!(kill_while_handlers_run("rabbitmq-quorum", "").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r4_rabbitmq_quorum_sigkill_during_retry_after_loses_nothing() {
    // Held unacknowledged in the killed process: the broker gives it back (R4).
    assert_eq!(kill_during_retry_after("rabbitmq-quorum", "").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s2_redis_sigkill_while_handlers_run_loses_nothing() {
    // What the killed life held is claimed by the next once idle for the claim timeout.
    assert_eq!(kill_while_handlers_run("redis", "").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s4_redis_sigkill_during_retry_after_loses_nothing() {
    // The waits were pending in Redis: the next life claims them.
    assert_eq!(kill_during_retry_after("redis", "").await, 0);
}

/// SIGKILL while batches run: every persisting broker brings back what the killed
/// process's batches held (K3, K6, N1, P1, R2, S2, one message at a time as alone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n1_jetstream_sigkill_while_batches_run_loses_nothing() {
    assert_eq!(kill_while_batches_run("jetstream").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k3_tracked_sigkill_while_batches_run_loses_nothing() {
    assert_eq!(kill_while_batches_run("kafka-tracked").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k6_transactional_sigkill_while_batches_run_loses_nothing() {
    assert_eq!(kill_while_batches_run("kafka-transactional").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p1_pulsar_sigkill_while_batches_run_loses_nothing() {
    assert_eq!(kill_while_batches_run("pulsar").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r2_rabbitmq_classic_sigkill_while_batches_run_loses_nothing() {
    assert_eq!(kill_while_batches_run("rabbitmq-classic").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r2_rabbitmq_quorum_sigkill_while_batches_run_loses_nothing() {
    assert_eq!(kill_while_batches_run("rabbitmq-quorum").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s2_redis_sigkill_while_batches_run_loses_nothing() {
    assert_eq!(kill_while_batches_run("redis").await, 0);
}
