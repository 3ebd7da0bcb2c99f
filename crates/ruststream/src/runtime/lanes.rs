//! The lanes of one subscription, held and polled by its driver task alone.
//!
//! A lane runs one delivery at a time and keeps a short queue behind it. The running
//! delivery is a future in a box the lane keeps for its whole life: a new delivery
//! replaces the finished one in place, so starting one allocates nothing, and nothing
//! here is shared with another task, so nothing takes a lock or needs a waker of its
//! own (the driver polls its lanes on every pass of its loop). A running delivery's
//! receipt stays here beside its future, not inside it: the driver can look at it while
//! the handler runs (`Subscription::running_on`), and it is not moved through the
//! future's state.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use super::shared::{Done, Fate, Job};
use super::work::{Boxes, LaneWork};
use crate::extract::{Context as CallContext, Incoming};
use crate::in_flight::InFlight;

/// Deliveries a lane holds beyond the one it runs: small, so a slow handler holds back
/// fetching instead of growing memory.
pub(crate) const LANE_QUEUE: usize = 1;

/// The lane of a delivery with no key (no order to keep): it starts on the first lane
/// that is free, never queued behind a running one (one hung handler then holds back
/// nothing but its own lane).
pub(crate) const ANY_LANE: usize = usize::MAX;

/// What a lane hands back when a delivery is done with: what it came to (the lanes add
/// its receipt, which they keep) and, unless a delayed copy keeps it, the box the
/// delivery came in.
pub(crate) type Finished = (Fate, Option<Box<Incoming>>);

pub(crate) struct Lanes<R, F, St> {
    start: St,
    /// Each lane's last delivery's future: running while the lane has its receipt,
    /// finished (holding nothing) otherwise, until the next start replaces it.
    running: Vec<Pin<Box<Option<F>>>>,
    /// The receipt of each lane's running delivery: what says a lane runs one.
    receipts: Vec<Option<R>>,
    queues: Vec<VecDeque<Job<R>>>,
    /// Lanes with a delivery running.
    busy: usize,
    /// Where the next scan for finished work begins, so no lane waits behind another.
    scan_from: usize,
    /// Where the next look for a free lane begins, so keyless work spreads over lanes.
    free_from: usize,
    /// Lanes that started a delivery which had waited (queued, or for any lane): the
    /// driver tells the subscription it runs now (`Subscription::running_on`).
    started_after_wait: Vec<usize>,
    /// Boxes for the next deliveries.
    boxes: Boxes,
    /// Where the number of running deliveries is published (when metrics are on).
    published: Option<Arc<InFlight>>,
}

impl<R, F, St> Lanes<R, F, St>
where
    F: Future<Output = Finished>,
    St: Fn(Box<Incoming>) -> F,
{
    /// `count` lanes; `start` turns a delivery into the future that runs it; the number of
    /// running deliveries is kept in `published`'s `running` when given; every box holds
    /// `context` beside its delivery.
    pub(crate) fn new(
        count: usize,
        published: Option<Arc<InFlight>>,
        context: Arc<CallContext>,
        start: St,
    ) -> Self {
        Self {
            start,
            running: (0..count).map(|_| Box::pin(None)).collect(),
            receipts: (0..count).map(|_| None).collect(),
            queues: (0..count)
                .map(|_| VecDeque::with_capacity(LANE_QUEUE))
                .collect(),
            busy: 0,
            scan_from: 0,
            free_from: 0,
            started_after_wait: Vec::new(),
            // Each lane's queue and running delivery, and one waiting for room.
            boxes: Boxes::new(context, count * (LANE_QUEUE + 1) + 1),
            published,
        }
    }

    /// [`offer`](Self::offer), for a job that `waited` (its start is told).
    #[inline(always)]
    fn offer_after(&mut self, lane: usize, job: Job<R>, waited: bool) -> Option<Job<R>> {
        if lane == ANY_LANE {
            return match self.free_lane() {
                Some(free) => {
                    self.start_after(free, job, waited);
                    None
                }
                None => Some(job),
            };
        }
        if self.receipts[lane].is_none() {
            self.start_after(lane, job, waited);
            None
        } else if self.queues[lane].len() < LANE_QUEUE {
            self.queues[lane].push_back(job);
            None
        } else {
            Some(job)
        }
    }

    /// Whether `lane` would take a job now.
    fn has_room(&self, lane: usize) -> bool {
        if lane == ANY_LANE {
            return self.receipts.iter().any(Option::is_none);
        }
        self.receipts[lane].is_none() || self.queues[lane].len() < LANE_QUEUE
    }

    #[inline]
    fn start(&mut self, lane: usize, job: Job<R>) {
        self.start_after(lane, job, false);
    }

    #[inline]
    fn start_after(&mut self, lane: usize, job: Job<R>, waited: bool) {
        if waited {
            self.started_after_wait.push(lane);
        }
        self.receipts[lane] = Some(job.receipt);
        self.running[lane].set(Some((self.start)(job.incoming)));
        self.busy += 1;
        self.publish();
    }

    fn poll_running(&mut self, cx: &mut Context<'_>) -> Poll<Done<R>> {
        let count = self.running.len();
        for i in 0..count {
            let lane = (self.scan_from + i) % count;
            if let Poll::Ready(done) = self.poll_lane(lane, cx) {
                self.scan_from = (lane + 1) % count;
                return Poll::Ready(done);
            }
        }
        Poll::Pending
    }

    fn publish(&self) {
        if let Some(in_flight) = &self.published {
            in_flight.running.store(self.busy, Ordering::Relaxed);
        }
    }
}

