//! The outbox against a real PostgreSQL: committed writes are published once and marked
//! sent, rolled-back ones never; a refused publish keeps its row and its key's order;
//! two relays share the table without publishing a row twice or reordering a key; with
//! an inbox behind it, a row sent twice is applied once.

mod common;

use common::{own_database, unique};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ruststream::core::{BoxFuture, MESSAGE_ID_HEADER, Outgoing, Publish, PublishError};
use ruststream::memory::MemoryBroker;
use ruststream::{App, HandlerOutcome, Message, Publisher, on};
use ruststream_sql::{Inbox, Outbox, Relay, Tx};
use ruststream_test_support::ops::get;
use sqlx::PgPool;
use tokio::sync::oneshot;

/// A relay running until the returned sender is dropped or fired.
fn relay(
    pool: &PgPool,
    publisher: Publisher,
) -> (oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let (stop, stopped) = oneshot::channel::<()>();
    let relay = Relay::new(pool.clone(), publisher).poll_every(Duration::from_millis(50));
    let task = tokio::spawn(async move {
        relay
            .run(async {
                let _ = stopped.await;
            })
            .await
            .expect("the relay runs");
    });
    (stop, task)
}

async fn until(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "not within {limit:?}: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn unsent(pool: &PgPool, address: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM ruststream_outbox WHERE address = $1 AND sent_at IS NULL",
    )
    .bind(address)
    .fetch_one(pool)
    .await
    .expect("count")
}

