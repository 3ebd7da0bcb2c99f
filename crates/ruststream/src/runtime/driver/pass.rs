//! One pass of the driver's loop: the event ladder, and the straight line the common case
//! takes through it.

use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use ruststream_core::{SubscribeError, Subscription};
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::Driver;
use super::settle::Timed;
use super::turn::Turn;
use crate::runtime::quiet::ErrorRun;
use crate::runtime::shared::{Done, Shared};
use crate::runtime::work::LaneWork;

/// What one pass of the driver's loop found to do, in the order it looks.
pub(super) enum Event<R> {
    /// A lane finished a delivery.
    Finished(Done<R>),
    /// A delivery to settle: a delayed copy's timer ran, or the straight line has one
    /// whose settlement waits (or is not a plain settlement).
    Done(Done<R>),
    Stop,
    /// The subscription's idle upkeep at the bound returned.
    Idle,
    /// The fetch wrote a delivery into the slot; its receipt.
    Fetched(R),
    /// Boxed: an event is moved a few times for every delivery, an error is rare.
    FetchFailed(Box<SubscribeError>),
    Ended,
}

impl<R> Event<R> {
    /// What a fetch came to.
    #[inline(always)]
    fn fetched(fetched: Option<Result<R, SubscribeError>>) -> Self {
        match fetched {
            Some(Ok(receipt)) => Self::Fetched(receipt),
            Some(Err(error)) => Self::FetchFailed(Box::new(error)),
            None => Self::Ended,
        }
    }
}

impl<Sub, S, L> Driver<'_, Sub, S, L>
where
    Sub: Subscription,
    S: Send + Sync + 'static,
    L: LaneWork<Sub::Receipt>,
{
    /// The loop's next event. While every lane is free, nothing waits for one and no
    /// timer is set, the ladder runs with the subscription's immediate fetch and what it
    /// fetches is started, polled and settled here, one delivery after another, within
    /// this one poll; the first thing that is not done at once is the event, and a fetch
    /// that would wait leaves the straight line for a full pass, which waits on the
    /// lanes, the timers, the stop signal and the fetch at once.
    pub(super) async fn next_event(
        &mut self,
        timers: &mut Timed<Sub::Receipt>,
    ) -> Event<Sub::Receipt> {
        // A delivery the straight line goes on from was settled in its first poll (or
        // gathered into a batch), and nothing in it sets a timer or makes one wait.
        let idle = timers.set.is_empty() && self.pending.is_none();
        let mut yielded = false;
        let straight = poll_fn(|cx| {
            // Polled again after its turn's yield: a full pass first, which looks at
            // what the straight line does not (a batch due by `max_wait`).
            if yielded {
                return Poll::Ready(None);
            }
            loop {
                debug_assert!(!idle || self.pending.is_none());
                // The rest of a finished batch first, each settled here when that waits
                // for nothing and no fetched delivery waits for room it could make.
                if let Some(done) = self.set.ready() {
                    if !idle {
                        return Poll::Ready(Some(Event::Finished(done)));
                    }
                    if let Some(done) = self.settle_now(done) {
                        return Poll::Ready(Some(Event::Finished(done)));
                    }
                    continue;
                }
                if !idle
                    || !self.set.straight()
                    || !fetch_room(&self.subscription, self.shared, &mut self.at_bound)
                {
                    return Poll::Ready(None);
                }
                let polled = {
                    let (subscription, slot) = (&mut self.subscription, self.slot.delivery_mut());
                    let now = pin!(poll_fn(|_| subscription.next_now(slot).map(Event::fetched)));
                    // Nothing runs and no timer is set: nothing can finish.
                    poll_event::<_, L, _>(cx, None, (&mut self.stop, &mut self.turn), now)
                };
                let receipt = match polled {
                    // The turn is over: the task yields.
                    Poll::Pending if self.turn.yielded => {
                        yielded = true;
                        return Poll::Pending;
                    }
                    // Nothing at once: the full pass.
                    Poll::Pending => return Poll::Ready(None),
                    Poll::Ready(Event::Fetched(receipt)) => receipt,
                    Poll::Ready(event) => return Poll::Ready(Some(event)),
                };
                let Some(done) = self.fetched(receipt, true, cx) else {
                    if self.set.straight() {
                        // Gathered into a batch that is not cut yet: fetch on.
                        continue;
                    }
                    return Poll::Ready(None);
                };
                if let Some(done) = self.settle_now(done) {
                    return Poll::Ready(Some(Event::Done(done)));
                }
            }
        });
        if let Some(event) = straight.await {
            return event;
        }
        let room = fetch_room(&self.subscription, self.shared, &mut self.at_bound);
        let waiting = self.pending.is_some();
        let (subscription, slot) = (&mut self.subscription, self.slot.delivery_mut());
        let mut fetch = pin!(async move {
            if waiting {
                subscription.while_waiting().await;
                std::future::pending::<()>().await;
            }
            if room {
                Event::fetched(subscription.next_into(slot).await)
            } else {
                subscription.idle().await;
                Event::Idle
            }
        });
        let (set, stop, turn) = (&mut self.set, &mut self.stop, &mut self.turn);
        poll_fn(|cx| {
            let running = Some((&mut *set, &mut timers.set));
            poll_event(cx, running, (&mut *stop, &mut *turn), fetch.as_mut())
        })
        .await
    }
}

