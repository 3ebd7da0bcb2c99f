//! The open window of a `Commit::Transactional` subscription: what it will commit, the
//! barrier before closing it, and the commit or abort itself (off the async runtime).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rdkafka::consumer::Consumer;
use rdkafka::producer::{FutureProducer, Producer};
use rdkafka::{Offset, TopicPartitionList};
use ruststream_core::{Settle, StillHeld, SubscribeError};
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::close::off_runtime;
use crate::context::{KafkaContext, Moves};
use crate::eos::{EosPipeline, Pipeline, TRANSACTION_TIMEOUT, WindowOffsets, fenced};
use crate::queue::Consumer_;
use crate::receipt::KafkaReceipt;

/// How a close ended, as the closing thread reports it.
enum Closed {
    Committed(Vec<(String, i32, i64)>),
    Aborted,
    Fenced(String),
}

/// What the subscription does next.
pub(crate) enum Tick {
    /// Fetch, but come back by this instant (the window is due then).
    Fetch(Instant),
    /// The pipeline was fenced: the subscription ends.
    Fenced,
}

pub(crate) struct Window {
    pipeline: Arc<Pipeline>,
    producer: Arc<FutureProducer<KafkaContext>>,
    address: String,
    began: Instant,
    offsets: WindowOffsets,
    in_flight: usize,
    parked: Waits,
    doomed: bool,
    reads: Reads,
    closing: Option<oneshot::Receiver<Closed>>,
    fenced: bool,
}

impl Window {
    /// Starts the pipeline's producer (fencing older ones with its id) and opens the
    /// first window.
    pub(crate) async fn start(
        pipeline: EosPipeline,
        address: &str,
        deadline: Duration,
    ) -> Result<Self, SubscribeError> {
        let shared = Arc::clone(&pipeline.shared);
        if shared.attached.swap(true, Ordering::AcqRel) {
            return Err(SubscribeError::new(
                address,
                format!(
                    "the EosPipeline `{}` already serves another subscription",
                    shared.id
                ),
            ));
        }
        let starting = Arc::clone(&shared);
        let producer = off_runtime(
            "start the transactional producer",
            deadline.max(TRANSACTION_TIMEOUT),
            move || starting.start(),
        )
        .await
        .ok_or_else(|| {
            SubscribeError::new(address, "the transactional producer did not start in time")
        })?
        .map_err(|e| SubscribeError::new(address, format!("EosPipeline `{}`: {e}", shared.id)))?;
        Ok(Self {
            pipeline: shared,
            producer,
            address: address.to_owned(),
            began: Instant::now(),
            offsets: WindowOffsets::new(),
            in_flight: 0,
            parked: Waits::default(),
            doomed: false,
            reads: Reads::default(),
            closing: None,
            fenced: false,
        })
    }

    pub(crate) fn handed_out(&mut self, topic: &Arc<str>, receipt: &KafkaReceipt, moves: &Moves) {
        self.in_flight += 1;
        self.reads.read(topic, receipt, moves);
    }

    /// `count` records handed out will not run (held early at a stop).
    pub(crate) fn never_ran(&mut self, count: usize) {
        self.in_flight = self.in_flight.saturating_sub(count);
    }

    /// `receipt`'s record waits for its delayed copy (no longer running); `still_held`
    /// is what its timer will ask, returned to hand to the timer.
    pub(crate) fn parked(
        &mut self,
        topic: &Arc<str>,
        receipt: &KafkaReceipt,
        still_held: StillHeld,
    ) -> StillHeld {
        let (new, asked) = self.parked.begin(topic, receipt, still_held);
        if new {
            self.in_flight = self.in_flight.saturating_sub(1);
        }
        asked
    }

    /// A settlement: `position` is the partition's new stored position, if it moved.
    pub(crate) fn settled(
        &mut self,
        topic: &Arc<str>,
        receipt: &KafkaReceipt,
        settle: Settle,
        position: Option<i64>,
        moves: &Moves,
    ) {
        if self.parked.ended(receipt) {
            // A delayed copy's original, read in an earlier window: its copy is in this
            // one, so an abort of this window must read the original again too.
            self.reads.read(topic, receipt, moves);
        } else {
            self.in_flight = self.in_flight.saturating_sub(1);
        }
        if settle == Settle::Redeliver {
            // K6: retry() makes the open window unable to commit.
            self.doomed = true;
        }
        if let Some(position) = position {
            self.offsets
                .insert((Arc::clone(topic), receipt.partition), position + 1);
        }
    }

    fn must_abort(&mut self, moves: &Moves) -> bool {
        self.doomed || self.pipeline.doomed.load(Ordering::Acquire) || self.reads.moved_since(moves)
    }

