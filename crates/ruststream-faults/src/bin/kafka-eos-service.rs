//! A consume-transform-produce service on `Commit::Transactional`, for fault tests.
//! Prints `handled <payload>` per handler call; produces `out-<payload>` to the output.
//!
//! `kafka-eos-service <brokers> <input> <output> <group> <transactional id> <commit interval ms>`

use std::io::Write;
use std::time::Duration;

use ruststream::{App, Delivery, HandlerOutcome, Publisher, on};
use ruststream_kafka::{Commit, EosPipeline, Kafka};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    ruststream_faults::log_to_stderr();
    let args: Vec<String> = std::env::args().collect();
    let [_, brokers, input, output, group, id, interval] = args.as_slice() else {
        return Err(
            "usage: kafka-eos-service <brokers> <input> <output> <group> <id> <interval ms>".into(),
        );
    };
    let output = output.clone();
    let handler = move |d: Delivery, publisher: Publisher| {
        let output = output.clone();
        async move {
            let payload = String::from_utf8_lossy(d.payload()).into_owned();
            let result = publisher
                .to(&output)
                .send_bytes(format!("out-{payload}"))
                .await;
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "handled {payload}");
            let _ = out.flush();
            match result {
                Ok(()) => HandlerOutcome::ack(),
                Err(_) => HandlerOutcome::retry(),
            }
        }
    };
    let kafka = Kafka::connect(brokers)?;
    let pipeline =
        EosPipeline::new(&kafka, id).commit_interval(Duration::from_millis(interval.parse()?));
    App::new()
        .register(on(
            kafka
                .topic(input)
                .group(group)
                .commit(Commit::Transactional(pipeline))
                .set("session.timeout.ms", "6000")
                .set("heartbeat.interval.ms", "500"),
            handler,
        ))
        .run()
        .await?;
    Ok(())
}
