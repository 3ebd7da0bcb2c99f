//! The kit a transport fills a delivery with: a new or reused delivery, its headers,
//! key, position and attempt, and sources read only when someone asks.

use std::sync::Arc;

use bytes::Bytes;

use super::deferred::{HeaderSource, HeadersLater, PositionLater, PositionSource, Slot};
use super::{Attempt, Delivery, Metadata};
use crate::headers::Headers;

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
            deferred: None,
            spare: None,
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
        self.discard_deferred();
        self
    }

    /// [`refill`](Delivery::refill) with the headers, key, metadata and attempt given
    /// at once: each field is written once (a transport that has them all, such as the
    /// memory broker, saves the second write and drop of each).
    #[inline]
    pub fn refill_with(
        &mut self,
        address: &Arc<str>,
        payload: Bytes,
        headers: Headers,
        key: Option<Bytes>,
        metadata: Metadata,
        attempt: Attempt,
    ) -> &mut Self {
        self.discard_deferred();
        self.payload = payload;
        self.headers = headers;
        self.key = key;
        if !Arc::ptr_eq(&self.address, address) {
            self.address = Arc::clone(address);
        }
        self.metadata = metadata;
        self.attempt = attempt;
        self.reply_to = None;
        self
    }

    /// Sets the headers in place.
    #[inline]
    pub fn set_headers(&mut self, headers: Headers) -> &mut Self {
        self.headers = headers;
        if self.deferred.is_some() {
            self.headers_set_over_deferred();
        }
        self
    }

    /// Headers set over a source: a header source is let go (a position source stays).
    #[cold]
    fn headers_set_over_deferred(&mut self) {
        if self.deferred.as_ref().is_some_and(|d| d.reads_headers())
            && let Some(mut deferred) = self.deferred.take()
        {
            // The payload the source held stays the delivery's.
            if let Some(payload) = deferred.take_payload() {
                self.payload = payload;
            }
            deferred.release();
            self.spare = Some(deferred);
        }
    }

    /// Leaves the headers, and the attempt (the retry-count header's, as
    /// [`Attempt::from_headers`] reads it), to be read from `source` when first asked for:
    /// a delivery whose headers nobody reads never pays for reading them. A malformed
    /// retry-count header is logged (a warning naming the address) when it is read.
    /// Replaces a [`PositionSource`] given before.
    #[inline]
    pub fn set_headers_from(&mut self, source: impl HeaderSource + 'static) -> &mut Self {
        self.own_deferred();
        self.deferred = Some(<dyn Slot>::with(self.spare.take(), HeadersLater(source)));
        self
    }

    /// Leaves the metadata and the attempt to be read from `source` when first asked
    /// for (the attempt is then the source's, whatever the headers say). Set the headers
    /// themselves first: this replaces a [`HeaderSource`] given before.
    #[inline]
    pub fn set_position_from(&mut self, source: impl PositionSource + 'static) -> &mut Self {
        self.own_deferred();
        self.deferred = Some(<dyn Slot>::with(self.spare.take(), PositionLater(source)));
        self
    }

    /// Reads now whatever was left to read from a [`HeaderSource`] or a
    /// [`PositionSource`], and lets go of it (and of the client's message it holds). The
    /// runtime calls this before it keeps a delivery past its handler (a delayed copy).
    #[inline]
    pub fn own_deferred(&mut self) {
        if self.deferred.is_some() {
            self.own_deferred_now();
        }
    }

    #[cold]
    fn own_deferred_now(&mut self) {
        let (metadata, attempt) = (*self.metadata(), self.attempt());
        if let Some(mut deferred) = self.deferred.take() {
            if let Some(headers) = deferred.take_headers() {
                self.headers = headers;
            }
            if let Some(payload) = deferred.take_payload() {
                self.payload = payload;
            }
            deferred.release();
            self.spare = Some(deferred);
        }
        self.metadata = metadata;
        self.attempt = attempt;
    }

    /// Done with this delivery: lets go of a [`HeaderSource`] or [`PositionSource`] (and
    /// the client's message it holds) without reading it, as the runtime does with a box
    /// it keeps for reuse. What was not read reads as the delivery's own from then on
    /// (no headers, no metadata, attempt 1, the payload it was refilled with).
    #[inline]
    pub fn discard_deferred(&mut self) {
        if self.deferred.is_some() {
            self.discard_deferred_now();
        }
    }

    #[cold]
    fn discard_deferred_now(&mut self) {
        if let Some(mut deferred) = self.deferred.take() {
            deferred.release();
            self.spare = Some(deferred);
        }
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
        self.own_deferred();
        self.metadata = metadata;
        self
    }

    /// Sets the attempt in place.
    #[inline]
    pub fn set_attempt(&mut self, attempt: Attempt) -> &mut Self {
        self.own_deferred();
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

    /// Sets the headers.
    #[inline]
    pub fn with_headers(mut self, headers: Headers) -> Self {
        self.set_headers(headers);
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
        self.set_metadata(metadata);
        self
    }

    /// Sets the attempt.
    #[inline]
    pub fn with_attempt(mut self, attempt: Attempt) -> Self {
        self.set_attempt(attempt);
        self
    }

    /// Counts one more attempt (the runtime runs the delivery again in place).
    #[inline]
    pub fn count_attempt(&mut self) {
        self.own_deferred();
        self.attempt = self.attempt.next();
    }
}
