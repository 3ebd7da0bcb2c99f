//! An order service on Kafka with `Commit::Tracked`: paid orders are acked, unpaid ones
//! are retried with `retry_after` (copies with `x-ruststream-retry-count`) and reach the
//! dead-letter topic after `max_attempts`; a second registration reads the dead letters.
//!
//! Needs a Kafka-API broker: `RUSTSTREAM_KAFKA_BROKERS=127.0.0.1:9092`, plus
//! the SASL/TLS variables of the README's "Connecting securely" when the cluster asks.
//! Run it with `cargo run -p ruststream-kafka --example kafka_orders`.

use std::time::Duration;

use ruststream::{App, HandlerOutcome, Headers, Message, Meta, Publisher, State, on};
use ruststream_core::Env;
use ruststream_kafka::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use ruststream_kafka::rdkafka::client::DefaultClientContext;
use ruststream_kafka::{Commit, Kafka};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
struct Order {
    id: u64,
    paid: bool,
}

struct Log(mpsc::UnboundedSender<String>);

async fn on_order(
    Message(order): Message<Order>,
    meta: Meta,
    State(log): State<Log>,
) -> HandlerOutcome {
    let outcome = if order.paid {
        HandlerOutcome::ack()
    } else {
        HandlerOutcome::retry_after(Duration::from_millis(200))
    };
    let _ = log.0.send(format!(
        "order {} on partition {:?} offset {:?}, attempt {} -> {outcome}",
        order.id,
        meta.partition,
        meta.offset,
        meta.attempt.number()
    ));
    outcome
}

async fn on_dead_letter(
    Message(order): Message<Order>,
    headers: Headers,
    State(log): State<Log>,
) -> HandlerOutcome {
    let _ = log.0.send(format!(
        "dead letter: order {} (x-ruststream-retry-count {:?})",
        order.id,
        headers.get_str(ruststream::RETRY_COUNT_HEADER)
    ));
    HandlerOutcome::ack()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Configuration from the environment (README, "Connecting securely"):
    // RUSTSTREAM_KAFKA_BROKERS, and SASL/TLS settings when the cluster asks for them.
    let kafka = Kafka::from_env(&Env::new("RUSTSTREAM_KAFKA"))?;
    let suffix = std::process::id();
    let (orders, dead) = (
        format!("example-orders-{suffix}"),
        format!("example-orders-dead-{suffix}"),
    );
    let admin: AdminClient<DefaultClientContext> = kafka.client_config().create()?;
    for result in admin
        .create_topics(
            &[
                NewTopic::new(&orders, 2, TopicReplication::Fixed(1)),
                NewTopic::new(&dead, 1, TopicReplication::Fixed(1)),
            ],
            &AdminOptions::new(),
        )
        .await?
    {
        result.map_err(|(topic, e)| format!("creating {topic}: {e}"))?;
    }

    let subscription = |topic: &str, group: &str| {
        kafka
            .topic(topic)
            .group(group)
            .commit(Commit::Tracked)
            .set("session.timeout.ms", "6000")
            .set("heartbeat.interval.ms", "500")
    };
    let (tx, mut log) = mpsc::unbounded_channel();
    let app = App::new()
        .info("kafka-orders-example", env!("CARGO_PKG_VERSION"))
        .state(Log(tx))
        .register(
            on(subscription(&orders, "billing"), on_order)
                .schema::<Order>()
                .max_attempts(3)
                .dead_letter(&dead)
                .lanes(4),
        )
        .register(on(subscription(&dead, "dead-letters"), on_dead_letter));
    // With arguments (`-- asyncapi`, `-- check --connect`) the service's command line
    // answers instead of the demonstration (the test command validates each example's
    // AsyncAPI document this way).
    if std::env::args().len() > 1 {
        return match app.cli().await {
            code if code == std::process::ExitCode::SUCCESS => Ok(()),
            _ => Err("the command failed".into()),
        };
    }
    let running = app.start().await?;

    // The same publishing shape on every transport: to(..).key(..).send(&value).
    let publisher = Publisher::new(kafka.publish_handle());
    for (id, paid) in [(1, true), (2, false)] {
        publisher
            .to(&orders)
            .key(id.to_string())
            .send(&Order { id, paid })
            .await?;
    }
    // 1 ack + 3 attempts of the unpaid order + its dead letter.
    for _ in 0..5 {
        println!(
            "{}",
            tokio::time::timeout(Duration::from_secs(60), log.recv())
                .await?
                .ok_or("stopped")?
        );
    }
    running.stop().await;
    std::mem::forget(admin);
    println!("stopped cleanly");
    Ok(())
}
