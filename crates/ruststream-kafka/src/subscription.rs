//! An open Kafka subscription: records in, positions stored (Tracked).

use std::collections::VecDeque;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::error::KafkaResult;
use rdkafka::message::{BorrowedMessage, Message};
use ruststream_core::{
    AckError, AddressNames, Attempt, BacklogProbe, Cause, Delivery, LinkProbe, Metadata, Settle,
    StillHeld, SubscribeError, Subscription,
};
use yoke::Yoke;

use crate::book::{Book, StoreWhen};
use crate::close::off_runtime;
use crate::config::Mode;
use crate::paused::Paused;
use crate::queue::{self, Borrowed, Consumer_, NotNow, Record, Wakeup, headers_of, record_now};
pub use crate::receipt::KafkaReceipt;
use crate::window::{Tick, Window};

/// Records a subscription holds that were polled at `max_in_flight` (from partitions not
/// paused yet) before it stops polling: a pause that does not hold cannot grow memory.
const EARLY_LIMIT: usize = 64;
/// How long a delivery waits for its lane before the consumer is polled meanwhile.
const LONG_WAIT: Duration = Duration::from_millis(200);

/// What one poll of the consumer gave.
enum Polled<'c> {
    /// A record waited for (read at once, like an error).
    Record(KafkaResult<BorrowedMessage<'c>>),
    /// The exactly-once window's commit is due: tick it before polling again.
    Due,
    /// The exactly-once producer was fenced: this subscription is done.
    Fenced,
}

/// An open subscription. Only its driver task uses it.
pub struct KafkaSubscription {
    consumer: Option<Consumer_>,
    wakeup: Wakeup,
    book: Book,
    commit: Mode,
    topics: AddressNames,
    /// The one topic a `KafkaTopic` reads: every record's topic, so the record's own name
    /// (a C string, measured and checked as UTF-8 on every read) is not asked for.
    only_topic: Option<Arc<str>>,
    address: Arc<str>,
    close_timeout: Duration,
    window: Option<Window>,
    /// Partitions paused while nothing is fetched, resumed by the next fetch.
    paused: Paused,
    /// Records polled while paused (from partitions assigned since), handed out first.
    early: VecDeque<(Delivery, KafkaReceipt)>,
}

impl std::fmt::Debug for KafkaSubscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSubscription")
            .field("address", &self.address)
            .field("commit", &self.commit)
            .finish()
    }
}

impl KafkaSubscription {
    pub(crate) fn new(
        consumer: Consumer_,
        wakeup: Wakeup,
        commit: Mode,
        only_topic: Option<&str>,
        address: &str,
        close_timeout: Duration,
        window: Option<Window>,
    ) -> Self {
        Self {
            book: Book::new(Arc::clone(&consumer.context().moves)),
            consumer: Some(consumer),
            wakeup,
            commit,
            topics: AddressNames::default(),
            only_topic: only_topic.map(Arc::from),
            address: Arc::from(address),
            close_timeout,
            window,
            paused: Paused::new(),
            early: VecDeque::new(),
        }
    }

    /// Writes `message` into `slot`, all but its headers (and its payload, unless
    /// `copy_payload`: a record kept whole gives it in place), and books it.
    #[inline]
    fn delivery(
        &mut self,
        message: &BorrowedMessage<'_>,
        slot: &mut Delivery,
        copy_payload: bool,
    ) -> KafkaReceipt {
        let topic = match &self.only_topic {
            Some(topic) => topic,
            None => self.topics.shared(message.topic()),
        };
        let (partition, offset) = (message.partition(), message.offset());
        let payload = if copy_payload {
            Bytes::copy_from_slice(message.payload().unwrap_or_default())
        } else {
            Bytes::new()
        };
        slot.refill(topic, payload)
            .set_key(message.key().map(Bytes::copy_from_slice))
            .set_metadata(
                Metadata::kafka(partition, offset)
                    .with_timestamp_ms(message.timestamp().to_millis()),
            );
        self.book
            .delivered(topic, partition, offset, self.commit.tracks())
    }

