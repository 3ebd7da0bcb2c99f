//! The inbox on real brokers, by the broker's own identity of a message: every record a
//! second reader gets again (a new Kafka group, a new JetStream durable: what a crash or
//! a rebalance would redeliver) is skipped, its effect applied once; on a broker that
//! gives a message no identity (Redis), a message without `x-ruststream-id` is refused
//! and dead-lettered, saying why.

mod common;

use common::{pool, unique};
use std::time::{Duration, Instant};

use ruststream::core::Env;
use ruststream::{App, HandlerOutcome, Message, Publisher, on};
use ruststream_kafka::{Commit, Kafka};
use ruststream_nats::Nats;
use ruststream_nats::async_nats::jetstream::{self, stream};
use ruststream_redis::Redis;
use ruststream_sql::{Inbox, Tx};
use sqlx::PgPool;

/// A ledger table of its own, and a handler adding each amount to it in the inbox's
/// transaction.
async fn ledger(
    pool: &PgPool,
    name: &str,
) -> (
    String,
    impl Fn(
        Message<i64>,
        Tx,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<HandlerOutcome, sqlx::Error>> + Send>>
    + Clone
    + Send
    + Sync
    + 'static,
) {
    let table = format!("ledger_{}", name.replace('-', "_"));
    sqlx::raw_sql(&format!(
        "DROP TABLE IF EXISTS {table}; CREATE TABLE {table} (amount bigint)"
    ))
    .execute(pool)
    .await
    .expect("ledger");
    let write = table.clone();
    let handler = move |Message(amount): Message<i64>, tx: Tx| {
        let write = write.clone();
        Box::pin(async move {
            sqlx::query(&format!("INSERT INTO {write} VALUES ($1)"))
                .bind(amount)
                .execute(&mut *tx.lock().await)
                .await?;
            Ok(HandlerOutcome::ack())
        }) as std::pin::Pin<Box<dyn Future<Output = _> + Send>>
    };
    (table, handler)
}

async fn sum(pool: &PgPool, table: &str) -> (i64, i64) {
    sqlx::query_as(&format!(
        "SELECT count(*), coalesce(sum(amount), 0)::bigint FROM {table}"
    ))
    .fetch_one(pool)
    .await
    .expect("sum")
}

async fn until(limit: Duration, what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check().await {
        assert!(Instant::now() < deadline, "not within {limit:?}: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn publish(publisher: &Publisher, address: &str, n: i64) {
    for amount in 1..=n {
        publisher
            .to(address)
            .key(format!("k{}", amount % 3))
            .send(&amount)
            .await
            .expect("published");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_records_read_again_by_another_group_are_skipped() {
    let pool = pool().await;
    let kafka = Kafka::from_env(&Env::new("RUSTSTREAM_KAFKA")).expect("Kafka");
    let topic = unique("inbox");
    let (table, handler) = ledger(&pool, &topic).await;
    publish(&Publisher::new(kafka.publish_handle()), &topic, 10).await;
    let inbox = Inbox::new(pool.clone());
    for (group, expected_skips) in [("first", 0), ("second", 10)] {
        let running = App::new()
            .register(
                on(
                    kafka
                        .topic(&topic)
                        .group(format!("{topic}-{group}"))
                        .commit(Commit::Tracked),
                    handler.clone(),
                )
                .name(&topic)
                .layer(inbox.clone()),
            )
            .start()
            .await
            .expect("start");
        until(Duration::from_secs(60), "every record seen", async || {
            sum(&pool, &table).await.0 == 10 && inbox.skipped() >= expected_skips
        })
        .await;
        running.stop().await;
    }
    assert_eq!(
        sum(&pool, &table).await,
        (10, 55),
        "each record applied once"
    );
    assert_eq!(inbox.skipped(), 10, "the second group's ten skipped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_messages_read_again_by_another_durable_are_skipped() {
    let pool = pool().await;
    let url = std::env::var("RUSTSTREAM_NATS_URL").expect("RUSTSTREAM_NATS_URL");
    let nats = Nats::connect(&url).await.expect("NATS");
    let name = unique("INBOX").replace('-', "_");
    jetstream::new(nats.client().clone())
        .create_stream(stream::Config {
            name: name.clone(),
            subjects: vec![name.clone()],
            ..Default::default()
        })
        .await
        .expect("stream");
    let (table, handler) = ledger(&pool, &name.to_lowercase()).await;
    publish(&Publisher::new(nats.publish_handle()), &name, 10).await;
    let inbox = Inbox::new(pool.clone());
    for (durable, expected_skips) in [("first", 0), ("second", 10)] {
        let running = App::new()
            .register(
                on(nats.consumer(&name, durable), handler.clone())
                    .name(&name)
                    .layer(inbox.clone()),
            )
            .start()
            .await
            .expect("start");
        until(Duration::from_secs(30), "every message seen", async || {
            sum(&pool, &table).await.0 == 10 && inbox.skipped() >= expected_skips
        })
        .await;
        running.stop().await;
    }
    assert_eq!(
        sum(&pool, &table).await,
        (10, 55),
        "each message applied once"
    );
    assert_eq!(inbox.skipped(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_entries_without_an_id_are_refused_and_dead_lettered_saying_why() {
    let pool = pool().await;
    let redis = Redis::connect_from_env(&Env::new("RUSTSTREAM_REDIS"))
        .await
        .expect("Redis");
    let (stream_name, dead) = (unique("inbox"), unique("inbox-dead"));
    let (table, handler) = ledger(&pool, &stream_name).await;
    let publisher = Publisher::new(redis.publish_handle());
    publish(&publisher, &stream_name, 2).await;
    publisher
        .to(&stream_name)
        .header(ruststream::core::MESSAGE_ID_HEADER, "order-3")
        .send(&3_i64)
        .await
        .expect("published");
    let running = App::new()
        .register(
            on(redis.stream(&stream_name, "g"), handler)
                .name(&stream_name)
                .max_attempts(2)
                .dead_letter(&dead)
                .layer(Inbox::new(pool.clone())),
        )
        .start()
        .await
        .expect("start");
    let mut connection = redis.connection();
    until(Duration::from_secs(20), "two dead letters", async || {
        let n: u64 = ruststream_redis::redis::cmd("XLEN")
            .arg(&dead)
            .query_async(&mut connection)
            .await
            .unwrap_or(0);
        n == 2
    })
    .await;
    running.stop().await;
    assert_eq!(
        sum(&pool, &table).await,
        (1, 3),
        "only the message with an id applied"
    );
    let entries: Vec<(String, Vec<(String, String)>)> = ruststream_redis::redis::cmd("XRANGE")
        .arg(&dead)
        .arg("-")
        .arg("+")
        .query_async(&mut connection)
        .await
        .expect("dead letters");
    for (_, fields) in entries {
        let reason = fields
            .iter()
            .find(|(name, _)| name == "x-ruststream-dead-letter-reason")
            .map(|(_, v)| v.as_str())
            .unwrap_or("");
        assert!(reason.contains("no `x-ruststream-id` header"), "{reason}");
    }
}

#[tokio::test]
async fn an_inbox_on_kafka_commit_auto_is_refused_at_start() {
    let pool = pool().await;
    let kafka = Kafka::from_env(&Env::new("RUSTSTREAM_KAFKA")).expect("Kafka");
    let (_, handler) = ledger(&pool, &unique("auto")).await;
    let refused = App::new()
        .register(
            on(kafka.topic("auto").group("auto"), handler.clone())
                .name("auto")
                .layer(Inbox::new(pool.clone())),
        )
        .validate()
        .expect_err("refused at start");
    let said = refused.to_string();
    assert!(
        said.contains("registration `auto`") && said.contains("Commit::Auto"),
        "{said}"
    );
    // Tracked is fine.
    App::new()
        .register(
            on(
                kafka.topic("auto").group("auto").commit(Commit::Tracked),
                handler,
            )
            .name("tracked")
            .layer(Inbox::new(pool)),
        )
        .validate()
        .expect("Tracked takes an inbox");
}
