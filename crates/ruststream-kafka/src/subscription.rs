//! An open Kafka subscription: records in, positions stored (Tracked).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rdkafka::TopicPartitionList;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::error::KafkaResult;
use rdkafka::message::{BorrowedMessage, Headers as _, Message};
use ruststream_core::{
    AckError, AddressNames, Attempt, Backlog, BacklogProbe, Cause, Delivery, Headers, LinkProbe,
    Metadata, Settle, SubscribeError, Subscription,
};

use crate::close::off_runtime;
use crate::config::Commit;
use crate::context::{Moves, TrackingContext};
pub use crate::receipt::KafkaReceipt;
use crate::tracker::OffsetTracker;
use crate::window::{Tick, Window};

#[derive(Debug)]
struct PartitionState {
    topic: Arc<str>,
    partition: i32,
    tracker: OffsetTracker,
    generation: u64,
    /// A one-partition list kept for storing its offset (`Commit::Tracked`): storing by
    /// topic name makes rdkafka build and free a native topic handle on every call.
    store: Option<TopicPartitionList>,
}

/// The subscription's bookkeeping, apart from the consumer: trackers per partition and
/// assignment generation. Partitions live in a vector (a consumer reads few) found by a
/// receipt's slot, or, for a new record, from the last one's.
#[derive(Debug)]
struct Book {
    moves: Arc<Moves>,
    partitions: Vec<PartitionState>,
    last: usize,
    seen_epoch: u64,
}

impl Book {
    fn new(moves: Arc<Moves>) -> Self {
        Self {
            moves,
            partitions: Vec::new(),
            last: 0,
            seen_epoch: 0,
        }
    }

    /// Discards the tracked state of partitions that moved since the last look (K5).
    fn forget_moved_partitions(&mut self) {
        let epoch = self.moves.epoch();
        if epoch == self.seen_epoch {
            return;
        }
        self.seen_epoch = epoch;
        for state in &mut self.partitions {
            let generation = self.moves.generation(&state.topic, state.partition);
            if generation != state.generation {
                state.tracker = OffsetTracker::new();
                state.generation = generation;
            }
        }
    }

    fn slot(&mut self, topic: &Arc<str>, partition: i32) -> usize {
        let is = |s: &PartitionState| s.partition == partition && *s.topic == **topic;
        if self.partitions.get(self.last).is_some_and(is) {
            return self.last;
        }
        let slot = match self.partitions.iter().position(is) {
            Some(slot) => slot,
            None => {
                self.partitions.push(PartitionState {
                    topic: Arc::clone(topic),
                    partition,
                    tracker: OffsetTracker::new(),
                    generation: self.moves.generation(topic, partition),
                    store: None,
                });
                self.partitions.len() - 1
            }
        };
        self.last = slot;
        slot
    }

    /// Records a delivered offset (tracked or not) and makes its receipt.
    fn delivered(
        &mut self,
        topic: Arc<str>,
        partition: i32,
        offset: i64,
        track: bool,
    ) -> KafkaReceipt {
        let slot = self.slot(&topic, partition);
        let state = &mut self.partitions[slot];
        if track {
            state.tracker.delivered(offset);
        }
        KafkaReceipt {
            topic,
            partition,
            offset,
            generation: state.generation,
            slot,
        }
    }

    /// Settles a receipt: the new stored position when it moved; nothing for a delivery
    /// read before its partition moved.
    fn settled(&mut self, receipt: &KafkaReceipt) -> Option<i64> {
        self.forget_moved_partitions();
        let state = self.partitions.get_mut(receipt.slot)?;
        if state.generation != receipt.generation {
            tracing::debug!(
                topic = &*receipt.topic,
                partition = receipt.partition,
                offset = receipt.offset,
                "settled after its partition moved: nothing stored (K5)"
            );
            return None;
        }
        state.tracker.settled(receipt.offset)
    }

    /// The list that stores `resume_at` as the position of `receipt`'s partition.
    fn store_list(
        &mut self,
        receipt: &KafkaReceipt,
        resume_at: i64,
    ) -> KafkaResult<&TopicPartitionList> {
        let state = &mut self.partitions[receipt.slot];
        let list = state.store.get_or_insert_with(|| {
            let mut list = TopicPartitionList::with_capacity(1);
            list.add_partition(&state.topic, state.partition);
            list
        });
        list.set_all_offsets(rdkafka::Offset::Offset(resume_at))?;
        Ok(list)
    }

