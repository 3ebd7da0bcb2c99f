//! An open Pulsar subscription: individual acks and nacks, held delayed redeliveries, and
//! the attempt count kept per message id.

use std::future::{Future, poll_fn};
use std::ops::ControlFlow;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use futures_util::StreamExt;
use pulsar::TokioExecutor;
use pulsar::consumer::{Consumer, ConsumerBuilder, Message};
use pulsar::message::Payload;
use pulsar::message::proto::MessageIdData;
use ruststream_core::hash::SpreadMap;
use ruststream_core::{
    AckError, AddressNames, Attempt, Delivery, Headers, Held, Metadata, Settle, SubscribeError,
    Subscription,
};
use tokio::time::Instant;

/// The shortest time between two subscriptions of one registration.
const RESUBSCRIBE_PAUSE: std::time::Duration = std::time::Duration::from_secs(1);

/// The topic and id of one delivery.
#[derive(Debug, Clone)]
pub struct PulsarReceipt {
    topic: Arc<str>,
    id: MessageIdData,
}

type IdKey = (u64, u64, i32, i32);

fn key(id: &MessageIdData) -> IdKey {
    (
        id.ledger_id,
        id.entry_id,
        id.partition.unwrap_or(-1),
        id.batch_index.unwrap_or(-1),
    )
}

/// A consumer id for the next subscribe: a number drawn once per process in the high
/// half, so that consumers of several processes (containers all running as pid 1
/// included) do not share one. The protocol scopes ids to a connection, and the client
/// counts from 0 in every process; pulsar-lite keys consumers by id across connections
/// and closes the connection of a second process's consumer 0.
pub(crate) fn consumer_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static PROCESS: std::sync::LazyLock<u64> = std::sync::LazyLock::new(|| {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u32(std::process::id());
        hasher.finish() << 32
    });
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    *PROCESS | u64::from(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
}

/// A subscribe on its way (see `PulsarSubscription::resubscribe`).
type Subscribing = std::pin::Pin<
    Box<dyn Future<Output = Result<Consumer<Vec<u8>, TokioExecutor>, pulsar::Error>> + Send>,
>;

/// An open subscription. Only its driver task calls it, so every ack, nack and held
/// redelivery is made by the driver task (P3).
pub struct PulsarSubscription {
    /// None after the client's consumer stream ended (the connection died and the client
    /// gave up on it): `next` subscribes again.
    consumer: Option<Consumer<Vec<u8>, TokioExecutor>>,
    /// How to subscribe again.
    builder: ConsumerBuilder<TokioExecutor>,
    /// When the last consumer was built: a stream that keeps ending (a terminated topic)
    /// is subscribed to again at most once a second.
    subscribed_at: Instant,
    /// A subscribe on its way: kept, so that a fetch the runtime drops halfway leaves it
    /// to the next call instead of leaving a consumer registered with the broker that
    /// nobody reads (one an `Exclusive` subscription would then refuse the next for).
    subscribing: Option<Subscribing>,
    address: Arc<str>,
    counts: bool,
    max_attempts: Option<u32>,
    attempts: SpreadMap<IdKey, u32>,
    held: Held<Instant, PulsarReceipt>,
    /// The held waits of a lost consumer, by message id: when each is due.
    waits: SpreadMap<IdKey, Instant>,
    topics: AddressNames,
}

impl std::fmt::Debug for PulsarSubscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PulsarSubscription")
            .field("address", &self.address)
            .finish()
    }
}

impl PulsarSubscription {
    pub(crate) fn new(
        consumer: Consumer<Vec<u8>, TokioExecutor>,
        builder: ConsumerBuilder<TokioExecutor>,
        address: &str,
        counts: bool,
        max_attempts: Option<u32>,
    ) -> Self {
        Self {
            consumer: Some(consumer),
            builder,
            subscribed_at: Instant::now(),
            subscribing: None,
            address: Arc::from(address),
            counts,
            max_attempts,
            attempts: SpreadMap::default(),
            held: Held::new(),
            waits: SpreadMap::default(),
            topics: AddressNames::default(),
        }
    }

