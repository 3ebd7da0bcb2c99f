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

/// What kind of failure a [`PublishError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PublishErrorKind {
    /// The broker refused the message (too large, unknown address, not authorised...).
    Rejected,
    /// No confirmation arrived in time.
    Timeout,
    /// The connection is gone.
    Disconnected,
    /// The message could not be encoded.
    Encode,
    /// Nobody answered a request.
    NoResponders,
}

/// A publish that was not confirmed by the broker.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("publishing to `{address}` failed ({kind:?}): {detail}")]
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
