//! Deliveries whose copy the broker refused, remembered across their comebacks so each
//! comes back later than the last time (SPEC G3).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use ruststream_core::Delivery;

/// Entries kept at most; past it the memory starts again (a delivery refused again then
/// waits the shortest time once more: slower growth, never a storm).
const CAPACITY: usize = 4096;

/// A delivery's identity on its broker: address and position.
type Identity = (Arc<str>, Option<i32>, Option<i64>, Option<u64>);

#[derive(Debug, Default)]
pub(crate) struct Refusals {
    counts: Mutex<HashMap<Identity, u32>>,
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
    ))
}

impl Refusals {
    /// One more refusal for `delivery`; how many in a row now (1 for the first).
    pub(crate) fn refused(&self, delivery: &Delivery) -> u32 {
        let Some(id) = identity(delivery) else {
            return 1;
        };
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        if counts.len() >= CAPACITY && !counts.contains_key(&id) {
            counts.clear();
        }
        let count = counts.entry(id).or_insert(0);
        *count = count.saturating_add(1);
        *count
    }

    /// The copy went out: forget the delivery.
    pub(crate) fn confirmed(&self, delivery: &Delivery) {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        if counts.is_empty() {
            return;
        }
        if let Some(id) = identity(delivery) {
            counts.remove(&id);
        }
    }
}
