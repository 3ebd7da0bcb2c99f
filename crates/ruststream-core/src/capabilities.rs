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
}

/// What the broker can do for one subscription. The runtime decides from these, never
/// from a broker's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    };
}