    /// A message as a delivery, its attempt counted where the subscription type counts.
    fn delivery(
        &mut self,
        topic: &Arc<str>,
        id: &MessageIdData,
        payload: &mut Payload,
        slot: &mut Delivery,
    ) {
        // The message is dropped after this: its parts are taken, not cloned.
        let metadata = &mut payload.metadata;
        let headers: Headers = if metadata.properties.is_empty() {
            Headers::new()
        } else {
            std::mem::take(&mut metadata.properties)
                .into_iter()
                .map(|kv| (kv.key, Bytes::from(kv.value)))
                .collect()
        };
        let attempt = if self.counts {
            let seen = self.attempts.entry(key(id)).or_insert(0);
            *seen += 1;
            Attempt::from_subscription(*seen)
        } else {
            // Exclusive and Failover deliver every message with count 0 (P4).
            Attempt::from_subscription(1)
        };
        let mut position = Metadata::sequence(metadata.sequence_id)
            .with_timestamp_ms(i64::try_from(metadata.publish_time).ok());
        position.ledger_entry = Some(key(id));
        let key = metadata.partition_key.take().map(Bytes::from);
        slot.refill(topic, Bytes::from(std::mem::take(&mut payload.data)))
            .set_headers(headers)
            .set_key(key)
            .set_metadata(position)
            .set_attempt(attempt);
    }

    /// A message from the client written into `slot`, with its receipt; `None` when it
    /// is held again instead (see below). The client's message is large (its metadata):
    /// only its data is moved out of it, not the whole of it from one binding to the next.
    #[inline(always)]
    fn arrived(
        &mut self,
        mut message: Message<Vec<u8>>,
        slot: &mut Delivery,
    ) -> Option<PulsarReceipt> {
        let topic = self.topics.get(&message.topic);
        // Taken, not cloned: the message is dropped below.
        let id = std::mem::take(&mut message.message_id.id);
        // (Empty unless a connection was lost: no lookup per message then.)
        if !self.waits.is_empty()
            && let Some(due) = self.waits.remove(&key(&id))
            && due > Instant::now()
        {
            // Held when the last connection died, and back before its delay is over.
            self.held.hold(due, PulsarReceipt { topic, id });
            return None;
        }
        self.delivery(&topic, &id, &mut message.payload, slot);
        Some(PulsarReceipt { topic, id })
    }

    /// Subscribes again after the last consumer's stream ended (a subscribe cut short is
    /// finished by the next call).
    async fn resubscribe(&mut self) -> Result<(), SubscribeError> {
        let subscribing = match &mut self.subscribing {
            Some(subscribing) => subscribing,
            None => {
                tokio::time::sleep_until(self.subscribed_at + RESUBSCRIBE_PAUSE).await;
                self.subscribed_at = Instant::now();
                let builder = self.builder.clone().with_consumer_id(consumer_id());
                self.subscribing
                    .insert(Box::pin(async move { builder.build::<Vec<u8>>().await }))
            }
        };
        let built = subscribing.await;
        self.subscribing = None;
        let consumer = built
            .map_err(|e| SubscribeError::new(&*self.address, format!("subscribing again: {e}")))?;
        tracing::info!(address = &*self.address, "subscribed again");
        self.consumer = Some(consumer);
        Ok(())
    }

    /// The consumer's stream ended: what it delivered and nobody acknowledged, the broker
    /// delivers again to the next consumer. The held waits are remembered by message id,
    /// so a held message that comes back early is held again for the rest of its delay
    /// instead of reaching the handler.
    fn lost_consumer(&mut self) {
        tracing::warn!(
            address = &*self.address,
            held = self.held.len(),
            "the consumer's stream ended (connection lost); subscribing again"
        );
        self.consumer = None;
        let now = Instant::now();
        self.waits.retain(|_, due| *due > now);
        for (due, receipt) in self.held.drain() {
            self.waits.insert(key(&receipt.id), due);
        }
    }

