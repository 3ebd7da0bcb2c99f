//! Which attempt a delivery is, and where it sits in the broker.

use crate::headers::{Headers, MalformedRetryCount};

/// Which attempt at handling a message this delivery is; the first delivery is attempt 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attempt {
    number: u32,
    source: AttemptSource,
}

/// Where an [`Attempt`] number came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AttemptSource {
    /// The broker's own redelivery count (JetStream `delivered`, the memory broker's
    /// count): it survives a restart of the service.
    Broker,
    /// Counted by the subscription in this process, per message (Pulsar, whose Rust
    /// client does not report the broker's count: SPEC D5). It starts again at 1 on
    /// another consumer or after a restart.
    Subscription,
    /// The runtime's count in the `x-ruststream-retry-count` header (attempt = header + 1).
    Header,
}

impl Attempt {
    /// The broker counted `number` deliveries (1 for the first).
    pub const fn from_broker(number: u32) -> Self {
        Self {
            number: if number == 0 { 1 } else { number },
            source: AttemptSource::Broker,
        }
    }

    /// The subscription counted `number` deliveries of this message itself (1 for the
    /// first), where the broker's count cannot be read.
    pub const fn from_subscription(number: u32) -> Self {
        Self {
            number: if number == 0 { 1 } else { number },
            source: AttemptSource::Subscription,
        }
    }

    /// The attempt the retry-count header says; absent is attempt 1. A malformed header
    /// counts as absent and is returned beside it, so the caller can log it.
    #[inline]
    pub fn from_headers(headers: &Headers) -> (Self, Option<MalformedRetryCount>) {
        if headers.is_empty() {
            return (Self::from_header_count(0), None);
        }
        let (count, malformed) = match headers.retry_count() {
            Ok(count) => (count.unwrap_or(0), None),
            Err(e) => (0, Some(e)),
        };
        (Self::from_header_count(count), malformed)
    }

    /// The attempt after `count` retries counted in the retry-count header (0, or no
    /// header: attempt 1).
    pub const fn from_header_count(count: u32) -> Self {
        Self {
            number: count.saturating_add(1),
            source: AttemptSource::Header,
        }
    }

    /// The attempt after this one, counted by the same source (a delivery the runtime
    /// runs again in place).
    pub const fn next(self) -> Self {
        Self {
            number: self.number.saturating_add(1),
            source: self.source,
        }
    }

    /// The attempt number, 1 for the first delivery.
    pub const fn number(self) -> u32 {
        self.number
    }

    /// Who counted it.
    pub const fn source(self) -> AttemptSource {
        self.source
    }
}

/// Broker-specific position of a delivery, for logs and extractors.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Metadata {
    /// Kafka partition.
    pub partition: Option<i32>,
    /// Kafka offset.
    pub offset: Option<i64>,
    /// Stream sequence (JetStream, the memory broker); Redis: the entry id's sequence
    /// part, its milliseconds being `timestamp_ms` (entry `<timestamp_ms>-<sequence>`);
    /// RabbitMQ: the channel's delivery tag; Pulsar: the producer's sequence id.
    pub sequence: Option<u64>,
    /// Milliseconds since the Unix epoch, when the broker reports a timestamp.
    pub timestamp_ms: Option<i64>,
    /// Pulsar: the message id the broker gave it, `(ledger, entry, partition, batch
    /// index)` (`-1` where a topic is not partitioned or a message not batched). It stays
    /// the same on every redelivery and in every subscription.
    pub ledger_entry: Option<(u64, u64, i32, i32)>,
}

impl Metadata {
    /// Metadata with a Kafka position.
    pub const fn kafka(partition: i32, offset: i64) -> Self {
        Self {
            partition: Some(partition),
            offset: Some(offset),
            sequence: None,
            timestamp_ms: None,
            ledger_entry: None,
        }
    }

    /// Sets the broker's timestamp, in milliseconds since the Unix epoch.
    pub const fn with_timestamp_ms(mut self, timestamp_ms: Option<i64>) -> Self {
        self.timestamp_ms = timestamp_ms;
        self
    }

    /// Metadata with a stream sequence.
    pub const fn sequence(sequence: u64) -> Self {
        Self {
            partition: None,
            offset: None,
            sequence: Some(sequence),
            timestamp_ms: None,
            ledger_entry: None,
        }
    }
}
