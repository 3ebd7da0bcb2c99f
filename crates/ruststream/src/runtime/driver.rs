//! The driver task: the only user of a subscription. It fetches, hands deliveries to
//! lanes, performs every settlement, owns the timers of delayed copies, and drains on
//! stop (SPEC E3).

use std::collections::hash_map::DefaultHasher;
use std::future::{Future, poll_fn};
use std::hash::{Hash, Hasher};
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use ruststream_core::{Capabilities, Copy, Declaration, Delivery, Publish, Settle, Subscription};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep_until};

use super::lanes::{Finished, Lanes as LaneSet};
use super::refusals::Refusals;
use super::{InFlight, Observe, copy, lane};
use crate::backoff::Backoff;
use crate::extract::Context;
use crate::middleware::Service;
use crate::ops::{Instruments, SettleError, SubscriptionHealth};
use crate::registration::{FailurePolicy, LaneKey};
use std::sync::atomic::Ordering;

/// After a subscription error, wait this long before fetching again.
const ERROR_PAUSE: Duration = Duration::from_millis(200);

/// Fetch errors in a row are logged at ERROR at most this often (the rest at DEBUG).
const ERROR_LOG_EVERY: Duration = Duration::from_secs(60);

/// When a fetch error was last logged at ERROR, and how many were not since.
#[derive(Default)]
struct FetchErrors {
    last: Option<Instant>,
    quiet: u64,
}

/// What the driver and its lanes share.
pub(crate) struct Shared<S> {
    pub(crate) service: S,
    pub(crate) context: Arc<Context>,
    pub(crate) registration: Arc<str>,
    pub(crate) declaration: Declaration,
    pub(crate) capabilities: Capabilities,
    pub(crate) copies: Arc<dyn Publish>,
    pub(crate) failure_policy: FailurePolicy,
    /// The handler deadline (SPEC G1).
    pub(crate) deadline: Duration,
    /// Turns `retry()` into a delayed redelivery (SPEC G2).
    pub(crate) backoff: Option<Backoff>,
    /// Deliveries whose copy the broker refused, and how often in a row (SPEC G3).
    pub(crate) refusals: Refusals,
    /// The app's stop signal: waits on a refused copy end at once when it comes.
    pub(crate) stop: watch::Receiver<bool>,
    pub(crate) observer: Option<Arc<dyn Observe>>,
    /// This subscription's deliveries fetched and not settled.
    pub(crate) in_flight: Arc<InFlight>,
    /// Fetching pauses while this many are in flight (SPEC G5).
    pub(crate) max_in_flight: usize,
    /// This registration's metric handles, when the app collects metrics.
    pub(crate) metrics: Option<Instruments>,
    /// This subscription's part of the app's readiness.
    pub(crate) health: Arc<SubscriptionHealth>,
}

impl<S> Shared<S> {
    fn begin(&self) {
        self.in_flight.count.fetch_add(1, Ordering::Relaxed);
    }

