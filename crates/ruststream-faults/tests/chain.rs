//! Effectively once across a chain, against the real broker and a real PostgreSQL:
//! service A (inbox) → its table + the outbox → the relay → service B (inbox) → its
//! table. While the messages come, A, B and the relay are SIGKILLed at seeded random
//! points and PostgreSQL is restarted once; at the end every message's effect is applied
//! exactly once in both tables, no outbox row is lost or left unsent, and the duplicates
//! the inboxes skipped are counted.
//!
//! `CHAIN_MESSAGES` (default 2,000), `CHAIN_SEED` (default 7) and `CHAIN_WAIT_S` (how
//! long the end may take, default 120) change the run.
//!
//! Not on Pulsar: against pulsar-lite, after A's lives are SIGKILLed, some inputs (2 to
//! 26 of 2,000 in the runs so far, in short runs of consecutive messages) never reach A's
//! handler again. pulsar-lite's own log explains it (run of 2026-12-05 16:40, inputs 279
//! to 281): the killed life's connection closes ("Closing connection conn-20 with reason
//! client closed connection") but its consumer is never removed: no "Consumer … removed,
//! N messages queued for replay" line follows, as one does for every other consumer whose
//! connection closed in that run, and the three entries it held unacknowledged
//! (1672:278-280) are never acknowledged nor dispatched again. Real Pulsar hands a closed
//! consumer's unacknowledged messages to the others; the client cannot (its ack timeout
//! redelivers only what the same consumer received). So the Pulsar chain is left out
//! rather than passed.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ruststream::Outgoing;
use ruststream::core::MESSAGE_ID_HEADER;
use ruststream_faults::{OwnPostgres, Service, Target};
use ruststream_sql::sqlx::{self, PgPool};

const SERVICE: &str = env!("CARGO_BIN_EXE_chain-service");
const ROLES: [&str; 3] = ["a", "relay", "b"];

/// A small deterministic generator (xorshift64): the same seed kills at the same points.
struct Draw(u64);

