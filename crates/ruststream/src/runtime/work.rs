//! What the driver asks of the work it runs: one delivery at a time per lane
//! ([`Lanes`](super::lanes::Lanes)), or batches per lane
//! ([`Batches`](super::batches::Batches)). The driver's fetch, settlement and stop are
//! the same for both; only how fetched deliveries are grouped and run differs.

use std::task::{Context, Poll};

use super::shared::{Done, Job};
use crate::extract::Incoming;

/// The lanes of one subscription, as its driver sees them.
pub(crate) trait LaneWork<R> {
    /// A box for the next fetch to write its delivery into.
    fn slot(&mut self) -> Box<Incoming>;

    /// A job for the delivery the fetch wrote into `slot`, which gets the next box.
    fn job(&mut self, slot: &mut Box<Incoming>, receipt: R) -> Job<R>;

    /// Whether a job offered to `lane` now would start (or join what starts) at once.
    fn is_free(&self, lane: usize) -> bool;

    /// The receipt of the delivery `lane` runs, when it runs exactly one.
    fn receipt(&self, lane: usize) -> Option<&R>;

    /// A lane for a keyless job, looking from where the last look ended.
    fn free_lane(&mut self) -> Option<usize>;

    /// Starts or queues `job` on `lane` when it has room; hands it back when not.
    fn offer(&mut self, lane: usize, job: Job<R>) -> Option<Job<R>>;

    /// A lane made room: the job waiting for it goes in.
    fn start_waiting(&mut self, waiting: &mut Option<(usize, Job<R>)>);

    /// Takes `job` whatever the room (a fetched delivery at stop, so it still runs).
    fn push(&mut self, lane: usize, job: Job<R>);

    /// Starts `job` on `lane`, which is free (every lane is: the straight line's case).
    fn start_free(&mut self, lane: usize, job: Job<R>);

    /// Polls what runs; the first delivery done is returned.
    fn poll_finished(&mut self, cx: &mut Context<'_>) -> Poll<Done<R>>;

    /// Polls what `lane` runs; a delivery done is returned.
    fn poll_lane(&mut self, lane: usize, cx: &mut Context<'_>) -> Poll<Done<R>>;

    /// The receipt of the next delivery that started after waiting (told to the
    /// subscription: `Subscription::running_on`).
    fn started_after_wait(&mut self) -> Option<&R>;

    /// Nothing held: nothing running, queued, or done and not yet handed back.
    fn is_idle(&self) -> bool;

    /// The app stops: whatever is held starts without waiting for more.
    fn stopping(&mut self) {}
}
