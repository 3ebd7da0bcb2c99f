//! What a Kafka subscription keeps per partition: the offsets running (Tracked), the
//! assignment generation a receipt was read in (K5), and the list that stores a position.

use std::sync::Arc;

use rdkafka::TopicPartitionList;
use rdkafka::error::{KafkaError, KafkaResult};

use crate::context::Moves;
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
    /// The offset to store at the next [`Book::store_due`] (where the group resumes).
    due: Option<i64>,
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
    /// Some partition has an offset to store.
    any_due: bool,
}

impl Book {
    pub(crate) fn new(moves: Arc<Moves>) -> Self {
        Self {
            moves,
            partitions: Vec::new(),
            last: 0,
            seen_epoch: 0,
            any_due: false,
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
                state.due = None;
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
                    due: None,
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
    /// [`store_due`](Self::store_due): a batch's settlements store once per partition.
    #[inline]
    pub(crate) fn store_later(&mut self, receipt: &KafkaReceipt, resume_at: i64) {
        self.partitions[receipt.slot].due = Some(resume_at);
        self.any_due = true;
    }

    /// Stores every position settled since the last call, one call per partition;
    /// `failed` hears of each that could not be stored (topic, partition, offset, why).
    #[inline]
    pub(crate) fn store_due(
        &mut self,
        store: impl Fn(&TopicPartitionList) -> KafkaResult<()>,
        failed: impl Fn(&str, i32, i64, KafkaError),
    ) {
        if self.any_due {
            self.store_each(store, failed);
        }
    }

    fn store_each(
        &mut self,
        store: impl Fn(&TopicPartitionList) -> KafkaResult<()>,
        failed: impl Fn(&str, i32, i64, KafkaError),
    ) {
        self.any_due = false;
        for state in &mut self.partitions {
            let Some(resume_at) = state.due.take() else {
                continue;
            };
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