/// What may finish: the lanes, and the delayed copies' timers.
type Running<'a, R, L> = (&'a mut L, &'a mut JoinSet<Done<R>>);

/// The ladder: finished lanes, then timers (`running`: `None` when nothing runs and no
/// timer is set), the stop signal, the driver's turn and the fetch. The fetch lives as long as
/// the pass waits (it holds the waker the broker wakes), and is dropped, like a
/// `select!` branch, once something else comes first.
#[inline(always)]
fn poll_event<R, L, Fetch>(
    cx: &mut Context<'_>,
    running: Option<Running<'_, R, L>>,
    (stop, turn): (&mut StopSignal, &mut Turn),
    fetch: Pin<&mut Fetch>,
) -> Poll<Event<R>>
where
    R: Send + 'static,
    L: LaneWork<R>,
    Fetch: Future<Output = Event<R>>,
{
    // The straight line (`running` is `None`) never waits here: it leaves for a full pass.
    let full_pass = running.is_some();
    if let Some((set, timers)) = running {
        if let Poll::Ready(done) = set.poll_finished(cx) {
            return Poll::Ready(Event::Finished(done));
        }
        if !timers.is_empty()
            && let Poll::Ready(Some(joined)) = timers.poll_join_next(cx)
        {
            // A timer that panicked or was aborted leaves nothing to settle.
            if let Ok(done) = joined {
                return Poll::Ready(Event::Done(done));
            }
        }
    }
    if stop.changed_to_stop() {
        return Poll::Ready(Event::Stop);
    }
    if !turn.proceed(cx) {
        return Poll::Pending;
    }
    if let Poll::Ready(event) = fetch.poll(cx) {
        turn.made_progress();
        return Poll::Ready(event);
    }
    // Nothing to do: wait, and make sure a stop wakes this task.
    if full_pass && stop.poll_stopped(cx) {
        return Poll::Ready(Event::Stop);
    }
    Poll::Pending
}

/// The app's stop signal as the loop sees it. Each pass reads the probe: one atomic
/// load, and the value itself only when it changed (first pass included, so a stop asked
/// before the start is seen, as is a dropped app, whose sender is gone). The value is
/// read, never awaited: tokio's `watch::changed` answers `Pending` when the task's
/// cooperative budget is spent, whatever the value, and a handler's tokio I/O may spend
/// it. The waiter
/// only wakes this task when the loop is about to wait.
pub(super) struct StopSignal {
    probe: watch::Receiver<bool>,
    waiter: Pin<Box<dyn Future<Output = ()> + Send>>,
}

