//! A fetched delivery: counted in flight, given to its lane, and polled there once.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::task::{Context, Poll};

use ruststream_core::{Delivery, Subscription};

use super::{Driver, Lanes, Waiting};
use crate::registration::LaneKey;
use crate::runtime::lanes::ANY_LANE;
use crate::runtime::shared::{Done, Job, Shared};
use crate::runtime::work::LaneWork;

impl<Sub, S, L> Driver<'_, Sub, S, L>
where
    Sub: Subscription,
    L: LaneWork<Sub::Receipt>,
{
    /// The delivery the fetch wrote into the slot, started on its lane (or queued, or
    /// kept waiting) and its lane polled once: what it came to when done at once. `idle`:
    /// every lane is free and nothing waits for one (the common case), so it starts.
    #[inline(always)]
    pub(super) fn fetched(
        &mut self,
        receipt: Sub::Receipt,
        idle: bool,
        cx: &mut Context<'_>,
    ) -> Option<Done<Sub::Receipt>> {
        if self.fetch_errors.succeeded() {
            self.shared.health.fetch_failed(false);
        }
        let job = self.set.job(&mut self.slot, receipt);
        let mut lane = count_in(self.shared, &self.lanes, &job);
        let started = if idle {
            if lane == ANY_LANE {
                lane = self.set.free_lane().unwrap_or(0);
            }
            self.set.start_free(lane, job);
            true
        } else {
            let started;
            (lane, started, self.pending) = offer(&mut self.subscription, &mut self.set, lane, job);
            started
        };
        let done = self.first_poll(lane, started, cx)?;
        self.set.start_waiting(&mut self.pending);
        Some(done)
    }

    /// The first poll of the lane a delivery was just given to (`started`: it runs there
    /// now): what it came to when done at once. Most handlers finish in their first
    /// poll, settled in this same pass; one that runs on is told to the subscription
    /// (one that waits was told in `offer`).
    #[inline(always)]
    fn first_poll(
        &mut self,
        lane: usize,
        started: bool,
        cx: &mut Context<'_>,
    ) -> Option<Done<Sub::Receipt>> {
        if lane == ANY_LANE {
            // Keyless and every lane busy: it waits for the first lane to free up.
            return None;
        }
        let Poll::Ready(done) = self.set.poll_lane(lane, cx) else {
            if started && let Some(receipt) = self.set.receipt(lane) {
                self.subscription.running_on(receipt);
            }
            return None;
        };
        Some(done)
    }
}

/// A delivery offered to `lane` while lanes are busy (returned: its lane, whether it
/// started there, and it again when it must wait): a free lane starts it; a busy one
/// queues it or, full, makes it wait. One that does not start is not done at once: the
/// subscription is told so.
fn offer<Sub: Subscription, L: LaneWork<Sub::Receipt>>(
    subscription: &mut Sub,
    set: &mut L,
    mut lane: usize,
    job: Job<Sub::Receipt>,
) -> (usize, bool, Waiting<Sub::Receipt>) {
    if lane == ANY_LANE
        && let Some(free) = set.free_lane()
    {
        lane = free;
    }
    let started = lane != ANY_LANE && set.is_free(lane);
    if !started {
        subscription.waiting(&job.receipt);
    }
    (lane, started, set.offer(lane, job).map(|job| (lane, job)))
}

/// A fetched delivery counted in flight: the lane it goes to.
#[inline(always)]
fn count_in<S, R>(shared: &Shared<S>, lanes: &Lanes, job: &Job<R>) -> usize {
    if let Some(metrics) = &shared.metrics {
        metrics.deliveries.inc();
    }
    shared.begin();
    if lanes.count == 1 {
        return 0;
    }
    pick_of_many(job.incoming.delivery(), lanes)
}

/// A keyed delivery's lane, by its key's hash (its order kept); a keyless one's is
/// [`ANY_LANE`]: the first free one.
fn pick_of_many(delivery: &Delivery, lanes: &Lanes) -> usize {
    let mut hasher = DefaultHasher::new();
    match (lanes.key, delivery.metadata().partition, delivery.key()) {
        (LaneKey::Partition, Some(partition), _) => partition.hash(&mut hasher),
        (_, _, Some(key)) => key.hash(&mut hasher),
        (_, _, None) => return ANY_LANE,
    }
    (hasher.finish() % lanes.count as u64) as usize
}
