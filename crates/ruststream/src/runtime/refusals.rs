//! Deliveries whose copy the broker refused, remembered across their comebacks so each
//! comes back later than the last time (SPEC G3), and so one whose dead letter was
//! refused goes straight to its dead letter when it comes back, its handler not run
//! again past the cap.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use ruststream_core::Delivery;

/// Entries kept at most; past it the memory starts again (a delivery refused again then
/// waits the shortest time once more: slower growth, never a storm).
const CAPACITY: usize = 4096;

/// A delivery's identity on its broker: address and position (Pulsar: its message id,
/// its sequence being its producer's).
type Identity = (Arc<str>, Option<i32>, Option<i64>, Option<u64>, LedgerEntry);
type LedgerEntry = Option<(u64, u64, i32, i32)>;

#[derive(Debug, Default)]
pub(crate) struct Refusals {
    counts: Mutex<HashMap<Identity, Refused>>,
    /// How many entries owe a dead letter: read without the lock for every delivery.
    owed: AtomicUsize,
}

/// A delivery's refusals in a row, and whether the last refused copy was its dead letter.
#[derive(Debug, Default, Clone, Copy)]
struct Refused {
    count: u32,
    dead_letter: bool,
}

fn identity(delivery: &Delivery) -> Option<Identity> {
    let m = delivery.metadata();
    if m.offset.is_none() && m.sequence.is_none() {
        // Core NATS: nothing identifies the message, and nothing brings it back anyway.
        return None;
    }
    Some((
        Arc::clone(delivery.address_arc()),
        m.partition,
        m.offset,
        m.sequence,
        m.ledger_entry,
    ))
}

impl Refusals {
    /// One more refusal for `delivery`, of its dead letter or of a retry copy; how many in
    /// a row now (1 for the first).
    pub(crate) fn refused(&self, delivery: &Delivery, dead_letter: bool) -> u32 {
        let Some(id) = identity(delivery) else {
            return 1;
        };
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        if counts.len() >= CAPACITY && !counts.contains_key(&id) {
            counts.clear();
            self.owed.store(0, Ordering::Relaxed);
        }
        let entry = counts.entry(id).or_default();
        entry.count = entry.count.saturating_add(1);
        if dead_letter && !entry.dead_letter {
            self.owed.fetch_add(1, Ordering::Relaxed);
        }
        entry.dead_letter |= dead_letter;
        entry.count
    }

    /// Whether `delivery` came back because its dead letter was refused: its handler
    /// ran its last attempt already.
    pub(crate) fn owes_dead_letter(&self, delivery: &Delivery) -> bool {
        if self.owed.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let Some(id) = identity(delivery) else {
            return false;
        };
        let counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        counts.get(&id).is_some_and(|r| r.dead_letter)
    }

    /// The copy went out: forget the delivery.
    pub(crate) fn confirmed(&self, delivery: &Delivery) {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        if counts.is_empty() {
            return;
        }
        if let Some(id) = identity(delivery)
            && counts.remove(&id).is_some_and(|r| r.dead_letter)
        {
            self.owed.fetch_sub(1, Ordering::Relaxed);
        }
    }
}
