//! The two traits a transport implements: a subscription descriptor and the open
//! subscription its driver task reads and settles.

use std::future::Future;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::task::Poll;

use crate::capabilities::Capabilities;
use crate::declaration::Declaration;
use crate::delivery::Delivery;
use crate::error::{AckError, SubscribeError};
use crate::plan::Settle;
use crate::publish::Publish;

/// A subscription descriptor bound to its broker: what to read, and what the broker can
/// do for it. The runtime validates registrations against it, then opens it, once for
/// each of the registration's consumers (a clone each).
pub trait Descriptor: Clone + Send + 'static {
    /// The open subscription.
    type Subscription: Subscription;

    /// The address read, for logs and errors (a topic, a subject, a pattern).
    fn address(&self) -> &str;

    /// The transport's name in metrics labels (`kafka`, `nats-core`, `jetstream`...).
    fn transport(&self) -> &'static str {
        "unnamed"
    }

    /// The single address a retry copy is published to, or `None` when the descriptor
    /// reads a set no single publish reaches (then the registration must name one).
    fn retry_address(&self) -> Option<&str>;

    /// What the broker can do for this subscription.
    fn capabilities(&self) -> Capabilities;

    /// Transport-specific rules a registration's declaration must keep (Pulsar: cap and
    /// dead letter go together). Each returned string is one broken rule.
    fn check(&self, declaration: &Declaration) -> Vec<String> {
        let _ = declaration;
        Vec::new()
    }

    /// True when this subscription would receive a message published to `address` (its
    /// topic, a topic in its list, a subject its pattern or filter matches). A dead letter
    /// published where its own registration reads would be handled again, without end, so
    /// such a registration refuses to start (SPEC G4).
    fn reads(&self, address: &str) -> bool {
        address == self.address()
    }

    /// Why `address` is not a valid destination on this broker (a NATS subject with a
    /// wildcard or an empty token, a Kafka topic with a character Kafka refuses), or
    /// `None` when it is. The runtime asks it of dead-letter and retry addresses at start
    /// (SPEC G4), so a bad name fails there instead of at the first dead letter.
    fn address_rule(&self, address: &str) -> Option<String> {
        let _ = address;
        None
    }

    /// The broker's confirmed publish, used for retry copies and dead letters.
    fn publisher(&self) -> Arc<dyn Publish>;

    /// The subscription as the service describes itself: by default its publisher's
    /// protocol and server; a transport adds the group, client id or queue it reads with.
    fn describe(&self) -> crate::Described {
        self.publisher().describe()
    }

    /// Asks the broker whether it answers and whether what this subscription reads
    /// exists (a metadata request, a passive declare), without joining a group, creating
    /// anything or receiving a message: a service's `check --connect`. `Err` says what
    /// failed. By default nothing is asked.
    fn verify(&self) -> impl Future<Output = Result<(), String>> + Send {
        std::future::ready(Ok(()))
    }

    /// The dead letters at `address` (this registration's dead-letter address), to list
    /// and replay them. By default: this broker keeps none to read back.
    fn dead_letters(
        &self,
        address: &str,
    ) -> impl Future<Output = Result<Box<dyn crate::LetterBox>, String>> + Send {
        let _ = address;
        std::future::ready(Err(format!(
            "{} keeps no dead letters to read back",
            self.transport()
        )))
    }

    /// Opens the subscription (missing streams, unknown topics... are errors here).
    fn open(
        self,
        declaration: &Declaration,
    ) -> impl Future<Output = Result<Self::Subscription, SubscribeError>> + Send;
}

/// Tells whether a connection is up (see [`Subscription::link`]).
pub type LinkProbe = Arc<dyn Fn() -> bool + Send + Sync>;

/// What a delayed retry copy's timer asks before it makes the copy (see
/// [`Subscription::parked`]): whether the delivery is still the subscription's to settle.
pub type StillHeld = Box<dyn Fn() -> bool + Send + Sync>;

/// One figure of a subscription's backlog, as the broker tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backlog {
    /// `pending` (not yet delivered to the group: Kafka high watermark − committed,
    /// JetStream `num_pending`), `ack_pending` (delivered, not acknowledged: JetStream
    /// `num_ack_pending`), `slow_consumer_dropped` (Core NATS, since the start).
    pub kind: &'static str,
    /// The partition, where the figure is per partition (Kafka).
    pub partition: Option<i32>,
    /// The figure.
    pub value: u64,
}

/// Asks the broker for a subscription's backlog (see [`Subscription::backlog`]).
pub type BacklogProbe =
    Arc<dyn Fn() -> crate::BoxFuture<'static, Result<Vec<Backlog>, String>> + Send + Sync>;

