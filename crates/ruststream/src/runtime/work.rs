//! What the driver asks of the work it runs: one delivery at a time per lane
//! ([`Lanes`](super::lanes::Lanes)), or batches per lane
//! ([`Batches`](super::batches::Batches)). The driver's fetch, settlement and stop are
//! the same for both; only how fetched deliveries are grouped and run differs.

use std::sync::Arc;
use std::task::{Context, Poll};

use ruststream_core::Delivery;

use super::shared::{Done, Job};
use crate::extract::{Context as CallContext, Incoming};

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

    /// Nothing runs and nothing done waits to be handed back (batch lanes may be
    /// gathering): the driver's straight line may fetch on and start what it fetches.
    fn straight(&self) -> bool {
        self.is_idle()
    }

    /// A delivery done and ready to hand back without polling anything (what is left
    /// of a finished batch), the first thing a pass looks at.
    #[inline(always)]
    fn ready(&mut self) -> Option<Done<R>> {
        None
    }

    /// The app stops: whatever is held starts without waiting for more.
    fn stopping(&mut self) {}
}

/// Boxes for the next deliveries. A delivery (about 180 bytes) is written into its box by
/// the fetch (`Subscription::next_into`, into the one box the driver holds for it) and
/// travels as a pointer from there to the handler's extractors and back; a finished
/// delivery's box comes back here, so the steady state allocates nothing. A box holds the
/// registration's shared context beside its delivery for its whole life (no reference
/// counted per delivery). A spare box keeps its last payload until reused, so no more are
/// kept than the lanes hold at once.
pub(crate) struct Boxes {
    // The boxes themselves are the point: they are handed out again, not their contents.
    #[allow(clippy::vec_box)]
    pub(super) spare: Vec<Box<Incoming>>,
    context: Arc<CallContext>,
    cap: usize,
}

impl Boxes {
    /// A pool keeping at most `cap` spare boxes, each with `context`.
    pub(crate) fn new(context: Arc<CallContext>, cap: usize) -> Self {
        Self {
            spare: Vec::new(),
            context,
            cap,
        }
    }

    /// A spare box when there is one (its last delivery is overwritten there), a new one
    /// otherwise.
    #[inline]
    pub(crate) fn take(&mut self) -> Box<Incoming> {
        match self.spare.pop() {
            Some(spare) => spare,
            None => self.new_box(),
        }
    }

    /// A new box, while the lanes have not yet handed back as many as they hold.
    #[cold]
    fn new_box(&self) -> Box<Incoming> {
        let context = Arc::clone(&self.context);
        Box::new(Incoming::new(Delivery::empty(), context))
    }

    /// A job for the delivery the fetch wrote into `slot`, which gets the next box.
    #[inline]
    pub(crate) fn job<R>(&mut self, slot: &mut Box<Incoming>, receipt: R) -> Job<R> {
        let next = self.take();
        Job {
            incoming: std::mem::replace(slot, next),
            receipt,
        }
    }

    /// A finished delivery's box, kept for reuse while there is room: it keeps its
    /// payload until reused, not a client's record.
    #[inline]
    pub(crate) fn give_back(&mut self, spare: Option<Box<Incoming>>) {
        if let Some(mut spare) = spare
            && self.spare.len() < self.cap
        {
            spare.delivery_mut().discard_deferred();
            self.spare.push(spare);
        }
    }
}
