//! Batches: a handler that takes many messages at once and settles each.
//!
//! [`on_batch`](crate::on_batch) binds a handler whose first argument is a [`Batch<T>`]: up to
//! [`max_batch`](crate::Registration::max_batch) messages of one lane, decoded one by one, each
//! an [`Item`] with its delivery (attempt, key, headers, broker position). It returns
//! a [`BatchOutcome`]: one [`HandlerOutcome`] per message, so each message settles
//! exactly as it would alone (attempts, `max_attempts`, dead letters and retry copies are
//! per message).
//!
//! ```
//! use ruststream::{App, BatchOutcome, HandlerOutcome, memory::MemoryBroker, on_batch};
//! use ruststream::batch::Batch;
//! use std::time::Duration;
//!
//! #[derive(serde::Deserialize)]
//! struct Order { id: u64 }
//!
//! async fn save_all(batch: Batch<Order>) -> BatchOutcome {
//!     // One bulk write for the whole batch; order 0 is refused.
//!     let mut outcome = BatchOutcome::ack_all();
//!     for (i, item) in batch.iter().enumerate() {
//!         if item.value.id == 0 {
//!             outcome.set(i, HandlerOutcome::drop());
//!         }
//!     }
//!     outcome
//! }
//!
//! let broker = MemoryBroker::new();
//! let app = App::new().register(
//!     on_batch(broker.topic("orders"), save_all)
//!         .max_batch(500)
//!         .max_wait(Duration::from_millis(20)),
//! );
//! ```
//!
//! A batch is cut when it holds `max_batch` messages or `max_wait` after its first
//! message, whichever comes first. It is formed per lane: a key's messages share a lane
//! and keep their order within a batch and across batches (a lane runs one batch at a
//! time). `max_in_flight` counts messages. A message that does not decode follows the
//! registration's failure policy alone; the handler gets the rest, never an empty batch.
//! The handler deadline covers the whole call; an `Err`, a panic or the deadline count as
//! `retry()` for every message of the batch.

use std::future::Future;
use std::marker::PhantomData;
use std::ops::Deref;

use std::sync::Arc;

use bytes::Bytes;
use ruststream_core::{Attempt, Cause, Delivery, HandlerOutcome, Headers};
use serde::de::DeserializeOwned;

use crate::codec::{Codec, Json};
use crate::extract::{FromDelivery, Incoming, Meta, Rejection};
use crate::middleware::Completion;
use crate::state::StateMap;

/// The messages of one batch, in the order they were read, each decoded from its payload
/// with codec `C` (JSON unless named). Derefs to a slice of [`Item`]s.
#[derive(Debug)]
pub struct Batch<T, C = Json> {
    items: Vec<Item<T>>,
    codec: PhantomData<fn() -> C>,
}

/// One message of a batch: its decoded value, and the delivery it came in (its attempt,
/// key, headers and broker position, each read only when asked: reading a Kafka
/// record's headers costs about a thousand instructions).
///
/// An item kept past the handler's call keeps the batch's deliveries (and the client's
/// buffers they hold) alive until it is dropped; the runtime settles with copies then.
#[derive(Clone)]
pub struct Item<T> {
    /// The decoded payload.
    pub value: T,
    members: Arc<Members>,
    index: usize,
}

/// The deliveries of one batch call, shared by its items while the call runs.
// The boxes travel back to the lanes for reuse: boxed on purpose.
#[allow(clippy::vec_box)]
pub(crate) struct Members(pub(crate) Vec<Box<Incoming>>);

/// The deliveries of a call that did not decode: their places in it, in order, and why.
pub(crate) type Refused = Vec<(usize, Rejection)>;

impl<T> Item<T> {
    /// The delivery as received.
    pub fn delivery(&self) -> &Delivery {
        self.members.0[self.index].delivery()
    }

    /// Which attempt this is (1 for the first delivery).
    pub fn attempt(&self) -> Attempt {
        self.delivery().attempt()
    }

    /// The key, if any.
    pub fn key(&self) -> Option<&Bytes> {
        self.delivery().key()
    }

