//! Tests of the delivery.

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
