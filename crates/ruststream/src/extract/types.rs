//! The built-in extractors.

use std::any::type_name;
use std::marker::PhantomData;
use std::ops::Deref;
use std::sync::Arc;

use bytes::Bytes;
use ruststream_core::{Attempt, Cause, Delivery, Headers};
use serde::de::DeserializeOwned;

use super::{FromDelivery, Incoming, Rejection};
use crate::codec::{Codec, Json};
use crate::publisher::Publisher;
use crate::state::StateMap;

/// The payload decoded from JSON into `T`. An undecodable payload never reaches the
/// handler: it follows the registration's failure policy (SPEC E1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message<T>(pub T);

impl<T> Message<T> {
    /// The decoded value.
    pub fn into_inner(self) -> T {
        self.0
    }
}

impl<T> Deref for Message<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: DeserializeOwned + Send + 'static> FromDelivery for Message<T> {
    fn from_delivery(incoming: &Incoming) -> Result<Self, Rejection> {
        decode::<T, Json>(incoming, type_name::<Self>()).map(Message)
    }
}

/// The payload decoded into `T` with codec `C`, for formats other than JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded<T, C>(pub T, pub PhantomData<C>);

impl<T, C> Deref for Decoded<T, C> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: DeserializeOwned + Send + 'static, C: Codec> FromDelivery for Decoded<T, C> {
    fn from_delivery(incoming: &Incoming) -> Result<Self, Rejection> {
        decode::<T, C>(incoming, type_name::<Self>()).map(|v| Decoded(v, PhantomData))
    }
}

fn decode<T: DeserializeOwned, C: Codec>(
    incoming: &Incoming,
    extractor: &'static str,
) -> Result<T, Rejection> {
    C::decode(incoming.delivery().payload_slice()).map_err(|error| {
        Rejection::new(
            extractor,
            Cause::context(format!("{} decode failed", C::NAME), error),
        )
    })
}

/// The raw payload bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payload(pub Bytes);

impl FromDelivery for Payload {
    fn from_delivery(incoming: &Incoming) -> Result<Self, Rejection> {
        Ok(Payload(incoming.delivery().payload().clone()))
    }
}

impl FromDelivery for Headers {
    fn from_delivery(incoming: &Incoming) -> Result<Self, Rejection> {
        Ok(incoming.delivery().headers().clone())
    }
}

impl FromDelivery for Attempt {
    fn from_delivery(incoming: &Incoming) -> Result<Self, Rejection> {
        Ok(incoming.delivery().attempt())
    }
}

impl FromDelivery for Delivery {
    fn from_delivery(incoming: &Incoming) -> Result<Self, Rejection> {
        Ok(incoming.delivery().clone())
    }
}

/// Where and how the delivery arrived: `meta.attempt.number()`, `meta.partition`...
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Meta {
    /// Which attempt this is (1 for the first delivery) and who counted it.
    pub attempt: Attempt,
    /// The key, if any.
    pub key: Option<Bytes>,
    /// The address it was read from.
    pub address: Arc<str>,
    /// The Kafka partition.
    pub partition: Option<i32>,
    /// The Kafka offset.
    pub offset: Option<i64>,
    /// The stream sequence (JetStream, the memory broker).
    pub sequence: Option<u64>,
    /// When the broker stored it, in milliseconds since the Unix epoch, where the broker
    /// says.
    pub timestamp_ms: Option<i64>,
    /// Pulsar's message id: `(ledger, entry, partition, batch index)`.
    pub ledger_entry: Option<(u64, u64, i32, i32)>,
}

impl FromDelivery for Meta {
    fn from_delivery(incoming: &Incoming) -> Result<Self, Rejection> {
        Ok(Meta::of(incoming.delivery()))
    }
}

impl Meta {
    /// Where and how `d` arrived.
    pub(crate) fn of(d: &Delivery) -> Self {
        let position = d.metadata();
        Meta {
            attempt: d.attempt(),
            key: d.key().cloned(),
            address: Arc::clone(d.address_arc()),
            partition: position.partition,
            offset: position.offset,
            sequence: position.sequence,
            timestamp_ms: position.timestamp_ms,
            ledger_entry: position.ledger_entry,
        }
    }
}

/// Shared state given to [`App::state`](crate::App::state). A handler asking for a type
/// the app does not have makes the app refuse to start.
#[derive(Debug)]
pub struct State<T>(pub Arc<T>);

impl<T> Clone for State<T> {
    fn clone(&self) -> Self {
        State(Arc::clone(&self.0))
    }
}

impl<T> Deref for State<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: Send + Sync + 'static> FromDelivery for State<T> {
    fn from_delivery(incoming: &Incoming) -> Result<Self, Rejection> {
        incoming
            .context()
            .state()
            .get::<T>()
            .map(State)
            .ok_or_else(|| Rejection::new(type_name::<Self>(), "the app has no such state"))
    }

    fn requirement(state: &StateMap) -> Option<String> {
        (!state.contains::<T>()).then(|| {
            format!(
                "the handler takes State<{}> but the app was given none (App::state)",
                type_name::<T>()
            )
        })
    }
}

impl FromDelivery for Publisher {
    fn from_delivery(incoming: &Incoming) -> Result<Self, Rejection> {
        Ok(incoming.context().publisher().clone())
    }
}

/// The address the sender of a request waits on (a NATS reply subject); publish the
/// reply there with the [`Publisher`]. Deliveries that are not requests are refused
/// (failure policy), so take `Option<ReplyTo>` when both arrive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyTo(pub Arc<str>);

impl FromDelivery for ReplyTo {
    fn from_delivery(incoming: &Incoming) -> Result<Self, Rejection> {
        incoming
            .delivery()
            .reply_to()
            .map(|r| ReplyTo(Arc::from(r)))
            .ok_or_else(|| {
                Rejection::new(
                    "ReplyTo",
                    "the delivery is not a request (it has no reply address)",
                )
            })
    }
}

impl<T: FromDelivery> FromDelivery for Option<T> {
    fn from_delivery(incoming: &Incoming) -> Result<Self, Rejection> {
        Ok(T::from_delivery(incoming).ok())
    }
}