impl<R, F, St> LaneWork<R> for Lanes<R, F, St>
where
    F: Future<Output = Finished>,
    St: Fn(Box<Incoming>) -> F,
{
    /// A box for the next fetch to write its delivery into: a spare one when there is
    /// one (its last delivery is overwritten there), a new one otherwise.
    #[inline]
    fn slot(&mut self) -> Box<Incoming> {
        self.boxes.take()
    }

    /// A job for the delivery the fetch wrote into `slot`, which gets the next box.
    #[inline]
    fn job(&mut self, slot: &mut Box<Incoming>, receipt: R) -> Job<R> {
        self.boxes.job(slot, receipt)
    }

    /// Whether `lane` runs nothing: a job offered to it starts at once.
    #[inline]
    fn is_free(&self, lane: usize) -> bool {
        self.receipts[lane].is_none()
    }

    /// The receipt of the delivery `lane` runs.
    #[inline]
    fn receipt(&self, lane: usize) -> Option<&R> {
        self.receipts[lane].as_ref()
    }

    /// A lane that runs nothing, looking from where the last look ended.
    fn free_lane(&mut self) -> Option<usize> {
        let count = self.receipts.len();
        let free = (0..count)
            .map(|i| (self.free_from + i) % count)
            .find(|&lane| self.receipts[lane].is_none())?;
        self.free_from = (free + 1) % count;
        Some(free)
    }

    /// Starts `job` on `lane` or queues it there when it has room; hands it back when not.
    /// A keyless job ([`ANY_LANE`]) starts on a free lane or is handed back.
    #[inline(always)]
    fn offer(&mut self, lane: usize, job: Job<R>) -> Option<Job<R>> {
        self.offer_after(lane, job, false)
    }

    /// A lane finished: the delivery waiting for its lane is queued if that lane has
    /// room now.
    #[inline(always)]
    fn start_waiting(&mut self, waiting: &mut Option<(usize, Job<R>)>) {
        if let Some((lane, _)) = waiting
            && self.has_room(*lane)
            && let Some((lane, job)) = waiting.take()
            && let Some(job) = self.offer_after(lane, job, true)
        {
            self.queues[lane].push_back(job);
        }
    }

    /// Queues `job` whatever the room (a fetched delivery at stop, so it still runs).
    fn push(&mut self, lane: usize, job: Job<R>) {
        if let Some(job) = self.offer(lane, job) {
            let lane = if lane == ANY_LANE { 0 } else { lane };
            self.queues[lane].push_back(job);
        }
    }

    /// Starts `job` on `lane`, which runs nothing (the pump's case: every lane free).
    #[inline(always)]
    fn start_free(&mut self, lane: usize, job: Job<R>) {
        debug_assert!(self.is_free(lane), "a lane runs one delivery at a time");
        self.start(lane, job);
    }

    /// Polls the running deliveries; what the first one done asks to settle is
    /// returned, and its lane has already started the next one it holds.
    #[inline(always)]
    fn poll_finished(&mut self, cx: &mut Context<'_>) -> Poll<Done<R>> {
        // Nothing running, the common case on every pass: no call.
        if self.busy == 0 {
            return Poll::Pending;
        }
        self.poll_running(cx)
    }

    /// Polls `lane`'s running delivery; when it is done, what it asks to settle is
    /// returned, and the lane has already started the next one it holds.
    #[inline]
    fn poll_lane(&mut self, lane: usize, cx: &mut Context<'_>) -> Poll<Done<R>> {
        if self.receipts[lane].is_none() {
            return Poll::Pending;
        }
        let Some(future) = self.running[lane].as_mut().as_pin_mut() else {
            return Poll::Pending;
        };
        let (fate, spare) = std::task::ready!(future.poll(cx));
        // The finished future stays until the next start replaces it: it holds nothing
        // now (its box came back above), and dropping it twice costs twice.
        let receipt = self.receipts[lane]
            .take()
            .expect("a lane keeps the receipt of the delivery it runs");
        self.busy -= 1;
        self.publish();
        self.boxes.give_back(spare);
        if let Some(next) = self.queues[lane].pop_front() {
            self.start_after(lane, next, true);
        }
        Poll::Ready(Done { receipt, fate })
    }

    /// The next lane that started a delivery which had waited, with that delivery's
    /// receipt (still running: its future was not polled since).
    #[inline]
    fn started_after_wait(&mut self) -> Option<&R> {
        while let Some(lane) = self.started_after_wait.pop() {
            if self.receipts[lane].is_some() {
                return self.receipts[lane].as_ref();
            }
        }
        None
    }

    /// Nothing running and nothing queued.
    fn is_idle(&self) -> bool {
        self.busy == 0
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::task::{Context, Poll, Waker};

    use bytes::Bytes;
    use ruststream_core::{HeaderSource, Headers, Settle};

    use super::{Finished, Lanes};
    use crate::extract::{Context as CallContext, Incoming};
    use crate::memory::MemoryBroker;
    use crate::runtime::shared::{Fate, Job};
    use crate::runtime::work::LaneWork;

    /// A client's record, as far as its holders go.
    struct Record(#[allow(dead_code)] Arc<()>);

    impl HeaderSource for Record {
        fn read(&self) -> Headers {
            Headers::new()
        }
    }

    /// The lanes let go of a client's record as soon as its delivery is done (G5: no more
    /// records held than deliveries run), read or not: a spare box keeps no source.
    #[test]
    fn g5_a_finished_deliverys_box_comes_back_without_its_source() {
        let record = Arc::new(());
        let context = Arc::new(CallContext {
            registration: Arc::from("lanes"),
            transport: "memory",
            state: Arc::default(),
            publisher: MemoryBroker::new().publisher(),
        });
        let mut lanes = Lanes::new(1, None, context, |incoming: Box<Incoming>| async move {
            (Fate::Settle(Settle::Ack), Some(incoming)) as Finished
        });
        let mut incoming = lanes.slot();
        incoming
            .delivery_mut()
            .refill(&Arc::from("orders"), Bytes::from_static(b"{}"))
            .set_headers_from(Record(Arc::clone(&record)));
        assert!(
            lanes
                .offer(
                    0,
                    Job {
                        incoming,
                        receipt: 7_u64
                    }
                )
                .is_none()
        );
        assert_eq!(Arc::strong_count(&record), 2, "held while it runs");
        let mut cx = Context::from_waker(Waker::noop());
        let Poll::Ready(done) = lanes.poll_finished(&mut cx) else {
            panic!("the delivery finishes in its first poll");
        };
        assert_eq!(done.receipt, 7);
        assert!(matches!(done.fate, Fate::Settle(Settle::Ack)));
        assert_eq!(lanes.boxes.spare.len(), 1, "its box kept for reuse");
        assert_eq!(Arc::strong_count(&record), 1, "the record let go, unread");
    }
}
