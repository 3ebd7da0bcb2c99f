//! Quick start: one app on the in-memory broker (no server) showing an `ack`, a
//! `retry_after` and a message that reaches its dead letter after `max_attempts`.
//!
//! Run it with `cargo run --example quickstart`.

use std::time::Duration;

use ruststream::memory::MemoryBroker;
use ruststream::{App, HandlerOutcome, Headers, Message, Meta, State, on};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
struct Order {
    id: u32,
    status: String,
}

/// Where handlers report what they did, so `main` knows when the story is over.
struct Steps(mpsc::UnboundedSender<String>);

async fn on_order(
    Message(order): Message<Order>,
    meta: Meta,
    State(steps): State<Steps>,
) -> HandlerOutcome {
    let attempt = meta.attempt.number();
    let outcome = match order.status.as_str() {
        "paid" => HandlerOutcome::ack(),
        "pending" if attempt == 1 => HandlerOutcome::retry_after(Duration::from_millis(300)),
        "pending" => HandlerOutcome::ack(),
        _ => HandlerOutcome::retry(),
    };
    let _ = steps.0.send(format!(
        "order {} ({}) attempt {attempt} -> {outcome}",
        order.id, order.status
    ));
    outcome
}

async fn on_dead_letter(
    Message(order): Message<Order>,
    headers: Headers,
    State(steps): State<Steps>,
) -> HandlerOutcome {
    let _ = steps.0.send(format!(
        "dead letter: order {} ({}) arrived unchanged, header source={:?}",
        order.id,
        order.status,
        headers.get_str("source").unwrap_or("-")
    ));
    HandlerOutcome::ack()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let broker = MemoryBroker::new();
    let (tx, mut steps) = mpsc::unbounded_channel();
    let app = App::new()
        .info("quickstart", env!("CARGO_PKG_VERSION"))
        .state(Steps(tx))
        .register(
            on(broker.topic("orders"), on_order)
                .name("orders")
                .schema::<Order>()
                .max_attempts(3)
                .dead_letter("orders.dead"),
        )
        .register(on(broker.topic("orders.dead"), on_dead_letter).name("dead-letters"));

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

    let publisher = broker.publisher();
    for (id, status) in [(1, "paid"), (2, "pending"), (3, "broken")] {
        publisher
            .to("orders")
            .key(id.to_string())
            .header("source", "quickstart")
            .send(&Order {
                id,
                status: status.to_owned(),
            })
            .await?;
        println!("published order {id} ({status})");
    }

    // 1 ack + 2 for pending + 3 attempts for broken + 1 dead letter.
    for _ in 0..7 {
        let step = tokio::time::timeout(Duration::from_secs(10), steps.recv())
            .await?
            .ok_or("the app stopped early")?;
        println!("{step}");
    }
    running.stop().await;
    println!("stopped cleanly");
    Ok(())
}
