//! The driver: one task per subscription, and the only user of it.
//!
//! # What the driver owns
//!
//! - The subscription: every fetch, every settlement and the close go through this task,
//!   so a transport never sees two calls at once.
//! - The lanes ([`Lanes`](super::lanes::Lanes)): futures polled by this task, not tasks
//!   of their own, so handing a delivery to a lane and getting its settlement back costs
//!   no cross-thread wake-up. Lanes overlap while handlers await; they share one thread.
//! - The slot: the box the next fetch writes its delivery into, which then travels to a
//!   lane as it is (nothing is moved or allocated per delivery).
//! - The delayed copies' timers (`retry_after` on the runtime's copy path): one task each,
//!   joined here, so their settlements too are made by this task.
//! - The in-flight count (SPEC G5): a delivery counts from its fetch until its settlement
//!   is done, including while it waits for its lane or for a delayed copy's timer.
//!
//! # One pass ([`pass`])
//!
//! A pass looks, in this order, at: a lane that finished, a timer that ran, the stop
//! signal, the driver's turn on its thread (it yields every 128 deliveries), then the
//! fetch (the next delivery when there is room, the subscription's idle upkeep at the
//! bound, its `while_waiting` upkeep while a fetched delivery waits for its lane). The
//! first thing found is the pass's event. One ladder serves both cases: the common case,
//! a backlog with every lane free and no timer set, takes the same ladder with the
//! subscription's immediate fetch (`Subscription::next_now`) and runs delivery after
//! delivery within one poll: fetched, started, polled once, settled ([`start`],
//! [`settle`]); it leaves that straight line at the first thing that would wait, for a
//! full pass that waits on all of them at once, and after the yield at the end of a turn,
//! for a full pass that looks at what the straight line does not (a batch due by
//! `max_wait` on another lane).
//!
//! # While a delivery is in a lane
//!
//! Its handler runs under its deadline; the driver keeps fetching while lanes have room
//! and there is room in flight. A delivery that waits for its lane, or whose handler did
//! not finish in its first poll, is told to the subscription (`waiting`, `running_on`),
//! so a transport can keep it alive (JetStream's `+WPI`); most deliveries never are.
//! Per-key order holds because a key's deliveries share a lane, which runs one at a time.
//!
//! # Settlement ([`settle`])
//!
//! A delivery is settled after its handler's outcome was planned (and its copy, if the
//! plan has one, confirmed by the broker): at once when the subscription can do it without
//! waiting (`Subscription::settle_now`), else through `Subscription::settle`. Settlement
//! failures are logged quietly (one ERROR, then one a minute) and the delivery comes back
//! as the broker's rules say.
//!
//! # Batches
//!
//! A batch registration runs this same loop over other lanes
//! ([`Batches`](super::batches::Batches), through [`LaneWork`]): a fetched delivery joins
//! its lane's open batch, a batch runs as one call once cut (`max_batch`, `max_wait`),
//! and its deliveries come back one at a time, first in a pass, to be settled here like
//! any other: within the straight line, one after another, when settling waits for
//! nothing. The straight line fetches on while batches only gather.
//!
//! # Stop ([`stop`])
//!
//! Nothing more is fetched; the lanes finish what they hold (a delivery fetched but not
//! started runs too), delayed copies are published early (or, where the broker holds the
//! original, handed back), all within the drain deadline; then the subscription is closed
//! within the close deadline, whatever the broker does (SPEC E3, G6).

mod pass;
mod settle;
mod start;
mod stop;
mod turn;

use std::future::{Future, poll_fn};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use ruststream_core::{SubscribeError, Subscription};
use tokio::sync::watch;

use super::batch;
use super::batches::Batches;
use super::lane;
use super::lanes::Lanes as LaneSet;
use super::quiet::ErrorRun;
use super::shared::{Job, Shared};
use super::work::LaneWork;
use crate::batch::CallBatch;
use crate::extract::{Context as CallContext, Incoming};
use crate::in_flight::InFlight;
use crate::middleware::Service;
use crate::registration::BatchLimits;
use crate::registration::LaneKey;
use pass::{Event, StopSignal};
use settle::Timed;
use turn::Turn;

/// After a subscription error, wait this long before fetching again.
const ERROR_PAUSE: Duration = Duration::from_millis(200);

/// How long a stop may take: the drain, then closing the subscription (SPEC G6).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadlines {
    pub(crate) drain: Duration,
    pub(crate) close: Duration,
}

/// How many lanes, and how deliveries are spread over them.
pub(crate) struct Lanes {
    pub(crate) count: usize,
    pub(crate) key: LaneKey,
}