    fn stored(&self, topic: &str, partition: i32) -> Option<i64> {
        self.partitions
            .iter()
            .find(|s| &*s.topic == topic && s.partition == partition)
            .and_then(|s| s.tracker.stored())
    }
}

type Consumer_ = Arc<StreamConsumer<TrackingContext>>;

/// Records a subscription holds that were polled at `max_in_flight` (from partitions not
/// paused yet) before it stops polling: a pause that does not hold cannot grow memory.
const EARLY_LIMIT: usize = 64;

/// What one poll of the consumer gave.
enum Polled<'c> {
    Record(KafkaResult<BorrowedMessage<'c>>),
    /// The exactly-once window's commit is due: tick it before polling again.
    Due,
    /// The exactly-once producer was fenced: this subscription is done.
    Fenced,
}

/// An open subscription. Only its driver task uses it.
pub struct KafkaSubscription {
    consumer: Option<Consumer_>,
    book: Book,
    commit: Commit,
    topics: AddressNames,
    address: Arc<str>,
    close_timeout: Duration,
    window: Option<Window>,
    /// Partitions paused at `max_in_flight` (G5), resumed by the next fetch. Every one
    /// ever paused is resumed: librdkafka keeps an application pause across a revoke and
    /// a later assignment of the same partition.
    paused: TopicPartitionList,
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
        consumer: StreamConsumer<TrackingContext>,
        moves: Arc<Moves>,
        commit: Commit,
        address: &str,
        close_timeout: Duration,
        window: Option<Window>,
    ) -> Self {
        Self {
            consumer: Some(Arc::new(consumer)),
            book: Book::new(moves),
            commit,
            topics: AddressNames::default(),
            address: Arc::from(address),
            close_timeout,
            window,
            paused: TopicPartitionList::new(),
            early: VecDeque::new(),
        }
    }

    fn delivery(&mut self, message: &BorrowedMessage<'_>) -> (Delivery, KafkaReceipt) {
        let topic = self.topics.get(message.topic());
        let headers: Headers = message
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
            .unwrap_or_default();
        let (attempt, malformed) = Attempt::from_headers(&headers);
        if let Some(error) = malformed {
            tracing::warn!(topic = &*topic, offset = message.offset(), %error, "counting it as the first attempt");
        }
        let (partition, offset) = (message.partition(), message.offset());
        let delivery = Delivery::new(
            Arc::clone(&topic),
            Bytes::copy_from_slice(message.payload().unwrap_or_default()),
        )
        .with_headers(headers)
        .with_key(message.key().map(Bytes::copy_from_slice))
        .with_metadata(
            Metadata::kafka(partition, offset).with_timestamp_ms(message.timestamp().to_millis()),
        )
        .with_attempt(attempt);
        let receipt = self
            .book
            .delivered(topic, partition, offset, self.commit.tracks());
        (delivery, receipt)
    }

    /// `Commit::Auto`: reads `receipt`'s record again. Its offset is stored back (so a
    /// commit meanwhile, or the one on close, does not pass it) and the partition sought
    /// back to it; records after it come again too (SPEC G3).
    fn rewind(&self, receipt: &KafkaReceipt) -> Result<(), AckError> {
        let Some(consumer) = self.consumer.as_ref() else {
            return Ok(());
        };
        let (topic, partition, offset) = (&*receipt.topic, receipt.partition, receipt.offset);
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

    /// Polls the consumer once, ticking the exactly-once window first.
    async fn poll<'c>(&mut self, consumer: &'c Consumer_) -> Polled<'c> {
        self.book.forget_moved_partitions();
        let due = match &mut self.window {
            Some(window) => match window.tick(consumer, &self.book.moves).await {
                Tick::Fetch(due) => Some(due),
                Tick::Fenced => return Polled::Fenced,
            },
            None => None,
        };
        let result = match due {
            None => consumer.recv().await,
            Some(due) => tokio::select! {
                result = consumer.recv() => result,
                () = tokio::time::sleep_until(due) => return Polled::Due,
            },
        };
        self.book.forget_moved_partitions();
        Polled::Record(result)
    }

    /// Makes a polled record a delivery and books it.
    fn handed_over(
        &mut self,
        consumer: &Consumer_,
        message: &BorrowedMessage<'_>,
    ) -> (Delivery, KafkaReceipt) {
        if self.commit == Commit::Auto
            && let Err(e) = consumer.store_offset_from_message(message)
        {
            // As librdkafka's own automatic store would, at hand-over (K2).
            tracing::warn!(address = &*self.address, error = %e, "storing the offset at hand-over failed");
        }
        let (delivery, receipt) = self.delivery(message);
        if let Some(window) = &mut self.window {
            window.handed_out(&receipt);
        }
        (delivery, receipt)
    }

    /// Pauses the assigned partitions not paused yet (G5).
    fn pause(&mut self, consumer: &Consumer_) {
        let Ok(assignment) = consumer.assignment() else {
            return;
        };
        let mut fresh = TopicPartitionList::new();
        for element in assignment.elements() {
            let (topic, partition) = (element.topic(), element.partition());
            if self.paused.find_partition(topic, partition).is_none() {
                fresh.add_partition(topic, partition);
            }
        }
        if fresh.count() == 0 {
            return;
        }
        match consumer.pause(&fresh) {
            Ok(()) => {
                tracing::debug!(
                    address = &*self.address,
                    partitions = fresh.count(),
                    "max_in_flight reached; partitions paused"
                );
                for element in fresh.elements() {
                    self.paused
                        .add_partition(element.topic(), element.partition());
                }
            }
            // Not marked paused: tried again on the next round.
            Err(e) => {
                tracing::warn!(address = &*self.address, error = %e, "pausing partitions at max_in_flight failed")
            }
        }
    }

    /// Resumes every partition paused at the bound.
    fn resume(&mut self, consumer: &Consumer_) {
        if self.paused.count() == 0 {
            return;
        }
        let paused = std::mem::replace(&mut self.paused, TopicPartitionList::new());
        if let Err(e) = consumer.resume(&paused) {
            tracing::warn!(address = &*self.address, error = %e, "resuming partitions paused at max_in_flight failed");
        }
    }

    /// The stored position of a partition (`Commit::Tracked`), for tests and metrics.
    pub fn stored_position(&self, topic: &str, partition: i32) -> Option<i64> {
        self.book.stored(topic, partition)
    }
}