    /// `Commit::Auto`: reads `receipt`'s record again. Its offset is stored back (so a
    /// commit meanwhile, or the one on close, does not pass it) and the partition sought
    /// back to it; records after it come again too (SPEC G3).
    fn rewind(&self, receipt: &KafkaReceipt) -> Result<(), AckError> {
        let Some(consumer) = self.consumer.as_ref() else {
            return Ok(());
        };
        let topic = &**self.book.topic(receipt);
        let (partition, offset) = (receipt.partition, receipt.offset);
        let failed = |what: &str, e: rdkafka::error::KafkaError| {
            AckError::Failed(Cause::context(
                format!("{what} {topic}/{partition} to offset {offset}"),
                e,
            ))
        };
        // `store_offset` stores the offset after the one given.
        consumer
            .store_offset(topic, partition, offset - 1)
            .map_err(|e| failed("storing back", e))?;
        consumer
            .seek(
                topic,
                partition,
                rdkafka::Offset::Offset(offset),
                Duration::ZERO,
            )
            .map_err(|e| failed("seeking", e))
    }

    /// Waits for the consumer's next record, ticking the exactly-once window first (a
    /// record already waiting, with no window, `next_into` takes itself, kept whole).
    async fn poll<'c>(&mut self, consumer: &'c Consumer_) -> Polled<'c> {
        self.book.forget_moved_partitions();
        let due = match &mut self.window {
            Some(window) => match window.tick(consumer, &self.book.moves).await {
                Tick::Fetch(due) => Some(due),
                Tick::Fenced => return Polled::Fenced,
            },
            None => None,
        };
        let result = loop {
            if let Some(result) = queue::poll_now(consumer) {
                break result;
            }
            match due {
                None => self.wakeup.ready().await,
                Some(due) => tokio::select! {
                    () = self.wakeup.ready() => {}
                    () = tokio::time::sleep_until(due) => return Polled::Due,
                },
            }
        };
        self.book.forget_moved_partitions();
        Polled::Record(result)
    }

    /// Makes a polled record a delivery, written into `slot`, and books it: its headers
    /// (and so the attempt) read now.
    fn handed_over(
        &mut self,
        consumer: &Consumer_,
        message: &BorrowedMessage<'_>,
        slot: &mut Delivery,
    ) -> KafkaReceipt {
        let receipt = self.taken(consumer, message, slot, true);
        let headers = headers_of(message);
        let (attempt, malformed) = Attempt::from_headers(&headers);
        if let Some(error) = malformed {
            let topic = &**self.book.topic(&receipt);
            tracing::warn!(topic, offset = receipt.offset, %error, "counting it as the first attempt");
        }
        slot.set_headers(headers).set_attempt(attempt);
        receipt
    }

    /// Makes a record kept whole a delivery, written into `slot`, and books it: its
    /// headers (and so the attempt) are read from the record only if someone asks, and
    /// its payload is decoded where it is (copied only if someone asks for the bytes).
    #[inline]
    fn held_over(&mut self, record: Record, slot: &mut Delivery) -> KafkaReceipt {
        let receipt = self.taken(record.0.backing_cart(), record.message(), slot, false);
        slot.set_headers_from(record);
        receipt
    }

    /// What every record handed over goes through: the offset stored at hand-over
    /// (`Commit::Auto`), the delivery written but for its headers, the window told.
    #[inline]
    fn taken(
        &mut self,
        consumer: &Consumer_,
        message: &BorrowedMessage<'_>,
        slot: &mut Delivery,
        copy_payload: bool,
    ) -> KafkaReceipt {
        if self.commit == Mode::Auto {
            self.store_at_hand_over(consumer, message);
        }
        let receipt = self.delivery(message, slot, copy_payload);
        if self.window.is_some() {
            self.window_handed_out(&receipt);
        }
        receipt
    }

    /// `Commit::Auto`: the offset stored at hand-over, as librdkafka's own automatic
    /// store would (K2). Out of line, like the window's part below: the code every record
    /// runs through stays small.
    #[inline(never)]
    fn store_at_hand_over(&self, consumer: &Consumer_, message: &BorrowedMessage<'_>) {
        if let Err(e) = consumer.store_offset_from_message(message) {
            tracing::warn!(address = &*self.address, error = %e, "storing the offset at hand-over failed");
        }
    }

    #[inline(never)]
    fn window_handed_out(&mut self, receipt: &KafkaReceipt) {
        if let Some(window) = &mut self.window {
            window.handed_out(self.book.topic(receipt), receipt, &self.book.moves);
        }
    }

    /// A record held early, written into `slot`.
    #[cold]
    fn hand_out_early(&mut self, slot: &mut Delivery) -> Option<KafkaReceipt> {
        let (delivery, receipt) = self.early.pop_front()?;
        *slot = delivery;
        Some(receipt)
    }

    #[cold]
    fn failed(&self, e: rdkafka::error::KafkaError) -> SubscribeError {
        SubscribeError::new(&*self.address, e)
    }

    /// Keeps a record polled at the bound to hand out first: its headers read now rather
    /// than its record kept, as it may wait a while.
    fn hold_early(&mut self, consumer: &Consumer_, message: &BorrowedMessage<'_>) {
        let mut delivery = Delivery::empty();
        let receipt = self.handed_over(consumer, message, &mut delivery);
        self.early.push_back((delivery, receipt));
        if self.early.len() == EARLY_LIMIT {
            tracing::warn!(
                address = &*self.address,
                held = EARLY_LIMIT,
                "partitions keep delivering at max_in_flight although paused; polling stops until deliveries settle"
            );
        }
    }

    /// Performs one settlement (none waits for the cluster). The common case, a `Tracked`
    /// ack or drop, is the early branch; the others are out of line, so the code a record
    /// runs through stays small (instruction cache: see BENCHMARKS.md).
    #[inline]
    fn settle_at_once(&mut self, receipt: &KafkaReceipt, settle: Settle) -> Result<(), AckError> {
        if self.commit == Mode::Tracked && matches!(settle, Settle::Ack | Settle::Drop) {
            // Nothing to store when the position did not move, or when the delivery
            // was read before its partition moved: the partition's next reader
            // starts from the committed offset anyway (K5). The group resumes from
            // the record after the position, stored before the next poll (a
            // batch's settlements store once per partition).
            if let Some(position) = self.book.settled(receipt) {
                self.book.store_later(receipt, position + 1);
            }
            return Ok(());
        }
        self.settle_otherwise(receipt, settle)
    }

    /// [`settle_at_once`](Self::settle_at_once) for every case but a `Tracked` ack or drop.
    #[inline(never)]
    fn settle_otherwise(&mut self, receipt: &KafkaReceipt, settle: Settle) -> Result<(), AckError> {
        debug_assert!(
            self.commit != Mode::Tracked || !matches!(settle, Settle::Ack | Settle::Drop)
        );
        match (self.commit, settle) {
            (Mode::Auto, Settle::Redeliver) => self.rewind(receipt),
            (Mode::Auto, _) => Ok(()),
            (Mode::Transactional, _) => {
                let position = match settle {
                    Settle::Ack | Settle::Drop => self.book.settled(receipt),
                    _ => None,
                };
                if let Some(window) = &mut self.window {
                    window.settled(
                        self.book.topic(receipt),
                        receipt,
                        settle,
                        position,
                        &self.book.moves,
                    );
                }
                Ok(())
            }
            (Mode::Tracked, Settle::Nothing) => Ok(()),
            (Mode::Tracked, other) => Err(AckError::failed(format!(
                "{other:?} has no meaning on Kafka"
            ))),
        }
    }

    /// Stores the positions settled since the last store (`Commit::Tracked`) when `when`
    /// says: before the next record while records keep coming, once for many of them;
    /// when the queue runs dry, at the bound and at close, whatever settled. A revoke
    /// stores its partitions' at once (in the consumer's context, inside the poll that
    /// serves it), so its commit sees them. A failure is logged: the records after the
    /// last stored position are read again by the partition's next reader (at least once).
    #[inline]
    fn store_settled(&mut self, when: StoreWhen) {
        let Some(consumer) = self.consumer.as_ref() else {
            return;
        };
        let address = &*self.address;
        self.book.store_due(
            when,
            |list| consumer.store_offsets(list),
            |topic, partition, offset, error| {
                tracing::warn!(
                    address,
                    topic,
                    partition,
                    offset,
                    %error,
                    "storing the settled position failed; the records after the last stored one may be read again"
                );
            },
        );
    }

    /// The stored position of a partition (`Commit::Tracked`), for tests and metrics.
    pub fn stored_position(&self, topic: &str, partition: i32) -> Option<i64> {
        self.book.stored(topic, partition)
    }
}

