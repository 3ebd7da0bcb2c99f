//! An order service on Pulsar: a Shared subscription whose `max_attempts` and dead letter
//! become the client's dead-letter policy, a `retry_after` held in the service, and a
//! second subscription reading the dead letters (with `REAL_TOPIC` and
//! `ORIGIN_MESSAGE_ID`).
//!
//! Needs a Pulsar broker: `RUSTSTREAM_PULSAR_URL=pulsar://127.0.0.1:6650`, plus
//! `RUSTSTREAM_PULSAR_TOKEN`/`_CA` when the cluster asks (README, "Connecting securely").
//! pulsar-lite, which the tests use, sends message frames the Rust client cannot decode
//! without the tests' relay (see `crates/ruststream-test-support/src/pulsar_relay.rs`), so
//! the test command compiles this example but does not run it.
//! Run it with `cargo run -p ruststream-pulsar --example pulsar_orders`.

use std::time::Duration;

use ruststream::{App, HandlerOutcome, Headers, Message, Meta, Publisher, State, on};
use ruststream_core::Env;
use ruststream_pulsar::{Pulsar, SubType};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
struct Order {
    id: u64,
    in_stock: bool,
}

struct Log(mpsc::UnboundedSender<String>);

async fn on_order(
    Message(order): Message<Order>,
    meta: Meta,
    State(log): State<Log>,
) -> HandlerOutcome {
    let outcome = match (order.in_stock, meta.attempt.number()) {
        (true, _) => HandlerOutcome::ack(),
        (false, 1) => HandlerOutcome::retry_after(Duration::from_millis(300)),
        (false, _) => HandlerOutcome::retry(),
    };
    let _ = log.0.send(format!(
        "order {} attempt {} -> {outcome}",
        order.id,
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
        "dead letter: order {} from {:?}",
        order.id,
        headers.get_str("REAL_TOPIC")
    ));
    HandlerOutcome::ack()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Configuration from the environment (README, "Connecting securely"):
    // RUSTSTREAM_PULSAR_URL, and RUSTSTREAM_PULSAR_TOKEN / _CA when the cluster asks.
    let pulsar = Pulsar::connect_from_env(&Env::new("RUSTSTREAM_PULSAR")).await?;
    let suffix = std::process::id();
    let orders = format!("persistent://public/default/orders-{suffix}");
    let dead = format!("persistent://public/default/orders-dead-{suffix}");
    let (tx, mut log) = mpsc::unbounded_channel();
    let app = App::new()
        .info("pulsar-orders-example", env!("CARGO_PKG_VERSION"))
        .state(Log(tx))
        .register(
            on(
                pulsar
                    .topic(&orders)
                    .subscription("billing")
                    .subscription_type(SubType::Shared)
                    .ack_timeout(Duration::from_secs(30))
                    .longest_delay(Duration::from_millis(300)),
                on_order,
            )
            .schema::<Order>()
            .max_attempts(3)
            .dead_letter(&dead),
        )
        .register(on(
            pulsar.topic(&dead).subscription("dead-letters"),
            on_dead_letter,
        ));
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
    // The same publishing shape on every transport (headers are the message's properties).
    let publisher = Publisher::new(pulsar.publish_handle());
    for (id, in_stock) in [(1, true), (2, false)] {
        publisher
            .to(&orders)
            .key(id.to_string())
            .send(&Order { id, in_stock })
            .await?;
    }
    // 1 ack + 3 attempts + the dead letter.
    for _ in 0..5 {
        println!(
            "{}",
            tokio::time::timeout(Duration::from_secs(30), log.recv())
                .await
                .map_err(|_| {
                    "nothing handled within 30 s: is the broker reachable, and is it a real \
                     Pulsar? (pulsar-lite needs the tests' relay: see this file's header)"
                })?
                .ok_or("stopped")?
        );
    }
    running.stop().await;
    println!("stopped cleanly");
    Ok(())
}
