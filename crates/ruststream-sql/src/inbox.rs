//! The inbox: a layer that runs a registration's handler inside a database transaction
//! which first records the message's id, so a message seen before is skipped, and whose
//! commit comes before the broker's settlement.

use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use ruststream::HandlerOutcome;
use ruststream::core::{Capabilities, Cause, Delivery, MESSAGE_ID_HEADER, OutcomeKind, Verb};
use ruststream::extract::{FromDelivery, Incoming, Rejection};
use ruststream::middleware::{Completion, Layer, Service};
use ruststream::ops::{Reading, Watch};
use sqlx::{Pool, Postgres, Transaction};
use tokio::sync::{Mutex, MutexGuard};

use crate::backend::Backend;

tokio::task_local! {
    /// The transaction of the delivery being handled (a [`Slot`] of its database), for
    /// its [`Tx`] extractor.
    static CURRENT: Arc<dyn std::any::Any + Send + Sync>;
}

type Slot<DB> = Arc<Mutex<Option<Transaction<'static, DB>>>>;

/// Runs a registration's handler in a PostgreSQL transaction that first records the
/// message's id in `ruststream_inbox`:
///
/// - an id already there: the handler is skipped and the delivery acknowledged (logged
///   at debug, counted in [`skipped`](Self::skipped) and, once the app
///   [watches](ruststream::App::watch) the inbox, in `ruststream_inbox_skipped_total`
///   per registration);
/// - the handler returns `ack()` or `drop()`: the transaction commits, then the broker
///   settlement is made (a commit that fails is a failed attempt: `retry()`);
/// - `retry()`, `retry_after(d)`, an error, a panic, a timeout or a refused payload: it
///   rolls back, leaving no trace of what the handler wrote.
///
/// The handler writes through the same transaction by taking a [`Tx`]. The id is the
/// `x-ruststream-id` header when the message has one (the outbox writes it), else the
/// broker's own identity where it has a stable one (Kafka topic, partition and offset;
/// JetStream and the memory broker the stream sequence; Redis the entry id; RabbitMQ's
/// `message-id` property, which its transport hands over as the header); a message
/// with neither is
/// refused (the registration's failure policy, with an ERROR saying why).
///
/// ```no_run
/// # async fn example(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// use ruststream::{App, HandlerOutcome, Message, memory::MemoryBroker, on};
/// use ruststream_sql::{Inbox, Tx};
///
/// async fn credit(Message(cents): Message<i64>, tx: Tx) -> Result<HandlerOutcome, sqlx::Error> {
///     sqlx::query("UPDATE account SET balance = balance + $1 WHERE id = 1")
///         .bind(cents)
///         .execute(&mut *tx.lock().await)
///         .await?;
///     Ok(HandlerOutcome::ack())
/// }
///
/// ruststream_sql::migrate(&pool).await?;
/// let broker = MemoryBroker::new();
/// let app = App::new().register(on(broker.topic("credits"), credit).layer(Inbox::new(pool)));
/// # Ok(()) }
/// ```
///
/// On SQLite (`Inbox::new(sqlite_pool)`, its table by [`migrate_sqlite`](crate::migrate_sqlite)) the
/// inbox works the same; the outbox is PostgreSQL's only.
#[derive(Debug)]
pub struct Inbox<DB: Backend = Postgres> {
    pool: Pool<DB>,
    /// Deliveries skipped as seen before, per registration.
    skipped: Arc<std::sync::Mutex<BTreeMap<String, u64>>>,
}

impl<DB: Backend> Clone for Inbox<DB> {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
            skipped: Arc::clone(&self.skipped),
        }
    }
}

impl<DB: Backend> Inbox<DB> {
    /// An inbox in `pool`'s database (its tables made by [`migrate`](crate::migrate)).
    pub fn new(pool: Pool<DB>) -> Self {
        Self {
            pool,
            skipped: Arc::default(),
        }
    }

    /// How many deliveries were skipped as seen before, since this inbox was made.
    pub fn skipped(&self) -> u64 {
        self.counts().values().sum()
    }

    pub(crate) fn count_skips(&self, registration: &str, n: u64) {
        if n > 0 {
            *self.counts().entry(registration.to_owned()).or_default() += n;
        }
    }