    /// Closes the window when it is due (or doomed) once nothing handed out is running,
    /// and says when to come back otherwise. Cancel safe: a close in progress is kept.
    pub(crate) async fn tick(&mut self, consumer: &Consumer_, moves: &Moves) -> Tick {
        loop {
            if self.fenced {
                return Tick::Fenced;
            }
            if let Some(closing) = &mut self.closing {
                let closed = closing.await.unwrap_or(Closed::Aborted);
                self.closing = None;
                self.closed(closed, moves);
                continue;
            }
            let abort = self.must_abort(moves);
            let due = Instant::now() >= self.began + self.pipeline.interval();
            let dirty =
                !self.offsets.is_empty() || self.pipeline.records.load(Ordering::Acquire) > 0;
            if !(abort || (due && dirty)) {
                if due {
                    self.began = Instant::now();
                }
                return Tick::Fetch(self.began + self.pipeline.interval());
            }
            if self.in_flight > 0 {
                // The barrier: hand out nothing until every running record settled.
                std::future::pending::<()>().await;
            }
            self.closing = Some(self.close(consumer, abort, moves).await);
        }
    }

    async fn close(
        &mut self,
        consumer: &Consumer_,
        abort: bool,
        moves: &Moves,
    ) -> oneshot::Receiver<Closed> {
        // Parked copies may be publishing; wait for them, and keep others out meanwhile.
        let gate = Arc::clone(&self.pipeline.gate).write_owned().await;
        // Asked again under the gate: a produce that failed, or whose report its caller
        // stopped waiting for, while the window waited for it dooms this window.
        let abort = abort || self.pipeline.doomed.load(Ordering::Acquire);
        let pipeline = Arc::clone(&self.pipeline);
        let producer = Arc::clone(&self.producer);
        let consumer = Arc::clone(consumer);
        let offsets: Vec<(String, i32, i64)> = self
            .offsets
            .iter()
            .map(|((t, p), o)| (t.to_string(), *p, *o))
            .collect();
        self.parked.forget_given_up();
        let read = self.rewinds(moves);
        let (tx, rx) = oneshot::channel();
        std::thread::spawn(move || {
            let closed = if abort {
                abort_and_rewind(&producer, &consumer, &read)
            } else {
                match commit(&producer, &consumer, &offsets) {
                    Ok(()) => Closed::Committed(offsets),
                    Err(e) if fenced(&e) => Closed::Fenced(e.to_string()),
                    Err(e) => {
                        tracing::warn!(pipeline = %pipeline.id, error = %e, "commit failed; aborting the window");
                        abort_and_rewind(&producer, &consumer, &read)
                    }
                }
            };
            // The next transaction is open: it starts undoomed before any produce joins it.
            pipeline.doomed.store(false, Ordering::Release);
            drop(gate);
            let _ = tx.send(closed);
        });
        rx
    }

    /// Each partition the window read, with where an abort rewinds it when the group has
    /// no committed position: the lowest offset the window read of it, or an original
    /// waiting for its delayed copy before that (read again, its wait makes no copy).
    fn rewinds(&self, moves: &Moves) -> Vec<(String, i32, i64)> {
        let mut read: Vec<(String, i32, i64)> = self.reads.partitions().collect();
        for (&(_, offset, generation), wait) in &self.parked.0 {
            let (topic, partition) = (&*wait.topic, wait.partition);
            let same = |(t, p, _): &&mut (String, i32, i64)| t == topic && *p == partition;
            if let Some((_, _, first)) = read.iter_mut().find(same)
                && moves.generation(topic, partition) == generation
            {
                *first = (*first).min(offset);
            }
        }
        read
    }

    fn closed(&mut self, closed: Closed, moves: &Moves) {
        match closed {
            Closed::Committed(offsets) => {
                self.pipeline.report(true, offsets);
            }
            Closed::Aborted => {
                // Everything read in the window is read again: drop what was tracked.
                moves.moved(self.reads.partitions().map(|(t, p, _)| (t, p)));
                tracing::info!(address = %self.address, pipeline = %self.pipeline.id, "window aborted; reading it again");
                self.pipeline.report(false, Vec::new());
            }
            Closed::Fenced(error) => {
                tracing::error!(
                    address = %self.address,
                    pipeline = %self.pipeline.id,
                    %error,
                    "another EosPipeline with this transactional id took over; stopping this subscription"
                );
                self.fenced = true;
            }
        }
        self.offsets.clear();
        self.reads.clear(moves);
        self.doomed = false;
        self.began = Instant::now();
    }

    /// On stop: commit what settled, or abort when something still runs or the window is
    /// doomed.
    pub(crate) async fn finish(mut self, consumer: &Consumer_, moves: &Moves, deadline: Duration) {
        if let Some(closing) = self.closing.take() {
            if let Ok(Ok(closed)) = tokio::time::timeout(deadline, closing).await {
                self.closed(closed, moves);
            }
        }
        if self.fenced {
            return;
        }
        let abort = self.in_flight > 0 || self.must_abort(moves);
        let rx = self.close(consumer, abort, moves).await;
        if let Ok(Ok(closed)) = tokio::time::timeout(deadline, rx).await {
            self.closed(closed, moves);
        }
    }
}

