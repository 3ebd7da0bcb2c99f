//! Requeues of a classic queue, counted by the service: the broker only flags a requeued
//! delivery (`redelivered`), so an undeclared `retry()` (a plain `basic.nack` with
//! requeue) would otherwise read attempt 1 forever and spin without a word (SPEC G2).

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::Duration;

/// Messages remembered at most; past it the memory starts again (a message then counts
/// from its header once more: a shorter floor once, never a storm).
const CAPACITY: usize = 4096;

/// The floor before a requeued message is nacked again: 10 ms, doubling, at most 1 s
/// (the runtime's floor for an in-place rerun).
const FLOOR_FIRST: Duration = Duration::from_millis(10);
const FLOOR_MOST: Duration = Duration::from_secs(1);

/// How often each message came back requeued, by its identity: its `message_id` when it
/// has one, else a digest of its body and headers.
#[derive(Debug, Default)]
pub(crate) struct Requeues {
    counts: HashMap<u64, u32>,
}

impl Requeues {
    /// `message` came back requeued once more; how many times now (1 for the first).
    pub(crate) fn came_back(&mut self, key: u64) -> u32 {
        if self.counts.len() >= CAPACITY && !self.counts.contains_key(&key) {
            self.counts.clear();
        }
        let count = self.counts.entry(key).or_insert(0);
        *count = count.saturating_add(1);
        *count
    }

    /// The message was settled for good: forget it.
    pub(crate) fn settled(&mut self, key: u64) {
        self.counts.remove(&key);
    }
}

/// A message's identity across its requeues.
pub(crate) fn key(message: &lapin::message::Delivery) -> u64 {
    let mut hasher = DefaultHasher::new();
    match message.properties.message_id() {
        Some(id) => id.as_str().hash(&mut hasher),
        None => {
            message.data.hash(&mut hasher);
            if let Some(table) = message.properties.headers() {
                for (name, value) in table.inner() {
                    name.as_str().hash(&mut hasher);
                    format!("{value:?}").hash(&mut hasher);
                }
            }
        }
    }
    hasher.finish()
}

/// How long a message requeued `count` times waits before it is nacked again.
pub(crate) fn floor(count: u32) -> Duration {
    let doubled = FLOOR_FIRST.saturating_mul(1 << count.min(16).saturating_sub(1));
    doubled.min(FLOOR_MOST)
}

#[cfg(test)]
mod tests {
    use super::{Requeues, floor};
    use std::time::Duration;

    #[test]
    fn g2_requeues_count_per_message_and_the_floor_doubles_to_a_second() {
        let mut requeues = Requeues::default();
        assert_eq!(requeues.came_back(7), 1);
        assert_eq!(requeues.came_back(7), 2);
        assert_eq!(requeues.came_back(8), 1);
        requeues.settled(7);
        assert_eq!(requeues.came_back(7), 1);
        let floors: Vec<Duration> = (1..=9).map(floor).collect();
        assert_eq!(floors[0], Duration::from_millis(10));
        assert_eq!(floors[1], Duration::from_millis(20));
        assert_eq!(floors[6], Duration::from_millis(640));
        assert_eq!(floors[7], Duration::from_secs(1));
        assert_eq!(floor(u32::MAX), Duration::from_secs(1));
    }
}