impl Subscription for KafkaSubscription {
    type Receipt = KafkaReceipt;

    /// Per assigned partition, the high watermark minus the group's committed offset
    /// (the low watermark where nothing is committed yet), asked of the cluster.
    fn backlog(&self) -> Option<BacklogProbe> {
        let consumer = Arc::clone(self.consumer.as_ref()?);
        Some(Arc::new(move || {
            let consumer = Arc::clone(&consumer);
            Box::pin(async move {
                tokio::task::spawn_blocking(move || crate::lag::lag(&consumer))
                    .await
                    .map_err(|e| e.to_string())?
            })
        }))
    }

    /// Up while a broker of the cluster answers a metadata request within two seconds
    /// (librdkafka reconnects by itself; it reports no "connected" state to ask).
    fn link(&self) -> Option<LinkProbe> {
        let consumer = Arc::clone(self.consumer.as_ref()?);
        Some(Arc::new(move || {
            consumer
                .fetch_metadata(None, Duration::from_secs(2))
                .is_ok()
        }))
    }

    async fn next_into(
        &mut self,
        slot: &mut Delivery,
    ) -> Option<Result<KafkaReceipt, SubscribeError>> {
        if let Poll::Ready(next) = self.next_now(slot) {
            return next;
        }
        let consumer = Arc::clone(self.consumer.as_ref()?);
        loop {
            return match self.poll(&consumer).await {
                Polled::Record(Ok(message)) => {
                    Some(Ok(self.handed_over(&consumer, &message, slot)))
                }
                Polled::Record(Err(e)) => Some(Err(SubscribeError::new(&*self.address, e))),
                Polled::Due => continue,
                Polled::Fenced => None,
            };
        }
    }

