//! The lanes of a batch registration: deliveries gathered per lane into batches, each
//! batch run by one call, each of its deliveries handed back to the driver alone.
//!
//! A lane gathers deliveries (an open batch) until it holds `max_batch` or `max_wait` has
//! passed since its first, then runs them as one batch once the lane's previous batch is
//! done: one batch at a time per lane, so a key's deliveries (which share a lane) keep
//! their order within and across batches. Keyless deliveries fill one lane's open batch
//! before the next. A finished batch's deliveries are handed to the driver one at a time
//! and settled exactly as single deliveries are.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use tokio::time::{Instant, Sleep, sleep_until};

use super::lanes::{ANY_LANE, Finished};
use super::shared::{Done, Job};
use super::work::{Boxes, LaneWork};
use crate::extract::{Context as CallContext, Incoming};
use crate::in_flight::InFlight;
use crate::registration::BatchLimits;

/// One lane: the batch it gathers and the batch it runs.
struct BatchLane<R, F> {
    /// The open batch's deliveries, and their receipts in the same order.
    // The boxes travel to the call and back to the lanes for reuse: boxed on purpose.
    #[allow(clippy::vec_box)]
    open: Vec<Box<Incoming>>,
    open_receipts: Vec<R>,
    /// When the open batch's first delivery came.
    opened: Option<Instant>,
    running: Pin<Box<Option<F>>>,
    /// The receipts of the running batch's deliveries, in its order; empty when the lane
    /// runs nothing.
    receipts: Vec<R>,
    /// The running batch did not finish in its first poll: its deliveries were told to
    /// the subscription as running.
    told: bool,
}

pub(crate) struct Batches<R, F, St> {
    start: St,
    limits: BatchLimits,
    lanes: Vec<BatchLane<R, F>>,
    /// A finished batch's deliveries, handed to the driver one at a time.
    done: VecDeque<Done<R>>,
    /// Deliveries held: gathered, running, or done and not yet handed back.
    held: usize,
    /// Deliveries in running batches (published as running).
    running: usize,
    /// The lane keyless deliveries fill now.
    fill: usize,
    scan_from: usize,
    /// Deliveries of batches that did not finish in their first poll, to tell the
    /// subscription of as running: (lane, index in its batch).
    started: Vec<(usize, usize)>,
    boxes: Boxes,
    /// Wakes the driver when the first open batch is due.
    timer: Pin<Box<Sleep>>,
    stopping: bool,
    published: Option<Arc<InFlight>>,
}

