//! What a lane does with one delivery: run the handler, decide, publish a copy the plan
//! asks for, and say what to settle.

use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::task::Poll;

use super::copy;
use super::lanes::Finished;
use super::mount::Handled;
use super::outlined::Outlined;
use super::quiet::{is_loud, is_power_of_ten};
use super::refusals;
use super::shared::{DelayedCopy, Fate, Shared};
use super::unwind::{CatchUnwind, Caught, Report};
use super::why::{self, Why};
use crate::backoff::RERUN_FLOOR;
use crate::extract::Incoming;
use crate::middleware::Chain;
use crate::middleware::Completion;
use crate::middleware::Service;
use crate::ops::{Instruments, Outcome, SettleError};
use crate::registration::FailurePolicy;
use ruststream_core::{
    AckError, Delivery, HandlerOutcome, OutcomeKind, Plan, Settle, Verdict, plan,
};

/// Runs a delivery; returns what to settle and, unless a delayed copy keeps it, the box
/// the delivery came in. (Its receipt stays with the lanes.)
pub(crate) async fn handle<S: Service>(
    shared: &Shared<S>,
    mut incoming: Box<Incoming>,
) -> Finished {
    if refusals::owes_dead_letter(shared, incoming.delivery()) {
        let fate = Outlined(pin!(refusals::dead_letter_again(
            shared,
            incoming.delivery()
        )))
        .await;
        return (fate, Some(incoming));
    }
    let mut reruns = 0;
    loop {
        let called = shared.metrics.as_ref().map(Instruments::now);
        // The handler, within its deadline (G1), its panics caught (E2). Written out here,
        // not as a function of its own: one future nested in another less per delivery.
        let (completion, report) = {
            // A panic while extracting or while polling both count. The extraction runs
            // in the first poll, so one catch covers both (each catch costs thread-local
            // round trips).
            let future = pin!(CatchUnwind(pin!(async {
                shared.service.call(&incoming).await
            })));
            match within_deadline(shared, future).await {
                Ok(completion) => (completion, None),
                Err(failed) => failed,
            }
        };
        // The common case first: nothing to plan, report or publish.
        if let Some(settle) = settled_as_planned(shared, incoming.delivery(), &completion) {
            return (Fate::Settle(settle), Some(incoming));
        }
        let concluded = pin!(conclude(
            shared, incoming, completion, report, called, false
        ));
        match Outlined(concluded).await {
            Concluded::Finished(finished) => return finished,
            Concluded::Rerun(again) => {
                reruns += 1;
                incoming = again;
                if !Outlined(pin!(rerun_after_floor(shared, reruns))).await {
                    // Stopping: left unsettled, the broker brings it back.
                    return (Fate::HandedBack, Some(incoming));
                }
                incoming.count_attempt();
            }
        }
    }
}

/// Polls a call caught for panics, within the registration's deadline: its output, or
/// how it failed (a panic, with its report, or the deadline). Most calls finish in their
/// first poll: no timer for them (the deadline then counts from the second poll, a
/// negligible difference).
#[inline(always)]
pub(crate) async fn within_deadline<S, F: Future>(
    shared: &Shared<S>,
    mut future: Pin<&mut CatchUnwind<'_, F>>,
) -> Result<F::Output, (Completion, Option<Box<Report>>)> {
    let first = poll_fn(|cx| Poll::Ready(future.as_mut().poll(cx))).await;
    let result = match first {
        Poll::Ready(result) => Ok(result),
        // Dropping the timed-out future cancels the handler.
        Poll::Pending => Outlined(pin!(tokio::time::timeout(shared.deadline, future))).await,
    };
    match result {
        Ok(Ok(output)) => Ok(output),
        Ok(Err(Caught { message, report })) => Err((Completion::Panicked(message), report)),
        Err(_) => Err((Completion::TimedOut(shared.deadline), None)),
    }
}

/// Waits the floor before an in-place rerun (G2); `false` when the app stops meanwhile.
pub(crate) async fn rerun_after_floor<S>(shared: &Shared<S>, reruns: u32) -> bool {
    copy::wait_unless_stopped(&shared.stop, RERUN_FLOOR.delay(reruns)).await
}

/// What a handled delivery came to: finished, or to be run again in place.
pub(crate) enum Concluded {
    Finished(Finished),
    /// The same record again, before anything its lane holds (K4); it stays unsettled
    /// meanwhile, so the position waits for it. The caller waits the floor (G2) first.
    Rerun(Box<Incoming>),
}

