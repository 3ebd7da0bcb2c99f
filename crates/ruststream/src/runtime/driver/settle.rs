//! Settlement: the one path from what a delivery came to, to the broker operation.

use std::ops::ControlFlow;
use std::sync::Arc;

use ruststream_core::{AckError, Settle, StillHeld, Subscription};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep_until};

use super::Driver;
use crate::ops::SettleError;
use crate::runtime::copy;
use crate::runtime::quiet::ErrorRun;
use crate::runtime::shared::{DelayedCopy, Done, Fate, Shared};
use crate::runtime::unwind::CatchUnwind;
use crate::runtime::work::LaneWork;

/// The mode delayed copies wait in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Timers {
    Waiting,
    Stopping,
}

/// The delayed copies' timer tasks, and the mode they wait in.
pub(super) struct Timed<R> {
    pub(super) set: JoinSet<Done<R>>,
    pub(super) tx: watch::Sender<Timers>,
    rx: watch::Receiver<Timers>,
}

impl<R: Send + 'static> Timed<R> {
    pub(super) fn new() -> Self {
        let (tx, rx) = watch::channel(Timers::Waiting);
        Self {
            set: JoinSet::new(),
            tx,
            rx,
        }
    }
}

impl<Sub, S, L> Driver<'_, Sub, S, L>
where
    Sub: Subscription,
    S: Send + Sync + 'static,
    L: LaneWork<Sub::Receipt>,
{
    /// Settles `done`, or starts its delayed copy's timer.
    pub(super) async fn settle(
        &mut self,
        done: Done<Sub::Receipt>,
        timers: &mut Timed<Sub::Receipt>,
    ) {
        if let Some(Done { receipt, fate }) = self.settle_now(done) {
            let errors = &mut self.settle_errors;
            apply(
                &mut self.subscription,
                self.shared,
                receipt,
                fate,
                timers,
                errors,
            )
            .await;
        }
    }

    /// The early branch of [`settle`](Self::settle): settles `done` when that waits for
    /// nothing (a settlement the subscription makes at once, or nothing to settle); hands
    /// it back otherwise.
    #[inline(always)]
    pub(super) fn settle_now(&mut self, done: Done<Sub::Receipt>) -> Option<Done<Sub::Receipt>> {
        let Done { receipt, fate } = done;
        let Fate::Settle(settle) = fate else {
            return Some(Done { receipt, fate });
        };
        if settle == Settle::Nothing {
            // Nothing to settle (a Core NATS delivery, an original whose copy went out).
            self.shared.end();
            return None;
        }
        match self.subscription.settle_now(receipt, settle) {
            ControlFlow::Break(result) => {
                settled(result, &mut self.settle_errors, self.shared, settle);
                None
            }
            ControlFlow::Continue(receipt) => Some(Done {
                receipt,
                fate: Fate::Settle(settle),
            }),
        }
    }
}

/// What a delivery came to, done: its settlement made (the subscription's waiting form,
/// after the immediate one declined), or its delayed copy's timer started.
pub(super) async fn apply<Sub: Subscription, S: Send + Sync + 'static>(
    subscription: &mut Sub,
    shared: &Arc<Shared<S>>,
    receipt: Sub::Receipt,
    fate: Fate,
    timers: &mut Timed<Sub::Receipt>,
    settle_errors: &mut ErrorRun,
) {
    match fate {
        Fate::Settle(Settle::Nothing) | Fate::HandedBack => shared.end(),
        Fate::Settle(settle) => {
            let result = subscription.settle(receipt, settle).await;
            settled(result, settle_errors, shared, settle);
        }
        Fate::DeadLetter(headers) => {
            subscription.dead_letter_headers(&receipt, *headers);
            let result = subscription.settle(receipt, Settle::DeadLetter).await;
            settled(result, settle_errors, shared, Settle::DeadLetter);
        }
        Fate::Delayed(delayed) => {
            let still_held = subscription.parked(&receipt);
            start_timer(Arc::clone(shared), receipt, *delayed, still_held, timers);
        }
    }
}

/// A delayed copy's timer: at its due time (or early, at stop) the copy is published and
/// the original's settlement comes back to the driver; unless `still_held` says the
/// original is no longer the subscription's to settle (it is read again and waits again).
fn start_timer<S: Send + Sync + 'static, R: Send + 'static>(
    shared: Arc<Shared<S>>,
    receipt: R,
    delayed: DelayedCopy,
    still_held: Option<StillHeld>,
    timers: &mut Timed<R>,
) {
    let DelayedCopy {
        incoming,
        copy,
        settle,
    } = delayed;
    let mut mode = timers.rx.clone();
    let delayed = shared.metrics.as_ref().map(|m| m.delayed.clone());
    if let Some(delayed) = &delayed {
        delayed.inc();
    }
    timers.set.spawn(async move {
        // Counted out however the task ends (aborted at the drain deadline too).
        let _counted = delayed.map(DelayedGuard);
        let timed = std::pin::pin!(async {
            let due = Instant::now() + copy.delay;
            let stopped = tokio::select! {
                biased;
                () = sleep_until(due) => false,
                _ = mode.wait_for(|m| *m == Timers::Stopping) => true,
            };
            if stopped && shared.capabilities.holds_original {
                // The original is still unsettled: the broker brings it back.
                return Fate::HandedBack;
            }
            if still_held.as_ref().is_some_and(|held| !held()) {
                tracing::info!(
                    registration = &*shared.registration,
                    address = incoming.delivery().address(),
                    "a delayed retry copy is not made: its original is read again"
                );
                return Fate::HandedBack;
            }
            if stopped {
                tracing::warn!(
                    registration = &*shared.registration,
                    address = incoming.delivery().address(),
                    "stopping: publishing a delayed retry copy before its time so it is not lost"
                );
            }
            let why = &"retry_after(..)";
            Fate::Settle(copy::deliver(&shared, incoming.delivery(), copy, settle, why).await)
        });
        // A panic (in a transport's publish) still hands the receipt back to the driver,
        // which counts the delivery out of flight; the original stays unsettled.
        let fate = CatchUnwind(timed).await.unwrap_or_else(|caught| {
            let at = caught.report.as_ref().map(|r| r.location.as_str());
            tracing::error!(
                registration = &*shared.registration,
                panic = %caught.message,
                at,
                "a delayed retry copy's timer panicked; the original is left unsettled"
            );
            Fate::HandedBack
        });
        Done { receipt, fate }
    });
}

/// Takes a delayed copy off the `ruststream_delayed` gauge when its timer task ends.
struct DelayedGuard(prometheus_client::metrics::gauge::Gauge);

impl Drop for DelayedGuard {
    fn drop(&mut self) {
        self.0.dec();
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
                dead_lettered(shared);
            }
        }
        Err(error) => settle_failed(settle_errors, shared, settle, &error),
    }
    shared.end();
}

/// A dead letter moved by the subscription: counted and told.
#[cold]
fn dead_lettered<S>(shared: &Shared<S>) {
    copy::dead_lettered(shared, None);
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