impl StopSignal {
    pub(super) fn new(mut stop: watch::Receiver<bool>) -> Self {
        let mut probe = stop.clone();
        probe.mark_changed();
        let waiter = Box::pin(async move {
            while !*stop.borrow_and_update() {
                if stop.changed().await.is_err() {
                    break;
                }
            }
        });
        Self { probe, waiter }
    }

    /// Whether a stop came, reading the value only when the probe says it changed.
    #[inline]
    fn changed_to_stop(&mut self) -> bool {
        match self.probe.has_changed() {
            Ok(false) => false,
            Ok(true) => *self.probe.borrow_and_update(),
            // The app is gone.
            Err(_) => true,
        }
    }

    /// Whether a stop came; otherwise this task is woken when one does (or at once,
    /// when the budget is spent: the next pass reads the probe).
    fn poll_stopped(&mut self, cx: &mut Context<'_>) -> bool {
        self.waiter.as_mut().poll(cx).is_ready()
    }
}

/// Whether there is room to fetch. At the bound nothing more is fetched until deliveries
/// settle (G5): running, queued, waiting for a delayed copy, or held by the subscription
/// itself. The subscription then only keeps up what it must (an EOS window's commit).
#[inline(always)]
fn fetch_room<Sub: Subscription, S>(
    subscription: &Sub,
    shared: &Shared<S>,
    at_bound: &mut bool,
) -> bool {
    let holding = subscription.holding();
    let held = &shared.in_flight.held;
    if held.load(Ordering::Relaxed) != holding {
        held.store(holding, Ordering::Relaxed);
    }
    let room = shared.in_flight.count() + holding < shared.max_in_flight;
    if room == *at_bound {
        *at_bound = !room;
        note_bound(shared, *at_bound);
    }
    room
}

/// Fetching paused at `max_in_flight` (G5), or resumed.
#[cold]
fn note_bound<S>(shared: &Shared<S>, at_bound: bool) {
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

/// The subscription ended by itself (not by a stop).
#[cold]
pub(super) fn note_ended<S>(shared: &Shared<S>) {
    tracing::warn!(
        registration = &*shared.registration,
        "the subscription ended: this registration receives nothing more"
    );
}

/// A fetch failed: readiness and metrics say so. While a broker is down this repeats
/// every pause: one ERROR, then at most one a minute with how many were left out.
pub(super) fn fetch_failed<S>(run: &mut ErrorRun, shared: &Shared<S>, error: &SubscribeError) {
    shared.health.fetch_failed(true);
    if let Some(metrics) = &shared.metrics {
        metrics.fetch_errors.inc();
    }
    let registration = &*shared.registration;
    match run.failed() {
        Some(quiet) => {
            tracing::error!(registration, %error, since_last_logged = quiet, "fetching failed; trying again");
        }
        None => tracing::debug!(registration, %error, "fetching failed; trying again"),
    }
}

#[cfg(test)]
mod tests {
    use std::future::poll_fn;
    use std::task::Poll;

    use tokio::sync::watch;
    use tokio::task::coop::poll_proceed;

    use super::StopSignal;

    /// Handlers' tokio I/O in a backlog the driver works through in one poll spends the
    /// task's cooperative budget; a stop asked just then is seen all the same. (Seen through
    /// `watch::changed`, which answers `Pending` on a spent budget, it was lost once the
    /// probe had been marked seen, and the driver fetched on for ever: an uncapped retry
    /// loop on the memory broker never stopped, about one stop in 300 under load.)
    #[tokio::test]
    async fn e3_a_stop_asked_while_the_budget_is_spent_is_seen() {
        let (tx, rx) = watch::channel(false);
        let mut stop = StopSignal::new(rx);
        tokio::spawn(async move {
            poll_fn(|cx| {
                assert!(!stop.changed_to_stop(), "no stop asked yet");
                while let Poll::Ready(unit) = poll_proceed(cx) {
                    unit.made_progress();
                }
                tx.send_replace(true);
                assert!(stop.changed_to_stop(), "the stop is seen on a spent budget");
                Poll::Ready(())
            })
            .await;
        })
        .await
        .unwrap();
    }
}
