//! A service whose binary is its command line (`App::cli`), for the command-line tests:
//! one Kafka registration (Kafka connects lazily, so the commands that need no broker
//! work with the broker down) and one on the memory broker.
//!
//! Environment: `RUSTSTREAM_KAFKA_BROKERS` (required), `CLI_SERVICE_TOPIC` (default
//! `cli-orders`), `CLI_SERVICE_BROKEN=1` adds two registrations the app refuses.

use std::process::ExitCode;
use std::time::Duration;

use ruststream::memory::MemoryBroker;
use ruststream::{App, HandlerOutcome, Message, Meta, on};
use ruststream_kafka::{Commit, Kafka};

/// An order, as the document describes it.
#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Order {
    id: u64,
}

/// Prints `done <id> <attempt>` (the fault tests' tally reads it).
async fn take(Message(order): Message<Order>, meta: Meta) -> HandlerOutcome {
    println!("done {} {}", order.id, meta.attempt.number());
    HandlerOutcome::ack()
}

#[tokio::main]
async fn main() -> ExitCode {
    let brokers = std::env::var("RUSTSTREAM_KAFKA_BROKERS").unwrap_or_default();
    let topic = std::env::var("CLI_SERVICE_TOPIC").unwrap_or_else(|_| "cli-orders".to_owned());
    let kafka = match Kafka::connect(&brokers) {
        Ok(kafka) => kafka.connect_timeout(Duration::from_secs(3)),
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::FAILURE;
        }
    };
    let memory = MemoryBroker::new();
    let mut app = App::new()
        .info("cli-service", "1.0.0")
        .register(
            on(
                kafka.topic(&topic).group("cli").commit(Commit::Tracked),
                take,
            )
            .name("take-order")
            .schema::<Order>()
            .max_attempts(3)
            .dead_letter(format!("{topic}.dead")),
        )
        .register(on(memory.topic("audit"), take).name("audit"));
    if std::env::var("CLI_SERVICE_BROKEN").is_ok() {
        app = app
            .register(on(memory.topic("no-lanes"), take).name("no-lanes").lanes(0))
            .register(
                on(memory.topic("loop"), take)
                    .name("own-dead-letter")
                    .max_attempts(2)
                    .dead_letter("loop"),
            );
    }
    app.cli().await
}