    /// The headers.
    pub fn headers(&self) -> &Headers {
        self.delivery().headers()
    }

    /// Where and how it arrived, as the [`Meta`] extractor gives it.
    pub fn meta(&self) -> Meta {
        Meta::of(self.delivery())
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for Item<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Item")
            .field("value", &self.value)
            .field("delivery", self.delivery())
            .finish()
    }
}

impl<T, C> Batch<T, C> {
    /// The items, to keep.
    pub fn into_items(self) -> Vec<Item<T>> {
        self.items
    }

    /// The decoded values, in order.
    pub fn values(&self) -> impl ExactSizeIterator<Item = &T> {
        self.items.iter().map(|item| &item.value)
    }
}

impl<T, C> Deref for Batch<T, C> {
    type Target = [Item<T>];
    fn deref(&self) -> &[Item<T>] {
        &self.items
    }
}

impl<T, C> IntoIterator for Batch<T, C> {
    type Item = Item<T>;
    type IntoIter = std::vec::IntoIter<Item<T>>;
    fn into_iter(self) -> Self::IntoIter {
        self.items.into_iter()
    }
}

impl<'b, T, C> IntoIterator for &'b Batch<T, C> {
    type Item = &'b Item<T>;
    type IntoIter = std::slice::Iter<'b, Item<T>>;
    fn into_iter(self) -> Self::IntoIter {
        self.items.iter()
    }
}

/// What a batch handler answers: one outcome per message, by its index in the
/// [`Batch`]. Start from one outcome for all and [`set`](Self::set) the exceptions, or
/// give each with [`each`](Self::each). A message left without an outcome (a list
/// shorter than the batch) is retried, and the registration logs an error naming it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchOutcome {
    all: Option<HandlerOutcome>,
    each: Vec<Option<HandlerOutcome>>,
}

impl BatchOutcome {
    /// `outcome` for every message.
    pub fn all(outcome: HandlerOutcome) -> Self {
        Self {
            all: Some(outcome),
            each: Vec::new(),
        }
    }

    /// `ack()` for every message.
    pub fn ack_all() -> Self {
        Self::all(HandlerOutcome::ack())
    }

    /// `retry()` for every message.
    pub fn retry_all() -> Self {
        Self::all(HandlerOutcome::retry())
    }

    /// `drop()` for every message.
    pub fn drop_all() -> Self {
        Self::all(HandlerOutcome::drop())
    }

    /// One outcome per message, in the batch's order.
    pub fn each(outcomes: impl IntoIterator<Item = HandlerOutcome>) -> Self {
        Self {
            all: None,
            each: outcomes.into_iter().map(Some).collect(),
        }
    }

    /// Sets the outcome of the message at `index`.
    pub fn set(&mut self, index: usize, outcome: HandlerOutcome) {
        if self.each.len() <= index {
            self.each.resize(index + 1, None);
        }
        self.each[index] = Some(outcome);
    }

    /// [`set`](Self::set), as a builder.
    #[must_use]
    pub fn with(mut self, index: usize, outcome: HandlerOutcome) -> Self {
        self.set(index, outcome);
        self
    }

    /// The outcome of the message at `index`, if one was given.
    pub fn get(&self, index: usize) -> Option<HandlerOutcome> {
        self.each.get(index).copied().flatten().or(self.all)
    }

    /// Whether every one of the first `count` messages has an outcome.
    pub(crate) fn covers(&self, count: usize) -> bool {
        self.all.is_some()
            || (self.each.len() >= count && self.each[..count].iter().all(Option::is_some))
    }
}

/// What a batch handler may return: a [`BatchOutcome`], or `Result<BatchOutcome, E>`
/// with `E` an error type (an `Err` is `retry()` for every message).
pub trait IntoBatchOutcome {
    /// The outcome, or the failure every message of the batch shares.
    fn into_batch_outcome(self) -> Result<BatchOutcome, Completion>;
}

