//! A message as received from a broker: what a handler sees of it (this file), what it
//! reads only when asked (`deferred`), its attempt and position (`attempt`), and the kit
//! transports fill it with (`fill`).

mod attempt;
mod deferred;
mod fill;
#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;

use crate::headers::Headers;
pub use attempt::{Attempt, AttemptSource, Metadata};
use deferred::Slot;
pub use deferred::{HeaderSource, PositionSource};

/// One received message: payload, headers, key, where it came from and which attempt it is.
pub struct Delivery {
    payload: Bytes,
    headers: Headers,
    key: Option<Bytes>,
    address: Arc<str>,
    metadata: Metadata,
    attempt: Attempt,
    reply_to: Option<Arc<str>>,
    /// When set, what it reads (headers, or metadata) and the attempt are its, not the
    /// fields above.
    deferred: Option<Box<dyn Slot>>,
    /// The box of a source let go, for the next one.
    spare: Option<Box<dyn Slot>>,
}

/// A clone holds its headers itself (read now if they were not yet), not the source.
impl Clone for Delivery {
    fn clone(&self) -> Self {
        Self {
            payload: self.payload().clone(),
            headers: self.headers().clone(),
            key: self.key.clone(),
            address: Arc::clone(&self.address),
            metadata: *self.metadata(),
            attempt: self.attempt(),
            reply_to: self.reply_to.clone(),
            deferred: None,
            spare: None,
        }
    }
}

impl fmt::Debug for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Delivery")
            .field("payload", self.payload())
            .field("headers", self.headers())
            .field("key", &self.key)
            .field("address", &self.address)
            .field("metadata", self.metadata())
            .field("attempt", &self.attempt())
            .field("reply_to", &self.reply_to)
            .finish()
    }
}

impl Delivery {
    /// Where the sender waits for a reply, if it is a request.
    #[inline]
    pub fn reply_to(&self) -> Option<&str> {
        self.reply_to.as_deref()
    }

    /// The payload bytes, as received. (Of a payload left in the client's record, a
    /// [`HeaderSource::payload`], this makes a copy the first time; to read it without
    /// one, use [`Delivery::payload_slice`].)
    #[inline]
    pub fn payload(&self) -> &Bytes {
        match &self.deferred {
            None => &self.payload,
            Some(deferred) => deferred.payload().unwrap_or(&self.payload),
        }
    }

    /// The payload bytes, as received, read in place: what decoding reads, with no copy
    /// of a payload left in the client's record.
    #[inline]
    pub fn payload_slice(&self) -> &[u8] {
        if let Some(deferred) = &self.deferred
            && let Some(payload) = deferred.payload_in_place()
        {
            return payload;
        }
        &self.payload
    }

    /// The headers, as received.
    #[inline]
    pub fn headers(&self) -> &Headers {
        match &self.deferred {
            None => &self.headers,
            Some(deferred) => deferred.headers().unwrap_or(&self.headers),
        }
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
        match &self.deferred {
            None => &self.metadata,
            Some(deferred) => deferred.position().map_or(&self.metadata, |p| &p.0),
        }
    }

    /// Which attempt this is.
    #[inline]
    pub fn attempt(&self) -> Attempt {
        match &self.deferred {
            None => self.attempt,
            Some(deferred) => self.deferred_attempt(&**deferred),
        }
    }

    #[cold]
    #[inline(never)]
    fn deferred_attempt(&self, deferred: &dyn Slot) -> Attempt {
        *deferred.cells().attempt.get_or_init(|| {
            if let Some((_, attempt)) = deferred.position() {
                *attempt
            } else if deferred.reads_headers() {
                self.attempt_from_headers()
            } else {
                self.attempt
            }
        })
    }

    fn attempt_from_headers(&self) -> Attempt {
        let (attempt, malformed) = Attempt::from_headers(self.headers());
        if let Some(error) = malformed {
            tracing::warn!(address = &*self.address, offset = self.metadata.offset, %error, "counting it as the first attempt");
        }
        attempt
    }
}