    /// Nacks the earliest held wait if it is due; whether one was. Popped only once the
    /// nack is done: a call cut short by the driver leaves it held, for the next call.
    async fn nack_due(&mut self) -> bool {
        let Some(first) = self.held.due_at(Instant::now()) else {
            return false;
        };
        let receipt = first.clone();
        let nacked = self.nack(receipt).await;
        self.held.pop();
        if let Err(e) = nacked {
            tracing::warn!(address = &*self.address, error = %e, "nack after retry_after failed");
        }
        true
    }

    /// The current consumer, for a settlement. None after the connection was lost: the
    /// settlement fails at once (the broker delivers the message again) rather than
    /// waiting for a new subscription, which only `next` makes, where a stop can cut it.
    /// The fetch, for both `next_into` (the driver's context) and `next_now` (a context
    /// that wakes no one): one message from the consumer, written into `slot` when it
    /// is a delivery. A message held again for the rest of its delay is
    /// [`Taken::Held`]: the caller looks at the held deliveries' timers before going on.
    #[inline(always)]
    fn take(&mut self, cx: &mut Context<'_>, slot: &mut Delivery) -> Poll<Taken> {
        let Some(consumer) = self.consumer.as_mut() else {
            return Poll::Ready(Taken::Lost);
        };
        Poll::Ready(match std::task::ready!(consumer.poll_next_unpin(cx)) {
            Some(Ok(message)) => match self.arrived(message, slot) {
                Some(receipt) => Taken::Delivery(Ok(receipt)),
                None => Taken::Held,
            },
            Some(Err(e)) => Taken::Delivery(Err(SubscribeError::new(&*self.address, e))),
            None => {
                self.lost_consumer();
                Taken::Lost
            }
        })
    }

    fn current(&mut self) -> Result<&mut Consumer<Vec<u8>, TokioExecutor>, AckError> {
        self.consumer.as_mut().ok_or_else(|| {
            AckError::failed(
                "the consumer's connection was lost; the broker delivers the message again",
            )
        })
    }

    async fn nack(&mut self, receipt: PulsarReceipt) -> Result<(), AckError> {
        if self.max_attempts.is_some_and(|max| {
            self.attempts
                .get(&key(&receipt.id))
                .is_some_and(|n| *n >= max)
        }) {
            // The client's dead-letter policy takes it on its next arrival: stop counting.
            self.attempts.remove(&key(&receipt.id));
        }
        self.current()?
            .nack_with_id(&receipt.topic, receipt.id)
            .await
            .map_err(AckError::failed)
    }
}

/// What one message from the consumer came to.
enum Taken {
    /// A delivery written into the slot, or the consumer's error.
    Delivery(Result<PulsarReceipt, SubscribeError>),
    /// A message come back early, held again for the rest of its delay.
    Held,
    /// No consumer, or its stream ended: subscribe again.
    Lost,
}

impl Subscription for PulsarSubscription {
    type Receipt = PulsarReceipt;

    async fn next_into(
        &mut self,
        slot: &mut Delivery,
    ) -> Option<Result<PulsarReceipt, SubscribeError>> {
        loop {
            // Held deliveries whose delay is over are nacked first, by this task (P1, P3).
            // Nothing held is the common case: then no clock read, no call.
            if !self.held.is_empty() && self.nack_due().await {
                continue;
            }
            if self.consumer.is_none() {
                match self.resubscribe().await {
                    Ok(()) => continue,
                    // The driver logs it, pauses, and asks again.
                    Err(e) => return Some(Err(e)),
                }
            }
            let mut due = pin!(self.held.next_due().map(tokio::time::sleep_until));
            let taken = poll_fn(|cx| {
                if let Poll::Ready(taken) = self.take(cx, slot) {
                    return Poll::Ready(Some(taken));
                }
                // A held delivery's delay is over: it is nacked first.
                match due.as_mut().as_pin_mut().map(|sleep| sleep.poll(cx)) {
                    Some(Poll::Ready(())) => Poll::Ready(None),
                    _ => Poll::Pending,
                }
            });
            // Otherwise a delay is over, a message was held again (its timer is looked
            // at), or the consumer was lost (subscribed again above).
            if let Some(Taken::Delivery(taken)) = taken.await {
                return Some(taken);
            }
        }
    }