impl IntoBatchOutcome for BatchOutcome {
    fn into_batch_outcome(self) -> Result<BatchOutcome, Completion> {
        Ok(self)
    }
}

impl<E> IntoBatchOutcome for Result<BatchOutcome, E>
where
    E: Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
{
    fn into_batch_outcome(self) -> Result<BatchOutcome, Completion> {
        self.map_err(|e| Completion::Failed(Cause::new(e)))
    }
}

/// An async function usable as a batch handler: a [`Batch<T, C>`] first, then up to four
/// arguments taken from the registration rather than from one message (`State<T>`,
/// `Publisher`), returning a [`BatchOutcome`] or `Result<BatchOutcome, E>`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a ruststream batch handler",
    label = "not a batch handler",
    note = "a batch handler is an `async fn(Batch<T>, ...)` whose further arguments (up to 4) are registration-wide extractors such as State<T> or Publisher, returning `BatchOutcome` or `Result<BatchOutcome, E>`"
)]
pub trait BatchHandler<T, C, Args>: Send + Sync + 'static {
    /// Runs the function over `batch`; the further arguments are extracted from `first`,
    /// the batch's first delivery.
    fn call<'a>(
        &'a self,
        batch: Batch<T, C>,
        first: &'a Incoming,
    ) -> impl Future<Output = Result<BatchOutcome, Completion>> + Send + 'a;

    /// What the further arguments need from the app, checked at startup.
    fn requirements(state: &StateMap) -> Vec<String>;
}

macro_rules! impl_batch_handler {
    ($($arg:ident),*) => {
        impl<F, Fut, R, T, C, $($arg,)*> BatchHandler<T, C, ($($arg,)*)> for F
        where
            F: Fn(Batch<T, C>, $($arg),*) -> Fut + Send + Sync + 'static,
            Fut: Future<Output = R> + Send,
            R: IntoBatchOutcome,
            T: Send + 'static,
            C: 'static,
            $($arg: FromDelivery,)*
        {
            #[allow(non_snake_case, unused_variables, clippy::redundant_closure_call)]
            fn call<'a>(
                &'a self,
                batch: Batch<T, C>,
                first: &'a Incoming,
            ) -> impl Future<Output = Result<BatchOutcome, Completion>> + Send + 'a {
                let args = (|| Ok::<_, Rejection>(($($arg::from_delivery(first)?,)*)))();
                async move {
                    match args {
                        Ok(($($arg,)*)) => (self)(batch, $($arg),*).await.into_batch_outcome(),
                        Err(rejection) => Err(Completion::Rejected(rejection)),
                    }
                }
            }

            #[allow(unused_mut, unused_variables)]
            fn requirements(state: &StateMap) -> Vec<String> {
                let mut missing = Vec::new();
                $(missing.extend($arg::requirement(state));)*
                missing
            }
        }
    };
}

impl_batch_handler!();
impl_batch_handler!(T1);
impl_batch_handler!(T1, T2);
impl_batch_handler!(T1, T2, T3);
impl_batch_handler!(T1, T2, T3, T4);

/// A batch handler as the runtime calls it (what [`on_batch`](crate::on_batch) makes; a
/// service never names it).
#[doc(hidden)]
pub struct BatchService<H, T, C, Args> {
    handler: H,
    _types: PhantomData<fn(T, C, Args)>,
}

impl<H, T, C, Args> BatchService<H, T, C, Args> {
    pub(crate) fn new(handler: H) -> Self {
        Self {
            handler,
            _types: PhantomData,
        }
    }
}

/// What the runtime asks of a batch registration's handler.
pub(crate) trait CallBatch: Send + Sync + 'static {
    /// Decodes each of `members` (in `refused`, the place and refusal of each that does
    /// not decode) and makes the call over those that did; no call when none did.
    fn call_batch<'a>(
        &'a self,
        members: &'a Arc<Members>,
        refused: &mut Refused,
    ) -> Option<impl Future<Output = Result<BatchOutcome, Completion>> + Send + use<'a, Self>>;
}