/// A fetched delivery waiting for room on its lane, and the lane.
type Waiting<R> = Option<(usize, Job<R>)>;

pub(crate) async fn drive<Sub: Subscription, S: Service>(
    subscription: Sub,
    shared: Arc<Shared<S>>,
    lanes: Lanes,
    stop: watch::Receiver<bool>,
    deadlines: Deadlines,
) {
    let shared_ref: &Shared<S> = &shared;
    let (running, context) = lane_parts(&shared);
    let set = LaneSet::new(lanes.count, running, context, move |incoming| {
        lane::handle(shared_ref, incoming)
    });
    run(subscription, &shared, set, lanes, stop, deadlines).await;
}

/// The driver of a batch registration: the same loop over lanes that gather batches.
pub(crate) async fn drive_batches<Sub: Subscription, S: CallBatch>(
    subscription: Sub,
    shared: Arc<Shared<S>>,
    lanes: Lanes,
    limits: BatchLimits,
    stop: watch::Receiver<bool>,
    deadlines: Deadlines,
) {
    let shared_ref: &Shared<S> = &shared;
    let (running, context) = lane_parts(&shared);
    let set = Batches::new(lanes.count, limits, running, context, move |members| {
        batch::handle_batch(shared_ref, members)
    });
    run(subscription, &shared, set, lanes, stop, deadlines).await;
}

/// What lanes of either kind keep of the registration: where they publish how many
/// run (when metrics are on), and the context every delivery's box holds.
fn lane_parts<S>(shared: &Shared<S>) -> (Option<Arc<InFlight>>, Arc<CallContext>) {
    let running = shared
        .metrics
        .as_ref()
        .map(|_| Arc::clone(&shared.in_flight));
    (running, Arc::clone(&shared.context))
}

/// The driver's loop over `set`, one delivery per lane or batches per lane, then the
/// stop.
pub(super) async fn run<Sub, S, L>(
    subscription: Sub,
    shared: &Arc<Shared<S>>,
    mut set: L,
    lanes: Lanes,
    stop: watch::Receiver<bool>,
    deadlines: Deadlines,
) where
    Sub: Subscription,
    S: Send + Sync + 'static,
    L: LaneWork<Sub::Receipt>,
{
    let slot = set.slot();
    let mut d = Driver {
        subscription,
        shared,
        set,
        pending: None,
        lanes,
        stop: StopSignal::new(stop),
        turn: Turn::new(),
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
        let done = match d.next_event(&mut timers).await {
            Event::Finished(done) => {
                d.set.start_waiting(&mut d.pending);
                done
            }
            Event::Done(done) => done,
            Event::Stop => break,
            Event::Idle => continue,
            Event::Fetched(receipt) => {
                let idle = d.pending.is_none() && d.set.is_idle();
                let Some(done) = with_context(|cx| d.fetched(receipt, idle, cx)).await else {
                    continue;
                };
                done
            }
            Event::FetchFailed(error) => {
                d.fetch_failed(&error).await;
                continue;
            }
            Event::Ended => {
                pass::note_ended(shared);
                break;
            }
        };
        d.settle(done, &mut timers).await;
    }

    shared.health.ended();
    let Driver {
        subscription,
        set,
        pending,
        ..
    } = d;
    stop::close_within(subscription, shared, set, pending, timers, deadlines).await;
}

/// The driver's state, apart from the delayed copies' timers.
struct Driver<'s, Sub: Subscription, S, L> {
    subscription: Sub,
    shared: &'s Arc<Shared<S>>,
    set: L,
    /// A fetched delivery waiting for room on its lane.
    pending: Waiting<Sub::Receipt>,
    lanes: Lanes,
    stop: StopSignal,
    /// How many more deliveries it fetches before it gives its thread back.
    turn: Turn,
    at_bound: bool,
    fetch_errors: ErrorRun,
    settle_errors: ErrorRun,
    /// The box the next fetch writes its delivery into.
    slot: Box<Incoming>,
}

impl<Sub, S, L> Driver<'_, Sub, S, L>
where
    Sub: Subscription,
    L: LaneWork<Sub::Receipt>,
{
    /// A fetch failed: told, and the next one after a pause.
    #[cold]
    async fn fetch_failed(&mut self, error: &SubscribeError) {
        pass::fetch_failed(&mut self.fetch_errors, self.shared, error);
        tokio::time::sleep(ERROR_PAUSE).await;
    }
}

/// A future ready in its first poll with what `f` makes of that poll's context.
fn with_context<T>(f: impl FnOnce(&mut Context<'_>) -> T) -> impl Future<Output = T> {
    let mut f = Some(f);
    poll_fn(move |cx| Poll::Ready(f.take().expect("polled once")(cx)))
}
