//! A lane runs deliveries one at a time, in the order the driver hands them over.

use std::future::poll_fn;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;

use super::board::{Board, Take};
use super::driver::{Done, Job, Shared};
use super::unwind::{CatchUnwind, panic_message};
use super::{Handled, copy};
use crate::extract::Incoming;
use crate::handler::Completion;
use crate::middleware::Service;
use crate::registration::FailurePolicy;
use ruststream_core::{Delivery, HandlerOutcome, Plan, Settle, Verdict, plan};

pub(crate) async fn run<S: Service, R: Send + 'static>(
    shared: Arc<Shared<S>>,
    board: Arc<Board<R>>,
    lane: usize,
) {
    loop {
        // No waker: only the driver adds jobs, and it polls its lanes on every pass.
        let next = poll_fn(|_| match board.take(lane) {
            Take::Job(job) => Poll::Ready(Some(job)),
            Take::Closed => Poll::Ready(None),
            Take::Empty => Poll::Pending,
        });
        let Some(job) = next.await else {
            break;
        };
        let finished = handle(&shared, job).await;
        board.finish(finished);
    }
}

async fn handle<S: Service, R>(shared: &Shared<S>, job: Job<R>) -> Done<R> {
    let incoming = Incoming::new(job.delivery, Arc::clone(&shared.context));
    loop {
        let completion = call(&shared.service, &incoming).await;
        let plan = decide(shared, incoming.delivery(), &completion);
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
                copy::publish(
                    shared.copies.as_ref(),
                    &shared.registration,
                    incoming.delivery(),
                    &c,
                    &shared.declaration,
                    &shared.capabilities,
                    plan.settle,
                )
                .await
            }
            Some(c) => {
                return Done::Delayed {
                    receipt: job.receipt,
                    delivery: Box::new(incoming.into_delivery()),
                    copy: c,
                    settle: plan.settle,
                };
            }
        };
        if settle == Settle::Redeliver && shared.capabilities.redeliver_in_place {
            // The same record again, before anything this lane holds (K4); it stays
            // unsettled meanwhile, so the position waits for it. Let others run first.
            tokio::task::yield_now().await;
            continue;
        }
        return Done::Settle {
            receipt: job.receipt,
            settle,
        };
    }
}

async fn call<S: Service>(service: &S, incoming: &Incoming) -> Completion {
    // A panic while extracting (synchronous) or while polling both count.
    let future = match catch_unwind(AssertUnwindSafe(|| service.call(incoming))) {
        Ok(future) => future,
        Err(payload) => return Completion::Panicked(panic_message(payload.as_ref())),
    };
    match CatchUnwind(pin!(future)).await {
        Ok(completion) => completion,
        Err(message) => Completion::Panicked(message),
    }
}

fn decide<S>(shared: &Shared<S>, delivery: &Delivery, completion: &Completion) -> Plan {
    let registration = &*shared.registration;
    let address = delivery.address();
    let attempt = delivery.attempt().number();
    let verdict = match completion {
        Completion::Outcome(outcome) => Verdict::Outcome(*outcome),
        Completion::Failed(error) => {
            tracing::warn!(registration, address, attempt, %error, "handler returned an error; retrying");
            Verdict::Outcome(HandlerOutcome::retry())
        }
        Completion::Panicked(message) => {
            tracing::error!(registration, address, attempt, panic = %message, "handler panicked; retrying");
            Verdict::Outcome(HandlerOutcome::retry())
        }
        Completion::Rejected(rejection) => {
            let (verdict, fate) = match shared.failure_policy {
                FailurePolicy::DeadLetter if shared.declaration.dead_letter.is_some() => {
                    (Verdict::Reject, "dead-lettered")
                }
                FailurePolicy::DeadLetter | FailurePolicy::Drop => {
                    (Verdict::Outcome(HandlerOutcome::drop()), "dropped")
                }
                FailurePolicy::Retry => (Verdict::Outcome(HandlerOutcome::retry()), "retried"),
            };
            tracing::error!(registration, address, attempt, error = %rejection, "undecodable delivery {fate}");
            verdict
        }
    };
    let plan = plan(verdict, attempt, &shared.declaration, &shared.capabilities);
    if let Some(error) = &plan.error {
        // Core NATS acks and drops are Unsupported by nature: say so quietly. Anything
        // else (a retry nothing can honour, a refused delay) deserves a warning.
        let expected = matches!(plan.settle, Settle::Nothing)
            && matches!(completion, Completion::Outcome(o) if o == &HandlerOutcome::ack() || o == &HandlerOutcome::drop());
        if expected {
            tracing::debug!(registration, address, attempt, %error, "settlement not supported");
        } else {
            tracing::warn!(registration, address, attempt, %error, "settlement not supported");
        }
    }
    plan
}
