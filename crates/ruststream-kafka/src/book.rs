//! What a Kafka subscription keeps per partition: the offsets running (Tracked), the
//! assignment generation a receipt was read in (K5), and the list that stores a position.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use rdkafka::TopicPartitionList;
use rdkafka::error::{KafkaError, KafkaResult};
use ruststream_core::StillHeld;

use crate::context::{Moves, NOTHING};
use crate::receipt::KafkaReceipt;
use crate::tracker::OffsetTracker;

#[derive(Debug)]
struct PartitionState {
    topic: Arc<str>,
    partition: i32,
    tracker: OffsetTracker,
    generation: u64,
    /// A one-partition list kept for storing its offset (`Commit::Tracked`): storing by
    /// topic name makes rdkafka build and free a native topic handle on every call.
    store: Option<TopicPartitionList>,
    /// The offset to store at the next [`Book::store_due`] (where the group resumes), or
    /// [`NOTHING`]; shared with [`Moves`], where a revoke takes it.
    due: Arc<AtomicI64>,
}

/// The subscription's bookkeeping, apart from the consumer: trackers per partition and
/// assignment generation. Partitions live in a vector (a consumer reads few) found by a
/// receipt's slot, or, for a new record, from the last one's.
#[derive(Debug)]
pub(crate) struct Book {
    pub(crate) moves: Arc<Moves>,
    partitions: Vec<PartitionState>,
    last: usize,
    seen_epoch: u64,
    /// Settlements that moved a position since the last store.
    unstored: u32,
}

/// When the book stores the settled positions (`Commit::Tracked`).
#[derive(Debug, Clone, Copy)]
pub(crate) enum StoreWhen {
    /// If [`UNDER_LOAD`] settlements moved a position since the last store: while records
    /// keep coming, librdkafka's store (as dear as a record's whole fetch) is made once
    /// for many of them.
    Many,
    /// If any did: the queue ran dry, the subscription waits at its bound, or it closes.
    Any,
}

/// Settlements a store waits for while records keep coming. A crash reads up to this
/// many more again than a store per settlement would; a revoke stores at once.
pub(crate) const UNDER_LOAD: u32 = 64;

impl Book {
    pub(crate) fn new(moves: Arc<Moves>) -> Self {
        Self {
            moves,
            partitions: Vec::new(),
            last: 0,
            seen_epoch: 0,
            unstored: 0,
        }
    }

    /// Discards the tracked state of partitions that moved since the last look (K5).
    #[inline]
    pub(crate) fn forget_moved_partitions(&mut self) {
        let epoch = self.moves.epoch();
        if epoch != self.seen_epoch {
            self.forget_partitions_moved_since(epoch);
        }
    }

    #[cold]
    fn forget_partitions_moved_since(&mut self, epoch: u64) {
        self.seen_epoch = epoch;
        for state in &mut self.partitions {
            let generation = self.moves.generation(&state.topic, state.partition);
            if generation != state.generation {
                state.tracker = OffsetTracker::new();
                state.generation = generation;
                // Its next reader starts from the committed offset (K5).
                state.due.store(NOTHING, Ordering::Relaxed);
            }
        }
    }

