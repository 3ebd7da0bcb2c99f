//! The inbox for batch handlers: one transaction per batch, recording every message's
//! id in it first, committed only when every new message of the batch is done.

use std::sync::Arc;

use ruststream::batch::Batch;
use ruststream::core::OutcomeKind;
use ruststream::extract::{FromDelivery, Incoming, Rejection, StateMap};
use ruststream::{BatchOutcome, HandlerOutcome};
use sqlx::{Postgres, Transaction};

use crate::backend::Backend;
use crate::inbox::{Inbox, id_of};

/// The inbox of a batch registration (`on_batch`), an extractor: the app holds the
/// [`Inbox`] as state (`App::state(inbox)`), and the handler opens one transaction for
/// its batch with [`begin`](Self::begin), writes through it what the messages
/// [`fresh`](BatchTx::fresh) ask for, and ends with [`commit`](BatchTx::commit), which
/// says what each message's outcome is:
///
/// - a message seen before (its id recorded by an earlier commit): `ack()`, skipped;
/// - a message without an id (see [`Inbox`]): `retry()`, with an ERROR saying why (never
///   applied; at `max_attempts` it goes to the dead letter like any retried message);
/// - the new ones: the handler's outcome when it is `ack()` or `drop()` for every one of
///   them, and the transaction commits first; if any of them is to be retried, the
///   transaction rolls back whole and every new message is retried (its effects were
///   rolled back with the others').
///
/// An error, a panic or the deadline before the commit rolls it back (the transaction is
/// dropped) and retries the batch, as for any batch handler.
///
/// ```no_run
/// # async fn example(pool: sqlx::PgPool) {
/// use ruststream::{App, BatchOutcome, memory::MemoryBroker, on_batch};
/// use ruststream::batch::Batch;
/// use ruststream_sql::{BatchInbox, Inbox};
///
/// async fn credit(batch: Batch<i64>, inbox: BatchInbox) -> Result<BatchOutcome, sqlx::Error> {
///     let mut tx = inbox.begin(&batch).await?;
///     for (i, item) in batch.iter().enumerate() {
///         if tx.fresh(i) {
///             sqlx::query("UPDATE account SET balance = balance + $1 WHERE id = 1")
///                 .bind(item.value)
///                 .execute(tx.conn())
///                 .await?;
///         }
///     }
///     tx.commit(BatchOutcome::ack_all()).await
/// }
///
/// let broker = MemoryBroker::new();
/// let app = App::new()
///     .state(Inbox::new(pool))
///     .register(on_batch(broker.topic("credits"), credit));
/// # }
/// ```
#[derive(Debug)]
pub struct BatchInbox<DB: Backend = Postgres> {
    inbox: Arc<Inbox<DB>>,
    registration: Arc<str>,
    transport: &'static str,
}

/// Where a message of the batch stands in the inbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Standing {
    New,
    Seen,
    NoId,
}

/// A batch's inbox transaction, from [`BatchInbox::begin`].
#[derive(Debug)]
pub struct BatchTx<DB: Backend = Postgres> {
    tx: Transaction<'static, DB>,
    standing: Vec<Standing>,
    inbox: Arc<Inbox<DB>>,
    registration: Arc<str>,
}

impl<DB: Backend> BatchInbox<DB> {
    /// Begins the batch's transaction and records the id of each message in it; tells
    /// which are new through [`BatchTx::fresh`].
    pub async fn begin<T, C>(&self, batch: &Batch<T, C>) -> Result<BatchTx<DB>, sqlx::Error> {
        let mut tx = self.inbox.pool().begin().await?;
        let mut standing = Vec::with_capacity(batch.len());
        for item in batch.iter() {
            let id = match id_of(item.delivery(), self.transport) {
                Ok(id) => id,
                Err(why) => {
                    let address = item.delivery().address();
                    tracing::error!(registration = &*self.registration, address, %why, "inbox: the message has no id; retried, never applied");
                    standing.push(Standing::NoId);
                    continue;
                }
            };
            let new = DB::record(&mut tx, &self.registration, &id).await?;
            standing.push(if new { Standing::New } else { Standing::Seen });
        }
        Ok(BatchTx {
            tx,
            standing,
            inbox: Arc::clone(&self.inbox),
            registration: Arc::clone(&self.registration),
        })
    }
}

impl<DB: Backend> BatchTx<DB> {
    /// Whether message `index` of the batch is new: the handler applies it. `false`
    /// for one seen before (skipped) and one without an id (retried).
    pub fn fresh(&self, index: usize) -> bool {
        self.standing.get(index) == Some(&Standing::New)
    }

    /// The transaction's connection, for the handler's writes.
    pub fn conn(&mut self) -> &mut DB::Connection {
        &mut self.tx
    }

    /// Ends the batch's transaction by `outcome` (what the handler answers for the new
    /// messages), and returns each message's outcome: see [`BatchInbox`].
    pub async fn commit(self, outcome: BatchOutcome) -> Result<BatchOutcome, sqlx::Error> {
        let answer = |i: usize| outcome.get(i).unwrap_or_else(HandlerOutcome::ack);
        let kept = |o: HandlerOutcome| matches!(o.kind(), OutcomeKind::Ack | OutcomeKind::Drop);
        let all_kept = (0..self.standing.len())
            .filter(|&i| self.standing[i] == Standing::New)
            .all(|i| kept(answer(i)));
        let each = self
            .standing
            .iter()
            .enumerate()
            .map(|(i, standing)| match standing {
                Standing::Seen => HandlerOutcome::ack(),
                Standing::NoId => HandlerOutcome::retry(),
                Standing::New if all_kept => answer(i),
                Standing::New if kept(answer(i)) => HandlerOutcome::retry(),
                Standing::New => answer(i),
            });
        let each = BatchOutcome::each(each.collect::<Vec<_>>());
        if all_kept {
            self.tx.commit().await?;
        } else {
            self.tx.rollback().await?;
        }
        let seen = self.standing.iter().filter(|s| **s == Standing::Seen);
        self.inbox
            .count_skips(&self.registration, seen.count() as u64);
        Ok(each)
    }
}

impl<DB: Backend> Clone for BatchInbox<DB> {
    fn clone(&self) -> Self {
        Self {
            inbox: Arc::clone(&self.inbox),
            registration: Arc::clone(&self.registration),
            transport: self.transport,
        }
    }
}

impl<DB: Backend> FromDelivery for BatchInbox<DB> {
    fn from_delivery(incoming: &Incoming) -> Result<Self, Rejection> {
        let context = incoming.context();
        let inbox = context.state().get::<Inbox<DB>>().ok_or_else(|| {
            Rejection::new(
                "BatchInbox",
                "the app has no Inbox: App::state(Inbox::new(pool))",
            )
        })?;
        Ok(Self {
            inbox,
            registration: Arc::from(context.registration()),
            transport: context.transport(),
        })
    }

    fn requirement(state: &StateMap) -> Option<String> {
        (!state.contains::<Inbox<DB>>()).then(|| {
            "the handler takes a BatchInbox but the app was given no Inbox \
             (App::state(Inbox::new(pool)))"
                .to_owned()
        })
    }
}
