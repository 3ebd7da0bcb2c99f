//! Stop: fetch nothing more, drain the lanes and the timers, close the subscription.

use std::future::{Future, poll_fn};
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;

use ruststream_core::Subscription;
use tokio::time::{Instant, sleep_until};

use super::settle::{Timed, Timers, apply};
use super::{Deadlines, Waiting};
use crate::runtime::quiet::ErrorRun;
use crate::runtime::shared::{Done, Shared};
use crate::runtime::work::LaneWork;

/// Lets the lanes finish what they hold, within the drain deadline, then closes within
/// the close deadline, whatever the broker does (G6).
pub(super) async fn close_within<Sub, S, L>(
    subscription: Sub,
    shared: &Arc<Shared<S>>,
    set: L,
    pending: Waiting<Sub::Receipt>,
    timers: Timed<Sub::Receipt>,
    deadlines: Deadlines,
) where
    Sub: Subscription,
    S: Send + Sync + 'static,
    L: LaneWork<Sub::Receipt>,
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

async fn drain_and_close<Sub, S, L>(
    mut subscription: Sub,
    shared: &Arc<Shared<S>>,
    mut set: L,
    pending: Waiting<Sub::Receipt>,
    mut timers: Timed<Sub::Receipt>,
    deadlines: Deadlines,
) where
    Sub: Subscription,
    S: Send + Sync + 'static,
    L: LaneWork<Sub::Receipt>,
{
    let mut deadline = pin!(sleep_until(Instant::now() + deadlines.drain));
    set.stopping();
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
        let Some(Done { receipt, fate }) = done else {
            tracing::warn!(
                registration = &*shared.registration,
                handlers_running = !set.is_idle(),
                timers_waiting = timers.set.len(),
                "drain timeout passed; unfinished deliveries stay unsettled"
            );
            timers.set.abort_all();
            break;
        };
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
