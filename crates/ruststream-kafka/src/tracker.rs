//! The offset tracker of one partition under `Commit::Tracked` (SPEC K3).
//!
//! Every delivered offset is recorded while it runs. The stored position is just below
//! the lowest offset still running, or the highest delivered once none runs; the group
//! resumes from stored position + 1. Settlements may arrive in any order (lanes), and
//! offsets never delivered (transaction markers, compacted records) leave no hole that
//! holds the position back, because only delivered offsets are recorded.

use std::collections::VecDeque;

/// Running offsets and the stored position of one partition.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct OffsetTracker {
    /// Ascending, each once. Offsets come in ascending order and mostly settle lowest
    /// first, so the common case is a push at the back and a pop at the front, not a
    /// tree's insert and remove.
    running: VecDeque<i64>,
    lowest_delivered: Option<i64>,
    highest_delivered: Option<i64>,
    stored: Option<i64>,
}

impl OffsetTracker {
    /// A tracker that has seen nothing.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// `offset` was handed to a handler (again, for a redelivery).
    #[inline]
    pub(crate) fn delivered(&mut self, offset: i64) {
        match self.running.back() {
            Some(last) if *last >= offset => {
                if let Err(at) = self.running.binary_search(&offset) {
                    self.running.insert(at, offset);
                }
            }
            _ => self.running.push_back(offset),
        }
        self.lowest_delivered = Some(self.lowest_delivered.map_or(offset, |l| l.min(offset)));
        self.highest_delivered = Some(self.highest_delivered.map_or(offset, |h| h.max(offset)));
    }

    /// `offset` is settled. Returns the new stored position when it moved up.
    #[inline]
    pub(crate) fn settled(&mut self, offset: i64) -> Option<i64> {
        match self.running.front() {
            // The common case: the lowest running one settles.
            Some(lowest) if *lowest == offset => {
                self.running.pop_front();
            }
            _ => {
                let at = self.running.binary_search(&offset).ok()?;
                self.running.remove(at);
            }
        }
        let position = match self.running.front() {
            Some(lowest) => lowest - 1,
            None => self.highest_delivered?,
        };
        // Below the first delivered offset there is nothing of ours to store.
        if self.stored.is_some_and(|stored| stored >= position)
            || self
                .lowest_delivered
                .is_some_and(|lowest| position < lowest)
        {
            return None;
        }
        self.stored = Some(position);
        Some(position)
    }

    /// The stored position: the last offset the group need not read again.
    pub(crate) fn stored(&self) -> Option<i64> {
        self.stored
    }

    /// The offset the group resumes from (stored position + 1).
    #[cfg(test)]
    pub(crate) fn committed(&self) -> Option<i64> {
        self.stored.map(|s| s + 1)
    }

    /// Offsets still running, lowest first.
    #[cfg(test)]
    pub(crate) fn running(&self) -> impl Iterator<Item = i64> + '_ {
        self.running.iter().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k3_the_seeds_worked_example() {
        let mut t = OffsetTracker::new();
        for offset in 10..=15 {
            t.delivered(offset);
        }
        for offset in [10, 11, 13, 14] {
            t.settled(offset);
        }
        assert_eq!(t.running().collect::<Vec<_>>(), vec![12, 15]);
        assert_eq!((t.stored(), t.committed()), (Some(11), Some(12)));
        assert_eq!(t.settled(12), Some(14));
        assert_eq!(t.committed(), Some(15), "15 still running");
        assert_eq!(t.settled(15), Some(15));
        assert_eq!(t.committed(), Some(16));
    }

    #[test]
    fn k3_offsets_never_delivered_do_not_hold_the_position_back() {
        let mut t = OffsetTracker::new();
        // 3 and 4 are a transaction marker and a compacted record: never delivered.
        for offset in [1, 2, 5, 6] {
            t.delivered(offset);
        }
        for offset in [6, 5, 2, 1] {
            t.settled(offset);
        }
        assert_eq!(t.committed(), Some(7));
    }

    #[test]
    fn k4_a_redelivered_offset_keeps_the_position_waiting() {
        let mut t = OffsetTracker::new();
        t.delivered(0);
        t.delivered(1);
        t.settled(1);
        assert_eq!(t.stored(), None, "0 still runs (it was retried)");
        t.delivered(0);
        assert_eq!(t.settled(0), Some(1));
    }

    #[test]
    fn settling_twice_or_unknown_offsets_changes_nothing() {
        let mut t = OffsetTracker::new();
        t.delivered(4);
        assert_eq!(t.settled(4), Some(4));
        assert_eq!(t.settled(4), None);
        assert_eq!(t.settled(99), None);
        assert_eq!(t.stored(), Some(4));
    }

    /// xorshift64*: deterministic pseudo-random numbers without a dependency.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    #[test]
    fn k3_property_the_position_never_passes_unsettled_work_and_reaches_the_end() {
        for seed in 1..=2_000u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            let mut t = OffsetTracker::new();
            // Offsets in order with random gaps (never delivered).
            let mut next = rng.below(5) as i64;
            let mut undelivered: Vec<i64> = Vec::new();
            let mut unsettled: Vec<i64> = Vec::new();
            let count = 1 + rng.below(40);
            for _ in 0..count {
                undelivered.push(next);
                next += 1 + if rng.below(4) == 0 {
                    rng.below(3) as i64
                } else {
                    0
                };
            }
            let highest = *undelivered.last().unwrap();
            undelivered.reverse();
            while !undelivered.is_empty() || !unsettled.is_empty() {
                let deliver =
                    !undelivered.is_empty() && (unsettled.is_empty() || rng.below(2) == 0);
                if !unsettled.is_empty() && rng.below(8) == 0 {
                    // Handled again while still running (K4): nothing changes.
                    let again = unsettled[rng.below(unsettled.len() as u64) as usize];
                    t.delivered(again);
                } else if deliver {
                    let offset = undelivered.pop().unwrap();
                    t.delivered(offset);
                    unsettled.push(offset);
                } else {
                    let i = rng.below(unsettled.len() as u64) as usize;
                    let offset = unsettled.swap_remove(i);
                    t.settled(offset);
                }
                let mut expected = unsettled.clone();
                expected.sort_unstable();
                assert_eq!(t.running().collect::<Vec<_>>(), expected, "seed {seed}");
                if let (Some(stored), Some(lowest)) = (t.stored(), unsettled.iter().min()) {
                    assert!(
                        stored < *lowest,
                        "seed {seed}: stored {stored} passed unsettled {lowest}"
                    );
                }
            }
            assert_eq!(
                t.stored(),
                Some(highest),
                "seed {seed}: all settled reaches the highest delivered"
            );
        }
    }
}