    /// A record held early, or one already in the client's queue, taken whole (without
    /// entering `poll`); an exactly-once window always goes through `next_into`'s poll,
    /// which keeps its commit on time.
    fn next_now(
        &mut self,
        slot: &mut Delivery,
    ) -> Poll<Option<Result<KafkaReceipt, SubscribeError>>> {
        let Some(consumer) = self.consumer.as_ref() else {
            return Poll::Ready(None);
        };
        let consumer = Arc::clone(consumer);
        self.store_settled(StoreWhen::Many);
        if !self.early.is_empty() {
            return Poll::Ready(self.hand_out_early(slot).map(Ok));
        }
        self.paused.resume(&consumer, &self.address);
        if self.window.is_some() {
            return Poll::Pending;
        }
        // The handle cloned above becomes the record's.
        self.book.forget_moved_partitions();
        match Yoke::<Borrowed<'static>, _>::try_attach_to_cart(consumer, record_now) {
            Ok(record) => {
                let record = Record(record);
                // Polling may have run a rebalance: forgotten before it is booked.
                self.book.forget_moved_partitions();
                Poll::Ready(Some(Ok(self.held_over(record, slot))))
            }
            Err(NotNow::Failed(e)) => Poll::Ready(Some(Err(self.failed(e)))),
            Err(NotNow::Empty) => {
                // Nothing more to read now: what settled is stored before the wait.
                self.store_settled(StoreWhen::Any);
                Poll::Pending
            }
        }
    }

    async fn settle(&mut self, receipt: KafkaReceipt, settle: Settle) -> Result<(), AckError> {
        self.settle_at_once(&receipt, settle)
    }

    /// Nothing in a Kafka settlement waits: the offset book, a stored offset, the window.
    fn settle_now(
        &mut self,
        receipt: KafkaReceipt,
        settle: Settle,
    ) -> ControlFlow<Result<(), AckError>, KafkaReceipt> {
        ControlFlow::Break(self.settle_at_once(&receipt, settle))
    }

    async fn idle(&mut self) {
        // At the bound (G5) the assigned partitions are paused and the consumer still
        // polled: it keeps its group membership (`max.poll.interval.ms`), an exactly-once
        // window still commits on time, and a paused partition gives nothing (librdkafka
        // drops what it had fetched and resumes from the next record handed out).
        let Some(consumer) = self.consumer.clone() else {
            return std::future::pending().await;
        };
        if self.early.len() >= EARLY_LIMIT {
            // Pausing does not hold (the client refuses it): stop polling rather than
            // hold records without bound, until deliveries settle.
            return std::future::pending().await;
        }
        self.store_settled(StoreWhen::Any);
        self.paused.pause(&consumer, &self.address);
        match self.poll(&consumer).await {
            // From a partition assigned since the last pause (paused next round), or one
            // whose pause failed (tried again next round).
            Polled::Record(Ok(message)) => self.hold_early(&consumer, &message),
            Polled::Record(Err(e)) => {
                tracing::debug!(address = &*self.address, error = %e, "polling at max_in_flight failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Polled::Due => {}
            Polled::Fenced => std::future::pending().await,
        }
    }

    /// What settled is stored now, not when the lane frees. A wait of 200 ms gets the
    /// bound's upkeep (paused, polled): the member still takes part in a rebalance,
    /// which the whole group waits for, and a window commits on time. A shorter wait does
    /// not pause, which drops what librdkafka fetched ahead.
    async fn while_waiting(&mut self) {
        self.store_settled(StoreWhen::Any);
        tokio::time::sleep(LONG_WAIT).await;
        loop {
            self.idle().await;
        }
    }

    /// Under `Tracked` and `Transactional` the record's position waits at it (D2): when its
    /// partition moves, or an aborted window rewinds it, the record is read again and waits
    /// again, so this wait's copy is not made (two copies otherwise). Under `Auto` the
    /// position passed it at hand-over: the copy is always made.
    fn parked(&mut self, receipt: &KafkaReceipt) -> Option<StillHeld> {
        if self.commit == Mode::Auto {
            return None;
        }
        let still_held = self.book.still_read_as(receipt);
        match &mut self.window {
            Some(window) => Some(window.parked(self.book.topic(receipt), receipt, still_held)),
            None => Some(still_held),
        }
    }

    async fn close(mut self) {
        self.store_settled(StoreWhen::Any);
        if let (Some(mut window), Some(consumer)) = (self.window.take(), self.consumer.as_ref()) {
            // Records held early were counted as handed out but never ran: what finished
            // in the window still commits (their offsets are not in it; they are read
            // again).
            window.never_ran(self.early.len());
            window
                .finish(consumer, &self.book.moves, self.close_timeout)
                .await;
        }
        let Some(consumer) = self.consumer.take() else {
            return;
        };
        let tracked = self.commit == Mode::Tracked;
        off_runtime(
            "commit and close the Kafka consumer",
            self.close_timeout,
            move || {
                if tracked && let Err(e) = consumer.commit_consumer_state(CommitMode::Sync) {
                    tracing::debug!(error = %e, "final commit on close");
                }
                consumer.unsubscribe();
                drop(consumer);
            },
        )
        .await;
    }
}

impl Drop for KafkaSubscription {
    fn drop(&mut self) {
        if let Some(consumer) = self.consumer.take() {
            // Never drop a consumer on the async runtime's thread (it can block).
            let _ = std::thread::Builder::new()
                .name("ruststream-kafka-drop".to_owned())
                .spawn(move || drop(consumer));
        }
    }
}
