//! What a handler run by several consumers saw: each key's message numbers in the order
//! they were handled, and the most calls running at once.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

/// Shared by the handler's calls (wrap it in an `Arc`).
#[derive(Debug, Default)]
pub struct Overlap {
    now: AtomicUsize,
    most: AtomicUsize,
    seen: Mutex<BTreeMap<String, Vec<u32>>>,
}

/// The payload of message `n` of `key`, as [`Overlap::handle`] reads it.
pub fn keyed_payload(key: &str, n: u32) -> String {
    format!("{key}/{n}")
}

impl Overlap {
    /// One call: blocks its thread for `work` (so only another task's call can run
    /// beside it), then records the payload's key and number (`key/n`).
    pub fn handle(&self, payload: &[u8], work: Duration) {
        let running = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(running, Ordering::SeqCst);
        std::thread::sleep(work);
        self.now.fetch_sub(1, Ordering::SeqCst);
        let text = String::from_utf8_lossy(payload);
        let (key, n) = text.split_once('/').expect("a key/n payload");
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(key.to_owned())
            .or_default()
            .push(n.parse().expect("a number"));
    }

    /// The most calls that ran at once.
    pub fn most(&self) -> usize {
        self.most.load(Ordering::SeqCst)
    }

    /// How many calls were recorded.
    pub fn count(&self) -> usize {
        self.per_key().values().map(Vec::len).sum()
    }

    /// How many different messages were handled.
    pub fn distinct(&self) -> usize {
        self.per_key()
            .values()
            .map(|numbers| {
                numbers
                    .iter()
                    .collect::<std::collections::BTreeSet<_>>()
                    .len()
            })
            .sum()
    }

    /// Each key's numbers in the order handled.
    pub fn per_key(&self) -> BTreeMap<String, Vec<u32>> {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Asserts each of `keys` keys got `per_key` messages, each once and in order.
    pub fn assert_each_key_in_order(&self, keys: usize, per_key: u32) {
        self.assert_order(keys, per_key, false);
    }

    /// Like [`Overlap::assert_each_key_in_order`], where a partition that moved to
    /// another member may be read again from its last commit (Kafka, K5): a key's
    /// messages in order when each is taken at its first handling, none missing.
    pub fn assert_each_key_in_order_allowing_replays(&self, keys: usize, per_key: u32) {
        self.assert_order(keys, per_key, true);
    }

    fn assert_order(&self, keys: usize, per_key: u32, replays: bool) {
        let seen = self.per_key();
        assert_eq!(seen.len(), keys, "keys seen");
        let expected: Vec<u32> = (0..per_key).collect();
        for (key, numbers) in seen {
            let firsts: Vec<u32> = if replays {
                let mut first = Vec::new();
                for n in numbers.iter().copied() {
                    if !first.contains(&n) {
                        first.push(n);
                    }
                }
                first
            } else {
                numbers.clone()
            };
            assert_eq!(firsts, expected, "key {key}: {numbers:?}, in order");
        }
    }
}

/// The rules a refused start names, as `registration: rule` lines; fails the test when
/// the start was not refused for broken registrations.
pub fn refusals(started: Result<ruststream::Running, ruststream::StartError>) -> Vec<String> {
    match started {
        Err(ruststream::StartError::Invalid(violations)) => violations
            .iter()
            .map(|v| format!("{}: {}", v.registration, v.rule))
            .collect(),
        Err(other) => panic!("refused for another reason: {other}"),
        Ok(_) => panic!("started although a registration is broken"),
    }
}
