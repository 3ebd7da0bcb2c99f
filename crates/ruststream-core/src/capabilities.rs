//! What a transport can do for one subscription.

use std::time::Duration;

/// How a settle verb exists on the broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    /// The broker has an operation for it; the transport performs it.
    Native,
    /// Settled by the transport's ack operation (Pulsar and Kafka `drop()`: there is no
    /// separate reject).
    AsAck,
    /// Nothing needs to be sent: the broker already treats the delivery this way
    /// (Kafka `Commit::Auto` stored the offset when it handed the record over).
    Implicit,
    /// The broker has nothing for it; the runtime reports `AckError::Unsupported`.
    Unsupported,
}

/// How a delayed redelivery (`retry_after`) can happen without a copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DelayedRedelivery {
    /// The broker holds the message for the delay (JetStream `-NAK {"delay"}`).
    Native,
    /// The transport holds the delivery unsettled for the delay, then redelivers
    /// (Pulsar). `limit`: delays not shorter than it are refused.
    Held {
        /// Exclusive upper bound on the delay (Pulsar's `ack_timeout`), if any.
        limit: Option<Duration>,
    },
    /// No way: the runtime publishes a delayed copy instead.
    Unsupported,
}

/// Who moves an exhausted delivery to the dead-letter address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadLetters {
    /// The runtime counts attempts against `max_attempts` and publishes the dead letter.
    Runtime,
    /// The broker's client does it (Pulsar's dead-letter policy); the runtime only
    /// asks for redeliveries.
    Broker,
    /// The runtime counts attempts and decides; the subscription moves the delivery to
    /// the dead-letter address and settles it in one step ([`Settle::DeadLetter`]:
    /// Redis `XADD` + `XACK` in one `MULTI`/`EXEC`), so it is never both or neither.
    ///
    /// [`Settle::DeadLetter`]: crate::Settle::DeadLetter
    Subscription,
}

/// What the broker can do for one subscription. The runtime decides from these, never
/// from a broker's name.
///
/// Built from [`Capabilities::NOTHING`] with the `with_*` methods (usable in a `const`),
/// so a capability added later is one more method, not a break in every transport:
///
/// ```
/// use ruststream_core::{Capabilities, Verb};
///
/// const ACKS: Capabilities = Capabilities::NOTHING
///     .with_ack(Verb::Native)
///     .with_drop(Verb::AsAck)
///     .with_native_count(true);
/// assert_eq!(ACKS.redeliver, Verb::Unsupported);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// `ack()`.
    pub ack: Verb,
    /// `drop()`.
    pub drop: Verb,
    /// `retry()`: deliver the same message again (JetStream `-NAK`, Kafka Tracked seek,
    /// Pulsar `nack`).
    pub redeliver: Verb,
    /// `retry_after(d)` without a copy.
    pub delayed_redelivery: DelayedRedelivery,
    /// The broker counts deliveries itself; otherwise the count travels in the
    /// `x-ruststream-retry-count` header of copies.
    pub native_count: bool,
    /// Who moves exhausted deliveries.
    pub dead_letters: DeadLetters,
    /// The original can stay unsettled while its delayed copy waits (Kafka Tracked and
    /// Transactional: the position waits), so a crash brings the original back.
    pub holds_original: bool,
    /// `Redeliver` means the same record handled again by this subscription (Kafka
    /// `Commit::Tracked` has nothing to ask the broker): the runtime runs it again in its
    /// lane at once, so it comes before the next record and its key keeps its order.
    pub redeliver_in_place: bool,
    /// The subscription can move its read position back to a delivery it handed over
    /// (Kafka `Commit::Auto`: store the offset back and seek). Used only when a copy is
    /// refused, so the record is read again instead of lost (SPEC G3); the settlement is
    /// a `Settle::Redeliver`.
    pub rewinds: bool,
    /// A delivery's position (partition and offset, stream sequence, message id) names
    /// its message: the same each time it comes back, and no other message's. The
    /// runtime remembers a refused dead letter by it (SPEC G3). Not RabbitMQ's delivery
    /// tag, its channel's count: there only the `x-ruststream-id` header names a message.
    pub positions_name_messages: bool,
}

impl Capabilities {
    /// A broker that settles nothing and counts nothing (Core NATS).
    pub const NOTHING: Self = Self {
        ack: Verb::Unsupported,
        drop: Verb::Unsupported,
        redeliver: Verb::Unsupported,
        delayed_redelivery: DelayedRedelivery::Unsupported,
        native_count: false,
        dead_letters: DeadLetters::Runtime,
        holds_original: false,
        redeliver_in_place: false,
        rewinds: false,
        positions_name_messages: true,
    };

    /// These capabilities with `ack()` set to `ack`.
    pub const fn with_ack(mut self, ack: Verb) -> Self {
        self.ack = ack;
        self
    }

    /// These capabilities with `drop()` set to `drop`.
    pub const fn with_drop(mut self, drop: Verb) -> Self {
        self.drop = drop;
        self
    }

    /// These capabilities with `retry()` without a copy set to `redeliver`.
    pub const fn with_redeliver(mut self, redeliver: Verb) -> Self {
        self.redeliver = redeliver;
        self
    }

    /// These capabilities with `retry_after(d)` without a copy set to `delayed_redelivery`.
    pub const fn with_delayed_redelivery(mut self, delayed_redelivery: DelayedRedelivery) -> Self {
        self.delayed_redelivery = delayed_redelivery;
        self
    }

    /// These capabilities with whether the broker counts deliveries set to `native_count`.
    pub const fn with_native_count(mut self, native_count: bool) -> Self {
        self.native_count = native_count;
        self
    }

    /// These capabilities with who moves exhausted deliveries set to `dead_letters`.
    pub const fn with_dead_letters(mut self, dead_letters: DeadLetters) -> Self {
        self.dead_letters = dead_letters;
        self
    }

    /// These capabilities with whether the original can stay unsettled while its delayed copy waits set to `holds_original`.
    pub const fn with_holds_original(mut self, holds_original: bool) -> Self {
        self.holds_original = holds_original;
        self
    }

    /// These capabilities with whether `Redeliver` means the same record again in its lane set to `redeliver_in_place`.
    pub const fn with_redeliver_in_place(mut self, redeliver_in_place: bool) -> Self {
        self.redeliver_in_place = redeliver_in_place;
        self
    }

    /// These capabilities with whether the read position can move back to a delivery set to `rewinds`.
    pub const fn with_rewinds(mut self, rewinds: bool) -> Self {
        self.rewinds = rewinds;
        self
    }

    /// These capabilities with whether a delivery's position names its message set to
    /// `positions_name_messages`.
    pub const fn with_positions_name_messages(mut self, positions_name_messages: bool) -> Self {
        self.positions_name_messages = positions_name_messages;
        self
    }
}