    #[inline]
    pub(crate) fn slot(&mut self, topic: &Arc<str>, partition: i32) -> usize {
        // The topic's name is one shared string per subscription: compared by address
        // first, by its bytes only when that differs.
        let is = |s: &PartitionState| {
            s.partition == partition && (Arc::ptr_eq(&s.topic, topic) || *s.topic == **topic)
        };
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
                    due: self.moves.unstored(topic, partition),
                });
                self.partitions.len() - 1
            }
        };
        self.last = slot;
        slot
    }

    /// Records a delivered offset (tracked or not) and makes its receipt.
    #[inline]
    pub(crate) fn delivered(
        &mut self,
        topic: &Arc<str>,
        partition: i32,
        offset: i64,
        track: bool,
    ) -> KafkaReceipt {
        let slot = self.slot(topic, partition);
        let state = &mut self.partitions[slot];
        if track {
            state.tracker.delivered(offset);
        }
        KafkaReceipt {
            slot,
            partition,
            offset,
            generation: state.generation,
        }
    }

    /// Whether `receipt`'s partition is still in the assignment it was read in (no move,
    /// no aborted window's rewind since), asked from any thread.
    pub(crate) fn still_read_as(&self, receipt: &KafkaReceipt) -> StillHeld {
        let (moves, topic) = (Arc::clone(&self.moves), Arc::clone(self.topic(receipt)));
        let (partition, generation) = (receipt.partition, receipt.generation);
        Box::new(move || moves.generation(&topic, partition) == generation)
    }

    /// The topic of `receipt`'s partition.
    #[inline]
    pub(crate) fn topic(&self, receipt: &KafkaReceipt) -> &Arc<str> {
        &self.partitions[receipt.slot].topic
    }

    /// Settles a receipt: the new stored position when it moved; nothing for a delivery
    /// read before its partition moved.
    #[inline]
    pub(crate) fn settled(&mut self, receipt: &KafkaReceipt) -> Option<i64> {
        self.forget_moved_partitions();
        let state = self.partitions.get_mut(receipt.slot)?;
        if state.generation != receipt.generation {
            settled_after_move(&state.topic, receipt);
            return None;
        }
        state.tracker.settled(receipt.offset)
    }

    /// Stores `resume_at` as the position of `receipt`'s partition at the next
    /// [`store_due`](Self::store_due): many settlements store once per partition.
    #[inline]
    pub(crate) fn store_later(&mut self, receipt: &KafkaReceipt, resume_at: i64) {
        self.partitions[receipt.slot]
            .due
            .store(resume_at, Ordering::Relaxed);
        self.unstored += 1;
    }

    /// Stores every position settled since the last store, one call per partition, when
    /// `when` says; `failed` hears of each that could not be stored (topic, partition,
    /// offset, why).
    #[inline]
    pub(crate) fn store_due(
        &mut self,
        when: StoreWhen,
        store: impl Fn(&TopicPartitionList) -> KafkaResult<()>,
        failed: impl Fn(&str, i32, i64, KafkaError),
    ) {
        let at_least = match when {
            StoreWhen::Many => UNDER_LOAD,
            StoreWhen::Any => 1,
        };
        if self.unstored >= at_least {
            self.store_each(store, failed);
        }
    }

    fn store_each(
        &mut self,
        store: impl Fn(&TopicPartitionList) -> KafkaResult<()>,
        failed: impl Fn(&str, i32, i64, KafkaError),
    ) {
        // A partition that moved since its settlement has nothing of ours to store (K5).
        self.forget_moved_partitions();
        self.unstored = 0;
        for state in &mut self.partitions {
            let resume_at = state.due.swap(NOTHING, Ordering::Relaxed);
            if resume_at == NOTHING {
                continue;
            }
            let list = state.store.get_or_insert_with(|| {
                let mut list = TopicPartitionList::with_capacity(1);
                list.add_partition(&state.topic, state.partition);
                list
            });
            let stored = list
                .set_all_offsets(rdkafka::Offset::Offset(resume_at))
                .and_then(|()| store(list));
            if let Err(e) = stored {
                failed(&state.topic, state.partition, resume_at, e);
            }
        }
    }

    pub(crate) fn stored(&self, topic: &str, partition: i32) -> Option<i64> {
        self.partitions
            .iter()
            .find(|s| &*s.topic == topic && s.partition == partition)
            .and_then(|s| s.tracker.stored())
    }
}

