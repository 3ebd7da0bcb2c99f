//! The inbox against a real PostgreSQL (the test command starts one): a message seen
//! before is skipped, a handler's writes commit only with `ack`/`drop`, a poison message
//! still reaches its dead letter with the inbox consistent.

mod common;

use common::{pool, unique};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ruststream::core::MESSAGE_ID_HEADER;
use ruststream::memory::MemoryBroker;
use ruststream::{App, HandlerOutcome, Headers, Message, Meta, on};
use ruststream_sql::{Inbox, Tx};
use sqlx::PgPool;

/// A table of effects of its own: one row per applied message, amounts summed.
async fn effects(pool: &PgPool, name: &str) -> String {
    let table = format!("effects_{name}_{}", std::process::id());
    sqlx::raw_sql(&format!(
        "DROP TABLE IF EXISTS {table}; CREATE TABLE {table} (message text, amount bigint)"
    ))
    .execute(pool)
    .await
    .expect("effects table");
    table
}

async fn totals(pool: &PgPool, table: &str) -> (i64, i64) {
    sqlx::query_as(&format!(
        "SELECT count(*), coalesce(sum(amount), 0)::bigint FROM {table}"
    ))
    .fetch_one(pool)
    .await
    .expect("totals")
}

async fn recorded(pool: &PgPool, registration: &str) -> i64 {
    let (n,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM ruststream_inbox WHERE registration = $1")
            .bind(registration)
            .fetch_one(pool)
            .await
            .expect("inbox rows");
    n
}

async fn until_idle(broker: &MemoryBroker) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !broker.is_idle() {
        assert!(Instant::now() < deadline, "the broker never went idle");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
}

#[tokio::test]
async fn a_message_seen_before_is_skipped_and_its_effect_applied_once() {
    let pool = pool().await;
    let table = effects(&pool, "dup").await;
    let registration = unique("credit");
    let broker = MemoryBroker::new();
    let inbox = Inbox::new(pool.clone());
    let write = table.clone();
    let handler = move |Message(amount): Message<i64>, headers: Headers, tx: Tx| {
        let write = write.clone();
        async move {
            let id = headers.get_str(MESSAGE_ID_HEADER).unwrap_or("-").to_owned();
            sqlx::query(&format!("INSERT INTO {write} VALUES ($1, $2)"))
                .bind(id)
                .bind(amount)
                .execute(&mut *tx.lock().await)
                .await?;
            Ok::<_, sqlx::Error>(HandlerOutcome::ack())
        }
    };
    let running = App::new()
        .metrics()
        .watch(std::sync::Arc::new(inbox.clone()))
        .register(
            on(broker.topic("credits"), handler)
                .name(&registration)
                .layer(inbox.clone()),
        )
        .start()
        .await
        .expect("start");
    let publisher = broker.publisher();
    for (id, amount) in [("a1", 5), ("a2", 7), ("a1", 5), ("a1", 5)] {
        publisher
            .to("credits")
            .header(MESSAGE_ID_HEADER, id)
            .send(&amount)
            .await
            .expect("published");
    }
    until_idle(&broker).await;
    let metrics = running.metrics().await.expect("metrics on");
    running.stop().await;
    assert!(
        metrics.contains(&format!(
            "ruststream_inbox_skipped_total{{registration=\"{registration}\"}} 2\n"
        )),
        "the skips are a series per registration: {metrics}"
    );
    assert_eq!(
        totals(&pool, &table).await,
        (2, 12),
        "a1 and a2 applied once each"
    );
    assert_eq!(inbox.skipped(), 2, "the two copies of a1 skipped");
    assert_eq!(recorded(&pool, &registration).await, 2);
}

#[tokio::test]
async fn a_retry_error_or_panic_after_writing_leaves_no_trace() {
    let pool = pool().await;
    let table = effects(&pool, "retry").await;
    let registration = unique("flaky");
    let broker = MemoryBroker::new();
    let write = table.clone();
    let handler = move |Message(amount): Message<i64>, meta: Meta, tx: Tx| {
        let write = write.clone();
        async move {
            sqlx::query(&format!("INSERT INTO {write} VALUES ('m', $1)"))
                .bind(amount)
                .execute(&mut *tx.lock().await)
                .await
                .expect("insert");
            match meta.attempt.number() {
                1 => Ok(HandlerOutcome::retry()),
                2 => Err("a failure after writing"),
                3 => panic!("a panic after writing"),
                _ => Ok(HandlerOutcome::ack()),
            }
        }
    };
    let running = App::new()
        .register(
            on(broker.topic("flaky"), handler)
                .name(&registration)
                .max_attempts(5)
                .layer(Inbox::new(pool.clone())),
        )
        .start()
        .await
        .expect("start");
    broker
        .publisher()
        .to("flaky")
        .send(&3)
        .await
        .expect("published");
    until_idle(&broker).await;
    running.stop().await;
    assert_eq!(
        totals(&pool, &table).await,
        (1, 3),
        "only attempt 4's write stayed"
    );
    assert_eq!(recorded(&pool, &registration).await, 1);
}

#[tokio::test]
async fn a_poison_message_reaches_its_dead_letter_with_the_inbox_consistent() {
    let pool = pool().await;
    let table = effects(&pool, "poison").await;
    let registration = unique("poison");
    let broker = MemoryBroker::recording();
    let calls = Arc::new(AtomicUsize::new(0));
    let (write, counted) = (table.clone(), Arc::clone(&calls));
    let handler = move |Message(amount): Message<i64>, tx: Tx| {
        let (write, counted) = (write.clone(), Arc::clone(&counted));
        async move {
            counted.fetch_add(1, Ordering::SeqCst);
            sqlx::query(&format!("INSERT INTO {write} VALUES ('p', $1)"))
                .bind(amount)
                .execute(&mut *tx.lock().await)
                .await
                .expect("insert");
            HandlerOutcome::retry()
        }
    };
    let running = App::new()
        .register(
            on(broker.topic("poison"), handler)
                .name(&registration)
                .max_attempts(3)
                .dead_letter("poison.dead")
                .layer(Inbox::new(pool.clone())),
        )
        .start()
        .await
        .expect("start");
    broker
        .publisher()
        .to("poison")
        .send(&9)
        .await
        .expect("published");
    until_idle(&broker).await;
    running.stop().await;
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!(broker.published("poison.dead").len(), 1, "one dead letter");
    assert_eq!(totals(&pool, &table).await, (0, 0), "no write stayed");
    assert_eq!(
        recorded(&pool, &registration).await,
        0,
        "and no id: a replay is handled"
    );
}

#[tokio::test]
async fn a_handler_without_an_inbox_asking_for_tx_is_refused_saying_why() {
    let broker = MemoryBroker::recording();
    let running = App::new()
        .register(
            on(broker.topic("bare"), |_tx: Tx| async {
                HandlerOutcome::ack()
            })
            .name("bare")
            .max_attempts(2)
            .dead_letter("bare.dead"),
        )
        .start()
        .await
        .expect("start");
    broker
        .publisher()
        .to("bare")
        .send(&1)
        .await
        .expect("published");
    until_idle(&broker).await;
    running.stop().await;
    let letters = broker.published("bare.dead");
    assert_eq!(letters.len(), 1, "refused, to the dead letter");
    let reason = letters[0]
        .headers
        .get_str("x-ruststream-dead-letter-reason")
        .unwrap_or("");
    assert!(
        reason.contains("add `.layer(Inbox::new(pool))`"),
        "{reason}"
    );
}

#[tokio::test]
async fn ids_older_than_the_horizon_are_pruned() {
    let pool = pool().await;
    let registration = unique("prune");
    sqlx::query("INSERT INTO ruststream_inbox (registration, message_id, received_at) VALUES ($1, 'old', now() - interval '8 days'), ($1, 'new', now())")
        .bind(&registration)
        .execute(&pool)
        .await
        .expect("rows");
    let pruned = Inbox::new(pool.clone())
        .prune(ruststream_sql::DEFAULT_HORIZON)
        .await
        .expect("prune");
    assert!(pruned >= 1);
    assert_eq!(recorded(&pool, &registration).await, 1, "the new one kept");
}

/// A batch handler gets one transaction per batch: a message seen before is skipped and
/// acknowledged, the new ones commit together, and a batch with any message to retry
/// rolls back whole and retries every new message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_one_transaction_and_its_repeats_are_skipped() {
    use ruststream::batch::Batch;
    use ruststream::{BatchOutcome, on_batch};
    use ruststream_sql::BatchInbox;

    let pool = pool().await;
    let table = effects(&pool, "batch").await;
    let registration = unique("batch-credit");
    let broker = MemoryBroker::new();
    let inbox = Inbox::new(pool.clone());
    let calls = Arc::new(AtomicUsize::new(0));
    let (write, counted) = (table.clone(), Arc::clone(&calls));
    let handler = move |batch: Batch<i64>, inbox: BatchInbox| {
        let (write, counted) = (write.clone(), Arc::clone(&counted));
        async move {
            let call = counted.fetch_add(1, Ordering::SeqCst);
            let mut tx = inbox.begin(&batch).await?;
            let mut outcome = BatchOutcome::ack_all();
            for (i, item) in batch.iter().enumerate() {
                if !tx.fresh(i) {
                    continue;
                }
                let id = item.headers().get_str(MESSAGE_ID_HEADER).unwrap_or("-");
                sqlx::query(&format!("INSERT INTO {write} VALUES ($1, $2)"))
                    .bind(id)
                    .bind(item.value)
                    .execute(tx.conn())
                    .await?;
                // The first call wants its message of 1 again: the whole batch rolls back.
                if call == 0 && item.value == 1 {
                    outcome.set(i, HandlerOutcome::retry());
                }
            }
            tx.commit(outcome).await
        }
    };
    let running = App::new()
        .state(inbox.clone())
        .register(
            on_batch(broker.topic("credits"), handler)
                .name(&registration)
                .max_batch(10)
                .max_wait(Duration::from_millis(200)),
        )
        .start()
        .await
        .expect("start");
    let publisher = broker.publisher();
    for (id, amount) in [("a1", 5), ("a2", 7), ("a1", 5), ("a3", 1)] {
        publisher
            .to("credits")
            .header(MESSAGE_ID_HEADER, id)
            .send(&amount)
            .await
            .expect("published");
    }
    until_idle(&broker).await;
    publisher
        .to("credits")
        .header(MESSAGE_ID_HEADER, "a2")
        .send(&7)
        .await
        .expect("published");
    until_idle(&broker).await;
    running.stop().await;
    assert!(
        calls.load(Ordering::SeqCst) >= 3,
        "the rolled-back batch came again"
    );
    assert_eq!(
        totals(&pool, &table).await,
        (3, 13),
        "a1, a2 and a3 applied once each, after the rollback"
    );
    assert_eq!(
        inbox.skipped(),
        2,
        "the second a1 in the first batch, the late a2"
    );
    assert_eq!(recorded(&pool, &registration).await, 3);
}
