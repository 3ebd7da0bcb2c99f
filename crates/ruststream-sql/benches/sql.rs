//! What the inbox and the outbox cost, next to hand-written loops doing the same database
//! work, against the real PostgreSQL the test command starts (a database of its own), on
//! the memory broker so the database is what is measured:
//!
//! - inbox: per message, a handler inserting one row in its transaction behind an
//!   `Inbox`, against a loop of `BEGIN; INSERT` into the inbox table `; INSERT; COMMIT`;
//! - outbox: rows written (one transaction each) and published by a `Relay`, against a
//!   loop of `BEGIN; INSERT; COMMIT;` then publish and wait for the confirmation.
//!
//! `cargo bench -p ruststream-sql --bench sql` (`SQL_MESSAGES`, default 2,000;
//! `SQL_ROUNDS`, default 3). Prints wall-clock rates and this process's CPU per message
//! (the database's own CPU is not counted), medians of the rounds, and the load average.

use std::time::{Duration, Instant};

use ruststream::memory::MemoryBroker;
use ruststream::{App, HandlerOutcome, Message, on};
use ruststream_sql::sqlx::postgres::PgPoolOptions;
use ruststream_sql::sqlx::{self, PgPool};
use ruststream_sql::{Inbox, Outbox, Relay, Tx, migrate};
use ruststream_test_support::bench::{env_count, load_average, process_cpu_ns};

/// Wall time and this process's CPU for `n` messages.
struct Cost {
    wall: Duration,
    cpu_ns: u64,
}

impl Cost {
    fn rate(&self, n: usize) -> f64 {
        n as f64 / self.wall.as_secs_f64()
    }
}

async fn measured<F: Future<Output = ()>>(work: F) -> Cost {
    let (start, cpu) = (Instant::now(), process_cpu_ns("self"));
    work.await;
    Cost {
        wall: start.elapsed(),
        cpu_ns: process_cpu_ns("self") - cpu,
    }
}

async fn database() -> PgPool {
    let server = std::env::var("RUSTSTREAM_POSTGRES_URL").expect(
        "RUSTSTREAM_POSTGRES_URL: run through scripts/test's brokers (scripts/brokers/postgres.sh)",
    );
    let admin = PgPool::connect(&server).await.expect("PostgreSQL");
    let name = format!("bench_{}", std::process::id());
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&admin)
        .await
        .expect("database");
    let base = server.rsplit_once('/').map_or(server.as_str(), |(b, _)| b);
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .connect(&format!("{base}/{name}"))
        .await
        .expect("the bench database");
    migrate(&pool).await.expect("migrate");
    sqlx::raw_sql("CREATE TABLE effect (n bigint)")
        .execute(&pool)
        .await
        .expect("table");
    pool
}

async fn raw_inbox(pool: &PgPool, round: usize, n: usize) {
    for i in 0..n {
        let mut tx = pool.begin().await.expect("begin");
        sqlx::query("INSERT INTO ruststream_inbox (registration, message_id) VALUES ('raw', $1) ON CONFLICT DO NOTHING")
            .bind(format!("{round}-{i}"))
            .execute(&mut *tx)
            .await
            .expect("inbox row");
        sqlx::query("INSERT INTO effect VALUES ($1)")
            .bind(i as i64)
            .execute(&mut *tx)
            .await
            .expect("effect");
        tx.commit().await.expect("commit");
    }
}

async fn framework_inbox(pool: &PgPool, round: usize, n: usize) {
    let broker = MemoryBroker::new();
    let topic = format!("inbox-{round}");
    let handler = |Message(i): Message<i64>, tx: Tx| async move {
        sqlx::query("INSERT INTO effect VALUES ($1)")
            .bind(i)
            .execute(&mut *tx.lock().await)
            .await?;
        Ok::<_, sqlx::Error>(HandlerOutcome::ack())
    };
    let running = App::new()
        .register(
            on(broker.topic(&topic), handler)
                .name(&topic)
                .lanes(1)
                .layer(Inbox::new(pool.clone())),
        )
        .start()
        .await
        .expect("start");
    let publisher = broker.publisher();
    for i in 0..n {
        publisher
            .to(&topic)
            .send(&(i as i64))
            .await
            .expect("published");
    }
    while !broker.is_idle() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    running.stop().await;
}

async fn raw_outbox(pool: &PgPool, round: usize, n: usize) {
    let broker = MemoryBroker::new();
    let publisher = broker.publisher();
    let address = format!("raw-out-{round}");
    for i in 0..n {
        let mut tx = pool.begin().await.expect("begin");
        sqlx::query("INSERT INTO effect VALUES ($1)")
            .bind(i as i64)
            .execute(&mut *tx)
            .await
            .expect("effect");
        tx.commit().await.expect("commit");
        publisher.to(&address).send(&i).await.expect("published");
    }
}

/// The rows are written first (untimed: the writer's own transactions), then the relay
/// is timed until every one is confirmed and marked.
async fn relayed(pool: &PgPool, round: usize, n: usize) -> Cost {
    let address = format!("relayed-{round}");
    for i in 0..n {
        let mut tx = pool.begin().await.expect("begin");
        Outbox::to(&address)
            .key(format!("k{}", i % 16))
            .send(&mut tx, &i)
            .await
            .expect("row");
        tx.commit().await.expect("commit");
    }
    let broker = MemoryBroker::new();
    let relay = Relay::new(pool.clone(), broker.publisher()).poll_every(Duration::from_millis(10));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    measured(async {
        let running = tokio::spawn(relay.run(async {
            let _ = stopped.await;
        }));
        loop {
            let (unsent, _) = Outbox::lag(pool).await.expect("lag");
            if unsent == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let _ = stop.send(());
        running.await.expect("relay").expect("relay ran");
    })
    .await
}

fn median(mut costs: Vec<Cost>, n: usize) -> (f64, f64) {
    costs.sort_by_key(|c| c.wall);
    let middle = &costs[costs.len() / 2];
    (middle.rate(n), middle.cpu_ns as f64 / n as f64)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let (n, rounds) = (env_count("SQL_MESSAGES", 2_000), env_count("SQL_ROUNDS", 3));
    let pool = database().await;
    let (mut inbox_raw, mut inbox_ours, mut out_raw, mut out_ours) =
        (vec![], vec![], vec![], vec![]);
    for round in 0..rounds {
        inbox_raw.push(measured(raw_inbox(&pool, round, n)).await);
        inbox_ours.push(measured(framework_inbox(&pool, round, n)).await);
        out_raw.push(measured(raw_outbox(&pool, round, n)).await);
        out_ours.push(relayed(&pool, round, n).await);
    }
    println!(
        "{n} messages, median of {rounds} rounds, load average {}",
        load_average()
    );
    println!("| what | messages/s | this process's CPU µs/message |");
    println!("|---|---|---|");
    for (what, costs) in [
        (
            "inbox, hand-written loop (BEGIN; INSERT inbox; INSERT; COMMIT)",
            inbox_raw,
        ),
        (
            "inbox, `Inbox` layer on the memory broker (1 lane)",
            inbox_ours,
        ),
        (
            "outbox, hand-written loop (BEGIN; INSERT; COMMIT; publish, confirmed)",
            out_raw,
        ),
        (
            "outbox, `Relay` publishing committed rows (confirmed, marked sent)",
            out_ours,
        ),
    ] {
        let (rate, cpu) = median(costs, n);
        println!("| {what} | {rate:.0} | {:.1} |", cpu / 1_000.0);
    }
}