impl<R, F, St> Batches<R, F, St>
where
    F: Future<Output = Vec<Finished>>,
    St: Fn(Vec<Box<Incoming>>) -> F,
{
    /// `count` lanes cutting batches by `limits`; `start` turns a batch into the future
    /// that runs it.
    pub(crate) fn new(
        count: usize,
        limits: BatchLimits,
        published: Option<Arc<InFlight>>,
        context: Arc<CallContext>,
        start: St,
    ) -> Self {
        let lanes = (0..count)
            .map(|_| BatchLane {
                open: Vec::new(),
                open_receipts: Vec::new(),
                opened: None,
                running: Box::pin(None),
                receipts: Vec::new(),
                told: false,
            })
            .collect();
        Self {
            start,
            limits,
            lanes,
            done: VecDeque::new(),
            held: 0,
            running: 0,
            fill: 0,
            scan_from: 0,
            started: Vec::new(),
            // Every lane's open and running batch, and one waiting for room.
            boxes: Boxes::new(context, count * limits.max_batch * 2 + 1),
            timer: Box::pin(sleep_until(Instant::now())),
            stopping: false,
            published,
        }
    }

    fn has_room(&self, lane: usize) -> bool {
        self.lanes[lane].open.len() < self.limits.max_batch
    }

    /// Adds `job` to `lane`'s open batch, and runs it when it is full and the lane free.
    fn gather(&mut self, lane: usize, job: Job<R>) {
        let gathering = &mut self.lanes[lane];
        if gathering.open.is_empty() {
            gathering.opened = Some(Instant::now());
        }
        gathering.open.push(job.incoming);
        gathering.open_receipts.push(job.receipt);
        self.held += 1;
        if self.is_due(lane, None) {
            self.cut(lane);
        }
    }

    /// Whether `lane`'s open batch should run now (`now`: the time, when known).
    fn is_due(&self, lane: usize, now: Option<Instant>) -> bool {
        let lane = &self.lanes[lane];
        let Some(opened) = lane.opened else {
            return false;
        };
        self.stopping
            || lane.open.len() >= self.limits.max_batch
            || self.limits.max_wait.is_zero()
            || now.is_some_and(|now| now >= opened + self.limits.max_wait)
    }

    /// Runs `lane`'s open batch, unless the lane still runs one.
    fn cut(&mut self, lane: usize) {
        let BatchLane {
            open,
            open_receipts,
            opened,
            running,
            receipts,
            ..
        } = &mut self.lanes[lane];
        if !receipts.is_empty() || open.is_empty() {
            return;
        }
        *opened = None;
        // The running batch's (empty) receipts become the next open batch's, keeping
        // their room; the deliveries go to the call in a vector of their own.
        std::mem::swap(receipts, open_receipts);
        let capacity = open.len();
        let members = std::mem::replace(open, Vec::with_capacity(capacity));
        self.running += members.len();
        running.set(Some((self.start)(members)));
        self.publish();
    }

    /// Runs every open batch that is due and whose lane is free; the timer is set for
    /// the first one still to come.
    fn cut_due(&mut self, cx: &mut Context<'_>) {
        let now = Instant::now();
        let mut next: Option<Instant> = None;
        for lane in 0..self.lanes.len() {
            if !self.lanes[lane].receipts.is_empty() {
                continue;
            }
            if self.is_due(lane, Some(now)) {
                self.cut(lane);
            } else if let Some(opened) = self.lanes[lane].opened {
                let due = opened + self.limits.max_wait;
                next = Some(next.map_or(due, |n| n.min(due)));
            }
        }
        if let Some(due) = next {
            self.timer.as_mut().reset(due);
            // Registers the waker; the due time is in the future.
            let _ = self.timer.as_mut().poll(cx);
        }
    }

    /// Polls `lane`'s running batch; when it is done, its deliveries join `done` and the
    /// lane's open batch runs if due.
    fn poll_batch(&mut self, lane: usize, cx: &mut Context<'_>) -> Poll<()> {
        let Some(future) = self.lanes[lane].running.as_mut().as_pin_mut() else {
            return Poll::Pending;
        };
        let Poll::Ready(finished) = future.poll(cx) else {
            // Most batches finish in their first poll; one that runs on is told (a
            // JetStream delivery is then kept alive).
            let batch = &mut self.lanes[lane];
            if !batch.told {
                batch.told = true;
                self.started
                    .extend((0..batch.receipts.len()).map(|i| (lane, i)));
            }
            return Poll::Pending;
        };
        self.lanes[lane].running.set(None);
        if std::mem::take(&mut self.lanes[lane].told) {
            // Deliveries of this batch not yet told as running need not be now.
            self.started.retain(|(told, _)| *told != lane);
        }
        let receipts = &mut self.lanes[lane].receipts;
        self.running -= receipts.len();
        debug_assert_eq!(
            receipts.len(),
            finished.len(),
            "one conclusion per delivery"
        );
        for (receipt, (fate, spare)) in receipts.drain(..).zip(finished) {
            self.boxes.give_back(spare);
            self.done.push_back(Done { receipt, fate });
        }
        self.publish();
        if self.is_due(lane, Some(Instant::now())) {
            self.cut(lane);
        }
        Poll::Ready(())
    }

    fn hand_back(&mut self) -> Poll<Done<R>> {
        match self.done.pop_front() {
            Some(done) => {
                self.held -= 1;
                Poll::Ready(done)
            }
            None => Poll::Pending,
        }
    }

    fn publish(&self) {
        if let Some(in_flight) = &self.published {
            in_flight.running.store(self.running, Ordering::Relaxed);
        }
    }
}

