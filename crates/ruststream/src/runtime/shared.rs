//! What the driver, its lanes and its timers hand each other.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use ruststream_core::{
    Capabilities, Declaration, HandlerOutcome, Plan, PlannedCopy, Publish, Settle, Verdict, plan,
};
use tokio::sync::watch;

use super::mount::Observe;
use super::refusals::Refusals;
use crate::backoff::Backoff;
use crate::extract::{Context, Incoming};
use crate::in_flight::InFlight;
use crate::ops::{Instruments, SubscriptionHealth};
use crate::registration::FailurePolicy;

/// What the driver and its lanes share.
pub(crate) struct Shared<S> {
    /// The handler (with its middleware), shared by the registration's consumers.
    pub(crate) service: Arc<S>,
    /// The plans of `ack()` and `drop()`, made once.
    pub(crate) planned: Planned,
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
    pub(crate) refusals: Arc<Refusals>,
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
    /// Whether a delivery's sequence is a stream's (JetStream, the memory broker): a dead
    /// letter then names it (D6).
    pub(crate) stream_sequence: bool,
}

impl<S> Shared<S> {
    // The driver is the count's only writer (metrics only read it): a load and a store,
    // not a locked read-modify-write per delivery.
    pub(crate) fn begin(&self) {
        let count = &self.in_flight.count;
        count.store(count.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }

    pub(crate) fn end(&self) {
        let count = &self.in_flight.count;
        count.store(count.load(Ordering::Relaxed) - 1, Ordering::Relaxed);
    }
}

/// The plans of `ack()` and `drop()` for one registration: neither depends on the
/// delivery (its attempt, its headers), only on the declaration and the broker's
/// capabilities, so they are made once instead of for every delivery.
pub(crate) struct Planned {
    pub(crate) ack: Plan,
    pub(crate) drop: Plan,
}

impl Planned {
    pub(crate) fn for_registration(declaration: &Declaration, capabilities: &Capabilities) -> Self {
        let once = |outcome| plan(Verdict::Outcome(outcome), 1, declaration, capabilities);
        Self {
            ack: once(HandlerOutcome::ack()),
            drop: once(HandlerOutcome::drop()),
        }
    }
}

/// A delivery handed to a lane (boxed once, then moved as a pointer: see `Lanes`).
pub(crate) struct Job<R> {
    pub(crate) incoming: Box<Incoming>,
    pub(crate) receipt: R,
}

/// What a lane or a timer hands back to the driver: a delivery's receipt, and what the
/// delivery came to.
pub(crate) struct Done<R> {
    pub(crate) receipt: R,
    pub(crate) fate: Fate,
}

/// What a delivery came to.
pub(crate) enum Fate {
    /// Settle the original (maybe with `Settle::Nothing`).
    Settle(Settle),
    /// Publish a copy after its delay, then settle the original. Boxed: delayed copies
    /// are rare, and a fate is moved a few times for every delivery (24 bytes, not 48).
    Delayed(Box<DelayedCopy>),
    /// Left unsettled on purpose: the broker brings it back (a held original at stop).
    HandedBack,
    /// Moved to the dead letter by the subscription ([`Settle::DeadLetter`]), adding
    /// these headers (SPEC D6). Boxed: rare.
    DeadLetter(Box<ruststream_core::Headers>),
}

/// A delivery kept for a delayed copy: publish `copy` after its delay, then settle the
/// original as `settle` says.
pub(crate) struct DelayedCopy {
    pub(crate) incoming: Box<Incoming>,
    pub(crate) copy: PlannedCopy,
    pub(crate) settle: Settle,
}
