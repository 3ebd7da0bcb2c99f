//! Typed publishing, inside handlers and outside the app.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use ruststream_core::{Outgoing, Publish, PublishError, PublishErrorKind};
use serde::Serialize;

use crate::codec::{Codec, Json};

/// Publishes to one broker, waiting for its confirmation. Cheap to clone. A handler gets
/// its registration's broker publisher by taking a `Publisher` argument.
#[derive(Clone)]
pub struct Publisher {
    inner: Arc<dyn Publish>,
}

impl fmt::Debug for Publisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Publisher")
    }
}

impl Publisher {
    /// A publisher over a transport's confirmed publish.
    pub fn new(inner: Arc<dyn Publish>) -> Self {
        Self { inner }
    }

    /// Starts a message to `address`.
    pub fn to(&self, address: impl AsRef<str>) -> PublishBuilder<'_> {
        PublishBuilder {
            publisher: self,
            message: Outgoing::new(address.as_ref(), Bytes::new()),
        }
    }

    /// Publishes a prepared message. With the `opentelemetry` feature, the current
    /// span's trace context goes into its headers first (unless they carry one).
    pub async fn publish(&self, mut message: Outgoing) -> Result<(), PublishError> {
        crate::trace_context::inject(&mut message.headers);
        self.inner.publish(message).await
    }

    /// Publishes every message at once and waits for all the broker's confirmations
    /// together: one result per message, in order, so a caller learns exactly which
    /// were refused. Each transport pipelines them (Kafka produces all and awaits the
    /// delivery reports together, JetStream and Pulsar await their acks together,
    /// RabbitMQ its publisher confirms, Redis pipelines the `XADD`s over its
    /// connection); a refused message does not stop the others. The messages are taken
    /// as the transport sends them: on Kafka, NATS and Redis one at a time, each let go
    /// once the client has its copy (Pulsar: 256 at a time), so an iterator that makes
    /// each one (as below) never holds them all at once; RabbitMQ and the memory broker
    /// hold each until its confirmation. The iterator is `Send`: it travels with the
    /// future that sends them.
    ///
    /// A message's address is an `Arc<str>`: messages to one address share one string
    /// (`Arc::clone`, as below) instead of each making its own copy. Its key and headers
    /// are fields of [`Outgoing`](crate::core::Outgoing), set before it is handed over
    /// (a Kafka key keeps a key's messages on one partition, in order).
    ///
    /// With the `opentelemetry` feature, the span current when `send_all` is called gives
    /// its trace context to every message that carries none of its own (asked once for
    /// the whole call).
    ///
    /// ```
    /// # async fn example(publisher: ruststream::Publisher) {
    /// use std::sync::Arc;
    /// use ruststream::core::Outgoing;
    ///
    /// let to: Arc<str> = Arc::from("orders");
    /// let orders = (0..100).map(|n| {
    ///     let mut order = Outgoing::new(Arc::clone(&to), format!(r#"{{"id":{n}}}"#));
    ///     order.key = Some(format!("customer-{}", n % 10).into());
    ///     order
    /// });
    /// let results = publisher.send_all(orders).await;
    /// let refused: Vec<usize> = (0..results.len()).filter(|&i| results[i].is_err()).collect();
    /// # }
    /// ```
    pub async fn send_all(
        &self,
        messages: impl IntoIterator<Item = Outgoing, IntoIter: Send>,
    ) -> Vec<Result<(), PublishError>> {
        let context = crate::trace_context::Captured::now();
        let messages = messages.into_iter().map(move |mut message| {
            context.inject(&mut message.headers);
            message
        });
        self.inner.publish_all(Box::new(messages)).await
    }

    /// The transport's publish.
    pub fn as_publish(&self) -> &Arc<dyn Publish> {
        &self.inner
    }
}

/// A message being prepared: add a key and headers, then send a value or bytes.
#[derive(Debug)]
#[must_use = "nothing is published until `send` or `send_bytes` is awaited"]
pub struct PublishBuilder<'p> {
    publisher: &'p Publisher,
    message: Outgoing,
}

impl PublishBuilder<'_> {
    /// Sets the key.
    pub fn key(mut self, key: impl Into<Bytes>) -> Self {
        self.message.key = Some(key.into());
        self
    }

    /// Adds a header.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<Bytes>) -> Self {
        self.message.headers.append(name, value);
        self
    }

    /// Sets a broker option (`ruststream_kafka::Partition(3)`,
    /// `ruststream_nats::MessageId(..)`): a transport reads the ones it defines and
    /// ignores the rest.
    pub fn with<T>(mut self, option: T) -> Self
    where
        T: std::any::Any + Send + Sync + PartialEq + fmt::Debug,
    {
        self.message.extras.insert(option);
        self
    }

    /// Encodes `value` as JSON and publishes it.
    pub async fn send<T: Serialize + ?Sized>(self, value: &T) -> Result<(), PublishError> {
        self.send_with::<Json, T>(value).await
    }

    /// Encodes `value` with codec `C` and publishes it.
    pub async fn send_with<C: Codec, T: Serialize + ?Sized>(
        mut self,
        value: &T,
    ) -> Result<(), PublishError> {
        let payload = C::encode(value)
            .map_err(|e| PublishError::new(&self.message.address, PublishErrorKind::Encode, e))?;
        self.message.payload = Bytes::from(payload);
        self.publisher.publish(self.message).await
    }

    /// Publishes raw bytes.
    pub async fn send_bytes(mut self, payload: impl Into<Bytes>) -> Result<(), PublishError> {
        self.message.payload = payload.into();
        self.publisher.publish(self.message).await
    }
}
