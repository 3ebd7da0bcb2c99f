//! The inbox on SQLite, an embedded database (no server): a message seen before is
//! skipped, a retried attempt leaves no trace, a batch is one transaction, old ids are
//! pruned, and a `Tx` of the other database is refused saying so.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ruststream::batch::Batch;
use ruststream::core::MESSAGE_ID_HEADER;
use ruststream::memory::MemoryBroker;
use ruststream::{App, BatchOutcome, HandlerOutcome, Message, Meta, on, on_batch};
use ruststream_sql::{BatchInbox, Inbox, Tx, migrate_sqlite};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool};
use sqlx::{Postgres, Sqlite};

/// A database file of the test's own, with the inbox table and an effects table.
async fn database(name: &str) -> SqlitePool {
    let path = std::env::temp_dir().join(format!("ruststream-{name}-{}.db", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let options = SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true);
    let pool = SqlitePool::connect_with(options).await.expect("SQLite");
    migrate_sqlite(&pool).await.expect("migrate");
    migrate_sqlite(&pool).await.expect("migrate twice");
    sqlx::raw_sql("CREATE TABLE effects (message text, amount integer)")
        .execute(&pool)
        .await
        .expect("effects table");
    pool
}

async fn totals(pool: &SqlitePool) -> (i64, i64) {
    sqlx::query_as("SELECT count(*), coalesce(sum(amount), 0) FROM effects")
        .fetch_one(pool)
        .await
        .expect("totals")
}

async fn until_idle(broker: &MemoryBroker) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !broker.is_idle() {
        assert!(Instant::now() < deadline, "the broker never went idle");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
}

async fn publish(broker: &MemoryBroker, sends: &[(&str, i64)]) {
    for (id, amount) in sends {
        broker
            .publisher()
            .to("credits")
            .header(MESSAGE_ID_HEADER, id.to_string())
            .send(amount)
            .await
            .expect("published");
    }
}

#[tokio::test]
async fn a_repeat_is_skipped_and_a_retried_attempt_leaves_no_trace() {
    let pool = database("single").await;
    let broker = MemoryBroker::new();
    let inbox = Inbox::new(pool.clone());
    let handler = |Message(amount): Message<i64>, meta: Meta, tx: Tx<Sqlite>| async move {
        sqlx::query("INSERT INTO effects VALUES ('x', ?)")
            .bind(amount)
            .execute(&mut *tx.lock().await)
            .await?;
        // The message of 7 asks for another attempt after writing: rolled back.
        if amount == 7 && meta.attempt.number() == 1 {
            return Ok::<_, sqlx::Error>(HandlerOutcome::retry());
        }
        Ok(HandlerOutcome::ack())
    };
    let running = App::new()
        .register(
            on(broker.topic("credits"), handler)
                .name("credit")
                .layer(inbox.clone()),
        )
        .start()
        .await
        .expect("start");
    publish(&broker, &[("a1", 5), ("a2", 7), ("a1", 5)]).await;
    until_idle(&broker).await;
    running.stop().await;
    assert_eq!(
        totals(&pool).await,
        (2, 12),
        "a1 once, a2 once after its retry"
    );
    assert_eq!(inbox.skipped(), 1);
    assert_eq!(
        inbox.prune(Duration::from_secs(3600)).await.expect("prune"),
        0
    );
    assert_eq!(inbox.prune(Duration::ZERO).await.expect("prune"), 2);
}

#[tokio::test]
async fn a_batch_is_one_sqlite_transaction() {
    let pool = database("batch").await;
    let broker = MemoryBroker::new();
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let handler = move |batch: Batch<i64>, inbox: BatchInbox<Sqlite>| {
        let counted = Arc::clone(&counted);
        async move {
            let call = counted.fetch_add(1, Ordering::SeqCst);
            let mut tx = inbox.begin(&batch).await?;
            let mut outcome = BatchOutcome::ack_all();
            for (i, item) in batch.iter().enumerate() {
                if tx.fresh(i) {
                    sqlx::query("INSERT INTO effects VALUES ('x', ?)")
                        .bind(item.value)
                        .execute(tx.conn())
                        .await?;
                    if call == 0 && item.value == 1 {
                        outcome.set(i, HandlerOutcome::retry());
                    }
                }
            }
            tx.commit(outcome).await
        }
    };
    let inbox = Inbox::new(pool.clone());
    let running = App::new()
        .state(inbox.clone())
        .register(
            on_batch(broker.topic("credits"), handler)
                .name("batch-credit")
                .max_batch(10)
                .max_wait(Duration::from_millis(200)),
        )
        .start()
        .await
        .expect("start");
    publish(&broker, &[("b1", 5), ("b2", 7), ("b1", 5), ("b3", 1)]).await;
    until_idle(&broker).await;
    running.stop().await;
    assert!(calls.load(Ordering::SeqCst) >= 2);
    assert_eq!(
        totals(&pool).await,
        (3, 13),
        "each once, after the rollback"
    );
    assert_eq!(inbox.skipped(), 1);
}

#[tokio::test]
async fn a_tx_of_the_other_database_is_refused_saying_why() {
    let pool = database("mixed").await;
    let broker = MemoryBroker::recording();
    let handler = |Message(_): Message<i64>, _tx: Tx<Postgres>| async { HandlerOutcome::ack() };
    let running = App::new()
        .register(
            on(broker.topic("credits"), handler)
                .name("mixed")
                .layer(Inbox::new(pool.clone())),
        )
        .start()
        .await
        .expect("start");
    ruststream_test_support::capture_logs("warn");
    publish(&broker, &[("c1", 1)]).await;
    until_idle(&broker).await;
    running.stop().await;
    let logs = ruststream_test_support::logs();
    assert!(logs.contains("another database"), "{logs}");
    assert_eq!(totals(&pool).await, (0, 0));
}