/// An open subscription. Exactly one task, the subscription's driver, calls it.
pub trait Subscription: Send + 'static {
    /// What the transport needs to settle one delivery (an ack subject, a partition and
    /// offset, a message id).
    type Receipt: Send + 'static;

    /// The next delivery, written into `slot`, and its receipt; `None` once the
    /// subscription is closed for good. `slot` holds an earlier delivery (or
    /// [`Delivery::empty`]) and is overwritten whole, with [`Delivery::refill`] and the
    /// `set_*` methods: the runtime hands over the box the delivery then travels in, so
    /// it is built where it stays instead of being moved there (a delivery is about 180
    /// bytes). Must be cancel safe: the driver drops it unfinished to settle or to stop;
    /// write `slot` after the last await, so it is whole whenever this returns or is
    /// dropped.
    fn next_into<'a>(
        &'a mut self,
        slot: &'a mut Delivery,
    ) -> impl Future<Output = Option<Result<Self::Receipt, SubscribeError>>> + Send + 'a;

    /// The next delivery when the subscription has one at once, written into `slot` as
    /// [`next_into`](Self::next_into) would; [`Poll::Pending`] when it would have to wait
    /// (nothing is registered to wake anyone then: the runtime goes on to `next_into`).
    /// The runtime asks this first, for the common case of a backlog, and runs what it
    /// gets without a future per fetch. The default, `Pending`, leaves every fetch to
    /// `next_into`. Must not wait, and must do only what `next_into` would have done for
    /// the same delivery (the two see the same deliveries in the same order).
    fn next_now(
        &mut self,
        slot: &mut Delivery,
    ) -> Poll<Option<Result<Self::Receipt, SubscribeError>>> {
        let _ = slot;
        Poll::Pending
    }

    /// Performs one settlement on the broker.
    fn settle(
        &mut self,
        receipt: Self::Receipt,
        settle: Settle,
    ) -> impl Future<Output = Result<(), AckError>> + Send;

    /// The headers the dead letter of `receipt` adds (SPEC D6: why, by whom, from where),
    /// given just before [`settle`](Self::settle) is asked for [`Settle::DeadLetter`];
    /// only subscriptions that move dead letters themselves
    /// ([`DeadLetters::Subscription`](crate::DeadLetters::Subscription)) are given them.
    /// By default they are not kept.
    fn dead_letter_headers(&mut self, receipt: &Self::Receipt, headers: crate::Headers) {
        let _ = (receipt, headers);
    }

    /// Performs one settlement without a future, when it need not wait (Kafka's offset
    /// book, the memory broker's queue, a JetStream ack with room in the client's
    /// queue): [`ControlFlow::Break`] with the result [`settle`](Self::settle) would
    /// give. [`ControlFlow::Continue`] (the default) hands the receipt back, untouched
    /// and with nothing done, and the runtime then calls `settle` with it. The runtime
    /// asks this first for the common case, a settlement right after the handler's first
    /// poll.
    fn settle_now(
        &mut self,
        receipt: Self::Receipt,
        settle: Settle,
    ) -> ControlFlow<Result<(), AckError>, Self::Receipt> {
        let _ = settle;
        ControlFlow::Continue(receipt)
    }

    /// The delivery is not done at once: its handler runs and did not finish in its
    /// first poll, or it starts now after [`waiting`](Self::waiting) for its lane. Its
    /// handler deadline counts from here. Called before it is settled, at most once after
    /// each `waiting`; most deliveries are done at once and never come here. What a
    /// transport does for long-running deliveries only (JetStream's `+WPI` keepalive)
    /// starts here, so the common case pays nothing for it.
    fn running_on(&mut self, receipt: &Self::Receipt) {
        let _ = receipt;
    }

    /// The delivery was fetched and waits for its lane (behind a running delivery of the
    /// same key, or for any lane to free up); [`running_on`](Self::running_on) follows
    /// when it starts. No handler deadline runs meanwhile.
    fn waiting(&mut self, receipt: &Self::Receipt) {
        let _ = receipt;
    }

    /// The delivery waits, unsettled, for its delayed retry copy (a runtime timer): it is
    /// not running any more (Kafka's transactional windows need not wait for it).
    ///
    /// May return what the timer asks when the wait ends, before it makes the copy:
    /// whether the delivery is still this subscription's to settle. `false` (Kafka: its
    /// partition moved, or an aborted window rewound it, so the record is read again and
    /// waits again) makes no copy and leaves the delivery unsettled. Called from the
    /// timer's task. Default: `None`, the copy is always made.
    fn parked(&mut self, receipt: &Self::Receipt) -> Option<StillHeld> {
        let _ = receipt;
        None
    }

    /// Deliveries the subscription holds itself after the runtime settled them (Pulsar:
    /// `retry_after` waits held until their nack). They count toward the registration's
    /// `max_in_flight` (SPEC G5).
    fn holding(&self) -> usize {
        0
    }

    /// What the subscription must keep doing while the runtime fetches nothing (at
    /// `max_in_flight`, SPEC G5): Kafka's exactly-once windows must still commit. The
    /// future may return now and then; the runtime calls it again. Must be cancel safe.
    /// Default: nothing (never returns).
    fn idle(&mut self) -> impl Future<Output = ()> + Send {
        std::future::pending()
    }

    /// What the subscription must keep doing while a delivery it handed over waits for
    /// its lane, when the runtime fetches nothing either (a slow handler ahead of a
    /// backlog): JetStream keeps what its client pulled ahead alive, which would outwait
    /// `ack_wait` in the client's buffer otherwise. Polled with the driver's context,
    /// dropped when the lane frees. Must be cancel safe. Default: the [`idle`](Self::idle)
    /// upkeep, called again each time it returns, so what a subscription holds is let go
    /// when due here too (Pulsar's, RabbitMQ's and Redis's `retry_after` waits, gathered
    /// acknowledgements), not once the lane frees. An `idle` that returns must have waited
    /// for something, or this spins.
    fn while_waiting(&mut self) -> impl Future<Output = ()> + Send {
        async move {
            loop {
                self.idle().await;
            }
        }
    }

    /// Whether the connection this subscription reads through is up, for the app's
    /// readiness check, which calls it from any thread (off the async threads: it may
    /// block briefly). `None`: readiness goes by fetch errors alone.
    fn link(&self) -> Option<LinkProbe> {
        None
    }

    /// What the broker tells about this subscription's backlog, asked when metrics are
    /// scraped (from another task). `None`: nothing to ask.
    fn backlog(&self) -> Option<BacklogProbe> {
        None
    }

    /// Stops fetching and closes the consumer. Deliveries not settled by now come back
    /// as the broker's rules say.
    fn close(self) -> impl Future<Output = ()> + Send;
}
