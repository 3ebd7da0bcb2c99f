//! A message as received from a broker.

use std::any::Any;
use std::fmt;
use std::sync::{Arc, OnceLock};

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

/// Headers a transport reads from its client's record only when someone asks for them
/// (librdkafka parses a record's header section on first access, at a cost of about a
/// thousand instructions a record, whether or not it holds any). Given to
/// [`Delivery::set_headers_from`]; the delivery keeps it until it is done with the
/// delivery, or reads it then if it keeps the delivery longer
/// ([`Delivery::own_deferred`]).
pub trait HeaderSource: Send + Sync {
    /// The record's headers, read from the client (once per delivery).
    fn read(&self) -> Headers;

    /// The record's payload, borrowed from the client's message. When this is `Some`,
    /// it is the delivery's payload (whatever the delivery was refilled with): decoding
    /// reads it in place ([`Delivery::payload_slice`]), and a `Bytes` of it is copied
    /// only when someone asks for one ([`Delivery::payload`]) or the delivery is kept
    /// past its handler ([`Delivery::own_deferred`]). `None` (the default): the
    /// delivery's own.
    fn payload(&self) -> Option<&[u8]> {
        None
    }
}

/// A delivery's position ([`Metadata`]) and the broker's count of its deliveries
/// ([`Attempt`]), read from the client's message only when someone asks for them (a
/// JetStream delivery's numbers are in its `$JS.ACK` reply subject, some forty digits to
/// read). Given to [`Delivery::set_position_from`]; kept like a [`HeaderSource`].
pub trait PositionSource: Send + Sync {
    /// The delivery's metadata and attempt, read from the client (once per delivery).
    fn read(&self) -> (Metadata, Attempt);
}

/// What a delivery reads later: its headers, or its position.
trait Later: Send + Sync {
    /// The headers; `None`: the delivery's own.
    fn headers(&self) -> Option<Headers>;
    /// The metadata and attempt; `None`: the delivery's own (the attempt the headers'
    /// when they are read later).
    fn position(&self) -> Option<(Metadata, Attempt)>;
    fn reads_headers(&self) -> bool;
    /// The payload, in place; `None`: the delivery's own.
    fn payload(&self) -> Option<&[u8]>;
}

struct HeadersLater<S>(S);

impl<S: HeaderSource> Later for HeadersLater<S> {
    fn headers(&self) -> Option<Headers> {
        Some(self.0.read())
    }
    fn position(&self) -> Option<(Metadata, Attempt)> {
        None
    }
    fn reads_headers(&self) -> bool {
        true
    }
    fn payload(&self) -> Option<&[u8]> {
        self.0.payload()
    }
}

struct PositionLater<S>(S);

impl<S: PositionSource> Later for PositionLater<S> {
    fn headers(&self) -> Option<Headers> {
        None
    }
    fn position(&self) -> Option<(Metadata, Attempt)> {
        Some(self.0.read())
    }
    fn reads_headers(&self) -> bool {
        false
    }
    fn payload(&self) -> Option<&[u8]> {
        None
    }
}

/// What was read from a source, each part once, when first asked for.
#[derive(Default)]
struct Cells {
    headers: OnceLock<Option<Headers>>,
    position: OnceLock<Option<(Metadata, Attempt)>>,
    attempt: OnceLock<Attempt>,
    /// The source's payload, copied once someone asked for a `Bytes` of it.
    payload: OnceLock<Bytes>,
}

impl Cells {
    fn is_empty(&self) -> bool {
        self.headers.get().is_none()
            && self.position.get().is_none()
            && self.attempt.get().is_none()
            && self.payload.get().is_none()
    }
}

/// A source and what was read from it, in one box. Done with, the source is let go and
/// the box kept: the delivery's next source of the same kind moves into it, so a box
/// handed back for reuse costs no allocation per message.
struct Deferred<L> {
    cells: Cells,
    source: Option<L>,
}

/// A [`Deferred`] of any source, as a delivery holds it.
trait Slot: Any + Send + Sync {
    fn cells(&self) -> &Cells;
    fn cells_mut(&mut self) -> &mut Cells;
    /// The source; `None` once let go.
    fn later(&self) -> Option<&dyn Later>;
    /// Lets go of the source and of what was read from it; the box stays.
    fn release(&mut self);
}