impl Draw {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Chain {
    target: Target,
    postgres: String,
    input: String,
    middle: String,
    group: String,
}

impl Chain {
    fn spawn(&self, role: &str) -> Service {
        let group = format!("{}_{role}", self.group);
        let address_args = [
            role,
            self.target.transport,
            &self.target.url,
            &self.input,
            &self.middle,
            &group,
        ];
        Service::spawn_with(
            SERVICE,
            &address_args,
            &[("RUSTSTREAM_POSTGRES_URL", &self.postgres)],
        )
    }
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    // -1 while PostgreSQL restarts: asked again.
    sqlx::query_scalar::<_, i64>(sql)
        .fetch_one(pool)
        .await
        .unwrap_or(-1)
}

async fn effectively_once(transport: &'static str) {
    let messages = setting("CHAIN_MESSAGES", 2_000) as i64;
    let mut draw = Draw(setting("CHAIN_SEED", 7) | 1);
    let postgres = OwnPostgres::start();
    let pool = PgPool::connect(&postgres.url()).await.expect("PostgreSQL");
    ruststream_sql::migrate(&pool).await.expect("migrate");
    sqlx::raw_sql("CREATE TABLE chain_a (n bigint); CREATE TABLE chain_b (n bigint)")
        .execute(&pool)
        .await
        .expect("tables");
    let target = Target::new(SERVICE, transport).await;
    let (input, group) = target.address().await;
    let (middle, _) = target.address().await;
    let chain = Chain {
        target,
        postgres: postgres.url(),
        input,
        middle,
        group,
    };
    let mut lives: BTreeMap<&str, Service> = ROLES.iter().map(|r| (*r, chain.spawn(r))).collect();

    // The messages come while the chain is cut: published a slice at a time.
    let publisher = chain.target.publisher.clone();
    let input = chain.input.clone();
    let publishing = tokio::spawn(async move {
        for n in 1..=messages {
            let mut message = Outgoing::new(input.clone(), Bytes::from(n.to_string()));
            message.key = Some(Bytes::from(format!("k{}", n % 8)));
            message.headers.insert(MESSAGE_ID_HEADER, format!("in-{n}"));
            publisher
                .publish(message)
                .await
                .unwrap_or_else(|e| panic!("publishing {n}: {e}"));
            if n % 200 == 0 {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    });
    let mut skipped = 0;
    for round in 0..6 {
        tokio::time::sleep(Duration::from_millis(300 + draw.next() % 1_200)).await;
        let role = ROLES[(draw.next() % 3) as usize];
        let killed = lives.remove(role).expect("alive").kill().await;
        skipped += killed.skipped;
        eprintln!("round {round}: SIGKILLed {role}");
        if round == 2 {
            postgres.restart();
            eprintln!("round {round}: PostgreSQL restarted");
        }
        lives.insert(role, chain.spawn(role));
    }
    publishing.await.expect("every message published");

    let deadline = Instant::now() + Duration::from_secs(setting("CHAIN_WAIT_S", 120));
    loop {
        let b = count(&pool, "SELECT count(*) FROM chain_b").await;
        let unsent = count(
            &pool,
            "SELECT count(*) FROM ruststream_outbox WHERE sent_at IS NULL",
        )
        .await;
        if b >= messages && unsent == 0 {
            break;
        }
        if Instant::now() > deadline {
            let missing: Vec<i64> = sqlx::query_scalar(
                "SELECT n FROM chain_a EXCEPT SELECT n FROM chain_b ORDER BY 1 LIMIT 20",
            )
            .fetch_all(&pool)
            .await
            .unwrap_or_default();
            let never: Vec<(i64, bool)> = sqlx::query_as(
                "SELECT g, EXISTS (SELECT 1 FROM ruststream_inbox WHERE message_id = 'in-' || g) \
                 FROM generate_series(1, $1) g WHERE g NOT IN (SELECT n FROM chain_a) LIMIT 20",
            )
            .bind(messages)
            .fetch_all(&pool)
            .await
            .unwrap_or_default();
            panic!(
                "not done: chain_b {b} of {messages}, {unsent} unsent; in A not B: {missing:?}; \
                 never in A (number, id in A's inbox): {never:?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    for (_, life) in lives {
        skipped += life.kill().await.skipped;
    }
    let expected_sum = messages * (messages + 1) / 2;
    for table in ["chain_a", "chain_b"] {
        let (rows, distinct, sum): (i64, i64, i64) = sqlx::query_as(&format!(
            "SELECT count(*), count(DISTINCT n), coalesce(sum(n), 0)::bigint FROM {table}"
        ))
        .fetch_one(&pool)
        .await
        .expect("totals");
        assert_eq!(
            (rows, distinct, sum),
            (messages, messages, expected_sum),
            "{table}: each message once"
        );
    }
    let (rows, unsent): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE sent_at IS NULL) FROM ruststream_outbox",
    )
    .fetch_one(&pool)
    .await
    .expect("outbox");
    assert_eq!(
        (rows, unsent),
        (messages, 0),
        "one outbox row per message, all sent"
    );
    println!(
        "RELIABILITY|{}|inbox → outbox → relay → inbox chain (`ruststream-sql`), {messages} messages: A, B and the relay SIGKILLed 6 times, PostgreSQL restarted once|lost 0 of {messages}; every outbox row sent|applied twice: 0 in either table ({skipped} deliveries skipped by the inboxes as seen before)|none declared",
        chain.target.label
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_chain_applies_each_message_once_through_kills_and_a_database_restart() {
    effectively_once("jetstream").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_chain_applies_each_message_once_through_kills_and_a_database_restart() {
    effectively_once("kafka-tracked").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_chain_applies_each_message_once_through_kills_and_a_database_restart() {
    effectively_once("redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_chain_applies_each_message_once_through_kills_and_a_database_restart() {
    effectively_once("rabbitmq-classic").await;
}
