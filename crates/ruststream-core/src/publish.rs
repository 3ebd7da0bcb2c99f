//! Publishing: a message going out, and the transport's confirmed publish.

use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;

use crate::error::PublishError;
use crate::headers::Headers;

/// A boxed, sendable future, as the object-safe parts of the contract return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A message to publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    /// Topic or subject.
    pub address: String,
    /// Payload bytes.
    pub payload: Bytes,
    /// Headers.
    pub headers: Headers,
    /// Key (Kafka record key, Pulsar partition key); ignored by brokers without keys.
    pub key: Option<Bytes>,
}

impl Outgoing {
    /// A message with no key and no headers.
    pub fn new(address: impl Into<String>, payload: impl Into<Bytes>) -> Self {
        Self {
            address: address.into(),
            payload: payload.into(),
            headers: Headers::new(),
            key: None,
        }
    }
}

/// A transport's publish, confirmed by the broker: the future resolves `Ok` only once
/// the broker has the message (Kafka delivery report, JetStream publish ack, Pulsar
/// receipt, Core NATS flush).
pub trait Publish: Send + Sync + 'static {
    /// Publishes `message` and waits for the broker's confirmation.
    fn publish(&self, message: Outgoing) -> BoxFuture<'_, Result<(), PublishError>>;
}