/// How far the group is behind on each partition assigned to `consumer` (blocking).
fn lag(consumer: &StreamConsumer<TrackingContext>) -> Result<Vec<Backlog>, String> {
    const ASK: Duration = Duration::from_secs(2);
    let assignment = consumer.assignment().map_err(|e| e.to_string())?;
    let committed = consumer
        .committed_offsets(assignment, ASK)
        .map_err(|e| e.to_string())?;
    committed
        .elements()
        .iter()
        .map(|element| {
            let (low, high) = consumer
                .fetch_watermarks(element.topic(), element.partition(), ASK)
                .map_err(|e| e.to_string())?;
            let from = match element.offset() {
                rdkafka::Offset::Offset(offset) => offset,
                _ => low,
            };
            Ok(Backlog {
                kind: "pending",
                partition: Some(element.partition()),
                value: u64::try_from(high.saturating_sub(from)).unwrap_or(0),
            })
        })
        .collect()
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
                tokio::task::spawn_blocking(move || lag(&consumer))
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

    async fn next(&mut self) -> Option<Result<(Delivery, KafkaReceipt), SubscribeError>> {
        let consumer = Arc::clone(self.consumer.as_ref()?);
        if let Some(early) = self.early.pop_front() {
            return Some(Ok(early));
        }
        self.resume(&consumer);
        loop {
            return match self.poll(&consumer).await {
                Polled::Record(Ok(message)) => Some(Ok(self.handed_over(&consumer, &message))),
                Polled::Record(Err(e)) => Some(Err(SubscribeError::new(&*self.address, e))),
                Polled::Due => continue,
                Polled::Fenced => None,
            };
        }
    }

    async fn settle(&mut self, receipt: KafkaReceipt, settle: Settle) -> Result<(), AckError> {
        match (self.commit, settle) {
            (Commit::Auto, Settle::Redeliver) => self.rewind(&receipt),
            (Commit::Auto, _) => Ok(()),
            (Commit::Transactional, _) => {
                let position = match settle {
                    Settle::Ack | Settle::Drop => self.book.settled(&receipt),
                    _ => None,
                };
                if let Some(window) = &mut self.window {
                    window.settled(&receipt, settle, position);
                }
                Ok(())
            }
            (Commit::Tracked, Settle::Nothing) => Ok(()),
            (Commit::Tracked, Settle::Ack | Settle::Drop) => {
                // Nothing to store when the position did not move, or when the delivery
                // was read before its partition moved: the partition's next reader
                // starts from the committed offset anyway (K5).
                let Some(position) = self.book.settled(&receipt) else {
                    return Ok(());
                };
                let Some(consumer) = self.consumer.as_ref() else {
                    return Ok(());
                };
                // The group resumes from the record after the position.
                self.book
                    .store_list(&receipt, position + 1)
                    .and_then(|list| consumer.store_offsets(list))
                    .map_err(|e| {
                        AckError::Failed(Cause::context(
                            format!(
                                "storing offset {position} of {}/{}",
                                receipt.topic, receipt.partition
                            ),
                            e,
                        ))
                    })
            }
            (Commit::Tracked, other) => Err(AckError::failed(format!(
                "{other:?} has no meaning on Kafka"
            ))),
        }
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
        self.pause(&consumer);
        match self.poll(&consumer).await {
            Polled::Record(Ok(message)) => {
                // From a partition assigned since the last pause (paused next round), or
                // one whose pause failed (tried again next round).
                let early = self.handed_over(&consumer, &message);
                self.early.push_back(early);
                if self.early.len() == EARLY_LIMIT {
                    tracing::warn!(
                        address = &*self.address,
                        held = EARLY_LIMIT,
                        "partitions keep delivering at max_in_flight although paused; polling stops until deliveries settle"
                    );
                }
            }
            Polled::Record(Err(e)) => {
                tracing::debug!(address = &*self.address, error = %e, "polling at max_in_flight failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Polled::Due => {}
            Polled::Fenced => std::future::pending().await,
        }
    }

    fn parked(&mut self, receipt: &KafkaReceipt) {
        if let Some(window) = &mut self.window {
            window.parked(receipt);
        }
    }

    async fn close(mut self) {
        if let (Some(window), Some(consumer)) = (self.window.take(), self.consumer.as_ref()) {
            window
                .finish(consumer, &self.book.moves, self.close_timeout)
                .await;
        }
        let Some(consumer) = self.consumer.take() else {
            return;
        };
        let tracked = self.commit == Commit::Tracked;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k5_a_move_discards_tracked_state_and_late_settlements_change_nothing() {
        let moves = Arc::new(Moves::default());
        let mut book = Book::new(Arc::clone(&moves));
        let topic: Arc<str> = Arc::from("orders");
        let early: Vec<KafkaReceipt> = (0..3)
            .map(|o| book.delivered(Arc::clone(&topic), 0, o, true))
            .collect();
        assert_eq!(book.settled(&early[1]), None, "0 still runs");
        // The partition is revoked and assigned again.
        moves.moved([("orders".to_owned(), 0)].into_iter());
        assert_eq!(
            book.settled(&early[0]),
            None,
            "read before the move: changes nothing"
        );
        assert_eq!(book.stored("orders", 0), None, "tracked state discarded");
        // The new reader starts again from the committed offset.
        let again = book.delivered(Arc::clone(&topic), 0, 0, true);
        assert_eq!(book.settled(&again), Some(0));
        assert_eq!(book.settled(&early[2]), None);
    }

    #[test]
    fn k5_other_partitions_keep_their_state() {
        let moves = Arc::new(Moves::default());
        let mut book = Book::new(Arc::clone(&moves));
        let topic: Arc<str> = Arc::from("orders");
        let p1 = book.delivered(Arc::clone(&topic), 1, 7, true);
        moves.moved([("orders".to_owned(), 0)].into_iter());
        assert_eq!(book.settled(&p1), Some(7));
    }
}