/// The partitions a window read from (with the lowest offset it read of each), and the
/// partition moves it has seen. A move after the window read dooms it: another member may
/// read those records again. A move before it read anything undoes nothing of it,
/// including the assignment a poll serves just before it returns the window's first
/// record.
#[derive(Default)]
struct Reads {
    epoch: u64,
    partitions: HashMap<(Arc<str>, i32), i64>,
}

impl Reads {
    fn read(&mut self, topic: &Arc<str>, receipt: &KafkaReceipt, moves: &Moves) {
        if self.partitions.is_empty() {
            self.epoch = moves.epoch();
        }
        let first = self
            .partitions
            .entry((Arc::clone(topic), receipt.partition))
            .or_insert(receipt.offset);
        *first = (*first).min(receipt.offset);
    }

    /// Partitions moved since the window first read.
    fn moved_since(&mut self, moves: &Moves) -> bool {
        if self.partitions.is_empty() {
            self.epoch = moves.epoch();
        }
        moves.epoch() != self.epoch
    }

    /// Each partition read, with the lowest offset read of it.
    fn partitions(&self) -> impl Iterator<Item = (String, i32, i64)> + '_ {
        self.partitions
            .iter()
            .map(|((t, p), first)| (t.to_string(), *p, *first))
    }

    /// A new window: it has read nothing.
    fn clear(&mut self, moves: &Moves) {
        self.partitions.clear();
        self.epoch = moves.epoch();
    }
}

/// How many times a window's abort is tried when the broker's answer is retriable.
const ABORT_TRIES: u32 = 3;

fn retriable(error: &rdkafka::error::KafkaError) -> bool {
    matches!(error, rdkafka::error::KafkaError::Transaction(e) if e.is_retriable())
}

/// Originals waiting for their delayed copies (`retry_after`), by their partition's place
/// in the book, offset and generation. A wait whose timer found its original read again
/// makes no copy and settles nothing: it is given up, and dropped at the next close (so
/// aborts and moves during waits leave nothing behind).
#[derive(Default)]
struct Waits(HashMap<(usize, i64, u64), Wait>);

struct Wait {
    topic: Arc<str>,
    partition: i32,
    given_up: Arc<AtomicBool>,
}

impl Waits {
    /// A wait begins; whether it is new, and `still_held` made to give the wait up when
    /// it answers no.
    fn begin(
        &mut self,
        topic: &Arc<str>,
        receipt: &KafkaReceipt,
        still_held: StillHeld,
    ) -> (bool, StillHeld) {
        let given_up = Arc::new(AtomicBool::new(false));
        let wait = Wait {
            topic: Arc::clone(topic),
            partition: receipt.partition,
            given_up: Arc::clone(&given_up),
        };
        let new = self.0.insert(key(receipt), wait).is_none();
        let asked = move || {
            let held = still_held();
            if !held {
                given_up.store(true, Ordering::Release);
            }
            held
        };
        (new, Box::new(asked))
    }

    /// `receipt`'s wait ended in its copy; whether it was waiting.
    fn ended(&mut self, receipt: &KafkaReceipt) -> bool {
        self.0.remove(&key(receipt)).is_some()
    }

    fn forget_given_up(&mut self) {
        self.0
            .retain(|_, wait| !wait.given_up.load(Ordering::Acquire));
    }
}

/// A parked delivery: its partition's place in the book, offset and generation.
fn key(receipt: &KafkaReceipt) -> (usize, i64, u64) {
    (receipt.slot, receipt.offset, receipt.generation)
}

fn commit(
    producer: &FutureProducer<KafkaContext>,
    consumer: &Consumer_,
    offsets: &[(String, i32, i64)],
) -> rdkafka::error::KafkaResult<()> {
    if !offsets.is_empty() {
        let mut list = TopicPartitionList::new();
        for (topic, partition, offset) in offsets {
            list.add_partition_offset(topic, *partition, Offset::Offset(*offset))?;
        }
        // Without group metadata (no group) the offsets cannot join the transaction.
        let group = consumer
            .group_metadata()
            .ok_or(rdkafka::error::KafkaError::ConsumerCommit(
                rdkafka::types::RDKafkaErrorCode::InvalidGroupId,
            ))?;
        producer.send_offsets_to_transaction(&list, &group, TRANSACTION_TIMEOUT)?;
    }
    producer.commit_transaction(TRANSACTION_TIMEOUT)?;
    producer.begin_transaction()
}

