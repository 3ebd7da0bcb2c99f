//! The service the fault tests run as a separate process and kill.
//!
//! `fault-service <transport> <url> <address> <group> <mode>`
//!
//! - transport: `core` (subject `address`, queue group `group`), `jetstream` (durable
//!   consumer `group` on stream `address`, whose one subject is `address`),
//!   `kafka-tracked` / `kafka-auto` / `kafka-transactional` (topic `address`, group
//!   `group`; the exactly-once pipeline's id is `<group>-tx`, and each handler call that
//!   finishes its work produces `out-<payload>` through it to `<address>-out`: a
//!   consume-transform-produce service), `pulsar` (Shared
//!   subscription `group` on topic `address`; `url` is the broker's `host:port`, reached
//!   through the checksum relay), `rabbitmq-classic` / `rabbitmq-quorum` (queue `address`,
//!   declared by the test, of that kind; `group` unused), `redis` (stream `address`,
//!   consumer group `group`, a consumer name of this process's own, a claim timeout of
//!   2 s so a killed life's entries come back soon).
//! - mode: `ack` (ack at once), `slow` (work 50 ms, then ack), `hold` (the first attempt
//!   asks `retry_after(3 s)`, later ones ack), `hang` (never returns), `batch` (a batch
//!   registration, `max_batch(20)`: per batch one call that works 50 ms, then acks all).
//!
//! It runs until SIGINT or SIGTERM (`Running::until_signal`); `FAULT_SHUTDOWN_MS` and
//! `FAULT_CLOSE_MS` set the app's shutdown and close timeouts.
//!
//! Prints `ready` once its subscription is open, then per handler call
//! `start <payload> <attempt>` on entry and `done <payload> <attempt>` (acked) or
//! `held <payload> <attempt>` (retry_after asked) on return, one line each, on stdout.

use std::io::Write;
use std::time::Duration;

use ruststream::batch::Batch;
use ruststream::core::Descriptor;
use ruststream::{App, BatchOutcome, Codec, Delivery, HandlerOutcome, Publisher, on, on_batch};
use ruststream_faults::HOLD;
use ruststream_kafka::{Commit, EosPipeline, Kafka};
use ruststream_nats::Nats;
use ruststream_pulsar::pulsar::ConsumerOptions;
use ruststream_pulsar::pulsar::consumer::InitialPosition;
use ruststream_pulsar::{Pulsar, SubType};
use ruststream_rabbitmq::{QueueKind, RabbitMq};
use ruststream_redis::Redis;

#[derive(Clone, Copy)]
enum Mode {
    Ack,
    Slow,
    Hold,
    Hang,
    Batch,
}

/// The payload as text (the tests publish `m-<n>`, not JSON).
struct Text;

impl Codec for Text {
    const NAME: &'static str = "text";

    fn decode<T: serde::de::DeserializeOwned>(
        payload: &[u8],
    ) -> Result<T, Box<dyn std::error::Error + Send + Sync>> {
        let text = std::str::from_utf8(payload)?;
        T::deserialize(serde::de::value::StrDeserializer::<serde::de::value::Error>::new(text))
            .map_err(Into::into)
    }

    fn encode<T: serde::Serialize + ?Sized>(
        _: &T,
    ) -> Result<Vec<u8>, Box<dyn std::error::Error + Send + Sync>> {
        Err("the fault service does not publish".into())
    }
}

