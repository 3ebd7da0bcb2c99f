//! Publishing: a message going out, and the transport's confirmed publish.

use std::any::{Any, TypeId};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;

use crate::error::PublishError;
use crate::headers::Headers;

/// A boxed, sendable future, as the object-safe parts of the contract return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A message to publish, made with [`Outgoing::new`] and its fields set.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Outgoing {
    /// Topic or subject. Shared: many messages to one address can share one string
    /// (`Arc::clone`), so a message costs no copy of its address.
    pub address: Arc<str>,
    /// Payload bytes.
    pub payload: Bytes,
    /// Headers.
    pub headers: Headers,
    /// Key (Kafka record key, Pulsar partition key); ignored by brokers without keys.
    pub key: Option<Bytes>,
    /// Broker options, typed (`ruststream_kafka::Partition`,
    /// `ruststream_nats::MessageId`); a transport reads the ones it knows.
    pub extras: Extras,
}

impl Outgoing {
    /// A message with no key and no headers.
    pub fn new(address: impl Into<Arc<str>>, payload: impl Into<Bytes>) -> Self {
        Self {
            address: address.into(),
            payload: payload.into(),
            headers: Headers::new(),
            key: None,
            extras: Extras::default(),
        }
    }
}

/// Options one broker understands, carried with a message as typed values: Kafka's
/// partition, a JetStream message id. A transport reads the types it defines and ignores
/// the rest. Empty, it holds no allocation.
#[derive(Clone, Default)]
pub struct Extras {
    entries: Vec<Extra>,
}

#[derive(Clone)]
struct Extra {
    value: Arc<dyn Any + Send + Sync>,
    eq: fn(&dyn Any, &dyn Any) -> bool,
    debug: fn(&dyn Any, &mut fmt::Formatter<'_>) -> fmt::Result,
}

impl Extras {
    /// Sets `value`, replacing one of the same type.
    pub fn insert<T: Any + Send + Sync + PartialEq + fmt::Debug>(&mut self, value: T) {
        let extra = Extra {
            value: Arc::new(value),
            eq: |a, b| a.downcast_ref::<T>() == b.downcast_ref::<T>(),
            debug: |v, f| match v.downcast_ref::<T>() {
                Some(v) => fmt::Debug::fmt(v, f),
                None => f.write_str("?"),
            },
        };
        match self.position(TypeId::of::<T>()) {
            Some(i) => self.entries[i] = extra,
            None => self.entries.push(extra),
        }
    }

    /// The value of type `T`, when set.
    pub fn get<T: Any>(&self) -> Option<&T> {
        let i = self.position(TypeId::of::<T>())?;
        self.entries[i].value.downcast_ref()
    }

    /// True when no option is set.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn position(&self, id: TypeId) -> Option<usize> {
        self.entries.iter().position(|e| (*e.value).type_id() == id)
    }
}

impl PartialEq for Extras {
    fn eq(&self, other: &Self) -> bool {
        self.entries.len() == other.entries.len()
            && self.entries.iter().all(|a| {
                other.entries.iter().any(|b| {
                    (*a.value).type_id() == (*b.value).type_id() && (a.eq)(&*a.value, &*b.value)
                })
            })
    }
}

impl Eq for Extras {}

impl fmt::Debug for Extras {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        struct Entry<'a>(&'a Extra);
        impl fmt::Debug for Entry<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                (self.0.debug)(&*self.0.value, f)
            }
        }
        f.debug_list()
            .entries(self.entries.iter().map(Entry))
            .finish()
    }
}

/// A transport's publish, confirmed by the broker: the future resolves `Ok` only once
/// the broker has the message (Kafka delivery report, JetStream publish ack, Pulsar
/// receipt, RabbitMQ publisher confirm, Redis `XADD` reply). Core NATS has no
/// acknowledgement: its publish resolves once the client has flushed it to its
/// connection.
pub trait Publish: Send + Sync + 'static {
    /// Publishes `message` and waits for the broker's confirmation.
    fn publish(&self, message: Outgoing) -> BoxFuture<'_, Result<(), PublishError>>;

    /// Publishes every message and waits for all the confirmations together: a result
    /// per message, in order. The messages come as the caller's iterator makes them; a
    /// transport that sends each before it takes the next can let each go once sent
    /// (Kafka, NATS, Redis; Pulsar a chunk at a time). By default every `publish` is
    /// started at once and their confirmations awaited together (the client pipelines
    /// them): each message is then held until its own confirmation.
    fn publish_all<'a>(
        &'a self,
        messages: Box<dyn Iterator<Item = Outgoing> + Send + 'a>,
    ) -> BoxFuture<'a, Vec<Result<(), PublishError>>> {
        use futures_util::StreamExt;
        let all: futures_util::stream::FuturesOrdered<_> =
            messages.map(|m| self.publish(m)).collect();
        Box::pin(all.collect())
    }

    /// The protocol and server this publisher reaches, for the service's description
    /// of itself (never its credentials); nothing by default.
    fn describe(&self) -> crate::Described {
        crate::Described::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    struct Partition(i32);

    #[test]
    fn typed_options_are_set_read_and_compared() {
        let mut a = Outgoing::new("orders", Bytes::new());
        assert!(a.extras.is_empty());
        a.extras.insert(Partition(1));
        a.extras.insert(Partition(3));
        assert_eq!(a.extras.get::<Partition>(), Some(&Partition(3)));
        assert_eq!(a.extras.get::<String>(), None);
        let mut b = Outgoing::new("orders", Bytes::new());
        b.extras.insert(Partition(3));
        assert_eq!(a, b);
        b.extras.insert(Partition(4));
        assert_ne!(a, b);
        assert_eq!(format!("{:?}", b.extras), "[Partition(4)]");
    }
}
