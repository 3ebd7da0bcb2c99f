//! The count of one subscription's unsettled deliveries, which the driver keeps and the
//! metrics read.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// One subscription's deliveries fetched and not settled yet (SPEC G5, G6).
#[derive(Debug)]
pub(crate) struct InFlight {
    pub(crate) registration: Arc<str>,
    pub(crate) address: String,
    pub(crate) count: AtomicUsize,
    /// Of those, how many a handler is running for (kept only when metrics are on).
    pub(crate) running: AtomicUsize,
    /// Settled into the subscription's own keeping and not done yet (a held
    /// `retry_after` wait: Pulsar, RabbitMQ quorum, Redis): they count toward
    /// `max_in_flight` as well, so the in-flight series shows them.
    pub(crate) held: AtomicUsize,
}

impl InFlight {
    pub(crate) fn new(registration: Arc<str>, address: String) -> Self {
        Self {
            registration,
            address,
            count: AtomicUsize::new(0),
            running: AtomicUsize::new(0),
            held: AtomicUsize::new(0),
        }
    }

    pub(crate) fn running(&self) -> usize {
        self.running.load(Ordering::Relaxed)
    }

    pub(crate) fn count(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    /// Everything that counts toward `max_in_flight`: the runtime's and the
    /// subscription's held waits.
    pub(crate) fn total(&self) -> usize {
        self.count() + self.held.load(Ordering::Relaxed)
    }
}
