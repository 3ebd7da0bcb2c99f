//! The subscription's consumer, how its driver waits for records, and the records it
//! hands out (kept whole beside a handle on the consumer).
//!
//! The consumer is rdkafka's `BaseConsumer`, polled without waiting. rdkafka's
//! `StreamConsumer` would wait for us, but its `recv()` registers a waker under a mutex
//! and unregisters it again for every record, even one already queued: about 200
//! instructions a record (callgrind, 5,059 against 4,862 for the whole record path).
//! Here the consumer's queue calls back when it stops being empty, and that wakes the
//! one task that waits (the subscription's driver) through a [`Notify`], whose stored
//! permit covers a record that arrives between an empty poll and the wait.
//!
//! Two things `StreamConsumer` did are done here too:
//!
//! - A poll that serves an event (a rebalance, a commit's result, statistics, a log
//!   line: rdkafka routes librdkafka's log through the consumer's queue, a token
//!   refresh) answers nothing, like an empty queue, and records may be
//!   queued behind the event: the queue is not empty, so no callback comes. Each such
//!   event reaches the consumer's context, which counts them ([`TrackingContext::served`]):
//!   a poll that answered nothing while the count moved is made again.
//! - librdkafka takes a consumer that has not polled for `max.poll.interval.ms` for a
//!   wedged one and leaves its group: a waiting driver polls at least every half of it.
//!
//! `tests/client_assumptions.rs` pins what this relies on in the client.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaResult;
use rdkafka::message::{BorrowedMessage, Headers as _, Message};
use ruststream_core::{HeaderSource, Headers};
use tokio::sync::Notify;
use tokio::time::{Instant, Sleep};
use yoke::Yoke;

use crate::context::TrackingContext;

/// The subscription's consumer, shared with the records it hands out.
pub(crate) type Consumer_ = Arc<BaseConsumer<TrackingContext>>;

/// librdkafka's default `max.poll.interval.ms`.
const MAX_POLL_INTERVAL: Duration = Duration::from_secs(300);

/// Wakes the subscription's driver when its consumer's queue may have something.
pub(crate) struct Wakeup {
    ready: Arc<Notify>,
    /// When a waiting driver polls anyway (half of `max.poll.interval.ms`).
    keepalive: Pin<Box<Sleep>>,
    every: Duration,
}

/// Makes the consumer `config` describes, with its queue's wake-up.
pub(crate) fn consumer(
    config: &ClientConfig,
    context: TrackingContext,
) -> KafkaResult<(Consumer_, Wakeup)> {
    let every = config
        .get("max.poll.interval.ms")
        .and_then(|ms| ms.parse().ok())
        .map_or(MAX_POLL_INTERVAL, Duration::from_millis)
        / 2;
    let mut consumer: BaseConsumer<TrackingContext> = config.create_with_context(context)?;
    let ready = Arc::new(Notify::new());
    let wake = Arc::clone(&ready);
    // Called on one of librdkafka's threads when the queue stops being empty.
    consumer.set_nonempty_callback(move || wake.notify_one());
    let wakeup = Wakeup {
        ready,
        keepalive: Box::pin(tokio::time::sleep(every)),
        every,
    };
    Ok((Arc::new(consumer), wakeup))
}

/// The next record (or error) in the consumer's queue, without waiting: `None` when the
/// queue is empty. Events the poll serves on the way are dealt with by the context.
#[inline]
pub(crate) fn poll_now(
    consumer: &BaseConsumer<TrackingContext>,
) -> Option<KafkaResult<BorrowedMessage<'_>>> {
    loop {
        let served = consumer.context().served();
        if let Some(polled) = consumer.poll(Duration::ZERO) {
            return Some(polled);
        }
        if consumer.context().served() == served {
            return None;
        }
        // The poll served an event: what is behind it is polled now.
    }
}

impl Wakeup {
    /// Returns when the queue may have something, or when a waiting consumer must poll
    /// to keep its group membership. Cancel safe.
    pub(crate) async fn ready(&mut self) {
        tokio::select! {
            () = self.ready.notified() => {}
            () = self.keepalive.as_mut() => {
                let next = Instant::now() + self.every;
                self.keepalive.as_mut().reset(next);
            }
        }
    }
}

/// A record borrowed from its consumer, in a form [`Yoke`] can keep beside (a handle on)
/// that consumer.
#[derive(yoke::Yokeable)]
pub(crate) struct Borrowed<'c>(BorrowedMessage<'c>);

/// A record kept with (a handle on) the consumer it borrows, so it can outlive the poll
/// that gave it: its headers are read from it only if someone asks for them (librdkafka
/// parses a record's header section on first access, allocating a buffer even for none:
/// most records' handlers never ask), and its payload is decoded in place (copied only if
/// someone asks for the bytes). A delivery holds it until its handler is done; the runtime
/// then lets go of it, so no more records (and the fetch buffers they share) are held than
/// deliveries run. The record and the handle sit side by side (no box of their own): the
/// delivery keeps them in the box it reuses for every record.
pub(crate) struct Record(pub(crate) Yoke<Borrowed<'static>, Consumer_>);

impl Record {
    pub(crate) fn message(&self) -> &BorrowedMessage<'_> {
        &self.0.get().0
    }
}

impl HeaderSource for Record {
    fn read(&self) -> Headers {
        headers_of(self.message())
    }

    /// Decoded in place, copied only if someone asks for the `Bytes`.
    fn payload(&self) -> Option<&[u8]> {
        Some(self.message().payload().unwrap_or_default())
    }
}

/// A record's headers, copied out of the client's message.
pub(crate) fn headers_of(message: &BorrowedMessage<'_>) -> Headers {
    message
        .headers()
        .map(|h| {
            h.iter()
                .map(|header| {
                    (
                        header.key,
                        Bytes::copy_from_slice(header.value.unwrap_or_default()),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Why the consumer gave no record at once.
pub(crate) enum NotNow {
    /// Nothing in the client's queue (or it served an event instead): wait for one.
    Empty,
    Failed(rdkafka::error::KafkaError),
}

/// The next record in the client's queue, if one is there now (no waiting).
#[inline]
pub(crate) fn record_now(consumer: &BaseConsumer<TrackingContext>) -> Result<Borrowed<'_>, NotNow> {
    match poll_now(consumer) {
        Some(Ok(message)) => Ok(Borrowed(message)),
        Some(Err(e)) => Err(NotNow::Failed(e)),
        None => Err(NotNow::Empty),
    }
}