/// Aborts the open transaction and seeks each partition the window read back to the
/// group's committed position, or, where the group has none or the broker does not say,
/// to the first record the window read of it (never to the beginning: a group that
/// started at the latest record, or whose committed read failed, would read history).
fn abort_and_rewind(
    producer: &FutureProducer<KafkaContext>,
    consumer: &Consumer_,
    read: &[(String, i32, i64)],
) -> Closed {
    // librdkafka: an abort that fails with a retriable error (a timeout) may be called again;
    // giving up at once would leave the transaction open and the next begin refused.
    for tries in 1.. {
        match producer.abort_transaction(TRANSACTION_TIMEOUT) {
            Ok(()) => break,
            Err(e) if fenced(&e) => return Closed::Fenced(e.to_string()),
            Err(e) if retriable(&e) && tries < ABORT_TRIES => {
                tracing::warn!(error = %e, tries, "abort_transaction failed; trying again");
            }
            Err(e) => {
                tracing::warn!(error = %e, "abort_transaction failed");
                break;
            }
        }
    }
    let mut list = TopicPartitionList::new();
    for (topic, partition, _) in read {
        list.add_partition(topic, *partition);
    }
    let committed = consumer.committed_offsets(list, TRANSACTION_TIMEOUT).ok();
    for (topic, partition, first) in read {
        let offset = committed
            .as_ref()
            .and_then(|c| c.find_partition(topic, *partition))
            .map(|e| e.offset())
            .filter(|o| matches!(o, Offset::Offset(_)))
            .unwrap_or(Offset::Offset(*first));
        if let Err(e) = consumer.seek(topic, *partition, offset, TRANSACTION_TIMEOUT) {
            tracing::warn!(topic, partition, error = %e, "rewinding after an abort failed");
        }
    }
    match producer.begin_transaction() {
        Ok(()) => Closed::Aborted,
        Err(e) => Closed::Fenced(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k6_d2_a_wait_whose_timer_made_no_copy_is_dropped_and_the_others_kept() {
        let (mut waits, topic) = (Waits::default(), Arc::from("orders"));
        let (new, read_again) = waits.begin(&topic, &at(3), Box::new(|| false));
        assert!(new);
        let (_, still_held) = waits.begin(&topic, &at(5), Box::new(|| true));
        let (_, ends_in_a_copy) = waits.begin(&topic, &at(7), Box::new(|| true));
        assert!(!read_again() && still_held() && ends_in_a_copy());
        assert!(waits.ended(&at(7)), "the copy made, the original settles");
        waits.forget_given_up();
        let left: Vec<i64> = waits.0.keys().map(|(_, offset, _)| *offset).collect();
        assert_eq!(
            left,
            vec![5],
            "the wait whose original is read again is gone"
        );
        assert!(!waits.ended(&at(3)));
    }

    fn moved(moves: &Moves) {
        moves.moved([("orders".to_owned(), 0)].into_iter());
    }

    fn at(offset: i64) -> KafkaReceipt {
        KafkaReceipt {
            slot: 0,
            partition: 0,
            offset,
            generation: 0,
        }
    }

    #[test]
    fn k6_an_assignment_served_by_the_poll_that_gave_the_first_record_dooms_nothing() {
        let (moves, topic) = (Moves::default(), Arc::from("orders"));
        let mut reads = Reads::default();
        // The poll serves the assignment, then returns the window's first record.
        moved(&moves);
        reads.read(&topic, &at(0), &moves);
        assert!(
            !reads.moved_since(&moves),
            "nothing was read before the move"
        );
    }

    #[test]
    fn k6_a_move_after_the_window_read_dooms_it_until_a_new_window() {
        let (moves, topic) = (Moves::default(), Arc::from("orders"));
        let mut reads = Reads::default();
        reads.read(&topic, &at(0), &moves);
        moved(&moves);
        reads.read(&topic, &at(0), &moves);
        assert!(
            reads.moved_since(&moves),
            "read before the move: read again"
        );
        reads.clear(&moves);
        assert!(
            !reads.moved_since(&moves),
            "a new window starts from the move"
        );
        moved(&moves);
        assert!(
            !reads.moved_since(&moves),
            "a move while it read nothing undoes nothing"
        );
    }

    #[test]
    fn k6_an_abort_without_a_committed_position_rewinds_to_the_first_record_read() {
        let (moves, topic) = (Moves::default(), Arc::from("orders"));
        let mut reads = Reads::default();
        // Read in the window, and a parked original from before it settled in it.
        reads.read(&topic, &at(7), &moves);
        reads.read(&topic, &at(9), &moves);
        reads.read(&topic, &at(4), &moves);
        let read: Vec<_> = reads.partitions().collect();
        assert_eq!(read, vec![("orders".to_owned(), 0, 4)]);
    }
}
