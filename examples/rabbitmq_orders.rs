//! An order service on RabbitMQ: a quorum queue of orders (the broker counts attempts;
//! `retry_after` holds an order unacknowledged and gives it back after the delay), and
//! the orders that never come in stock moved to a dead-letter queue after three attempts.
//!
//! Needs a RabbitMQ broker: `RUSTSTREAM_RABBITMQ_URL=amqp://guest:guest@127.0.0.1:5672/%2f`.
//! Run it with `cargo run -p ruststream-rabbitmq --example rabbitmq_orders`.

use std::time::Duration;

use ruststream::{App, HandlerOutcome, Message, Meta, Publisher, State, on};
use ruststream_core::Env;
use ruststream_rabbitmq::{QueueKind, RabbitMq};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
struct Order {
    id: u64,
    in_stock: bool,
}

struct Log(mpsc::UnboundedSender<String>);

/// In-stock orders are done; the others wait for stock, twice, then give up.
async fn on_order(
    Message(order): Message<Order>,
    meta: Meta,
    State(log): State<Log>,
) -> HandlerOutcome {
    let attempt = meta.attempt.number();
    let outcome = if order.in_stock {
        HandlerOutcome::ack()
    } else {
        HandlerOutcome::retry_after(Duration::from_millis(200))
    };
    let _ = log
        .0
        .send(format!("order {} attempt {attempt} -> {outcome}", order.id));
    outcome
}

async fn on_dead_letter(Message(order): Message<Order>, State(log): State<Log>) -> HandlerOutcome {
    let _ = log.0.send(format!("dead letter: order {}", order.id));
    HandlerOutcome::ack()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Configuration from the environment (README, "Connecting securely").
    let rabbit = RabbitMq::connect_from_env(&Env::new("RUSTSTREAM_RABBITMQ")).await?;
    let suffix = std::process::id();
    let (orders, dead) = (
        format!("example-orders-{suffix}"),
        format!("example-orders-dead-{suffix}"),
    );
    let (tx, mut log) = mpsc::unbounded_channel();
    let app = App::new()
        .info("rabbitmq-orders-example", env!("CARGO_PKG_VERSION"))
        .state(Log(tx))
        // The dead-letter reader comes first: declaring its queue at start.
        .register(on(rabbit.queue(&dead).declare(true), on_dead_letter).name("dead-letters"))
        .register(
            on(
                rabbit.queue(&orders).kind(QueueKind::Quorum).declare(true),
                on_order,
            )
            .name("orders")
            .schema::<Order>()
            .max_attempts(3)
            .dead_letter(&dead),
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

    let publisher = Publisher::new(rabbit.publish_handle());
    for (id, in_stock) in [(1, true), (2, false)] {
        publisher.to(&orders).send(&Order { id, in_stock }).await?;
    }
    // 1 ack + 3 attempts of the out-of-stock order + its dead letter.
    for _ in 0..5 {
        let line = tokio::time::timeout(Duration::from_secs(10), log.recv())
            .await?
            .ok_or("stopped")?;
        println!("{line}");
    }
    running.stop().await;
    println!("stopped cleanly");
    Ok(())
}
