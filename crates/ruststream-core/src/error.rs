//! Errors of the contract: settlement, publishing, subscribing.

use std::time::Duration;

/// A settlement the transport could not carry out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AckError {
    /// The broker has no operation for this outcome (Core NATS settles nothing;
    /// Kafka `Commit::Auto` cannot bring a record back).
    #[error("the broker has no operation for `{verb}` on this subscription")]
    Unsupported {
        /// The verb asked for: `ack`, `drop`, `retry`.
        verb: &'static str,
    },
    /// A delayed redelivery the subscription cannot hold that long (Pulsar: a delay not
    /// shorter than `ack_timeout`, because the client's timer would bring it back first).
    #[error("retry_after({delay:?}) refused: the subscription's limit is {limit:?} (ack_timeout)")]
    DelayTooLong {
        /// The delay asked for.
        delay: Duration,
        /// The longest delay the subscription can hold, exclusive.
        limit: Duration,
    },
    /// The broker or connection failed while settling.
    #[error("settlement failed: {0}")]
    Failed(String),
}

/// What kind of failure a [`PublishError`] is. [`is_transient`](Self::is_transient) tells
/// the two families apart: a transient failure may pass if tried again (the connection
/// is back, the broker answers in time); a permanent one is the broker's answer about
/// this message or address and will be the same next time (SPEC G3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PublishErrorKind {
    /// The broker refused the message for a reason not named below.
    Rejected,
    /// No confirmation arrived in time. Transient.
    Timeout,
    /// The connection is gone. Transient.
    Disconnected,
    /// The message could not be encoded (a header the broker cannot carry).
    Encode,
    /// Nobody answered a request.
    NoResponders,
    /// The message is larger than the broker or the address accepts.
    TooLarge,
    /// The destination is full and refuses new messages (a JetStream stream at its
    /// limits with the discard-new policy, storage exhausted).
    Full,
    /// No such destination (no stream captures the subject, an unknown topic).
    NoSuchAddress,
    /// The credentials may not publish there.
    NotAuthorized,
}

impl PublishErrorKind {
    /// True for failures that may pass when tried again ([`Timeout`](Self::Timeout),
    /// [`Disconnected`](Self::Disconnected)); false for the broker's refusals.
    pub const fn is_transient(self) -> bool {
        matches!(self, Self::Timeout | Self::Disconnected)
    }
}

impl std::fmt::Display for PublishErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Rejected => "rejected",
            Self::Timeout => "timed out",
            Self::Disconnected => "disconnected",
            Self::Encode => "cannot be encoded",
            Self::NoResponders => "no responders",
            Self::TooLarge => "too large",
            Self::Full => "destination full",
            Self::NoSuchAddress => "no such destination",
            Self::NotAuthorized => "not authorized",
        })
    }
}

/// A publish that was not confirmed by the broker.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("publishing to `{address}` failed ({kind}): {detail}")]
pub struct PublishError {
    /// The address published to.
    pub address: String,
    /// The kind of failure.
    pub kind: PublishErrorKind,
    /// The broker's or client's explanation.
    pub detail: String,
}

impl PublishError {
    /// A publish error for `address`.
    pub fn new(address: impl Into<String>, kind: PublishErrorKind, detail: impl ToString) -> Self {
        Self {
            address: address.into(),
            kind,
            detail: detail.to_string(),
        }
    }
}

/// A subscription that could not be opened or read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("subscription on `{address}`: {detail}")]
pub struct SubscribeError {
    /// The descriptor's address.
    pub address: String,
    /// What went wrong, for an operator.
    pub detail: String,
}

impl SubscribeError {
    /// A subscribe error for `address`.
    pub fn new(address: impl Into<String>, detail: impl ToString) -> Self {
        Self {
            address: address.into(),
            detail: detail.to_string(),
        }
    }
}