/// How a call ended, made into what to settle: planned, reported, its copy published
/// (or kept for its delay). `called`: when the call began, for the metrics; `told`: the
/// call's failure was reported for its whole batch (this delivery's report is quiet). The
/// caller takes [`settled_as_planned`] first, the common case's early branch.
pub(crate) async fn conclude<S>(
    shared: &Shared<S>,
    mut incoming: Box<Incoming>,
    completion: Completion,
    report: Option<Box<Report>>,
    called: Option<u64>,
    told: bool,
) -> Concluded {
    let plan = decide(shared, incoming.delivery(), &completion, report, told);
    if let (Some(metrics), Some(called)) = (&shared.metrics, called) {
        metrics.observe_since(called);
        metrics.observe_age(incoming.delivery().metadata().timestamp_ms);
        metrics.outcome(Outcome::of(&completion));
    }
    if let Some(observer) = &shared.observer {
        observer.handled(&Handled {
            registration: &shared.registration,
            delivery: incoming.delivery(),
            completion: &completion,
            plan: &plan,
        });
    }
    let settle = match plan.copy {
        None => plan.settle,
        Some(c) if c.delay.is_zero() => {
            copy::deliver(shared, incoming.delivery(), c, plan.settle, &completion).await
        }
        Some(c) => {
            // Kept for the delay: its headers read now, the client's record let go.
            incoming.delivery_mut().own_deferred();
            let delayed = Fate::Delayed(Box::new(DelayedCopy {
                incoming,
                copy: c,
                settle: plan.settle,
            }));
            return Concluded::Finished((delayed, None));
        }
    };
    if settle == Settle::Redeliver && shared.capabilities.redeliver_in_place {
        return Concluded::Rerun(incoming);
    }
    if settle == Settle::DeadLetter {
        // The subscription moves it: it adds what the dead letter says about itself.
        let why = Why {
            reason: &completion.to_string(),
            registration: &shared.registration,
            stream_sequence: shared.stream_sequence,
        };
        let headers = why::added(incoming.delivery(), why);
        return Concluded::Finished((Fate::DeadLetter(Box::new(headers)), Some(incoming)));
    }
    Concluded::Finished((Fate::Settle(settle), Some(incoming)))
}

/// The common case: an `ack()` or a `drop()`, whose plan was made once for the
/// registration, with no metrics or observer to tell about it. Its settlement, reported
/// as `decide` would when the broker has no operation for it (Core NATS); `None` for
/// anything else, which `decide` plans.
#[inline]
pub(crate) fn settled_as_planned<S>(
    shared: &Shared<S>,
    delivery: &Delivery,
    completion: &Completion,
) -> Option<Settle> {
    if shared.metrics.is_some() || shared.observer.is_some() {
        return None;
    }
    let Completion::Outcome(outcome) = completion else {
        return None;
    };
    let plan = match outcome.kind() {
        OutcomeKind::Ack => &shared.planned.ack,
        OutcomeKind::Drop => &shared.planned.drop,
        OutcomeKind::Retry { .. } => return None,
    };
    // Logged at debug level when it is expected (a Core NATS ack: SPEC N2), so the call
    // is skipped while that level is off everywhere.
    if let Some(error) = &plan.error
        && (plan.settle != Settle::Nothing || tracing::level_enabled!(tracing::Level::DEBUG))
    {
        report_unsupported(shared, delivery, completion, plan, error);
    }
    Some(plan.settle)
}

fn decide<S>(
    shared: &Shared<S>,
    delivery: &Delivery,
    completion: &Completion,
    report: Option<Box<Report>>,
    told: bool,
) -> Plan {
    let verdict = match completion {
        // The common case: the handler's own outcome, nothing to report.
        Completion::Outcome(outcome) => Verdict::Outcome(*outcome),
        _ => failure_verdict(shared, delivery, completion, report, told),
    };
    let verdict = with_backoff(shared, delivery, verdict, told);
    let attempt = delivery.attempt().number();
    let plan = plan(verdict, attempt, &shared.declaration, &shared.capabilities);
    if let Some(error) = &plan.error {
        report_unsupported(shared, delivery, completion, &plan, error);
    }
    plan
}