    /// A message the client has at once, when nothing held waits for its delay (then
    /// `next_into` nacks what is due first) and the consumer is there.
    /// A queued message is handed out in one poll: pinned by `tests/client_assumptions.rs`.
    fn next_now(
        &mut self,
        slot: &mut Delivery,
    ) -> Poll<Option<Result<PulsarReceipt, SubscribeError>>> {
        // Nothing is left waiting on this context: when it finds nothing, `next_into`
        // polls again with the driver's own.
        if self.held.is_empty()
            && let Poll::Ready(Taken::Delivery(taken)) =
                self.take(&mut Context::from_waker(Waker::noop()), slot)
        {
            return Poll::Ready(Some(taken));
        }
        // Something held (`next_into` nacks what is due first), nothing at once, or the
        // consumer gone (`next_into` subscribes again).
        Poll::Pending
    }

    async fn settle(&mut self, receipt: PulsarReceipt, settle: Settle) -> Result<(), AckError> {
        let receipt = match self.settle_now(receipt, settle) {
            ControlFlow::Break(result) => return result,
            ControlFlow::Continue(receipt) => receipt,
        };
        match settle {
            Settle::Nothing => Ok(()),
            // `settle_now` acks while the consumer is there.
            Settle::Ack | Settle::Drop => {
                self.attempts.remove(&key(&receipt.id));
                self.current().map(drop)
            }
            Settle::Redeliver => self.nack(receipt).await,
            Settle::RedeliverAfter(delay) => {
                // Held unacknowledged here; `next` nacks it when the delay is over. A stop
                // before then loses the wait, not the message (P7).
                self.held.hold(Instant::now() + delay, receipt);
                Ok(())
            }
            Settle::DeadLetter => Err(AckError::Unsupported {
                verb: "dead letter",
            }),
        }
    }

    /// An ack or a drop: the client's ack is a message on an unbounded channel to its
    /// connection's task, sent in its first poll (pinned by `tests/client_assumptions.rs`). (Were it ever to wait, the ack is
    /// reported failed, and the broker delivers the message again: its id went with it.)
    fn settle_now(
        &mut self,
        receipt: PulsarReceipt,
        settle: Settle,
    ) -> ControlFlow<Result<(), AckError>, PulsarReceipt> {
        let (Settle::Ack | Settle::Drop, Some(consumer)) = (settle, self.consumer.as_mut()) else {
            return ControlFlow::Continue(receipt);
        };
        self.attempts.remove(&key(&receipt.id));
        let ack = pin!(consumer.ack_with_id(&receipt.topic, receipt.id));
        ControlFlow::Break(match ack.poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(result) => result.map_err(AckError::failed),
            Poll::Pending => Err(AckError::failed(
                "the client's ack queue did not take the ack at once; the broker delivers the message again",
            )),
        })
    }

    fn holding(&self) -> usize {
        self.held.len()
    }

    /// At `max_in_flight`, and while a delivery waits for its lane, the driver stops
    /// calling `next`: held waits that come due are nacked here (which frees room, G5),
    /// so the broker delivers them again on time, to another consumer of the
    /// subscription too; without it they would wait for the next fetch, or forever.
    async fn idle(&mut self) {
        let Some(due) = self.held.next_due() else {
            return std::future::pending().await;
        };
        tokio::time::sleep_until(due).await;
        self.nack_due().await;
    }

    async fn close(self) {
        let Some(mut consumer) = self.consumer else {
            return;
        };
        if let Err(e) =
            tokio::time::timeout(std::time::Duration::from_secs(10), consumer.close()).await
        {
            tracing::warn!(address = &*self.address, error = %e, "closing the consumer timed out");
        }
    }
}