impl<L: Later + 'static> Slot for Deferred<L> {
    fn cells(&self) -> &Cells {
        &self.cells
    }
    fn cells_mut(&mut self) -> &mut Cells {
        &mut self.cells
    }
    fn later(&self) -> Option<&dyn Later> {
        self.source.as_ref().map(|source| source as &dyn Later)
    }
    fn release(&mut self) {
        self.source = None;
        // Mostly nothing was read: then there is nothing to clear (a look at each cell
        // costs less than dropping and writing all four).
        if !self.cells.is_empty() {
            self.cells = Cells::default();
        }
    }
}

impl dyn Slot {
    /// `later` in a box: `spare`'s if it held a source of the same kind, else a new one.
    fn with<L: Later + 'static>(spare: Option<Box<dyn Slot>>, later: L) -> Box<dyn Slot> {
        if let Some(mut spare) = spare
            && let Some(deferred) = (&mut *spare as &mut dyn Any).downcast_mut::<Deferred<L>>()
        {
            deferred.source = Some(later);
            return spare;
        }
        Box::new(Deferred {
            cells: Cells::default(),
            source: Some(later),
        })
    }

    /// The payload in the source, read in place.
    #[inline]
    fn payload_in_place(&self) -> Option<&[u8]> {
        self.later()?.payload()
    }

    fn reads_headers(&self) -> bool {
        self.later().is_some_and(Later::reads_headers)
    }

    #[cold]
    #[inline(never)]
    fn payload(&self) -> Option<&Bytes> {
        let in_place = self.payload_in_place()?;
        Some(
            self.cells()
                .payload
                .get_or_init(|| Bytes::copy_from_slice(in_place)),
        )
    }

    /// The payload as a `Bytes` the caller owns: the copy made earlier, or a new one.
    fn take_payload(&mut self) -> Option<Bytes> {
        match self.cells_mut().payload.take() {
            Some(bytes) => Some(bytes),
            None => self.payload_in_place().map(Bytes::copy_from_slice),
        }
    }

    /// The headers as the caller's: those read earlier, or read now.
    fn take_headers(&mut self) -> Option<Headers> {
        match self.cells_mut().headers.take() {
            Some(headers) => headers,
            None => self.later().and_then(Later::headers),
        }
    }

    // Out of line: the common delivery has everything at hand.
    #[cold]
    #[inline(never)]
    fn headers(&self) -> Option<&Headers> {
        self.cells()
            .headers
            .get_or_init(|| self.later().and_then(Later::headers))
            .as_ref()
    }

    #[cold]
    #[inline(never)]
    fn position(&self) -> Option<&(Metadata, Attempt)> {
        self.cells()
            .position
            .get_or_init(|| self.later().and_then(Later::position))
            .as_ref()
    }
}

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

    /// Where the sender waits for a reply, if it is a request.
    #[inline]
    pub fn reply_to(&self) -> Option<&str> {
        self.reply_to.as_deref()
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

    /// Counts its reads, and its own drop (the client's record it stands for let go).
    struct Counted {
        headers: Headers,
        reads: Arc<std::sync::atomic::AtomicUsize>,
        _alive: Arc<()>,
    }

    impl HeaderSource for Counted {
        fn read(&self) -> Headers {
            self.reads
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.headers.clone()
        }
    }

    fn lazy(retry_count: &str) -> (Delivery, Arc<std::sync::atomic::AtomicUsize>, Arc<()>) {
        let mut headers = Headers::new();
        headers.insert(RETRY_COUNT_HEADER, retry_count.to_owned());
        let (reads, alive) = (Arc::default(), Arc::new(()));
        let mut delivery = Delivery::empty();
        delivery
            .refill(&Arc::from("orders"), Bytes::from_static(b"{}"))
            .set_headers_from(Counted {
                headers,
                reads: Arc::clone(&reads),
                _alive: Arc::clone(&alive),
            });
        (delivery, reads, alive)
    }

    fn reads(count: &std::sync::atomic::AtomicUsize) -> usize {
        count.load(std::sync::atomic::Ordering::Relaxed)
    }

    #[test]
    fn headers_from_a_source_are_read_once_and_only_when_asked() {
        let (mut delivery, count, alive) = lazy("2");
        assert_eq!(delivery.payload().as_ref(), b"{}");
        assert_eq!(reads(&count), 0, "nothing asked for the headers yet");
        assert_eq!(
            delivery.attempt(),
            Attempt::from_header_count(2),
            "the attempt is the header's"
        );
        assert_eq!(
            delivery.headers().get(RETRY_COUNT_HEADER).map(|v| &v[..]),
            Some(&b"2"[..])
        );
        assert_eq!(reads(&count), 1, "read once, however often asked");
        let copy = delivery.clone();
        assert_eq!(reads(&count), 1);
        assert_eq!(copy.attempt().number(), 3);
        assert_eq!(
            Arc::strong_count(&alive),
            2,
            "a clone does not hold the source"
        );
        delivery.own_deferred();
        assert_eq!(Arc::strong_count(&alive), 1, "owned: the source is let go");
        assert_eq!(delivery.attempt().number(), 3);
        assert_eq!(delivery.headers().len(), 1);
        delivery.count_attempt();
        assert_eq!(delivery.attempt().number(), 4);
        assert_eq!(reads(&count), 1);
    }

    #[test]
    fn a_source_is_let_go_unread_or_read_at_once_as_asked() {
        // Done with: let go without reading.
        let (mut delivery, count, alive) = lazy("0");
        delivery.discard_deferred();
        assert_eq!((reads(&count), Arc::strong_count(&alive)), (0, 1));
        // Kept past its handler: read now, then let go.
        let (mut delivery, count, alive) = lazy("5");
        delivery.own_deferred();
        assert_eq!((reads(&count), Arc::strong_count(&alive)), (1, 1));
        assert_eq!(delivery.attempt().number(), 6);
        // Refilled: the next message's headers are its own.
        let (mut delivery, count, alive) = lazy("1");
        delivery.refill(&Arc::from("orders"), Bytes::new());
        assert_eq!((reads(&count), Arc::strong_count(&alive)), (0, 1));
        assert!(delivery.headers().is_empty());
        assert_eq!(delivery.attempt().number(), 1);
        // A malformed count reads as the first attempt, as an eager read would.
        let (delivery, _, _) = lazy("-1");
        assert_eq!(delivery.attempt().number(), 1);
    }

    /// A record whose payload stays in it.
    struct Whole {
        payload: Vec<u8>,
        _alive: Arc<()>,
    }

    impl HeaderSource for Whole {
        fn read(&self) -> Headers {
            let mut headers = Headers::new();
            headers.insert(RETRY_COUNT_HEADER, "1");
            headers
        }
        fn payload(&self) -> Option<&[u8]> {
            Some(&self.payload)
        }
    }

    fn whole(payload: &[u8]) -> (Delivery, Arc<()>) {
        let alive = Arc::new(());
        let mut delivery = Delivery::empty();
        delivery
            .refill(&Arc::from("orders"), Bytes::new())
            .set_headers_from(Whole {
                payload: payload.to_vec(),
                _alive: Arc::clone(&alive),
            });
        (delivery, alive)
    }

    #[test]
    fn a_payload_left_in_the_source_is_read_in_place_and_kept_when_owned() {
        let (delivery, alive) = whole(b"{\"id\":1}");
        assert_eq!(delivery.payload_slice(), b"{\"id\":1}");
        assert_eq!(
            &delivery.payload()[..],
            b"{\"id\":1}",
            "a copy, made on request"
        );
        assert_eq!(
            delivery.payload().as_ptr(),
            delivery.payload().as_ptr(),
            "copied once"
        );
        let copy = delivery.clone();
        drop(delivery);
        assert_eq!(
            Arc::strong_count(&alive),
            1,
            "a clone holds its own payload"
        );
        assert_eq!(&copy.payload()[..], b"{\"id\":1}");
        // Kept past its handler: the payload (and the headers) become its own.
        let (mut delivery, alive) = whole(b"kept");
        delivery.own_deferred();
        assert_eq!(Arc::strong_count(&alive), 1);
        assert_eq!(
            (&delivery.payload()[..], delivery.payload_slice()),
            (&b"kept"[..], &b"kept"[..])
        );
        assert_eq!(delivery.attempt().number(), 2);
        // Headers set over it let the source go but keep its payload.
        let (mut delivery, alive) = whole(b"stays");
        delivery.set_headers(Headers::new());
        assert_eq!(Arc::strong_count(&alive), 1);
        assert_eq!(&delivery.payload()[..], b"stays");
        assert_eq!(delivery.attempt().number(), 1);
        // Refilled: the next message's payload is its own.
        let (mut delivery, alive) = whole(b"old");
        delivery.refill(&Arc::from("orders"), Bytes::from_static(b"new"));
        assert_eq!(Arc::strong_count(&alive), 1);
        assert_eq!(delivery.payload_slice(), b"new");
        // Refilled whole: the same, every field the next message's.
        let (mut delivery, alive) = whole(b"old");
        delivery.set_reply_to(Some(Arc::from("inbox")));
        let mut headers = Headers::new();
        headers.insert("k", "v");
        delivery.refill_with(
            &Arc::from("orders"),
            Bytes::from_static(b"new"),
            headers.clone(),
            Some(Bytes::from_static(b"key")),
            Metadata::sequence(9),
            Attempt::from_broker(3),
        );
        assert_eq!(Arc::strong_count(&alive), 1, "the old source let go");
        assert_eq!(delivery.payload_slice(), b"new");
        assert_eq!(delivery.headers(), &headers);
        assert_eq!(delivery.key().map(|k| &k[..]), Some(&b"key"[..]));
        assert_eq!(delivery.metadata(), &Metadata::sequence(9));
        assert_eq!(delivery.attempt().number(), 3);
        assert_eq!(delivery.reply_to(), None, "not the old message's");
        assert_eq!(delivery.address(), "orders");
    }

    fn box_of(delivery: &Delivery) -> Option<*const ()> {
        delivery
            .deferred
            .as_deref()
            .map(|d| std::ptr::from_ref(d).cast::<()>())
    }

    #[test]
    fn a_source_let_go_leaves_its_box_for_the_next_of_its_kind() {
        let (mut delivery, _, alive) = lazy("1");
        assert_eq!(delivery.attempt().number(), 2, "read, and so cached");
        let first = box_of(&delivery).expect("a box");
        delivery.discard_deferred();
        assert_eq!(Arc::strong_count(&alive), 1, "the source is let go");
        let mut headers = Headers::new();
        headers.insert(RETRY_COUNT_HEADER, "6");
        let (count, next) = (
            Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            Arc::new(()),
        );
        delivery
            .refill(&Arc::from("orders"), Bytes::new())
            .set_headers_from(Counted {
                headers,
                reads: Arc::clone(&count),
                _alive: Arc::clone(&next),
            });
        assert_eq!(box_of(&delivery), Some(first), "the same box, reused");
        assert_eq!(reads(&count), 0);
        assert_eq!(
            delivery.attempt().number(),
            7,
            "nothing read from the last source carries over"
        );
        assert_eq!(reads(&count), 1);
        // Owned, the box is kept too; a source of another kind gets a box of its own.
        delivery.own_deferred();
        assert_eq!(Arc::strong_count(&next), 1);
        delivery.set_position_from(Position(5));
        assert_ne!(box_of(&delivery), Some(first));
        assert_eq!(delivery.metadata().sequence, Some(5));
        assert_eq!(delivery.headers().len(), 1, "the headers owned before stay");
    }

    struct Position(u64);

    impl PositionSource for Position {
        fn read(&self) -> (Metadata, Attempt) {
            (Metadata::sequence(self.0), Attempt::from_broker(4))
        }
    }

    #[test]
    fn a_position_from_a_source_keeps_the_headers_set_around_it() {
        let mut headers = Headers::new();
        headers.insert(RETRY_COUNT_HEADER, "7");
        let mut delivery = Delivery::empty();
        delivery
            .refill(&Arc::from("orders"), Bytes::new())
            .set_headers(headers.clone())
            .set_position_from(Position(42));
        // The broker's count, whatever the header says.
        assert_eq!(delivery.attempt(), Attempt::from_broker(4));
        assert_eq!(delivery.metadata().sequence, Some(42));
        assert_eq!(delivery.headers(), &headers);
        // Headers set afterwards leave the position to be read.
        delivery.set_headers(Headers::new());
        assert_eq!(
            (delivery.metadata().sequence, delivery.attempt().number()),
            (Some(42), 4)
        );
        assert!(delivery.headers().is_empty());
        // Owned: read into the delivery itself; a further attempt counts from there.
        delivery.own_deferred();
        delivery.count_attempt();
        assert_eq!(
            (delivery.metadata().sequence, delivery.attempt().number()),
            (Some(42), 5)
        );
        // Discarded: nothing of it is read.
        delivery
            .refill(&Arc::from("orders"), Bytes::new())
            .set_position_from(Position(9));
        delivery.discard_deferred();
        assert_eq!(
            (delivery.metadata().sequence, delivery.attempt().number()),
            (None, 1)
        );
    }
}