/// What a failed call (an error, a panic, the deadline, a refused extraction) amounts
/// to, reported as loudly as the spec asks (quietly when the batch's report `told` it).
fn failure_verdict<S>(
    shared: &Shared<S>,
    delivery: &Delivery,
    completion: &Completion,
    report: Option<Box<Report>>,
    told: bool,
) -> Verdict {
    let registration = &*shared.registration;
    let address = delivery.address();
    let attempt = delivery.attempt().number();
    let loud = !told && is_loud(shared, attempt);
    match completion {
        Completion::Outcome(outcome) => Verdict::Outcome(*outcome),
        Completion::Failed(error) => {
            let error = Chain(error.as_error());
            if loud {
                tracing::warn!(registration, address, attempt, %error, "handler returned an error; retrying");
            } else {
                tracing::debug!(registration, address, attempt, %error, "handler returned an error; retrying");
            }
            Verdict::Outcome(HandlerOutcome::retry())
        }
        Completion::Panicked(message) => {
            report_panic(registration, address, attempt, loud, message, report);
            Verdict::Outcome(HandlerOutcome::retry())
        }
        Completion::TimedOut(deadline) => {
            if loud {
                tracing::error!(
                    registration,
                    address,
                    attempt,
                    ?deadline,
                    "handler passed its deadline and was cancelled; counted as a failed attempt"
                );
            } else {
                tracing::debug!(
                    registration,
                    address,
                    attempt,
                    ?deadline,
                    "handler passed its deadline and was cancelled; counted as a failed attempt"
                );
            }
            Verdict::Outcome(HandlerOutcome::retry())
        }
        Completion::Rejected(rejection) => {
            let (verdict, fate) = match shared.failure_policy {
                // "dead-lettered" is said once the dead letter is confirmed.
                FailurePolicy::DeadLetter if shared.declaration.dead_letter.is_some() => {
                    (Verdict::Reject, "going to the dead letter")
                }
                FailurePolicy::DeadLetter | FailurePolicy::Drop => {
                    (Verdict::Outcome(HandlerOutcome::drop()), "dropped")
                }
                FailurePolicy::Retry => (Verdict::Outcome(HandlerOutcome::retry()), "retried"),
            };
            tracing::error!(registration, address, attempt, error = %rejection, "undecodable delivery {fate}");
            verdict
        }
    }
}

/// A handler panicked: where, and (once per message, its first attempt: G2) the
/// backtrace.
#[cold]
fn report_panic(
    registration: &str,
    address: &str,
    attempt: u32,
    loud: bool,
    message: &str,
    report: Option<Box<Report>>,
) {
    let (location, backtrace) = match report.map(|r| *r) {
        Some(r) => (r.location, r.backtrace),
        None => ("unknown".to_owned(), None),
    };
    let location = location.as_str();
    match backtrace {
        Some(backtrace) if attempt == 1 => tracing::error!(
            registration, address, attempt, panic = %message, location,
            backtrace = %format_args!("\n{backtrace}"),
            "handler panicked; retrying"
        ),
        _ if loud => tracing::error!(
            registration, address, attempt, panic = %message, location,
            "handler panicked; retrying"
        ),
        _ => tracing::debug!(
            registration, address, attempt, panic = %message, location,
            "handler panicked; retrying"
        ),
    }
}

/// A `retry()` under the registration's backoff becomes a delayed redelivery (G2); an
/// uncapped retry loop is reported now and then.
fn with_backoff<S>(
    shared: &Shared<S>,
    delivery: &Delivery,
    verdict: Verdict,
    told: bool,
) -> Verdict {
    let attempt = delivery.attempt().number();
    match verdict {
        Verdict::Outcome(outcome) if matches!(outcome.kind(), OutcomeKind::Retry { .. }) => {
            if !told && shared.declaration.max_attempts.is_none() && is_power_of_ten(attempt) {
                // Nothing caps it: say so now and then, never silently (G2).
                tracing::warn!(
                    registration = &*shared.registration,
                    address = delivery.address(),
                    attempt,
                    "this delivery keeps failing and no max_attempts caps it"
                );
            }
            match (outcome.kind(), shared.backoff) {
                (OutcomeKind::Retry { delay: None }, Some(backoff)) => {
                    Verdict::Outcome(HandlerOutcome::retry_after(backoff.delay(attempt)))
                }
                _ => verdict,
            }
        }
        other => other,
    }
}

/// A settlement the broker has no operation for: counted, and logged quietly where the
/// spec designs it so (Core NATS acks and drops, the original of a copy that went out).
#[cold]
fn report_unsupported<S>(
    shared: &Shared<S>,
    delivery: &Delivery,
    completion: &Completion,
    plan: &Plan,
    error: &AckError,
) {
    let registration = &*shared.registration;
    let address = delivery.address();
    let attempt = delivery.attempt().number();
    if let Some(metrics) = &shared.metrics {
        metrics.settle_failed(match error {
            AckError::Unsupported { .. } => SettleError::Unsupported,
            _ => SettleError::Failed,
        });
    }
    // Core NATS acks and drops are Unsupported by nature, and so is settling the original
    // of a copy that went out: both as the spec designs them, said quietly. Anything else
    // (a retry nothing can honour, a refused delay) deserves a warning.
    let expected = matches!(plan.settle, Settle::Nothing)
        && (plan.copy.is_some()
            || matches!(completion, Completion::Outcome(o) if o == &HandlerOutcome::ack() || o == &HandlerOutcome::drop()));
    if expected {
        tracing::debug!(registration, address, attempt, %error, "settlement not supported");
    } else {
        tracing::warn!(registration, address, attempt, %error, "settlement not supported");
    }
}