impl<H, T, C, Args> CallBatch for BatchService<H, T, C, Args>
where
    H: BatchHandler<T, C, Args>,
    T: DeserializeOwned + Send + 'static,
    C: Codec,
    Args: 'static,
{
    fn call_batch<'a>(
        &'a self,
        members: &'a Arc<Members>,
        refused: &mut Refused,
    ) -> Option<
        impl Future<Output = Result<BatchOutcome, Completion>> + Send + use<'a, H, T, C, Args>,
    > {
        let mut items = Vec::with_capacity(members.0.len());
        let mut first = None;
        refused.clear();
        for (index, incoming) in members.0.iter().enumerate() {
            match decode::<T, C>(incoming) {
                Ok(value) => {
                    first.get_or_insert(&**incoming);
                    items.push(Item {
                        value,
                        members: Arc::clone(members),
                        index,
                    });
                }
                Err(rejection) => refused.push((index, rejection)),
            }
        }
        let batch = Batch {
            items,
            codec: PhantomData,
        };
        Some(self.handler.call(batch, first?))
    }
}

fn decode<T: DeserializeOwned, C: Codec>(incoming: &Incoming) -> Result<T, Rejection> {
    C::decode(incoming.delivery().payload_slice()).map_err(|error| {
        Rejection::new(
            std::any::type_name::<Batch<T, C>>(),
            Cause::context(format!("{} decode failed", C::NAME), error),
        )
    })
}

/// The messages a batch holds at most unless set.
pub const DEFAULT_MAX_BATCH: usize = 100;

/// How long a batch waits for more after its first message unless set.
pub const DEFAULT_MAX_WAIT: std::time::Duration = std::time::Duration::from_millis(20);

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::memory::MemoryBroker;
    use crate::{App, StartError, on_batch};

    #[test]
    fn an_outcome_for_all_with_exceptions_by_index() {
        let outcome = BatchOutcome::ack_all().with(2, HandlerOutcome::retry());
        assert_eq!(outcome.get(0), Some(HandlerOutcome::ack()));
        assert_eq!(outcome.get(2), Some(HandlerOutcome::retry()));
        assert_eq!(outcome.get(9), Some(HandlerOutcome::ack()));
        let each = BatchOutcome::each([HandlerOutcome::drop(), HandlerOutcome::ack()]);
        assert_eq!(each.get(0), Some(HandlerOutcome::drop()));
        assert_eq!(each.get(1), Some(HandlerOutcome::ack()));
        assert_eq!(
            each.get(2),
            None,
            "past the list: no outcome (retried, logged)"
        );
        let mut set = BatchOutcome::each([]);
        set.set(1, HandlerOutcome::retry_after(Duration::from_secs(1)));
        assert_eq!(set.get(0), None);
        assert_eq!(
            set.get(1),
            Some(HandlerOutcome::retry_after(Duration::from_secs(1)))
        );
    }

    async fn ack_all(_: Batch<u32>) -> BatchOutcome {
        BatchOutcome::ack_all()
    }

    #[tokio::test]
    async fn e4_batch_limits_out_of_bounds_are_refused_at_start() {
        let broker = MemoryBroker::new();
        let refused = App::new()
            .register(
                on_batch(broker.topic("a"), ack_all)
                    .name("empty")
                    .max_batch(0),
            )
            .register(
                on_batch(broker.topic("b"), ack_all)
                    .name("unfillable")
                    .max_in_flight(10)
                    .max_batch(11),
            )
            .start()
            .await;
        let Err(StartError::Invalid(violations)) = refused else {
            panic!("started with batch limits out of bounds");
        };
        let rules: Vec<(&str, &str)> = violations
            .iter()
            .map(|v| (v.registration.as_str(), v.rule.as_str()))
            .collect();
        assert!(
            rules.contains(&("empty", "max_batch must be at least 1")),
            "{rules:?}"
        );
        assert!(
            rules.iter().any(|(name, rule)| *name == "unfillable"
                && rule.contains("max_batch(11) is above max_in_flight(10)")),
            "{rules:?}"
        );
    }
}
