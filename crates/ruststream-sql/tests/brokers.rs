//! The inbox on real brokers, by the broker's own identity of a message: every record a
//! second reader gets again (a new Kafka group, a new JetStream durable: what a crash or
//! a rebalance would redeliver) is skipped, its effect applied once; on a broker that
//! gives a message no identity of its own (RabbitMQ: unless its `message-id` property is
//! set), a message without `x-ruststream-id` is refused and dead-lettered, saying why.

mod common;

use common::{pool, unique};
use std::time::{Duration, Instant};

use ruststream::core::Env;
use ruststream::{App, HandlerOutcome, Message, Publisher, on};
use ruststream_kafka::{Commit, Kafka};
use ruststream_nats::Nats;
use ruststream_nats::async_nats::jetstream::{self, stream};
use ruststream_pulsar::Pulsar;
use ruststream_rabbitmq::lapin::BasicProperties;
use ruststream_rabbitmq::lapin::options::{BasicGetOptions, BasicPublishOptions};
use ruststream_rabbitmq::lapin::types::AMQPValue;
use ruststream_rabbitmq::{QueueKind, RabbitMq};
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

/// Runs the app `reading` makes for a first reader, then for a second one reading the
/// same ten messages again: every one is applied once, and the second reader's ten are
/// skipped by `inbox`.
async fn read_twice(
    pool: &PgPool,
    table: &str,
    inbox: &Inbox,
    limit: Duration,
    reading: impl Fn(&str) -> App,
) {
    for (reader, expected_skips) in [("first", 0), ("second", 10)] {
        let running = reading(reader).start().await.expect("start");
        until(limit, "every message seen", async || {
            sum(pool, table).await.0 == 10 && inbox.skipped() >= expected_skips
        })
        .await;
        running.stop().await;
    }
    assert_eq!(
        sum(pool, table).await,
        (10, 55),
        "each message applied once"
    );
    assert_eq!(inbox.skipped(), 10, "the second reader's ten skipped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_records_read_again_by_another_group_are_skipped() {
    let pool = pool().await;
    let kafka = Kafka::from_env(&Env::new("RUSTSTREAM_KAFKA")).expect("Kafka");
    let topic = unique("inbox");
    let (table, handler) = ledger(&pool, &topic).await;
    publish(&Publisher::new(kafka.publish_handle()), &topic, 10).await;
    let inbox = Inbox::new(pool.clone());
    read_twice(&pool, &table, &inbox, Duration::from_secs(60), |group| {
        App::new().register(
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
    })
    .await;
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
    read_twice(&pool, &table, &inbox, Duration::from_secs(30), |durable| {
        App::new().register(
            on(nats.consumer(&name, durable), handler.clone())
                .name(&name)
                .layer(inbox.clone()),
        )
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_entries_read_again_by_another_group_are_skipped() {
    let pool = pool().await;
    let redis = Redis::connect_from_env(&Env::new("RUSTSTREAM_REDIS"))
        .await
        .expect("Redis");
    let stream_name = unique("inbox");
    let (table, handler) = ledger(&pool, &stream_name).await;
    publish(&Publisher::new(redis.publish_handle()), &stream_name, 10).await;
    let inbox = Inbox::new(pool.clone());
    read_twice(&pool, &table, &inbox, Duration::from_secs(30), |group| {
        App::new().register(
            on(redis.stream(&stream_name, group), handler.clone())
                .name(&stream_name)
                .layer(inbox.clone()),
        )
    })
    .await;
}

/// On Pulsar a message's id is the broker's message id (ledger, entry, partition, batch
/// index), the same in every subscription: a second subscription's reads are skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pulsar_messages_read_again_by_another_subscription_are_skipped() {
    let pool = pool().await;
    let broker = std::env::var("RUSTSTREAM_PULSAR_ADDR").expect("RUSTSTREAM_PULSAR_ADDR");
    // pulsar-lite leaves the checksum out of message frames; the relay adds it.
    let relay = ruststream_test_support::pulsar_relay::start(broker).await;
    let pulsar = Pulsar::connect(&format!("pulsar://{relay}"))
        .await
        .expect("Pulsar");
    let topic = unique("inbox");
    let (table, handler) = ledger(&pool, &topic).await;
    publish(&Publisher::new(pulsar.publish_handle()), &topic, 10).await;
    let inbox = Inbox::new(pool.clone());
    read_twice(
        &pool,
        &table,
        &inbox,
        Duration::from_secs(30),
        |subscription| {
            App::new().register(
                on(
                    pulsar.topic(&topic).subscription(subscription),
                    handler.clone(),
                )
                .name(&topic)
                .layer(inbox.clone()),
            )
        },
    )
    .await;
}

/// On RabbitMQ a message's id is its `x-ruststream-id`, else its AMQP `message-id`
/// property (two messages with one `message-id` are applied once); a message with
/// neither (a delivery tag is the channel's) is refused, to the dead letter, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_message_id_is_the_id_and_messages_without_one_are_refused() {
    let pool = pool().await;
    let rabbit = RabbitMq::connect_from_env(&Env::new("RUSTSTREAM_RABBITMQ"))
        .await
        .expect("RabbitMQ");
    let (queue, dead) = (unique("inbox"), unique("inbox-dead"));
    for name in [&queue, &dead] {
        rabbit
            .declare_queue(name, QueueKind::Classic)
            .await
            .expect("queue");
    }
    let (table, handler) = ledger(&pool, &queue).await;
    let publisher = Publisher::new(rabbit.publish_handle());
    publish(&publisher, &queue, 2).await;
    publisher
        .to(&queue)
        .header(ruststream::core::MESSAGE_ID_HEADER, "order-3")
        .send(&3_i64)
        .await
        .expect("published");
    let raw = rabbit.connection().create_channel().await.expect("channel");
    for (id, payload) in [("order-4", "4"), ("order-4", "4"), ("order-5", "5")] {
        raw.basic_publish(
            "".into(),
            queue.as_str().into(),
            BasicPublishOptions::default(),
            payload.as_bytes(),
            BasicProperties::default().with_message_id(id.into()),
        )
        .await
        .expect("published")
        .await
        .expect("sent");
    }
    let inbox = Inbox::new(pool.clone());
    let running = App::new()
        .register(
            on(rabbit.queue(&queue), handler)
                .name(&queue)
                .max_attempts(2)
                .dead_letter(&dead)
                .layer(inbox.clone()),
        )
        .start()
        .await
        .expect("start");
    let channel = rabbit.connection().create_channel().await.expect("channel");
    let mut reasons = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while reasons.len() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "dead letters: {reasons:?}"
        );
        let got = channel
            .basic_get(dead.as_str().into(), BasicGetOptions { no_ack: true })
            .await
            .expect("basic.get");
        match got {
            Some(message) => {
                let headers = message
                    .delivery
                    .properties
                    .headers()
                    .clone()
                    .unwrap_or_default();
                let reason = headers
                    .inner()
                    .get("x-ruststream-dead-letter-reason")
                    .map(|v| match v {
                        AMQPValue::LongString(text) => {
                            String::from_utf8_lossy(text.as_bytes()).into_owned()
                        }
                        other => format!("{other:?}"),
                    })
                    .unwrap_or_default();
                reasons.push(reason);
            }
            None => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while sum(&pool, &table).await != (3, 12) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    running.stop().await;
    assert_eq!(
        sum(&pool, &table).await,
        (3, 12),
        "the messages with an id applied, order-4 once"
    );
    assert_eq!(inbox.skipped(), 1, "the second order-4");
    for reason in reasons {
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
