//! Consume, transform, produce, exactly once: orders in, invoices out, through an
//! `EosPipeline`. Each window's invoices and the orders' offsets commit in one Kafka
//! transaction; a `read_committed` consumer sees both or neither.
//!
//! Needs a Kafka-API broker: `RUSTSTREAM_KAFKA_BROKERS=127.0.0.1:9092`, plus
//! the SASL/TLS variables of the README's "Connecting securely" when the cluster asks.
//! Run it with `cargo run -p ruststream-kafka --example kafka_eos`.

use std::time::Duration;

use ruststream::{App, HandlerOutcome, Headers, Message, Publisher, on};
use ruststream_core::Env;
use ruststream_kafka::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use ruststream_kafka::rdkafka::client::DefaultClientContext;
use ruststream_kafka::{Commit, EosPipeline, Kafka};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
struct Order {
    id: u64,
    cents: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct Invoice {
    order: u64,
    total_cents: u64,
}

/// Publishes through the pipeline (the registration's publisher), then acks: the invoice
/// and the order's offset commit together. An order that cannot be invoiced aborts the
/// window with `retry()`, and the window is read again.
async fn invoice(Message(order): Message<Order>, publisher: Publisher) -> HandlerOutcome {
    let invoice = Invoice {
        order: order.id,
        total_cents: order.cents + order.cents / 5,
    };
    let invoices = INVOICES.get().map(String::as_str).unwrap_or("invoices");
    match publisher
        .to(invoices)
        .key(order.id.to_string())
        .send(&invoice)
        .await
    {
        Ok(()) => HandlerOutcome::ack(),
        Err(_) => HandlerOutcome::retry(),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Configuration from the environment (README, "Connecting securely"):
    // RUSTSTREAM_KAFKA_BROKERS, and SASL/TLS settings when the cluster asks for them.
    let kafka = Kafka::from_env(&Env::new("RUSTSTREAM_KAFKA"))?;
    let suffix = std::process::id();
    let (orders, invoices) = (
        format!("eos-orders-{suffix}"),
        format!("eos-invoices-{suffix}"),
    );
    INVOICES.set(invoices.clone()).ok();
    let admin: AdminClient<DefaultClientContext> = kafka.client_config().create()?;
    for result in admin
        .create_topics(
            &[
                NewTopic::new(&orders, 1, TopicReplication::Fixed(1)),
                NewTopic::new(&invoices, 1, TopicReplication::Fixed(1)),
            ],
            &AdminOptions::new(),
        )
        .await?
    {
        result.map_err(|(topic, e)| format!("creating {topic}: {e}"))?;
    }

    let pipeline = EosPipeline::new(&kafka, format!("invoicing-{suffix}"))
        .commit_interval(Duration::from_millis(100));
    let mut reports = pipeline.reports();
    let group = format!("invoicing-{suffix}");
    let app = App::new()
        .info("kafka-eos-example", env!("CARGO_PKG_VERSION"))
        .register(
            on(
                kafka
                    .topic(&orders)
                    .group(&group)
                    .commit(Commit::Transactional(pipeline.clone()))
                    .set("session.timeout.ms", "6000")
                    .set("heartbeat.interval.ms", "500"),
                invoice,
            )
            .schema::<Order>(),
        );
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
    for id in 1..=5 {
        let order = serde_json::to_vec(&Order {
            id,
            cents: id * 1000,
        })?;
        kafka
            .publisher()
            .send(&orders, None, &Headers::new(), &order, None)
            .await?;
    }
    // Wait for a committed window that covers all five orders.
    loop {
        tokio::time::timeout(Duration::from_secs(60), reports.changed()).await??;
        let Some(report) = reports.borrow_and_update().clone() else {
            continue;
        };
        println!(
            "window {}: {} with {} invoice(s), offsets {:?}",
            report.number,
            if report.committed {
                "committed"
            } else {
                "aborted"
            },
            report.records,
            report.offsets
        );
        if report.committed && report.offsets.iter().any(|(_, _, next)| *next == 5) {
            break;
        }
    }
    running.stop().await;
    std::mem::forget(admin);
    println!("stopped cleanly");
    Ok(())
}

/// Where invoices go (a demo shortcut; a service would take it as `State`).
static INVOICES: std::sync::OnceLock<String> = std::sync::OnceLock::new();
