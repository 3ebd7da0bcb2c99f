//! The driver task: the only user of a subscription. It fetches, hands deliveries to
//! lanes, performs every settlement, owns the timers of delayed copies, and drains on
//! stop (SPEC E3).

use std::collections::hash_map::DefaultHasher;
use std::future::{Future, poll_fn};
use std::hash::{Hash, Hasher};
use std::ops::ControlFlow;
use std::pin::Pin;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Duration;

use ruststream_core::{AckError, Delivery, Settle, SubscribeError, Subscription};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep_until};

use super::lanes::{ANY_LANE, Finished, Lanes as LaneSet};
use super::quiet::ErrorRun;
use super::shared::{DelayedCopy, Done, Fate, Job, Shared};
use super::{copy, lane};
use crate::extract::Incoming;
use crate::middleware::Service;
use crate::ops::SettleError;
use crate::registration::LaneKey;

/// After a subscription error, wait this long before fetching again.
const ERROR_PAUSE: Duration = Duration::from_millis(200);

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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Timers {
    Waiting,
    Stopping,
}

/// A fetch failed: readiness and metrics say so. While a broker is down this repeats
/// every pause: one ERROR, then at most one a minute with how many were left out.
fn fetch_failed<S>(run: &mut ErrorRun, shared: &Shared<S>, error: &SubscribeError) {
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

/// A settlement failed (its delivery comes back as the broker's rules say). During a
/// broker restart every running delivery's settlement fails: one ERROR, then at most one
/// a minute with how many were left out, until one goes through.
#[cold]
fn settle_failed<S>(run: &mut ErrorRun, shared: &Shared<S>, settle: Settle, error: &AckError) {
    if let Some(metrics) = &shared.metrics {
        metrics.settle_failed(match error {
            AckError::Unsupported { .. } => SettleError::Unsupported,
            _ => SettleError::Failed,
        });
    }
    let registration = &*shared.registration;
    match run.failed() {
        Some(quiet) => {
            tracing::error!(registration, ?settle, %error, since_last_logged = quiet, "settlement failed");
        }
        None => tracing::debug!(registration, ?settle, %error, "settlement failed"),
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

/// The subscription ended by itself (not by a stop).
#[cold]
fn note_ended<S>(shared: &Shared<S>) {
    tracing::warn!(
        registration = &*shared.registration,
        "the subscription ended: this registration receives nothing more"
    );
}

/// Fetching paused at `max_in_flight` (G5), or resumed.
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

/// What one pass of the driver's loop found to do, in the order it looks.
enum Event<R> {
    /// A lane finished a delivery.
    Finished(Done<R>),
    /// A delivery to settle: a delayed copy's timer ran, or the pump has one whose
    /// settlement waits (or is not a plain settlement).
    Done(Done<R>),
    Stop,
    /// The subscription's idle upkeep at the bound returned.
    Idle,
    /// The fetch wrote a delivery into the slot; its receipt.
    Fetched(R),
    FetchFailed(SubscribeError),
    Ended,
}

pub(crate) async fn drive<Sub: Subscription, S: Service>(
    subscription: Sub,
    shared: Arc<Shared<S>>,
    lanes: Lanes,
    stop: watch::Receiver<bool>,
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
    let context = Arc::clone(&shared.context);
    let mut set = LaneSet::new(lanes.count, running, context, move |incoming| {
        lane::handle(shared_ref, incoming)
    });
    let slot = set.slot();
    let mut d = Driver {
        subscription,
        shared: &shared,
        set,
        pending: None,
        lanes,
        stop: StopSignal::new(stop),
        at_bound: false,
        fetch_errors: ErrorRun::default(),
        settle_errors: ErrorRun::default(),
        slot,
    };
    let mut timers = Timed::new();
    loop {
        // A delivery that waited for its lane and starts now: its deadline counts from
        // here (JetStream keeps it alive that long: SPEC D3).
        while let Some(receipt) = d.set.started_after_wait() {
            d.subscription.running_on(receipt);
        }
        // The common case first, within this one poll: deliveries fetched at once, run,
        // finished and settled, one after another, while nothing else goes on.
        let timers_idle = timers.set.is_empty();
        let event = match poll_fn(|cx| d.pump(cx, timers_idle)).await {
            Some(event) => event,
            None => {
                // A full pass: whatever comes first of a lane finishing, a timer, the
                // stop signal and the fetch (which waits here when nothing is there).
                let room = fetch_room(&d.subscription, &shared, &mut d.at_bound);
                let fetch = Fetch {
                    subscription: &mut d.subscription,
                    slot: d.slot.delivery_mut(),
                    room,
                    waiting: d.pending.is_some(),
                };
                fetch
                    .or_else(&mut d.set, &mut timers.set, &mut d.stop)
                    .await
            }
        };
        let done = match event {
            Event::Finished(done) => {
                d.set.start_waiting(&mut d.pending);
                done
            }
            Event::Done(done) => done,
            Event::Stop => break,
            Event::Idle => continue,
            Event::Fetched(receipt) => {
                let Some(done) = with_context(|cx| d.fetched(receipt, cx)).await else {
                    continue;
                };
                done
            }
            Event::FetchFailed(error) => {
                d.fetch_failed(&error).await;
                continue;
            }
            Event::Ended => {
                note_ended(&shared);
                break;
            }
        };
        if let Some(Done { receipt, fate }) = d.settle_at_once(done) {
            let (errors, timers) = (&mut d.settle_errors, &mut timers);
            apply(&mut d.subscription, &shared, receipt, fate, timers, errors).await;
        }
    }

    shared.health.ended();
    let Driver {
        subscription,
        set,
        pending,
        ..
    } = d;
    close_within(subscription, &shared, set, pending, timers, deadlines).await;
}

/// The driver's state, apart from the delayed copies' timers.
struct Driver<'s, Sub: Subscription, S, F, St> {
    subscription: Sub,
    shared: &'s Shared<S>,
    set: LaneSet<Sub::Receipt, F, St>,
    /// A fetched delivery waiting for room on its lane.
    pending: Waiting<Sub::Receipt>,
    /// How many lanes, and how deliveries are spread over them.
    lanes: Lanes,
    stop: StopSignal,
    at_bound: bool,
    fetch_errors: ErrorRun,
    settle_errors: ErrorRun,
    /// The box the next fetch writes its delivery into.
    slot: Box<Incoming>,
}

impl<Sub, S, F, St> Driver<'_, Sub, S, F, St>
where
    Sub: Subscription,
    F: Future<Output = Finished>,
    St: Fn(Box<Incoming>) -> F,
{
    /// The common case as a straight line, without leaving the driver's poll: while no
    /// lane runs, no delivery waits for one and no timer is set, a delivery the
    /// subscription has at once (`Subscription::next_now`) is started and, when its
    /// handler finishes in its first poll and its settlement waits for nothing, settled;
    /// then the next. What it stops at is the loop's next event; anything else, a fetch
    /// that would wait included, is left to a full pass (`None`).
    #[inline(always)]
    fn pump(
        &mut self,
        cx: &mut Context<'_>,
        timers_idle: bool,
    ) -> Poll<Option<Event<Sub::Receipt>>> {
        loop {
            if !timers_idle || self.pending.is_some() || !self.set.is_idle() {
                return Poll::Ready(None);
            }
            if !fetch_room(&self.subscription, self.shared, &mut self.at_bound) {
                return Poll::Ready(None);
            }
            if self.stop.changed_to_stop(cx) {
                return Poll::Ready(Some(Event::Stop));
            }
            // The cooperative budget, as in a full pass (see `poll_event`).
            let Poll::Ready(budget) = tokio::task::coop::poll_proceed(cx) else {
                return Poll::Pending;
            };
            let Poll::Ready(fetched) = self.subscription.next_now(self.slot.delivery_mut()) else {
                return Poll::Ready(None);
            };
            budget.made_progress();
            let receipt = match fetched {
                Some(Ok(receipt)) => receipt,
                Some(Err(error)) => return Poll::Ready(Some(Event::FetchFailed(error))),
                None => return Poll::Ready(Some(Event::Ended)),
            };
            let Some(done) = self.fetched_while_idle(receipt, cx) else {
                return Poll::Ready(None);
            };
            if let Some(done) = self.settle_at_once(done) {
                return Poll::Ready(Some(Event::Done(done)));
            }
        }
    }

    /// The delivery the fetch wrote into the slot, started on its lane (or queued, or
    /// kept waiting) and its lane polled once: what it came to when done at once.
    #[inline(always)]
    fn fetched(
        &mut self,
        receipt: Sub::Receipt,
        cx: &mut Context<'_>,
    ) -> Option<Done<Sub::Receipt>> {
        let job = self.job(receipt);
        let (lane, started);
        (lane, started, self.pending) = accept(
            self.shared,
            &mut self.subscription,
            &mut self.set,
            &self.lanes,
            job,
        );
        let done = self.first_poll(lane, started, cx)?;
        self.set.start_waiting(&mut self.pending);
        Some(done)
    }

    /// `fetched` in the pump, where every lane is free and nothing waits for one: the
    /// delivery starts on its lane without an offer.
    #[inline(always)]
    fn fetched_while_idle(
        &mut self,
        receipt: Sub::Receipt,
        cx: &mut Context<'_>,
    ) -> Option<Done<Sub::Receipt>> {
        let job = self.job(receipt);
        let mut lane = count_in(self.shared, &self.lanes, &job);
        if lane == ANY_LANE {
            lane = self.set.free_lane().unwrap_or(0);
        }
        self.set.start_free(lane, job);
        self.first_poll(lane, true, cx)
    }

    /// The delivery the fetch wrote into the slot, as a job (a fetch that works again
    /// after failures is told).
    #[inline(always)]
    fn job(&mut self, receipt: Sub::Receipt) -> Job<Sub::Receipt> {
        if self.fetch_errors.succeeded() {
            self.shared.health.fetch_failed(false);
        }
        self.set.job(&mut self.slot, receipt)
    }

    /// The first poll of the lane a delivery was just given to (`started`: it runs there
    /// now): what it came to when done at once. Most handlers finish in their first
    /// poll, settled in this same pass; one that runs on is told to the subscription
    /// (one that waits was told in `accept`).
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

    /// Settles `done` when that waits for nothing (the common case: a settlement the
    /// subscription makes at once, or nothing to settle); hands it back otherwise.
    #[inline(always)]
    fn settle_at_once(&mut self, done: Done<Sub::Receipt>) -> Option<Done<Sub::Receipt>> {
        let Done { receipt, fate } = done;
        match fate {
            // Nothing to settle (a Core NATS delivery, an original whose copy went out).
            Fate::Settle(Settle::Nothing) => self.shared.end(),
            Fate::Settle(settle) => match self.subscription.settle_now(receipt, settle) {
                ControlFlow::Break(result) => {
                    settled(result, &mut self.settle_errors, self.shared, settle);
                }
                ControlFlow::Continue(receipt) => {
                    let fate = Fate::Settle(settle);
                    return Some(Done { receipt, fate });
                }
            },
            fate => return Some(Done { receipt, fate }),
        }
        None
    }

    /// A fetch failed: told, and the next one after a pause.
    #[cold]
    async fn fetch_failed(&mut self, error: &SubscribeError) {
        fetch_failed(&mut self.fetch_errors, self.shared, error);
        tokio::time::sleep(ERROR_PAUSE).await;
    }
}

/// A future ready in its first poll with what `f` makes of that poll's context.
fn with_context<T>(f: impl FnOnce(&mut Context<'_>) -> T) -> impl Future<Output = T> {
    let mut f = Some(f);
    poll_fn(move |cx| Poll::Ready(f.take().expect("polled once")(cx)))
}

/// Stop: fetch nothing more; let the lanes finish what they hold, within the drain
/// deadline, then close within the close deadline, whatever the broker does (G6).
async fn close_within<Sub, S, F, St>(
    subscription: Sub,
    shared: &Arc<Shared<S>>,
    set: LaneSet<Sub::Receipt, F, St>,
    pending: Waiting<Sub::Receipt>,
    timers: Timed<Sub::Receipt>,
    deadlines: Deadlines,
) where
    Sub: Subscription,
    S: Service,
    F: Future<Output = Finished>,
    St: Fn(Box<Incoming>) -> F,
{
    let hard = Instant::now() + deadlines.drain + deadlines.close;
    let drained = drain_and_close(subscription, shared, set, pending, timers, deadlines);
    if tokio::time::timeout_at(hard, drained).await.is_err() {
        tracing::warn!(
            registration = &*shared.registration,
            deadline = ?deadlines.drain + deadlines.close,
            "the subscription did not close within the drain and close deadlines (the broker \
             unreachable?); left behind, unsettled deliveries come back as the broker's rules say"
        );
    }
}

/// The delayed copies' timer tasks, and the mode they wait in.
struct Timed<R> {
    set: JoinSet<Done<R>>,
    tx: watch::Sender<Timers>,
    rx: watch::Receiver<Timers>,
}

impl<R: Send + 'static> Timed<R> {
    fn new() -> Self {
        let (tx, rx) = watch::channel(Timers::Waiting);
        Self {
            set: JoinSet::new(),
            tx,
            rx,
        }
    }
}

/// The app's stop signal as the loop sees it: one waiter for the whole loop (it also
/// sees a stop asked before the start, and a dropped app, whose sender is gone), polled
/// when the probe says the signal changed (first pass included) and before the loop
/// waits; the probe is one atomic load per pass.
struct StopSignal {
    probe: watch::Receiver<bool>,
    waiter: Pin<Box<dyn Future<Output = ()> + Send>>,
}

impl StopSignal {
    fn new(mut stop: watch::Receiver<bool>) -> Self {
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

    /// Whether a stop came, looking only when the probe says the signal changed.
    #[inline]
    fn changed_to_stop(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.probe.has_changed().unwrap_or(true) {
            return false;
        }
        // Marked seen before the poll: a stop asked after it shows on the next pass.
        self.probe.mark_unchanged();
        self.waiter.as_mut().poll(cx).is_ready()
    }

    /// Whether a stop came; otherwise this task is woken when one does.
    fn poll_stopped(&mut self, cx: &mut Context<'_>) -> bool {
        self.waiter.as_mut().poll(cx).is_ready()
    }
}

/// A pass's fetch: the next delivery when there is room, the subscription's idle upkeep
/// at the bound, nothing while a fetched delivery waits for its lane.
struct Fetch<'a, Sub> {
    subscription: &'a mut Sub,
    slot: &'a mut Delivery,
    room: bool,
    waiting: bool,
}

impl<Sub: Subscription> Fetch<'_, Sub> {
    /// The first event of the pass: the fetch, or whatever comes before it. The fetch
    /// lives as long as the pass waits (it holds the waker the broker wakes), and is
    /// dropped, like a select! branch, once something else comes first.
    async fn or_else<F, St>(
        self,
        set: &mut LaneSet<Sub::Receipt, F, St>,
        timers: &mut JoinSet<Done<Sub::Receipt>>,
        stop: &mut StopSignal,
    ) -> Event<Sub::Receipt>
    where
        F: Future<Output = Finished>,
        St: Fn(Box<Incoming>) -> F,
    {
        let Self {
            subscription,
            slot,
            room,
            waiting,
        } = self;
        let mut fetch = pin!(async {
            if waiting {
                std::future::pending::<()>().await;
            }
            if room {
                Some(subscription.next_into(slot).await)
            } else {
                subscription.idle().await;
                None
            }
        });
        poll_fn(|cx| poll_event(cx, set, timers, stop, fetch.as_mut())).await
    }
}

/// One pass of the loop: finished lanes, then timers, the stop signal and the fetch.
#[inline(always)]
fn poll_event<R, F, St, Fetch>(
    cx: &mut Context<'_>,
    set: &mut LaneSet<R, F, St>,
    timers: &mut JoinSet<Done<R>>,
    stop: &mut StopSignal,
    fetch: Pin<&mut Fetch>,
) -> Poll<Event<R>>
where
    R: Send + 'static,
    F: Future<Output = Finished>,
    St: Fn(Box<Incoming>) -> F,
    Fetch: Future<Output = Option<Option<Result<R, SubscribeError>>>>,
{
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
    if stop.changed_to_stop(cx) {
        return Poll::Ready(Event::Stop);
    }
    // A broker with a backlog answers every fetch at once, and most clients' fetches
    // (librdkafka's queue, the memory broker) take nothing from tokio's cooperative
    // budget: each takes a unit here, so the driver gives its thread back every so many
    // deliveries instead of only when the backlog is gone (the runtime's other tasks,
    // timers and handler deadlines included, would wait that long).
    let Poll::Ready(budget) = tokio::task::coop::poll_proceed(cx) else {
        // Out of budget: this task is woken again at once, behind the others.
        return Poll::Pending;
    };
    if let Poll::Ready(fetched) = fetch.poll(cx) {
        budget.made_progress();
        return Poll::Ready(match fetched {
            Some(Some(Ok(receipt))) => Event::Fetched(receipt),
            Some(Some(Err(error))) => Event::FetchFailed(error),
            Some(None) => Event::Ended,
            None => Event::Idle,
        });
    }
    // Nothing to do: wait, and make sure a stop wakes this task.
    if stop.poll_stopped(cx) {
        return Poll::Ready(Event::Stop);
    }
    Poll::Pending
}

async fn drain_and_close<Sub, S, F, St>(
    mut subscription: Sub,
    shared: &Arc<Shared<S>>,
    mut set: LaneSet<Sub::Receipt, F, St>,
    pending: Waiting<Sub::Receipt>,
    mut timers: Timed<Sub::Receipt>,
    deadlines: Deadlines,
) where
    Sub: Subscription,
    S: Service,
    F: Future<Output = Finished>,
    St: Fn(Box<Incoming>) -> F,
{
    let mut deadline = pin!(sleep_until(Instant::now() + deadlines.drain));
    if let Some((lane, job)) = pending {
        // Fetched but not started: it runs too rather than being dropped.
        set.push(lane, job);
    }
    let _ = timers.tx.send(Timers::Stopping);
    let mut settle_errors = ErrorRun::default();
    while !set.is_idle() || !timers.set.is_empty() {
        let done = poll_fn(|cx| {
            if let Poll::Ready(done) = set.poll_finished(cx) {
                return Poll::Ready(Some(done));
            }
            if !timers.set.is_empty()
                && let Poll::Ready(Some(Ok(done))) = timers.set.poll_join_next(cx)
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
            Some(Done { receipt, fate }) => {
                let errors = &mut settle_errors;
                apply(
                    &mut subscription,
                    shared,
                    receipt,
                    fate,
                    &mut timers,
                    errors,
                )
                .await;
            }
            None => {
                tracing::warn!(
                    registration = &*shared.registration,
                    handlers_running = !set.is_idle(),
                    timers_waiting = timers.set.len(),
                    "drain timeout passed; unfinished deliveries stay unsettled"
                );
                timers.set.abort_all();
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

/// A fetched delivery waiting for room on its lane, and the lane.
type Waiting<R> = Option<(usize, Job<R>)>;

/// A fetched delivery, counted in flight and offered to its lane (returned, with whether
/// it started there): a free lane starts it; a busy one queues it or, full, makes it wait
/// (handed back, to be kept pending). One that does not start is not done at once: the
/// subscription is told so.
#[inline(always)]
fn accept<Sub: Subscription, S, F, St>(
    shared: &Shared<S>,
    subscription: &mut Sub,
    set: &mut LaneSet<Sub::Receipt, F, St>,
    lanes: &Lanes,
    job: Job<Sub::Receipt>,
) -> (usize, bool, Waiting<Sub::Receipt>)
where
    F: Future<Output = Finished>,
    St: Fn(Box<Incoming>) -> F,
{
    let mut lane = count_in(shared, lanes, &job);
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
    pick_lane(job.incoming.delivery(), lanes)
}

/// The lane a delivery goes to: the only one, mostly (no call then).
#[inline(always)]
fn pick_lane(delivery: &Delivery, lanes: &Lanes) -> usize {
    if lanes.count == 1 {
        return 0;
    }
    pick_of_many(delivery, lanes)
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

/// Settles one delivery as its lane asked, and counts it out of flight.
async fn settle_one<Sub: Subscription, S>(
    subscription: &mut Sub,
    shared: &Shared<S>,
    receipt: Sub::Receipt,
    settle: Settle,
    settle_errors: &mut ErrorRun,
) {
    if settle == Settle::Nothing {
        shared.end();
    } else {
        let result = subscription.settle(receipt, settle).await;
        settled(result, settle_errors, shared, settle);
    }
}

/// A settlement done: its failure told, and the delivery counted out of flight.
#[inline(always)]
fn settled<S>(
    result: Result<(), AckError>,
    settle_errors: &mut ErrorRun,
    shared: &Shared<S>,
    settle: Settle,
) {
    match result {
        Ok(()) => {
            settle_errors.succeeded();
            if settle == Settle::DeadLetter {
                copy::dead_lettered(shared, None);
            }
        }
        Err(error) => settle_failed(settle_errors, shared, settle, &error),
    }
    shared.end();
}

async fn apply<Sub: Subscription, S: Service>(
    subscription: &mut Sub,
    shared: &Arc<Shared<S>>,
    receipt: Sub::Receipt,
    fate: Fate,
    timers: &mut Timed<Sub::Receipt>,
    settle_errors: &mut ErrorRun,
) {
    match fate {
        Fate::Settle(settle) => {
            settle_one(subscription, shared, receipt, settle, settle_errors).await;
        }
        Fate::HandedBack => shared.end(),
        Fate::Delayed(delayed) => {
            let DelayedCopy {
                incoming,
                copy,
                settle,
            } = *delayed;
            subscription.parked(&receipt);
            let shared = Arc::clone(shared);
            let mut mode = timers.rx.clone();
            let delayed = shared.metrics.as_ref().map(|m| m.delayed.clone());
            if let Some(delayed) = &delayed {
                delayed.inc();
            }
            timers.set.spawn(async move {
                // Counted out however the task ends (aborted at the drain deadline too).
                let _counted = delayed.map(DelayedGuard);
                let due = Instant::now() + copy.delay;
                let stopped = tokio::select! {
                    () = sleep_until(due) => false,
                    _ = mode.wait_for(|m| *m == Timers::Stopping) => true,
                };
                if stopped && shared.capabilities.holds_original {
                    // The original is still unsettled: the broker brings it back.
                    let fate = Fate::HandedBack;
                    return Done { receipt, fate };
                }
                if stopped {
                    tracing::warn!(
                        registration = &*shared.registration,
                        address = incoming.delivery().address(),
                        "stopping: publishing a delayed retry copy before its time so it is not lost"
                    );
                }
                let settle = copy::deliver(&shared, incoming.delivery(), copy, settle).await;
                let fate = Fate::Settle(settle);
                Done { receipt, fate }
            });
        }
    }
}
