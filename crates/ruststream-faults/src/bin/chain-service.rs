//! One stage of an effectively-once chain, for the inbox/outbox fault tests:
//!
//! `chain-service <role> <transport> <url> <input> <middle> <group>` with
//! `RUSTSTREAM_POSTGRES_URL` naming the database.
//!
//! - `a`: reads `input` behind an inbox; in the same transaction adds the message's
//!   number to `chain_a` and writes it to the outbox for `middle` (keyed as it came).
//! - `relay`: publishes the outbox to the broker.
//! - `b`: reads `middle` behind an inbox; adds the number to `chain_b`.
//!
//! transport: `jetstream` (durable `group` on the stream capturing each subject; the test
//! makes one stream per subject), `kafka-tracked`, `redis`, `rabbitmq-classic`, `pulsar`
//! (through the checksum relay). Prints `done <n> <attempt>` per applied message and
//! `skipped <count>` (the inbox's duplicates so far) every 200 ms; runs until SIGTERM.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use ruststream::core::Descriptor;
use ruststream::{App, HandlerOutcome, Message, Meta, Publisher, on};
use ruststream_kafka::{Commit, Kafka};
use ruststream_nats::Nats;
use ruststream_pulsar::pulsar::ConsumerOptions;
use ruststream_pulsar::pulsar::consumer::InitialPosition;
use ruststream_pulsar::{Pulsar, SubType};
use ruststream_rabbitmq::RabbitMq;
use ruststream_redis::Redis;
use ruststream_sql::sqlx::{self, PgPool};
use ruststream_sql::{Inbox, Outbox, Relay, Tx, migrate};

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Stage A: its effect and the next stage's message, in one transaction.
async fn stage_a(
    Message(n): Message<i64>,
    meta: Meta,
    tx: Tx,
    middle: String,
) -> Result<HandlerOutcome, sqlx::Error> {
    let mut tx = tx.lock().await;
    sqlx::query("INSERT INTO chain_a (n) VALUES ($1)")
        .bind(n)
        .execute(&mut *tx)
        .await?;
    let key = meta.key.map(|k| k.to_vec()).unwrap_or_default();
    Outbox::to(middle).key(key).send(&mut tx, &n).await?;
    say(&format!("done {n} {}", meta.attempt.number()));
    Ok(HandlerOutcome::ack())
}

/// Stage B: its effect.
async fn stage_b(
    Message(n): Message<i64>,
    meta: Meta,
    tx: Tx,
) -> Result<HandlerOutcome, sqlx::Error> {
    sqlx::query("INSERT INTO chain_b (n) VALUES ($1)")
        .bind(n)
        .execute(&mut *tx.lock().await)
        .await?;
    say(&format!("done {n} {}", meta.attempt.number()));
    Ok(HandlerOutcome::ack())
}

async fn serve<D: Descriptor>(
    role: &str,
    descriptor: D,
    middle: String,
    pool: PgPool,
) -> Result<(), String> {
    let inbox = Inbox::new(pool.clone());
    let app = match role {
        "a" => App::new().register(
            on(descriptor, move |m: Message<i64>, meta: Meta, tx: Tx| {
                stage_a(m, meta, tx, middle.clone())
            })
            .name("chain-a")
            .lanes(4)
            .layer(inbox.clone()),
        ),
        _ => App::new().register(
            on(descriptor, stage_b)
                .name("chain-b")
                .lanes(4)
                .layer(inbox.clone()),
        ),
    };
    let running = app.start().await.map_err(|e| e.to_string())?;
    say("ready");
    let counting = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            say(&format!("skipped {} 0", inbox.skipped()));
        }
    });
    running.until_signal().await;
    counting.abort();
    Ok(())
}

async fn relay(publisher: Publisher, pool: PgPool) -> Result<(), String> {
    say("ready");
    let stop = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        term.recv().await;
    };
    Relay::new(pool, publisher)
        .poll_every(Duration::from_millis(200))
        .run(stop)
        .await
        .map_err(|e| e.to_string())
}

#[tokio::main]
async fn main() -> ExitCode {
    ruststream_faults::log_to_stderr();
    let args: Vec<String> = std::env::args().collect();
    let [_, role, transport, url, input, middle, group] = args.as_slice() else {
        eprintln!("usage: chain-service <a|b|relay> <transport> <url> <input> <middle> <group>");
        return ExitCode::from(2);
    };
    match run(role, transport, url, input, middle, group).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(
    role: &str,
    transport: &str,
    url: &str,
    input: &str,
    middle: &str,
    group: &str,
) -> Result<(), String> {
    let database = std::env::var("RUSTSTREAM_POSTGRES_URL").map_err(|e| e.to_string())?;
    let pool = PgPool::connect(&database)
        .await
        .map_err(|e| e.to_string())?;
    migrate(&pool).await.map_err(|e| e.to_string())?;
    let address = if role == "b" { middle } else { input };
    let middle = middle.to_owned();
    let e = |e: &dyn std::fmt::Display| e.to_string();
    match transport {
        "jetstream" => {
            let nats = Nats::connect(url).await.map_err(|x| e(&x))?;
            if role == "relay" {
                return relay(Publisher::new(nats.publish_handle()), pool).await;
            }
            let consumer = nats
                .consumer(address, group)
                .ack_wait(Duration::from_secs(5));
            serve(role, consumer, middle, pool).await
        }
        "kafka-tracked" => {
            let kafka = Kafka::connect(url).map_err(|x| e(&x))?;
            if role == "relay" {
                return relay(Publisher::new(kafka.publish_handle()), pool).await;
            }
            let topic = kafka
                .topic(address)
                .group(group)
                .commit(Commit::Tracked)
                .set("session.timeout.ms", "6000")
                .set("heartbeat.interval.ms", "500");
            serve(role, topic, middle, pool).await
        }
        "redis" => {
            let redis = Redis::connect(url).await.map_err(|x| e(&x))?;
            if role == "relay" {
                return relay(Publisher::new(redis.publish_handle()), pool).await;
            }
            let stream = redis
                .stream(address, group)
                .claim_timeout(Duration::from_secs(2));
            serve(role, stream, middle, pool).await
        }
        "rabbitmq-classic" => {
            let rabbit = RabbitMq::connect(url).await.map_err(|x| e(&x))?;
            if role == "relay" {
                return relay(Publisher::new(rabbit.publish_handle()), pool).await;
            }
            serve(role, rabbit.queue(address), middle, pool).await
        }
        "pulsar" => {
            let relayed = ruststream_test_support::pulsar_relay::start(url.to_owned()).await;
            let pulsar = Pulsar::connect(&format!("pulsar://{relayed}"))
                .await
                .map_err(|x| e(&x))?;
            if role == "relay" {
                return relay(
                    Publisher::new(std::sync::Arc::new(pulsar.publisher())),
                    pool,
                )
                .await;
            }
            let topic = pulsar
                .topic(address)
                .subscription(group)
                .subscription_type(SubType::Shared)
                // What a killed life held comes back after this (pulsar-lite does not
                // always hand a disconnected consumer's messages to another).
                .ack_timeout(Duration::from_secs(10))
                .options(
                    ConsumerOptions::default().with_initial_position(InitialPosition::Earliest),
                );
            serve(role, topic, middle, pool).await
        }
        other => Err(format!("unknown transport `{other}`")),
    }
}
