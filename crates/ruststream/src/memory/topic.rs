//! The memory broker's descriptor and subscription.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::task::Poll;

use ruststream_core::{
    AckError, Attempt, Capabilities, DeadLetters, Declaration, DelayedRedelivery, Delivery,
    Descriptor, MalformedRetryCount, Metadata, Publish, Settle, SubscribeError, Subscription, Verb,
};

use super::MemoryBroker;
use super::group::{Group, Settled, Stored};

/// A subscription on a memory address: every group gets every message; subscriptions of
/// one group compete.
#[derive(Debug, Clone)]
pub struct MemoryTopic {
    broker: MemoryBroker,
    address: String,
    group: String,
    capabilities: Capabilities,
}

/// The memory broker's own: it counts deliveries, holds a delayed one, redelivers.
pub(crate) const NATIVE: Capabilities = Capabilities::NOTHING
    .with_ack(Verb::Native)
    .with_drop(Verb::Native)
    .with_redeliver(Verb::Native)
    .with_delayed_redelivery(DelayedRedelivery::Native)
    .with_native_count(true)
    .with_dead_letters(DeadLetters::Runtime)
    .with_holds_original(true)
    .with_redeliver_in_place(false)
    .with_rewinds(false);

/// [`MemoryTopic::runtime_retries`]: as Kafka `Commit::Tracked`.
pub(crate) const RUNTIME_RETRIES: Capabilities = Capabilities::NOTHING
    .with_ack(Verb::Native)
    .with_drop(Verb::AsAck)
    .with_redeliver(Verb::Native)
    .with_delayed_redelivery(DelayedRedelivery::Unsupported)
    .with_native_count(false)
    .with_dead_letters(DeadLetters::Runtime)
    .with_holds_original(true)
    .with_redeliver_in_place(true)
    .with_rewinds(false);

impl MemoryTopic {
    pub(crate) fn new(broker: MemoryBroker, address: String) -> Self {
        let capabilities = broker.posed().unwrap_or(NATIVE);
        Self {
            broker,
            address,
            group: "default".to_owned(),
            capabilities,
        }
    }

    /// Reads as consumer group `name` (default `default`).
    pub fn group(mut self, name: impl Into<String>) -> Self {
        self.group = name.into();
        self
    }

    /// Behaves like a broker that counts nothing and cannot delay (Kafka): attempts travel
    /// in the `x-ruststream-retry-count` header of runtime copies. `retry()` without a
    /// declaration still redelivers at once, like Kafka `Commit::Tracked`.
    pub fn runtime_retries(mut self) -> Self {
        self.capabilities = RUNTIME_RETRIES;
        self
    }
}

impl Descriptor for MemoryTopic {
    type Subscription = MemorySubscription;

    fn address(&self) -> &str {
        &self.address
    }

    fn transport(&self) -> &'static str {
        "memory"
    }

    fn retry_address(&self) -> Option<&str> {
        Some(&self.address)
    }

    fn capabilities(&self) -> Capabilities {
        self.capabilities
    }

    fn publisher(&self) -> Arc<dyn Publish> {
        Arc::new(self.broker.clone())
    }

    async fn open(self, _declaration: &Declaration) -> Result<MemorySubscription, SubscribeError> {
        let group = self.broker.group(&self.address, &self.group);
        Ok(MemorySubscription {
            consumer: group.consumer(),
            group,
            address: Arc::from(self.address.as_str()),
            header_count: !self.capabilities.native_count,
            at_most_once: self.capabilities.ack == Verb::Unsupported,
            settled: Settled::default(),
        })
    }
}

/// An open memory subscription.
#[derive(Debug)]
pub struct MemorySubscription {
    group: Arc<Group>,
    /// This subscription's name in its group: what it holds goes back when it closes.
    consumer: u32,
    address: Arc<str>,
    /// Attempts are counted in the retry-count header, not by the queue.
    header_count: bool,
    /// Nothing is settled (as on Core NATS): a delivery is done with once handed over.
    at_most_once: bool,
    /// An ack or drop `settle_now` made: removed from the group with the next fetch,
    /// under the same lock (one lock round trip per delivery instead of two), or at
    /// close. The pump fetches right after it settles, so it waits no longer than that.
    settled: Settled,
}

impl MemorySubscription {
    /// Writes a copy of a popped entry into `slot` (under the group's lock: nothing is
    /// moved out of the group and back); its tag is the receipt. A malformed retry
    /// count is handed back to be logged once the lock is let go.
    #[inline]
    fn fill(
        &self,
        slot: &mut Delivery,
        tag: u64,
        message: &Stored,
        delivered: u32,
    ) -> (u64, Option<MalformedRetryCount>) {
        let (attempt, malformed) = if self.header_count {
            Attempt::from_headers(&message.headers)
        } else {
            (Attempt::from_broker(delivered), None)
        };
        slot.refill_with(
            &self.address,
            message.payload.clone(),
            message.headers.clone(),
            message.key.clone(),
            Metadata::sequence(message.sequence),
            attempt,
        );
        (tag, malformed)
    }