#[tokio::test]
async fn committed_writes_are_published_once_and_rolled_back_ones_never() {
    let pool = own_database().await;
    let (kept, dropped) = (unique("kept"), unique("dropped"));
    let broker = MemoryBroker::recording();
    let mut tx = pool.begin().await.expect("tx");
    let mut ids = Vec::new();
    for n in 0..3 {
        ids.push(
            Outbox::to(&kept)
                .key("k")
                .header("trace", "t")
                .send(&mut tx, &n)
                .await
                .expect("write"),
        );
    }
    tx.commit().await.expect("commit");
    let mut tx = pool.begin().await.expect("tx");
    Outbox::to(&dropped).send(&mut tx, &1).await.expect("write");
    tx.rollback().await.expect("rollback");

    let (stop, task) = relay(&pool, broker.publisher());
    until(Duration::from_secs(10), "three published", || {
        broker.published(&kept).len() == 3
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _ = stop.send(());
    task.await.expect("relay ended");
    let published = broker.published(&kept);
    assert_eq!(published.len(), 3, "each once");
    let got: Vec<&str> = published
        .iter()
        .map(|m| m.headers.get_str(MESSAGE_ID_HEADER).unwrap())
        .collect();
    assert_eq!(
        got,
        ids.iter().map(String::as_str).collect::<Vec<_>>(),
        "in order, with their ids"
    );
    assert_eq!(published[0].headers.get_str("trace"), Some("t"));
    assert_eq!(published[2].payload.as_ref(), b"2");
    assert_eq!(unsent(&pool, &kept).await, 0, "marked sent");
    assert!(
        broker.published(&dropped).is_empty(),
        "a rolled-back write is never published"
    );
}

/// A broker that refuses the first publish of every message whose payload is `2`.
struct Refusing {
    inner: Publisher,
    refused: AtomicUsize,
}

impl Publish for Refusing {
    fn publish(&self, message: Outgoing) -> BoxFuture<'_, Result<(), PublishError>> {
        Box::pin(async move {
            if message.payload.as_ref() == b"2" && self.refused.fetch_add(1, Ordering::SeqCst) == 0
            {
                return Err(PublishError::new(
                    &message.address,
                    ruststream::core::PublishErrorKind::Rejected,
                    "refused once",
                ));
            }
            self.inner.publish(message).await
        })
    }
}

#[tokio::test]
async fn a_refused_publish_keeps_its_row_and_its_keys_order() {
    let pool = own_database().await;
    let address = unique("refused");
    let broker = MemoryBroker::recording();
    let mut tx = pool.begin().await.expect("tx");
    for n in 0..5 {
        Outbox::to(&address)
            .key("one-key")
            .send(&mut tx, &n)
            .await
            .expect("write");
    }
    tx.commit().await.expect("commit");
    let refusing = Arc::new(Refusing {
        inner: broker.publisher(),
        refused: AtomicUsize::new(0),
    });
    let (stop, task) = relay(&pool, Publisher::new(refusing.clone()));
    until(Duration::from_secs(10), "five published", || {
        broker.published(&address).len() == 5
    })
    .await;
    let _ = stop.send(());
    task.await.expect("relay ended");
    let order: Vec<String> = broker
        .published(&address)
        .iter()
        .map(|m| String::from_utf8_lossy(&m.payload).into_owned())
        .collect();
    assert_eq!(
        order,
        ["0", "1", "2", "3", "4"],
        "the key's order kept across the refusal"
    );
    assert!(refusing.refused.load(Ordering::SeqCst) >= 1);
    assert_eq!(unsent(&pool, &address).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_relays_share_the_table_without_a_row_twice_or_a_key_reordered() {
    let pool = own_database().await;
    let address = unique("shared");
    let broker = MemoryBroker::recording();
    let (first, first_task) = relay(&pool, broker.publisher());
    let (second, second_task) = relay(&pool, broker.publisher());
    // Written while both relays run, in many small transactions.
    for n in 0..400 {
        let mut tx = pool.begin().await.expect("tx");
        Outbox::to(&address)
            .key(format!("k{}", n % 10))
            .send(&mut tx, &n)
            .await
            .expect("write");
        tx.commit().await.expect("commit");
    }
    until(Duration::from_secs(30), "400 published", || {
        broker.published(&address).len() >= 400
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _ = (first.send(()), second.send(()));
    first_task.await.expect("first ended");
    second_task.await.expect("second ended");
    let published = broker.published(&address);
    assert_eq!(published.len(), 400, "no row twice");
    let mut last: BTreeMap<String, i64> = BTreeMap::new();
    for message in &published {
        let key = String::from_utf8_lossy(message.key.as_deref().unwrap()).into_owned();
        let n: i64 = String::from_utf8_lossy(&message.payload).parse().unwrap();
        let before = last.insert(key.clone(), n);
        assert!(
            before.is_none_or(|b| b < n),
            "key {key}: {n} after {before:?}"
        );
    }
    assert_eq!(unsent(&pool, &address).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_the_relay_sends_twice_is_applied_once_behind_an_inbox() {
    let pool = own_database().await;
    let address = unique("chain");
    let table = format!("chain_{}", std::process::id());
    sqlx::raw_sql(&format!(
        "DROP TABLE IF EXISTS {table}; CREATE TABLE {table} (n bigint)"
    ))
    .execute(&pool)
    .await
    .expect("table");
    let broker = MemoryBroker::new();
    let inbox = Inbox::new(pool.clone());
    let write = table.clone();
    let handler = move |Message(n): Message<i64>, tx: Tx| {
        let write = write.clone();
        async move {
            sqlx::query(&format!("INSERT INTO {write} VALUES ($1)"))
                .bind(n)
                .execute(&mut *tx.lock().await)
                .await?;
            Ok::<_, sqlx::Error>(HandlerOutcome::ack())
        }
    };
    let running = App::new()
        .register(
            on(broker.topic(&address), handler)
                .name(&address)
                .layer(inbox.clone()),
        )
        .start()
        .await
        .expect("start");
    let mut tx = pool.begin().await.expect("tx");
    for n in 1..=20 {
        Outbox::to(&address)
            .key(format!("k{}", n % 3))
            .send(&mut tx, &n)
            .await
            .expect("write");
    }
    tx.commit().await.expect("commit");
    let (stop, task) = relay(&pool, broker.publisher());
    let sum = |pool: PgPool, table: String| async move {
        sqlx::query_scalar::<_, Option<i64>>(&format!("SELECT sum(n)::bigint FROM {table}"))
            .fetch_one(&pool)
            .await
            .expect("sum")
            .unwrap_or(0)
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while sum(pool.clone(), table.clone()).await != 210 {
        assert!(Instant::now() < deadline, "not every message applied");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // As a relay that died after publishing and before marking would: send them again.
    sqlx::query("UPDATE ruststream_outbox SET sent_at = NULL WHERE address = $1")
        .bind(&address)
        .execute(&pool)
        .await
        .expect("unmark");
    sqlx::query("SELECT pg_notify('ruststream_outbox', '')")
        .execute(&pool)
        .await
        .expect("notify");
    let deadline = Instant::now() + Duration::from_secs(20);
    while inbox.skipped() < 20 {
        assert!(
            Instant::now() < deadline,
            "the second sends were not all skipped: {}",
            inbox.skipped()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = stop.send(());
    task.await.expect("relay ended");
    running.stop().await;
    assert_eq!(
        sum(pool.clone(), table.clone()).await,
        210,
        "each applied once"
    );
    let count: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
        .fetch_one(&pool)
        .await
        .expect("count");
    assert_eq!(count, 20);
}

/// A broker that never answers the first publish.
struct Silent {
    inner: Publisher,
    calls: AtomicUsize,
}

impl Publish for Silent {
    fn publish(&self, message: Outgoing) -> BoxFuture<'_, Result<(), PublishError>> {
        Box::pin(async move {
            if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
                std::future::pending::<()>().await;
            }
            self.inner.publish(message).await
        })
    }
}

#[tokio::test]
async fn a_publish_never_confirmed_holds_nothing_and_the_row_goes_out_later() {
    let pool = own_database().await;
    let address = unique("silent");
    let broker = MemoryBroker::recording();
    let mut tx = pool.begin().await.expect("tx");
    for n in 0..3 {
        Outbox::to(&address)
            .key("k")
            .send(&mut tx, &n)
            .await
            .expect("write");
    }
    tx.commit().await.expect("commit");
    let silent = Arc::new(Silent {
        inner: broker.publisher(),
        calls: AtomicUsize::new(0),
    });
    let (stop, stopped) = oneshot::channel::<()>();
    let relay = Relay::new(pool.clone(), Publisher::new(silent))
        .poll_every(Duration::from_millis(50))
        .publish_timeout(Duration::from_millis(200));
    let task = tokio::spawn(relay.run(async {
        let _ = stopped.await;
    }));
    until(Duration::from_secs(10), "three published", || {
        broker.published(&address).len() == 3
    })
    .await;
    let _ = stop.send(());
    task.await.expect("relay ended").expect("relay ran");
    let order: Vec<String> = broker
        .published(&address)
        .iter()
        .map(|m| String::from_utf8_lossy(&m.payload).into_owned())
        .collect();
    assert_eq!(
        order,
        ["0", "1", "2"],
        "the unanswered row went out first, later"
    );
    assert_eq!(unsent(&pool, &address).await, 0);
}

/// A broker that refuses every publish.
struct Closed;

impl Publish for Closed {
    fn publish(&self, message: Outgoing) -> BoxFuture<'_, Result<(), PublishError>> {
        Box::pin(async move {
            Err(PublishError::new(
                &message.address,
                ruststream::core::PublishErrorKind::Rejected,
                "closed",
            ))
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_lag_is_a_series_and_a_reason_not_to_be_ready() {
    let pool = own_database().await;
    let address = unique("lagging");
    let mut tx = pool.begin().await.expect("tx");
    for n in 0..3 {
        Outbox::to(&address).send(&mut tx, &n).await.expect("write");
    }
    tx.commit().await.expect("commit");
    let relay = Relay::new(pool.clone(), Publisher::new(Arc::new(Closed)))
        .poll_every(Duration::from_millis(50))
        .max_lag(Duration::from_millis(600));
    let app = App::new().ops(0).watch(relay.watch());
    let running = app.start().await.expect("start");
    let addr = running.ops_addr().expect("ops on");
    let (ready, body) = get(addr, "/health/ready").await;
    assert_eq!(ready, 200, "no round yet, within max_lag: {body}");
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(relay.run(async {
        let _ = stopped.await;
    }));
    let deadline = Instant::now() + Duration::from_secs(10);
    let (status, body) = loop {
        let (status, body) = get(addr, "/health/ready").await;
        if status == 503 || Instant::now() > deadline {
            break (status, body);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("outbox lag: 3 rows unsent"), "{body}");
    let (_, metrics) = get(addr, "/metrics").await;
    assert!(
        metrics.contains("ruststream_outbox_unsent 3\n"),
        "{metrics}"
    );
    let oldest = metrics
        .lines()
        .find_map(|l| l.strip_prefix("ruststream_outbox_oldest_unsent_seconds "))
        .and_then(|v| v.parse::<f64>().ok())
        .expect("the oldest row's age is a series");
    assert!(oldest >= 0.6, "{oldest}");
    assert!(metrics.trim_end().ends_with("# EOF"), "{metrics}");
    let _ = stop.send(());
    task.await.expect("relay task").expect("relay ran");
    running.stop().await;
}

/// A broker that refuses every publish, counting them.
struct Refuses(AtomicUsize);

impl Publish for Refuses {
    fn publish(&self, message: Outgoing) -> BoxFuture<'_, Result<(), PublishError>> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            Err(PublishError::new(
                &message.address,
                ruststream::core::PublishErrorKind::Disconnected,
                "the broker is away",
            ))
        })
    }
}

/// While the broker is away and writers keep notifying, the relay tries once a poll (not
/// at every write) and says so once, then once a minute; it says when it goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_away_is_tried_once_a_poll_and_said_once() {
    ruststream_test_support::capture_logs("ruststream_sql=debug");
    let pool = own_database().await;
    let address = unique("away");
    let refuses = Arc::new(Refuses(AtomicUsize::new(0)));
    let relay = Relay::new(pool.clone(), Publisher::new(refuses.clone()))
        .poll_every(Duration::from_millis(200));
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(relay.run(async {
        let _ = stopped.await;
    }));
    // A write (and its notification) every 10 ms for 2 s, all under one key.
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(2) {
        let mut tx = pool.begin().await.expect("tx");
        Outbox::to(&address)
            .key("k")
            .send(&mut tx, &1)
            .await
            .expect("write");
        tx.commit().await.expect("commit");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let _ = stop.send(());
    task.await.expect("relay task").expect("relay ran");
    let tried = refuses.0.load(Ordering::SeqCst);
    assert!(
        (2..=14).contains(&tried),
        "tried {tried} times in 2 s with a 200 ms poll"
    );
    let logs = ruststream_test_support::logs();
    let warned = logs
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("outbox relay"))
        .count();
    assert_eq!(warned, 1, "{logs}");
    assert!(logs.contains("the broker is away"), "{logs}");
}