    fn end(&self) {
        self.in_flight.count.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How long a stop may take: the drain, then closing the subscription (SPEC G6).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadlines {
    pub(crate) drain: Duration,
    pub(crate) close: Duration,
}

pub(crate) struct Lanes {
    pub(crate) count: usize,
    pub(crate) key: LaneKey,
}

/// A delivery handed to a lane (boxed once, then moved as a pointer: see `Board`).
pub(crate) struct Job<R> {
    pub(crate) delivery: Box<Delivery>,
    pub(crate) receipt: R,
}

/// What a lane or a timer hands back to the driver.
pub(crate) enum Done<R> {
    /// Settle the original (maybe with `Settle::Nothing`).
    Settle { receipt: R, settle: Settle },
    /// Publish `copy` after its delay, then settle the original.
    Delayed {
        receipt: R,
        // Boxed: delayed copies are rare, and the common variant stays small.
        delivery: Box<Delivery>,
        copy: Copy,
        settle: Settle,
    },
    /// Left unsettled on purpose: the broker brings it back (a held original at stop).
    HandedBack,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Timers {
    Waiting,
    Stopping,
}

/// What one pass of the driver's loop found to do, in the order it looks.
enum Event<R> {
    /// A lane finished a delivery.
    Finished(Done<R>),
    /// A delayed copy's timer ran.
    Timer(Done<R>),
    Stop,
    /// The subscription's idle upkeep at the bound returned.
    Idle,
    Fetched(Job<R>),
    FetchFailed(ruststream_core::SubscribeError),
    Ended,
}

pub(crate) async fn drive<Sub: Subscription, S: Service>(
    mut subscription: Sub,
    shared: Arc<Shared<S>>,
    lanes: Lanes,
    mut stop: watch::Receiver<bool>,
    deadlines: Deadlines,
) {
    // Lanes are futures polled by this task, not tasks of their own: handing a delivery
    // to a lane and getting its settlement back then costs no cross-thread wake-up. Lanes
    // run concurrently (a handler waiting on I/O lets the others run), on one thread.
    let shared_ref: &Shared<S> = &shared;
    let running = shared
        .metrics
        .as_ref()
        .map(|_| Arc::clone(&shared.in_flight));
    let mut set = LaneSet::new(lanes.count, running, move |job| {
        lane::handle(shared_ref, job)
    });
    let mut timers: JoinSet<Done<Sub::Receipt>> = JoinSet::new();
    let (timers_tx, timers_rx) = watch::channel(Timers::Waiting);
    let mut pending: Option<(usize, Job<Sub::Receipt>)> = None;
    let mut round_robin = 0usize;

    // One waiter for the whole loop (it also sees a stop asked before the start, and a
    // dropped app, whose sender is gone). It is polled when the probe says the signal
    // changed (first pass included), and before the loop waits; the probe is one atomic
    // load per pass.
    let mut probe = stop.clone();
    probe.mark_changed();
    let mut stopped = pin!(async move {
        while !*stop.borrow_and_update() {
            if stop.changed().await.is_err() {
                break;
            }
        }
    });
    let mut at_bound = false;
    let mut fetch_errors = FetchErrors::default();
    loop {
        // At the bound nothing more is fetched until deliveries settle (G5): running,
        // queued, waiting for a delayed copy, or held by the subscription itself. The
        // subscription then only keeps up what it must (an EOS window's commit).
        let room = shared.in_flight.count() + subscription.holding() < shared.max_in_flight;
        if room == at_bound {
            at_bound = !room;
            tracing::debug!(
                registration = &*shared.registration,
                max_in_flight = shared.max_in_flight,
                "{}",
                if at_bound {
                    "max_in_flight reached; fetching paused"
                } else {
                    "fetching resumed"
                }
            );
        }
        // The common case is a straight line: a lane done, settled; a delivery fetched,
        // started on its lane; no select, no queue shared with anyone.
        let waiting = pending.is_some();
        // The fetch lives as long as this pass waits (it holds the waker the broker
        // wakes), and is dropped, like a select! branch, once something else comes first.
        let event = {
            let mut fetch = pin!(async {
                if waiting {
                    std::future::pending::<()>().await;
                }
                if room {
                    Some(subscription.next().await)
                } else {
                    subscription.idle().await;
                    None
                }
            });
            poll_fn(|cx| {
                if let Poll::Ready(done) = set.poll_finished(cx) {
                    return Poll::Ready(Event::Finished(done));
                }
                if !timers.is_empty()
                    && let Poll::Ready(Some(joined)) = timers.poll_join_next(cx)
                {
                    // A timer that panicked or was aborted leaves nothing to settle.
                    if let Ok(done) = joined {
                        return Poll::Ready(Event::Timer(done));
                    }
                }
                if probe.has_changed().unwrap_or(true) {
                    // Marked seen before the poll: a stop asked after it shows on the next pass.
                    probe.mark_unchanged();
                    if stopped.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(Event::Stop);
                    }
                }
                if let Poll::Ready(fetched) = fetch.as_mut().poll(cx) {
                    return Poll::Ready(match fetched {
                        Some(Some(Ok((delivery, receipt)))) => {
                            Event::Fetched(set.job(delivery, receipt))
                        }
                        Some(Some(Err(error))) => Event::FetchFailed(error),
                        Some(None) => Event::Ended,
                        None => Event::Idle,
                    });
                }
                // Nothing to do: wait, and make sure a stop wakes this task.
                if stopped.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Event::Stop);
                }
                Poll::Pending
            })
            .await
        };
        match event {
            Event::Finished(done) => {
                if let Some((lane, _)) = &pending
                    && set.has_room(*lane)
                    && let Some((lane, job)) = pending.take()
                {
                    set.push(lane, job);
                }
                apply(&mut subscription, &shared, done, &mut timers, &timers_rx).await;
            }
            Event::Timer(done) => {
                apply(&mut subscription, &shared, done, &mut timers, &timers_rx).await;
            }
            Event::Stop => break,
            Event::Idle => {}
            Event::Fetched(job) => {
                if fetch_errors.last.is_some() {
                    // Fetching works again: the next failure is news.
                    fetch_errors = FetchErrors::default();
                    shared.health.fetch_failed(false);
                }
                if let Some(metrics) = &shared.metrics {
                    metrics.deliveries.inc();
                }
                shared.begin();
                let lane = pick_lane(&job.delivery, &lanes, &mut round_robin);
                // A lane with room takes it at once; a full one is waited for.
                if let Some(job) = set.offer(lane, job) {
                    pending = Some((lane, job));
                }
            }
            Event::FetchFailed(error) => {
                // While a broker is down this repeats every pause: one ERROR, then at
                // most one a minute with how many were left out.
                shared.health.fetch_failed(true);
                if let Some(metrics) = &shared.metrics {
                    metrics.fetch_errors.inc();
                }
                let now = Instant::now();
                match fetch_errors.last {
                    Some(at) if now.duration_since(at) < ERROR_LOG_EVERY => {
                        fetch_errors.quiet += 1;
                        tracing::debug!(registration = &*shared.registration, %error, "fetching failed; trying again");
                    }
                    _ => {
                        tracing::error!(registration = &*shared.registration, %error, since_last_logged = fetch_errors.quiet, "fetching failed; trying again");
                        fetch_errors = FetchErrors {
                            last: Some(now),
                            quiet: 0,
                        };
                    }
                }
                tokio::time::sleep(ERROR_PAUSE).await;
            }
            Event::Ended => {
                tracing::warn!(
                    registration = &*shared.registration,
                    "the subscription ended: this registration receives nothing more"
                );
                break;
            }
        }
    }