impl<R, F, St> LaneWork<R> for Batches<R, F, St>
where
    F: Future<Output = Vec<Finished>>,
    St: Fn(Vec<Box<Incoming>>) -> F,
{
    fn slot(&mut self) -> Box<Incoming> {
        self.boxes.take()
    }

    fn job(&mut self, slot: &mut Box<Incoming>, receipt: R) -> Job<R> {
        self.boxes.job(slot, receipt)
    }

    fn is_free(&self, lane: usize) -> bool {
        self.lanes[lane].receipts.is_empty() && self.has_room(lane)
    }

    /// A batch runs many: its deliveries are told through `started_after_wait`.
    fn receipt(&self, _lane: usize) -> Option<&R> {
        None
    }

    /// The lane keyless deliveries fill: the current one while it has room and runs
    /// nothing, else the next free one, else the next with room.
    fn free_lane(&mut self) -> Option<usize> {
        let count = self.lanes.len();
        let order = |from: usize| (0..count).map(move |i| (from + i) % count);
        let lane = order(self.fill)
            .find(|&lane| self.is_free(lane))
            .or_else(|| order(self.fill).find(|&lane| self.has_room(lane)))?;
        self.fill = lane;
        Some(lane)
    }

    fn offer(&mut self, lane: usize, job: Job<R>) -> Option<Job<R>> {
        let lane = if lane == ANY_LANE {
            match self.free_lane() {
                Some(lane) => lane,
                None => return Some(job),
            }
        } else {
            lane
        };
        if !self.has_room(lane) {
            return Some(job);
        }
        self.gather(lane, job);
        None
    }

    fn start_waiting(&mut self, waiting: &mut Option<(usize, Job<R>)>) {
        if let Some((lane, job)) = waiting.take() {
            *waiting = self.offer(lane, job).map(|job| (lane, job));
        }
    }

    fn push(&mut self, lane: usize, job: Job<R>) {
        if let Some(job) = self.offer(lane, job) {
            let lane = if lane == ANY_LANE { self.fill } else { lane };
            self.gather(lane, job);
        }
    }

    fn start_free(&mut self, lane: usize, job: Job<R>) {
        let refused = self.offer(lane, job);
        debug_assert!(refused.is_none(), "a free lane has room");
    }

    fn poll_finished(&mut self, cx: &mut Context<'_>) -> Poll<Done<R>> {
        if self.held == 0 {
            return Poll::Pending;
        }
        if let Poll::Ready(done) = self.hand_back() {
            return Poll::Ready(done);
        }
        self.cut_due(cx);
        let count = self.lanes.len();
        for i in 0..count {
            let lane = (self.scan_from + i) % count;
            if self.poll_batch(lane, cx).is_ready() {
                self.scan_from = (lane + 1) % count;
                return self.hand_back();
            }
        }
        Poll::Pending
    }

    #[inline(always)]
    fn poll_lane(&mut self, lane: usize, cx: &mut Context<'_>) -> Poll<Done<R>> {
        if let Poll::Ready(done) = self.hand_back() {
            return Poll::Ready(done);
        }
        if self.lanes[lane].running.is_none() {
            // Gathered into the open batch, nothing cut: the common case.
            return Poll::Pending;
        }
        std::task::ready!(self.poll_batch(lane, cx));
        self.hand_back()
    }

    fn started_after_wait(&mut self) -> Option<&R> {
        let (lane, index) = self.started.pop()?;
        self.lanes[lane].receipts.get(index)
    }

    fn is_idle(&self) -> bool {
        self.held == 0
    }

    fn straight(&self) -> bool {
        self.running == 0 && self.done.is_empty()
    }

    fn ready(&mut self) -> Option<Done<R>> {
        match self.hand_back() {
            Poll::Ready(done) => Some(done),
            Poll::Pending => None,
        }
    }

    fn stopping(&mut self) {
        self.stopping = true;
    }
}
