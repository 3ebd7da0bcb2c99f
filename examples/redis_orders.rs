//! An order service on Redis Streams: a stream of orders read by the consumer group
//! `billing` (Redis counts the attempts; `retry_after` leaves an order pending in Redis
//! and claims it again after the delay), and the orders that never come in stock moved
//! to a dead-letter stream after three attempts, atomically.
//!
//! Needs a Redis server: `RUSTSTREAM_REDIS_URL=redis://127.0.0.1:6379`.
//! Run it with `cargo run -p ruststream-redis --example redis_orders`.

use std::time::Duration;

use ruststream::{App, HandlerOutcome, Message, Meta, Publisher, State, on};
use ruststream_core::Env;
use ruststream_redis::Redis;
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
    let redis = Redis::connect_from_env(&Env::new("RUSTSTREAM_REDIS")).await?;
    let suffix = std::process::id();
    let (orders, dead) = (
        format!("example-orders-{suffix}"),
        format!("example-orders-dead-{suffix}"),
    );
    let (tx, mut log) = mpsc::unbounded_channel();
    let app = App::new()
        .info("redis-orders-example", env!("CARGO_PKG_VERSION"))
        .state(Log(tx))
        // Each registration creates its stream and group at start when missing.
        .register(on(redis.stream(&dead, "audit"), on_dead_letter).name("dead-letters"))
        .register(
            on(redis.stream(&orders, "billing"), on_order)
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

    let publisher = Publisher::new(redis.publish_handle());
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