    shared.health.ended();
    // Stop: fetch nothing more; let the lanes finish what they hold, within the drain
    // deadline, then close within the close deadline, whatever the broker does (G6).
    let hard = Instant::now() + deadlines.drain + deadlines.close;
    let stopped = tokio::time::timeout_at(
        hard,
        drain_and_close(
            subscription,
            &shared,
            set,
            pending,
            timers,
            timers_tx,
            timers_rx,
            deadlines,
        ),
    )
    .await;
    if stopped.is_err() {
        tracing::warn!(
            registration = &*shared.registration,
            deadline = ?deadlines.drain + deadlines.close,
            "the subscription did not close within the drain and close deadlines (the broker \
             unreachable?); left behind, unsettled deliveries come back as the broker's rules say"
        );
    }
}

#[allow(clippy::too_many_arguments)]
async fn drain_and_close<Sub, S, F, St>(
    mut subscription: Sub,
    shared: &Arc<Shared<S>>,
    mut set: LaneSet<Sub::Receipt, F, St>,
    pending: Option<(usize, Job<Sub::Receipt>)>,
    mut timers: JoinSet<Done<Sub::Receipt>>,
    timers_tx: watch::Sender<Timers>,
    timers_rx: watch::Receiver<Timers>,
    deadlines: Deadlines,
) where
    Sub: Subscription,
    S: Service,
    F: Future<Output = Finished<Sub::Receipt>>,
    St: Fn(Job<Sub::Receipt>) -> F,
{
    let mut deadline = pin!(sleep_until(Instant::now() + deadlines.drain));
    if let Some((lane, job)) = pending {
        // Fetched but not started: it runs too rather than being dropped.
        set.push(lane, job);
    }
    let _ = timers_tx.send(Timers::Stopping);
    while !set.is_idle() || !timers.is_empty() {
        let done = poll_fn(|cx| {
            if let Poll::Ready(done) = set.poll_finished(cx) {
                return Poll::Ready(Some(done));
            }
            if !timers.is_empty()
                && let Poll::Ready(Some(Ok(done))) = timers.poll_join_next(cx)
            {
                return Poll::Ready(Some(done));
            }
            if deadline.as_mut().poll(cx).is_ready() {
                return Poll::Ready(None);
            }
            Poll::Pending
        })
        .await;
        match done {
            Some(done) => apply(&mut subscription, shared, done, &mut timers, &timers_rx).await,
            None => {
                tracing::warn!(
                    registration = &*shared.registration,
                    handlers_running = !set.is_idle(),
                    timers_waiting = timers.len(),
                    "drain timeout passed; unfinished deliveries stay unsettled"
                );
                timers.abort_all();
                break;
            }
        }
    }
    // Dropping the lanes drops their running handlers.
    drop(set);
    if tokio::time::timeout(deadlines.close, subscription.close())
        .await
        .is_err()
    {
        tracing::warn!(
            registration = &*shared.registration,
            close_timeout = ?deadlines.close,
            "closing the subscription timed out; left behind"
        );
    }
}

