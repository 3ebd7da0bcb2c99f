//! Where the driver and its lanes pass work: one queue per lane, one queue of finished
//! work. Lanes are futures polled by the driver task itself, so nothing here needs a
//! waker: a job only ever arrives while the driver runs, and the driver polls its lanes
//! on every pass of its loop. (Two tokio channels did this before, at about a thousand
//! instructions per delivery each.)

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use ruststream_core::Delivery;

use super::driver::{Done, Job};

/// Deliveries a lane holds beyond the one it runs: small, so a slow handler holds back
/// fetching instead of growing memory.
pub(crate) const LANE_QUEUE: usize = 1;

/// Boxes kept for the next deliveries. A delivery (about 180 bytes) is moved into a box
/// once, when fetched, and travels as a pointer from there to the lane, the handler's
/// extractors and back; a finished lane returns its box here, so the steady state
/// allocates nothing. A spare box keeps its last delivery (and payload) until reused, so
/// no more are kept than the lanes hold at once (each lane's queue and running delivery,
/// and one waiting for room).
fn spare_boxes(lanes: usize) -> usize {
    lanes * (LANE_QUEUE + 1) + 1
}

pub(crate) struct Board<R> {
    inner: Mutex<Inner<R>>,
    /// How many finished jobs wait in `done`: the driver looks here on every pass
    /// without taking the lock.
    finished: AtomicUsize,
}

struct Inner<R> {
    queues: Vec<VecDeque<Job<R>>>,
    done: VecDeque<Done<R>>,
    // The boxes themselves are the point: they are handed out again, not their contents.
    #[allow(clippy::vec_box)]
    spare: Vec<Box<Delivery>>,
    spare_cap: usize,
    closed: bool,
}

/// What a lane finds on its queue.
pub(crate) enum Take<R> {
    Job(Job<R>),
    Empty,
    Closed,
}

impl<R> Board<R> {
    pub(crate) fn new(lanes: usize) -> Self {
        Self {
            inner: Mutex::new(Inner {
                queues: (0..lanes)
                    .map(|_| VecDeque::with_capacity(LANE_QUEUE + 1))
                    .collect(),
                done: VecDeque::with_capacity(lanes * (LANE_QUEUE + 1)),
                spare: Vec::new(),
                spare_cap: spare_boxes(lanes),
                closed: false,
            }),
            finished: AtomicUsize::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner<R>> {
        // Every update is a single push or pop: a poisoned lock is still consistent.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn has_room(&self, lane: usize) -> bool {
        self.lock().queues[lane].len() < LANE_QUEUE
    }

    /// A job for a fetched delivery, boxed in a spare box when there is one.
    pub(crate) fn job(&self, delivery: Delivery, receipt: R) -> Job<R> {
        let spare = self.lock().spare.pop();
        let delivery = match spare {
            Some(mut spare) => {
                *spare = delivery;
                spare
            }
            None => Box::new(delivery),
        };
        Job { delivery, receipt }
    }

    /// Queues `job` on `lane` when it has room; hands it back when not.
    pub(crate) fn offer(&self, lane: usize, job: Job<R>) -> Option<Job<R>> {
        let mut inner = self.lock();
        if inner.queues[lane].len() < LANE_QUEUE {
            inner.queues[lane].push_back(job);
            None
        } else {
            Some(job)
        }
    }

    /// Queues `job` whatever the room (a fetched delivery at stop, so it still runs).
    pub(crate) fn push(&self, lane: usize, job: Job<R>) {
        self.lock().queues[lane].push_back(job);
    }

    pub(crate) fn take(&self, lane: usize) -> Take<R> {
        let mut inner = self.lock();
        match inner.queues[lane].pop_front() {
            Some(job) => Take::Job(job),
            None if inner.closed => Take::Closed,
            None => Take::Empty,
        }
    }

    /// A lane finished `done`, and returns the box its delivery came in.
    pub(crate) fn finish(&self, done: Done<R>, spare: Option<Box<Delivery>>) {
        let mut inner = self.lock();
        inner.done.push_back(done);
        if let Some(spare) = spare
            && inner.spare.len() < inner.spare_cap
        {
            inner.spare.push(spare);
        }
        self.finished.fetch_add(1, Ordering::Release);
    }

    pub(crate) fn pop_done(&self) -> Option<Done<R>> {
        if !self.has_done() {
            return None;
        }
        let done = self.lock().done.pop_front();
        if done.is_some() {
            self.finished.fetch_sub(1, Ordering::Relaxed);
        }
        done
    }

    pub(crate) fn has_done(&self) -> bool {
        self.finished.load(Ordering::Acquire) > 0
    }

    /// No more jobs: lanes end once their queues are empty.
    pub(crate) fn close(&self) {
        self.lock().closed = true;
    }
}
