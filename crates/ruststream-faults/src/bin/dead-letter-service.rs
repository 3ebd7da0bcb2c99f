//! A service whose handler fails until it is fixed, for the dead-letter tests; its
//! binary is its command line (`App::cli`), so the tests run `dead-letters list|replay`
//! on it as an operator would.
//!
//! `dead-letter-service <transport> <url> <source> <dead> <group> [command...]`
//!
//! - transport: `kafka-tracked`, `jetstream` (durable `group` on the stream capturing
//!   `source`), `rabbitmq-classic`, `redis`, `pulsar` (Shared subscription `group`,
//!   through the checksum relay the tests reach pulsar-lite by).
//! - The registration is named `orders`: `max_attempts(2)`, dead letter `dead`.
//! - `DL_BROKEN=1`: the handler answers `retry()` (so every message is dead-lettered
//!   after its second attempt); otherwise it acks. Either way it prints
//!   `done <payload> <attempt>` when it acks, `failed <payload> <attempt>` otherwise.
//! - `DL_SLOW_MS=n`: every publish waits n ms first (a broker slow to confirm), so a
//!   replay can be killed midway.

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use ruststream::core::{
    BoxFuture, Capabilities, Declaration, Described, Descriptor, LetterBox, Outgoing, Publish,
    PublishError,
};
use ruststream::{App, Delivery, HandlerOutcome, on};
use ruststream_kafka::{Commit, Kafka};
use ruststream_nats::Nats;
use ruststream_pulsar::pulsar::ConsumerOptions;
use ruststream_pulsar::pulsar::consumer::InitialPosition;
use ruststream_pulsar::{Pulsar, SubType};
use ruststream_rabbitmq::RabbitMq;
use ruststream_redis::Redis;

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

async fn handle(d: Delivery, broken: bool) -> HandlerOutcome {
    let payload = String::from_utf8_lossy(d.payload()).into_owned();
    let attempt = d.attempt().number();
    if broken {
        say(&format!("failed {payload} {attempt}"));
        HandlerOutcome::retry()
    } else {
        say(&format!("done {payload} {attempt}"));
        HandlerOutcome::ack()
    }
}

/// A descriptor whose publishes wait first: a broker slow to confirm.
#[derive(Clone)]
struct Slow<D> {
    inner: D,
    pause: Duration,
}

struct SlowPublish {
    inner: Arc<dyn Publish>,
    pause: Duration,
}

impl Publish for SlowPublish {
    fn publish(&self, message: Outgoing) -> BoxFuture<'_, Result<(), PublishError>> {
        Box::pin(async move {
            tokio::time::sleep(self.pause).await;
            self.inner.publish(message).await
        })
    }

    fn describe(&self) -> Described {
        self.inner.describe()
    }
}

impl<D: Descriptor> Descriptor for Slow<D> {
    type Subscription = D::Subscription;

    fn address(&self) -> &str {
        self.inner.address()
    }

    fn transport(&self) -> &'static str {
        self.inner.transport()
    }

    fn retry_address(&self) -> Option<&str> {
        self.inner.retry_address()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn check(&self, declaration: &Declaration) -> Vec<String> {
        self.inner.check(declaration)
    }

    fn reads(&self, address: &str) -> bool {
        self.inner.reads(address)
    }

    fn address_rule(&self, address: &str) -> Option<String> {
        self.inner.address_rule(address)
    }

    fn publisher(&self) -> Arc<dyn Publish> {
        let inner = self.inner.publisher();
        Arc::new(SlowPublish {
            inner,
            pause: self.pause,
        })
    }

    fn dead_letters(
        &self,
        address: &str,
    ) -> impl std::future::Future<Output = Result<Box<dyn LetterBox>, String>> + Send {
        self.inner.dead_letters(address)
    }

    async fn open(
        self,
        declaration: &Declaration,
    ) -> Result<D::Subscription, ruststream::core::SubscribeError> {
        self.inner.open(declaration).await
    }
}

async fn serve<D: Descriptor>(descriptor: D, dead: &str, command: Vec<String>) -> ExitCode {
    let broken = std::env::var("DL_BROKEN").is_ok();
    let pause = std::env::var("DL_SLOW_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(Duration::ZERO, Duration::from_millis);
    let app = App::new().register(
        on(
            Slow {
                inner: descriptor,
                pause,
            },
            move |d: Delivery| handle(d, broken),
        )
        .name("orders")
        .max_attempts(2)
        .dead_letter(dead),
    );
    app.cli_with(command).await
}

#[tokio::main]
async fn main() -> ExitCode {
    ruststream_faults::log_to_stderr();
    let args: Vec<String> = std::env::args().collect();
    let [program, transport, url, source, dead, group, rest @ ..] = args.as_slice() else {
        eprintln!(
            "usage: dead-letter-service <transport> <url> <source> <dead> <group> [command...]"
        );
        return ExitCode::from(2);
    };
    let command: Vec<String> = std::iter::once(program.clone())
        .chain(rest.iter().cloned())
        .collect();
    let fail = |e: String| {
        eprintln!("error: {e}");
        ExitCode::FAILURE
    };
    match transport.as_str() {
        "kafka-tracked" => match Kafka::connect(url) {
            Ok(kafka) => {
                let topic = kafka
                    .topic(source)
                    .group(group)
                    .commit(Commit::Tracked)
                    .set("session.timeout.ms", "6000")
                    .set("heartbeat.interval.ms", "500");
                serve(topic, dead, command).await
            }
            Err(e) => fail(e.to_string()),
        },
        "jetstream" => match Nats::connect(url).await {
            Ok(nats) => {
                serve(
                    nats.consumer(source, group).filter_subject(source),
                    dead,
                    command,
                )
                .await
            }
            Err(e) => fail(e.to_string()),
        },
        "rabbitmq-classic" => match RabbitMq::connect(url).await {
            Ok(rabbit) => serve(rabbit.queue(source), dead, command).await,
            Err(e) => fail(e.to_string()),
        },
        "redis" => match Redis::connect(url).await {
            Ok(redis) => serve(redis.stream(source.as_str(), group.as_str()), dead, command).await,
            Err(e) => fail(e.to_string()),
        },
        // Through the checksum relay, as every test reaches pulsar-lite.
        "pulsar" => match Pulsar::connect(&format!(
            "pulsar://{}",
            ruststream_test_support::pulsar_relay::start(url.clone()).await
        ))
        .await
        {
            Ok(pulsar) => {
                let topic = pulsar
                    .topic(source)
                    .subscription(group)
                    .subscription_type(SubType::Shared)
                    .options(
                        ConsumerOptions::default().with_initial_position(InitialPosition::Earliest),
                    );
                serve(topic, dead, command).await
            }
            Err(e) => fail(e.to_string()),
        },
        other => fail(format!("unknown transport `{other}`")),
    }
}