/// The `batch` mode's handler: one line per message on entry and after the work.
async fn handle_batch(batch: Batch<String, Text>) -> BatchOutcome {
    for item in &batch {
        say(&format!("start {} {}", item.value, item.attempt().number()));
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    for item in &batch {
        say(&format!("done {} {}", item.value, item.attempt().number()));
    }
    BatchOutcome::ack_all()
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

async fn handle(
    d: Delivery,
    publisher: Publisher,
    mode: Mode,
    output: Option<&str>,
) -> HandlerOutcome {
    let payload = String::from_utf8_lossy(d.payload()).into_owned();
    let attempt = d.attempt().number();
    say(&format!("start {payload} {attempt}"));
    match mode {
        Mode::Ack => {}
        Mode::Slow => tokio::time::sleep(Duration::from_millis(50)).await,
        Mode::Hold if attempt == 1 => {
            say(&format!("held {payload} {attempt}"));
            return HandlerOutcome::retry_after(HOLD);
        }
        Mode::Hold => {}
        Mode::Hang => std::future::pending::<()>().await,
        Mode::Batch => unreachable!("the batch mode registers a batch handler"),
    }
    if let Some(output) = output
        && let Err(e) = publisher
            .to(output)
            .send_bytes(format!("out-{payload}"))
            .await
    {
        eprintln!("producing the output of {payload} failed: {e}");
        return HandlerOutcome::retry();
    }
    say(&format!("done {payload} {attempt}"));
    HandlerOutcome::ack()
}

fn millis(variable: &str) -> Option<Duration> {
    std::env::var(variable)
        .ok()
        .and_then(|v| v.parse().ok())
        .map(Duration::from_millis)
}

/// Serves `descriptor` in `mode`; with an `output`, each handler call that finishes its
/// work produces to it before it acks.
async fn serve<D: Descriptor>(
    descriptor: D,
    mode: Mode,
    output: Option<String>,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut app = App::new();
    if let Some(timeout) = millis("FAULT_SHUTDOWN_MS") {
        app = app.shutdown_timeout(timeout);
    }
    if let Some(timeout) = millis("FAULT_CLOSE_MS") {
        app = app.close_timeout(timeout);
    }
    let app = if matches!(mode, Mode::Batch) {
        app.register(
            on_batch(descriptor, handle_batch)
                .name("fault-service")
                .lanes(4)
                .max_batch(20)
                .max_wait(Duration::from_millis(20)),
        )
    } else {
        app.register(
            on(descriptor, move |d: Delivery, publisher: Publisher| {
                let output = output.clone();
                async move { handle(d, publisher, mode, output.as_deref()).await }
            })
            .name("fault-service")
            .lanes(4),
        )
    };
    let running = app.start().await?;
    say("ready");
    running.until_signal().await;
    say("stopped");
    Ok(())
}

fn kafka_topic(
    url: &str,
    topic: &str,
    group: &str,
    commit: Commit,
) -> Result<ruststream_kafka::KafkaTopic<ruststream_kafka::Grouped>, Box<dyn std::error::Error>> {
    Ok(Kafka::connect(url)?
        .topic(topic)
        .group(group)
        .commit(commit)
        .set("auto.commit.interval.ms", "100")
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "500"))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    ruststream_faults::log_to_stderr();
    let args: Vec<String> = std::env::args().collect();
    let [_, transport, url, address, group, mode] = args.as_slice() else {
        return Err("usage: fault-service <transport> <url> <address> <group> <mode>".into());
    };
    let mode = match mode.as_str() {
        "ack" => Mode::Ack,
        "slow" => Mode::Slow,
        "hold" => Mode::Hold,
        "hang" => Mode::Hang,
        "batch" => Mode::Batch,
        other => {
            return Err(format!("unknown mode `{other}`: ack, slow, hold, hang or batch").into());
        }
    };
    match transport.as_str() {
        "core" => {
            let nats = Nats::connect(url).await?;
            serve(nats.subject(address).queue_group(group), mode, None).await
        }
        "jetstream" => {
            let nats = Nats::connect(url).await?;
            let consumer = nats
                .consumer(address, group)
                .filter_subject(address)
                // Deliveries the killed service held come back after this.
                .ack_wait(Duration::from_secs(5));
            serve(consumer, mode, None).await
        }
        "kafka-tracked" => serve(kafka_topic(url, address, group, Commit::Tracked)?, mode, None).await,
        "kafka-auto" => serve(kafka_topic(url, address, group, Commit::Auto)?, mode, None).await,
        "kafka-transactional" => {
            // The same transactional id in every life: a new life fences the killed one.
            let kafka = Kafka::connect(url)?;
            let pipeline = EosPipeline::new(&kafka, format!("{group}-tx"));
            let topic = kafka_topic(url, address, group, Commit::Transactional(pipeline))?;
            serve(topic, mode, Some(format!("{address}-out"))).await
        }
        "pulsar" => {
            let relay = ruststream_test_support::pulsar_relay::start(url.clone()).await;
            let pulsar = Pulsar::connect(&format!("pulsar://{relay}")).await?;
            let topic = pulsar
                .topic(address)
                .subscription(group)
                .subscription_type(SubType::Shared)
                .options(
                    ConsumerOptions::default().with_initial_position(InitialPosition::Earliest),
                );
            serve(topic, mode, None).await
        }
        "rabbitmq-classic" | "rabbitmq-quorum" => {
            // The test declared the queue, of this kind.
            let rabbit = RabbitMq::connect(url).await?;
            let kind = if transport == "rabbitmq-quorum" {
                QueueKind::Quorum
            } else {
                QueueKind::Classic
            };
            serve(rabbit.queue(address).kind(kind), mode, None).await
        }
        "redis" => {
            let redis = Redis::connect(url).await?;
            let stream = redis
                .stream(address.as_str(), group.as_str())
                .claim_timeout(Duration::from_secs(2));
            serve(stream, mode, None).await
        }
        other => Err(format!(
            "unknown transport `{other}`: core, jetstream, kafka-tracked, kafka-auto, kafka-transactional, pulsar, rabbitmq-classic, rabbitmq-quorum or redis"
        )
        .into()),
    }
}