    pub(crate) fn pool(&self) -> &Pool<DB> {
        &self.pool
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, u64>> {
        self.skipped.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Deletes the ids recorded more than `horizon` ago; returns how many. A message
    /// redelivered after its id was pruned is handled again, so keep the horizon well
    /// past the longest redelivery (a week is the documented default).
    pub async fn prune(&self, horizon: Duration) -> Result<u64, sqlx::Error> {
        DB::prune(&self.pool, horizon).await
    }
}

/// `ruststream_inbox_skipped_total{registration}`: deliveries skipped as seen before.
/// `App::new().watch(Arc::new(inbox.clone()))` serves it.
impl<DB: Backend> Watch for Inbox<DB> {
    fn readings(&self) -> Vec<Reading> {
        self.counts()
            .iter()
            .map(|(registration, n)| {
                Reading::counter(
                    "ruststream_inbox_skipped",
                    "deliveries the inbox skipped and acknowledged as seen before",
                    *n as f64,
                )
                .label("registration", registration.as_str())
            })
            .collect()
    }
}

/// What pruning keeps unless told otherwise: a week of ids.
pub const DEFAULT_HORIZON: Duration = Duration::from_secs(7 * 24 * 3600);

impl<S: Service, DB: Backend> Layer<S> for Inbox<DB> {
    type Service = InboxService<S, DB>;

    fn layer(&self, inner: S) -> InboxService<S, DB> {
        InboxService {
            inner,
            inbox: self.clone(),
        }
    }

    /// Kafka `Commit::Auto` stores a record's offset when it is handed over (K2): a crash
    /// skips the record before the inbox's transaction could protect it.
    fn check(&self, transport: &'static str, capabilities: &Capabilities) -> Vec<String> {
        let auto = transport == "kafka" && capabilities.redeliver == Verb::Unsupported;
        if auto {
            vec![
                "an inbox on Kafka Commit::Auto cannot protect a record: its offset is stored \
                 when it is handed over (K2), so a crash skips it before the transaction \
                 could commit; use Commit::Tracked"
                    .to_owned(),
            ]
        } else {
            Vec::new()
        }
    }
}

/// A handler behind an [`Inbox`].
#[derive(Debug)]
pub struct InboxService<S, DB: Backend = Postgres> {
    inner: S,
    inbox: Inbox<DB>,
}

impl<S: Service, DB: Backend> Service for InboxService<S, DB> {
    async fn call(&self, incoming: &Incoming) -> Completion {
        let registration = incoming.context().registration();
        let id = match message_id(incoming) {
            Ok(id) => id,
            Err(why) => {
                tracing::error!(registration, address = incoming.delivery().address(), %why, "inbox: the message has no id");
                return Completion::Rejected(Rejection::new("Inbox", why));
            }
        };
        let mut tx = match self.inbox.pool.begin().await {
            Ok(tx) => tx,
            Err(e) => return failed("beginning the inbox transaction", e),
        };
        match DB::record(&mut tx, registration, &id).await {
            Err(e) => return failed("recording the message in the inbox", e),
            Ok(false) => {
                tracing::debug!(registration, message_id = %id, "inbox: seen before; skipped and acknowledged");
                *self
                    .inbox
                    .counts()
                    .entry(registration.to_owned())
                    .or_default() += 1;
                return Completion::Outcome(HandlerOutcome::ack());
            }
            Ok(true) => {}
        }
        let slot: Slot<DB> = Arc::new(Mutex::new(Some(tx)));
        let current: Arc<dyn std::any::Any + Send + Sync> = slot.clone();
        // A handler's extractors run when its future is made (a `Tx` among them), its body
        // when polled: both see the transaction.
        let handled = CURRENT.sync_scope(Arc::clone(&current), || self.inner.call(incoming));
        let completion = CURRENT.scope(current, handled).await;
        let Some(tx) = slot.lock().await.take() else {
            return completion;
        };
        let kept = completion
            .outcome()
            .is_some_and(|o| matches!(o.kind(), OutcomeKind::Ack | OutcomeKind::Drop));
        if !kept {
            let _ = tx.rollback().await;
            return completion;
        }
        match tx.commit().await {
            Ok(()) => completion,
            Err(e) => failed("committing the inbox transaction", e),
        }
    }
}

fn failed(what: &str, error: sqlx::Error) -> Completion {
    Completion::Failed(Cause::new(format!("inbox: {what}: {error}")))
}

/// The message's id: its `x-ruststream-id`, else the broker's own stable identity.
fn message_id(incoming: &Incoming) -> Result<String, String> {
    id_of(incoming.delivery(), incoming.context().transport())
}

/// A delivery's id on `transport`: its `x-ruststream-id`, else the broker's own stable
/// identity; why there is none otherwise.
pub(crate) fn id_of(delivery: &Delivery, transport: &str) -> Result<String, String> {
    if let Some(id) = delivery.headers().get_str(MESSAGE_ID_HEADER) {
        return Ok(id.to_owned());
    }
    let meta = delivery.metadata();
    if let Some((ledger, entry, partition, batch)) = meta.ledger_entry {
        let address = delivery.address();
        return Ok(format!(
            "{transport}:{address}/{ledger}:{entry}:{partition}:{batch}"
        ));
    }
    match (transport, meta.partition, meta.offset, meta.sequence) {
        ("kafka", Some(partition), Some(offset), _) => {
            Ok(format!("kafka:{}/{partition}/{offset}", delivery.address()))
        }
        ("jetstream" | "memory", _, _, Some(sequence)) => {
            Ok(format!("{transport}:{}#{sequence}", delivery.address()))
        }
        ("redis", _, _, Some(sequence)) => match meta.timestamp_ms {
            Some(ms) => Ok(format!("redis:{}/{ms}-{sequence}", delivery.address())),
            None => Err("a Redis entry without its id".to_owned()),
        },
        _ => Err(format!(
            "no `{MESSAGE_ID_HEADER}` header, and {transport} gives this message no stable \
             identity of its own: publish it through the outbox, or set the header"
        )),
    }
}

/// The inbox transaction of the delivery being handled, for the handler's own writes:
/// `sqlx::query(..).execute(&mut *tx.lock().await)`. Only in a registration behind an
/// [`Inbox`] of the same database (`Tx<Sqlite>` behind an SQLite inbox); anywhere else
/// the delivery is refused, saying so.
#[derive(Debug)]
pub struct Tx<DB: Backend = Postgres>(Slot<DB>);

impl<DB: Backend> Clone for Tx<DB> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

impl<DB: Backend> Tx<DB> {
    /// The transaction's connection, for one query or several.
    pub async fn lock(&self) -> TxGuard<'_, DB> {
        TxGuard(self.0.lock().await)
    }
}

/// A locked [`Tx`]: derefs to the transaction's connection.
pub struct TxGuard<'a, DB: Backend = Postgres>(MutexGuard<'a, Option<Transaction<'static, DB>>>);

impl<DB: Backend> std::ops::Deref for TxGuard<'_, DB> {
    type Target = DB::Connection;

    fn deref(&self) -> &DB::Connection {
        self.0
            .as_deref()
            .expect("the inbox transaction is open while the handler runs")
    }
}

impl<DB: Backend> std::ops::DerefMut for TxGuard<'_, DB> {
    fn deref_mut(&mut self) -> &mut DB::Connection {
        self.0
            .as_deref_mut()
            .expect("the inbox transaction is open while the handler runs")
    }
}

impl<DB: Backend> FromDelivery for Tx<DB> {
    fn from_delivery(_incoming: &Incoming) -> Result<Self, Rejection> {
        let current = CURRENT.try_with(Arc::clone).map_err(|_| {
            Rejection::new(
                "Tx",
                "no inbox transaction: add `.layer(Inbox::new(pool))` to this registration",
            )
        })?;
        current
            .downcast::<Mutex<Option<Transaction<'static, DB>>>>()
            .map(Tx)
            .map_err(|_| {
                Rejection::new(
                    "Tx",
                    "the registration's inbox is on another database than this Tx's \
                 (Tx<Postgres> behind an SQLite inbox, or the reverse)",
                )
            })
    }
}
