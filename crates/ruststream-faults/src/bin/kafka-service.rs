//! A Kafka service for fault tests. Prints one line per handler call on stdout:
//! `handled <payload> attempt <n> offset <o>`.
//!
//! `kafka-service <brokers> <topic> <group> <mode>`, where mode is `hold` (every record
//! asks `retry_after(10 min)`, so a kill lands during the wait) or `ack`.

use std::io::Write;
use std::time::Duration;

use ruststream::{App, Delivery, HandlerOutcome, on};
use ruststream_kafka::{Commit, Kafka};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    let args: Vec<String> = std::env::args().collect();
    let [_, brokers, topic, group, mode] = args.as_slice() else {
        return Err("usage: kafka-service <brokers> <topic> <group> <hold|ack>".into());
    };
    let hold = mode == "hold";
    let handler = move |d: Delivery| async move {
        let line = format!(
            "handled {} attempt {} offset {}\n",
            String::from_utf8_lossy(d.payload()),
            d.attempt().number(),
            d.metadata().offset.unwrap_or(-1)
        );
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(line.as_bytes());
        let _ = out.flush();
        if hold {
            HandlerOutcome::retry_after(Duration::from_secs(600))
        } else {
            HandlerOutcome::ack()
        }
    };
    let kafka = Kafka::connect(brokers)?;
    App::new()
        .register(on(
            kafka
                .topic(topic)
                .group(group)
                .commit(Commit::Tracked)
                .set("auto.commit.interval.ms", "100")
                .set("session.timeout.ms", "6000")
                .set("heartbeat.interval.ms", "500"),
            handler,
        ))
        .run()
        .await?;
    Ok(())
}
