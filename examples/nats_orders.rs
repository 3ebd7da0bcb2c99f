//! An order service on NATS: JetStream for orders (the server counts attempts and holds
//! delayed retries; exhausted orders go to a dead-letter subject), Core NATS for price
//! requests (request/reply).
//!
//! Needs a nats-server with JetStream: `RUSTSTREAM_NATS_URL=nats://127.0.0.1:4222`,
//! plus credentials and TLS variables when the server asks (README, "Connecting securely"). Run it with `cargo run -p ruststream-nats --example nats_orders`.

use std::time::Duration;

use futures_util::StreamExt;

use ruststream::{App, HandlerOutcome, Message, Meta, Publisher, ReplyTo, State, on};
use ruststream_core::Env;
use ruststream_nats::async_nats::jetstream::{self, stream};
use ruststream_nats::{MessageId, Nats};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
struct Order {
    id: u64,
    in_stock: bool,
}

struct Log(mpsc::UnboundedSender<String>);

/// JetStream: ack in-stock orders; wait for stock twice, then give up (dead letter).
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
    let _ = log.0.send(format!(
        "order {} attempt {attempt} (server's count) -> {outcome}",
        order.id
    ));
    outcome
}

/// Core: answer price requests.
async fn on_price(
    Message(id): Message<u64>,
    reply: ReplyTo,
    publisher: Publisher,
) -> HandlerOutcome {
    match publisher.to(&*reply.0).send(&(id * 250)).await {
        Ok(()) => HandlerOutcome::ack(),
        Err(_) => HandlerOutcome::drop(),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Configuration from the environment (README, "Connecting securely"):
    // RUSTSTREAM_NATS_URL, and credentials and TLS files when the server asks for them.
    let nats = Nats::connect_from_env(&Env::new("RUSTSTREAM_NATS")).await?;
    let suffix = std::process::id();
    let (stream_name, orders, dead, prices) = (
        format!("EXAMPLE_ORDERS_{suffix}"),
        format!("example.{suffix}.orders"),
        format!("example.{suffix}.orders.dead"),
        format!("example.{suffix}.prices"),
    );
    let js = jetstream::new(nats.client().clone());
    js.create_stream(stream::Config {
        name: stream_name.clone(),
        subjects: vec![orders.clone()],
        ..Default::default()
    })
    .await?;
    let mut dead_letters = nats.client().subscribe(dead.clone()).await?;

    let (tx, mut log) = mpsc::unbounded_channel();
    let app = App::new()
        .info("nats-orders-example", env!("CARGO_PKG_VERSION"))
        .state(Log(tx))
        .register(
            on(
                nats.consumer(&stream_name, "billing")
                    .filter_subject(&orders),
                on_order,
            )
            .schema::<Order>()
            .max_attempts(3)
            .dead_letter(&dead),
        )
        .register(on(nats.subject(&prices).queue_group("pricing"), on_price));
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
    nats.client().flush().await?;

    // The same publishing shape on every transport; the JetStream message id (the
    // stream stores each id once) is a typed option.
    let publisher = Publisher::new(nats.publish_handle());
    for (id, in_stock) in [(1, true), (2, false)] {
        publisher
            .to(&orders)
            .with(MessageId(format!("order-{id}")))
            .send(&Order { id, in_stock })
            .await?;
    }
    // 1 ack + 3 attempts of the out-of-stock order.
    for _ in 0..4 {
        println!(
            "{}",
            tokio::time::timeout(Duration::from_secs(10), log.recv())
                .await?
                .ok_or("stopped")?
        );
    }
    let letter = tokio::time::timeout(Duration::from_secs(10), dead_letters.next())
        .await?
        .ok_or("no dead letter")?;
    println!(
        "dead letter on {}: {}",
        letter.subject,
        String::from_utf8_lossy(&letter.payload)
    );
    let price: u64 = nats
        .publisher()
        .request(&prices, &7u64, Duration::from_secs(2))
        .await?;
    println!("price of item 7: {price}");

    running.stop().await;
    js.delete_stream(&stream_name).await?;
    println!("stopped cleanly");
    Ok(())
}