/// Takes a delayed copy off the `ruststream_delayed` gauge when its timer task ends.
struct DelayedGuard(prometheus_client::metrics::gauge::Gauge);

impl Drop for DelayedGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

fn pick_lane(delivery: &Delivery, lanes: &Lanes, round_robin: &mut usize) -> usize {
    if lanes.count == 1 {
        return 0;
    }
    let mut hasher = DefaultHasher::new();
    match (lanes.key, delivery.metadata().partition, delivery.key()) {
        (LaneKey::Partition, Some(partition), _) => partition.hash(&mut hasher),
        (_, _, Some(key)) => key.hash(&mut hasher),
        (_, _, None) => {
            *round_robin = round_robin.wrapping_add(1);
            return *round_robin % lanes.count;
        }
    }
    (hasher.finish() % lanes.count as u64) as usize
}

async fn apply<Sub: Subscription, S: Service>(
    subscription: &mut Sub,
    shared: &Arc<Shared<S>>,
    done: Done<Sub::Receipt>,
    timers: &mut JoinSet<Done<Sub::Receipt>>,
    timers_rx: &watch::Receiver<Timers>,
) {
    match done {
        Done::Settle { receipt, settle } => {
            if settle != Settle::Nothing
                && let Err(error) = subscription.settle(receipt, settle).await
            {
                tracing::error!(registration = &*shared.registration, ?settle, %error, "settlement failed");
                if let Some(metrics) = &shared.metrics {
                    metrics.settle_failed(match error {
                        ruststream_core::AckError::Unsupported { .. } => SettleError::Unsupported,
                        _ => SettleError::Failed,
                    });
                }
            }
            shared.end();
        }
        Done::HandedBack => shared.end(),
        Done::Delayed {
            receipt,
            delivery,
            copy,
            settle,
        } => {
            subscription.parked(&receipt);
            let shared = Arc::clone(shared);
            let mut mode = timers_rx.clone();
            let delayed = shared.metrics.as_ref().map(|m| m.delayed.clone());
            if let Some(delayed) = &delayed {
                delayed.inc();
            }
            timers.spawn(async move {
                // Counted out however the task ends (aborted at the drain deadline too).
                let _counted = delayed.map(DelayedGuard);
                let due = Instant::now() + copy.delay;
                let stopped = tokio::select! {
                    () = sleep_until(due) => false,
                    _ = mode.wait_for(|m| *m == Timers::Stopping) => true,
                };
                if stopped && shared.capabilities.holds_original {
                    // The original is still unsettled: the broker brings it back.
                    return Done::HandedBack;
                }
                if stopped {
                    tracing::warn!(
                        registration = &*shared.registration,
                        address = delivery.address(),
                        "stopping: publishing a delayed retry copy before its time so it is not lost"
                    );
                }
                let settle = copy::deliver(&shared, &delivery, copy, settle).await;
                Done::Settle { receipt, settle }
            });
        }
    }
}