    /// A filled delivery's receipt, its malformed retry count (if any) logged; at most
    /// once, the delivery is done with (removed with the next fetch).
    #[inline]
    fn filled(&mut self, (tag, malformed): (u64, Option<MalformedRetryCount>)) -> u64 {
        if let Some(error) = malformed {
            tracing::warn!(address = &*self.address, %error, "counting it as the first attempt");
        }
        if self.at_most_once {
            self.settled = Settled(Some(tag));
        }
        tag
    }

    /// An ack or drop made earlier that found its delivery no longer outstanding (none
    /// does while the subscription is open: only closing releases its deliveries).
    #[inline]
    fn stale(&self, stale: Settled) {
        if let Some(tag) = stale.0 {
            self.stale_settlement(tag);
        }
    }

    #[cold]
    fn stale_settlement(&self, tag: u64) {
        tracing::warn!(
            address = &*self.address,
            tag,
            "a settled delivery was no longer outstanding"
        );
    }

    /// Removes the ack or drop `settle_now` left for the next fetch, now.
    #[inline]
    fn flush_settled(&mut self) {
        if self.settled.0.is_some() {
            self.flush_settled_now();
        }
    }

    #[cold]
    fn flush_settled_now(&mut self) {
        if let Some(tag) = self.settled.0.take() {
            let removed = self.group.remove(tag);
            self.stale(Settled((!removed).then_some(tag)));
        }
    }

    /// Settles `tag` on the group's queue (nothing here waits).
    fn settle_at_once(&mut self, tag: u64, settle: Settle) -> Result<(), AckError> {
        self.flush_settled();
        let known = match settle {
            Settle::Nothing => true,
            Settle::Ack | Settle::Drop => self.group.remove(tag),
            Settle::Redeliver => self.group.requeue(tag),
            Settle::RedeliverAfter(delay) => self.group.requeue_after(tag, delay),
            Settle::DeadLetter => {
                return Err(AckError::Unsupported {
                    verb: "dead letter",
                });
            }
        };
        if known {
            Ok(())
        } else {
            Err(AckError::failed(format!(
                "delivery {tag} is not outstanding on `{}`",
                self.address
            )))
        }
    }
}

/// A subscription dropped without closing (its driver aborted) still removes what it
/// acked.
impl Drop for MemorySubscription {
    fn drop(&mut self) {
        self.flush_settled();
    }
}

impl Subscription for MemorySubscription {
    type Receipt = u64;

    async fn next_into(&mut self, slot: &mut Delivery) -> Option<Result<u64, SubscribeError>> {
        // Taken when first polled: the pop removes it under its first lock.
        let settled = std::mem::take(&mut self.settled);
        let (filled, stale) = (self.group)
            .pop(self.consumer, settled, |tag, message, delivered| {
                self.fill(slot, tag, message, delivered)
            })
            .await;
        self.stale(stale);
        Some(Ok(self.filled(filled)))
    }

    fn next_now(&mut self, slot: &mut Delivery) -> Poll<Option<Result<u64, SubscribeError>>> {
        let settled = std::mem::take(&mut self.settled);
        let (filled, stale) =
            (self.group).try_pop(self.consumer, settled, |tag, message, delivered| {
                self.fill(slot, tag, message, delivered)
            });
        self.stale(stale);
        match filled {
            Some(filled) => Poll::Ready(Some(Ok(self.filled(filled)))),
            None => Poll::Pending,
        }
    }

    async fn settle(&mut self, tag: u64, settle: Settle) -> Result<(), AckError> {
        match self.settle_now(tag, settle) {
            ControlFlow::Break(result) => result,
            // `settle_now` settles every verb at once.
            ControlFlow::Continue(tag) => self.settle_at_once(tag, settle),
        }
    }

    /// The queue's settlement waits for nothing. An ack or drop is removed with the next
    /// fetch (it cannot fail while the subscription is open: see `stale`).
    #[inline]
    fn settle_now(&mut self, tag: u64, settle: Settle) -> ControlFlow<Result<(), AckError>, u64> {
        if matches!(settle, Settle::Ack | Settle::Drop) {
            self.flush_settled();
            self.settled = Settled(Some(tag));
            return ControlFlow::Break(Ok(()));
        }
        ControlFlow::Break(self.settle_at_once(tag, settle))
    }

    async fn close(mut self) {
        self.flush_settled();
        // Unsettled deliveries go back to the group, as on a disconnect.
        self.group.release(self.consumer);
    }
}
