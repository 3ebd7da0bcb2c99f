//! A message as received from a broker.

use std::sync::Arc;

use bytes::Bytes;

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
    /// Stream sequence (JetStream, the memory broker).
    pub sequence: Option<u64>,
    /// Milliseconds since the Unix epoch, when the broker reports a timestamp.
    pub timestamp_ms: Option<i64>,
}

impl Metadata {
    /// Metadata with a Kafka position.
    pub const fn kafka(partition: i32, offset: i64) -> Self {
        Self {
            partition: Some(partition),
            offset: Some(offset),
            sequence: None,
            timestamp_ms: None,
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
        }
    }
}

/// One received message: payload, headers, key, where it came from and which attempt it is.
#[derive(Debug, Clone)]
pub struct Delivery {
    payload: Bytes,
    headers: Headers,
    key: Option<Bytes>,
    address: Arc<str>,
    metadata: Metadata,
    attempt: Attempt,
    reply_to: Option<Arc<str>>,
}

impl Delivery {
    /// A first-attempt delivery from `address`. Transports fill the rest with the `with_*` methods.
    #[inline]
    pub fn new(address: Arc<str>, payload: Bytes) -> Self {
        Self {
            payload,
            headers: Headers::new(),
            key: None,
            address,
            metadata: Metadata::default(),
            attempt: Attempt::from_broker(1),
            reply_to: None,
        }
    }

    /// A delivery with no address and no payload, to be refilled: the slot a
    /// [`Subscription::next_into`](crate::Subscription::next_into) writes into.
    pub fn empty() -> Self {
        Self::new(Arc::from(""), Bytes::new())
    }

    /// Makes this a first-attempt delivery from `address` in place, as [`Delivery::new`]
    /// would build it (what it held before is dropped); the `set_*` methods fill the rest.
    /// A transport's [`Subscription::next_into`](crate::Subscription::next_into) writes
    /// each message into the delivery the runtime hands it this way, so a delivery is
    /// built where it stays instead of being moved there.
    ///
    /// `address` is shared, not taken: the runtime hands a subscription back the boxes
    /// of its earlier deliveries, which mostly hold the very same address already, and
    /// then nothing is counted up or down.
    #[inline]
    pub fn refill(&mut self, address: &Arc<str>, payload: Bytes) -> &mut Self {
        self.payload = payload;
        self.headers = Headers::new();
        self.key = None;
        if !Arc::ptr_eq(&self.address, address) {
            self.address = Arc::clone(address);
        }
        self.metadata = Metadata::default();
        self.attempt = Attempt::from_broker(1);
        self.reply_to = None;
        self
    }

    /// Sets the headers in place.
    #[inline]
    pub fn set_headers(&mut self, headers: Headers) -> &mut Self {
        self.headers = headers;
        self
    }

    /// Sets the key in place.
    #[inline]
    pub fn set_key(&mut self, key: Option<Bytes>) -> &mut Self {
        self.key = key;
        self
    }

    /// Sets the broker metadata in place.
    #[inline]
    pub fn set_metadata(&mut self, metadata: Metadata) -> &mut Self {
        self.metadata = metadata;
        self
    }

    /// Sets the attempt in place.
    #[inline]
    pub fn set_attempt(&mut self, attempt: Attempt) -> &mut Self {
        self.attempt = attempt;
        self
    }

    /// Sets the reply address in place.
    #[inline]
    pub fn set_reply_to(&mut self, reply_to: Option<Arc<str>>) -> &mut Self {
        self.reply_to = reply_to;
        self
    }

    /// Sets the address a reply goes to (a NATS request's reply subject).
    #[inline]
    pub fn with_reply_to(mut self, reply_to: Option<Arc<str>>) -> Self {
        self.reply_to = reply_to;
        self
    }

    /// Where the sender waits for a reply, if it is a request.
    #[inline]
    pub fn reply_to(&self) -> Option<&str> {
        self.reply_to.as_deref()
    }

    /// Sets the headers.
    #[inline]
    pub fn with_headers(mut self, headers: Headers) -> Self {
        self.headers = headers;
        self
    }

    /// Sets the key.
    #[inline]
    pub fn with_key(mut self, key: Option<Bytes>) -> Self {
        self.key = key;
        self
    }

    /// Sets the broker metadata.
    #[inline]
    pub fn with_metadata(mut self, metadata: Metadata) -> Self {
        self.metadata = metadata;
        self
    }

    /// Sets the attempt.
    #[inline]
    pub fn with_attempt(mut self, attempt: Attempt) -> Self {
        self.attempt = attempt;
        self
    }

    /// Counts one more attempt (the runtime runs the delivery again in place).
    #[inline]
    pub fn count_attempt(&mut self) {
        self.attempt = self.attempt.next();
    }

    /// The payload bytes, as received.
    #[inline]
    pub fn payload(&self) -> &Bytes {
        &self.payload
    }

    /// The headers, as received.
    #[inline]
    pub fn headers(&self) -> &Headers {
        &self.headers
    }

    /// The key (Kafka record key, Pulsar partition key), if any.
    #[inline]
    pub fn key(&self) -> Option<&Bytes> {
        self.key.as_ref()
    }

    /// The address it was read from (topic or subject).
    #[inline]
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The address as a shared string.
    #[inline]
    pub fn address_arc(&self) -> &Arc<str> {
        &self.address
    }

    /// Broker position data.
    #[inline]
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// Which attempt this is.
    #[inline]
    pub fn attempt(&self) -> Attempt {
        self.attempt
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RETRY_COUNT_HEADER;

    #[test]
    fn attempt_is_header_plus_one() {
        let mut h = Headers::new();
        assert_eq!(Attempt::from_headers(&h).0.number(), 1);
        h.insert(RETRY_COUNT_HEADER, "2");
        let (a, bad) = Attempt::from_headers(&h);
        assert_eq!(
            (a.number(), a.source(), bad),
            (3, AttemptSource::Header, None)
        );
        h.insert(RETRY_COUNT_HEADER, "-4");
        let (a, bad) = Attempt::from_headers(&h);
        assert_eq!(a.number(), 1);
        assert!(bad.is_some());
        h.insert(RETRY_COUNT_HEADER, "4294967295");
        assert_eq!(Attempt::from_headers(&h).0.number(), u32::MAX);
    }
}