#[cold]
fn settled_after_move(topic: &str, receipt: &KafkaReceipt) {
    tracing::debug!(
        topic,
        partition = receipt.partition,
        offset = receipt.offset,
        "settled after its partition moved: nothing stored (K5)"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k5_a_move_discards_tracked_state_and_late_settlements_change_nothing() {
        let moves = Arc::new(Moves::default());
        let mut book = Book::new(Arc::clone(&moves));
        let topic: Arc<str> = Arc::from("orders");
        let early: Vec<KafkaReceipt> = (0..3).map(|o| book.delivered(&topic, 0, o, true)).collect();
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
        let again = book.delivered(&topic, 0, 0, true);
        assert_eq!(book.settled(&again), Some(0));
        assert_eq!(book.settled(&early[2]), None);
    }

    /// The offsets each call of `store_due` stored, in order.
    fn stored_by(book: &mut Book, when: StoreWhen) -> Vec<i64> {
        let stored = std::cell::RefCell::new(Vec::new());
        book.store_due(
            when,
            |list| {
                for element in list.elements() {
                    if let rdkafka::Offset::Offset(offset) = element.offset() {
                        stored.borrow_mut().push(offset);
                    }
                }
                Ok(())
            },
            |topic, partition, offset, e| panic!("{topic}/{partition} at {offset}: {e}"),
        );
        stored.into_inner()
    }

    /// Settles offsets `range` on partition 0 of `topic`, one after the other.
    fn settle_each(book: &mut Book, topic: &Arc<str>, range: std::ops::Range<i64>) {
        for offset in range {
            let receipt = book.delivered(topic, 0, offset, true);
            let position = book.settled(&receipt).expect("the lowest running settled");
            book.store_later(&receipt, position + 1);
        }
    }

    #[test]
    fn k3_under_load_one_store_serves_many_settlements_and_a_revoke_takes_what_waits() {
        let moves = Arc::new(Moves::default());
        let mut book = Book::new(Arc::clone(&moves));
        let topic: Arc<str> = Arc::from("orders");
        settle_each(&mut book, &topic, 0..10);
        assert!(stored_by(&mut book, StoreWhen::Many).is_empty(), "10 wait");
        // The partition is revoked: the revoke takes the waiting position to store it.
        let mut revoked = TopicPartitionList::new();
        revoked.add_partition("orders", 0);
        let due = moves.take_unstored(&revoked);
        let element = due
            .find_partition("orders", 0)
            .expect("the position waited");
        assert_eq!(element.offset(), rdkafka::Offset::Offset(10));
        assert!(
            stored_by(&mut book, StoreWhen::Any).is_empty(),
            "taken once"
        );
        settle_each(&mut book, &topic, 10..10 + i64::from(UNDER_LOAD));
        assert_eq!(
            stored_by(&mut book, StoreWhen::Many),
            vec![10 + i64::from(UNDER_LOAD)],
            "one store, at the last position"
        );
        settle_each(&mut book, &topic, 74..75);
        assert_eq!(
            stored_by(&mut book, StoreWhen::Any),
            vec![75],
            "the queue ran dry"
        );
    }

    #[test]
    fn k5_a_position_waiting_to_be_stored_is_dropped_when_its_partition_moves() {
        let moves = Arc::new(Moves::default());
        let mut book = Book::new(Arc::clone(&moves));
        let topic: Arc<str> = Arc::from("orders");
        settle_each(&mut book, &topic, 0..3);
        // Lost rather than revoked (no revoke took it): its next reader decides.
        moves.moved([("orders".to_owned(), 0)].into_iter());
        assert!(stored_by(&mut book, StoreWhen::Any).is_empty());
    }

    #[test]
    fn k5_other_partitions_keep_their_state() {
        let moves = Arc::new(Moves::default());
        let mut book = Book::new(Arc::clone(&moves));
        let topic: Arc<str> = Arc::from("orders");
        let p1 = book.delivered(&topic, 1, 7, true);
        moves.moved([("orders".to_owned(), 0)].into_iter());
        assert_eq!(book.settled(&p1), Some(7));
    }
}
