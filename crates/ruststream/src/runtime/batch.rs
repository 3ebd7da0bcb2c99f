//! What a batch lane does with one batch: decode each delivery, call the handler once,
//! and conclude each delivery alone, as a single delivery's lane would
//! ([`lane::conclude`]).

use std::pin::pin;
use std::sync::Arc;

use ruststream_core::Cause;

use super::copy;
use super::lane::{self, Concluded};
use super::lanes::Finished;
use super::shared::{Fate, Shared};
use super::unwind::{CatchUnwind, Report};
use crate::batch::{BatchOutcome, CallBatch, Members};
use crate::extract::{Incoming, Rejection};
use crate::middleware::Completion;
use crate::ops::Instruments;

/// How one call ended for one delivery, and a panic's report (given to the first only).
type Ended = (Completion, Option<Box<Report>>);

/// Runs a batch; returns, in its order, what each delivery came to. Deliveries the plan
/// runs again in place (Kafka `Commit::Tracked`) run again as a batch of their own, after
/// the floor, before the lane's next batch.
// The boxes travel back to the lanes for reuse: boxed on purpose.
#[allow(clippy::vec_box)]
pub(crate) async fn handle_batch<S: CallBatch>(
    shared: &Shared<S>,
    members: Vec<Box<Incoming>>,
) -> Vec<Finished> {
    let count = members.len();
    // Each entry is overwritten with its delivery's conclusion below.
    let mut finished: Vec<Finished> = Vec::with_capacity(count);
    finished.resize_with(count, || (Fate::HandedBack, None));
    let (mut at, mut todo) = (Vec::with_capacity(count), Vec::with_capacity(count));
    for (i, incoming) in members.into_iter().enumerate() {
        if copy::owes_dead_letter(shared, incoming.delivery()) {
            let settle = copy::dead_letter_again(shared, incoming.delivery()).await;
            finished[i] = (Fate::Settle(settle), Some(incoming));
        } else {
            at.push(i);
            todo.push(incoming);
        }
    }
    let (mut reruns, mut refused) = (0, Vec::with_capacity(todo.len()));
    while !todo.is_empty() {
        let called = shared.metrics.as_ref().map(Instruments::now);
        let members = Arc::new(Members(std::mem::take(&mut todo)));
        let result = call(shared, &members, &mut refused).await;
        let ended = Spread::new(result, &mut refused, shared);
        let (mut again_at, mut again) = (Vec::new(), Vec::new());
        for ((i, incoming), (completion, report)) in
            at.drain(..).zip(taken_back(members)).zip(ended)
        {
            if let Some(settle) = lane::settled_as_planned(shared, incoming.delivery(), &completion)
            {
                finished[i] = (Fate::Settle(settle), Some(incoming));
                continue;
            }
            match lane::conclude(shared, incoming, completion, report, called).await {
                Concluded::Finished(done) => finished[i] = done,
                Concluded::Rerun(incoming) => {
                    again_at.push(i);
                    again.push(incoming);
                }
            }
        }
        if again.is_empty() {
            break;
        }
        reruns += 1;
        if !lane::rerun_after_floor(shared, reruns).await {
            // Stopping: left unsettled, the broker brings them back.
            for (i, incoming) in again_at.into_iter().zip(again) {
                finished[i] = (Fate::HandedBack, Some(incoming));
            }
            break;
        }
        for incoming in &mut again {
            incoming.count_attempt();
        }
        (at, todo) = (again_at, again);
    }
    finished
}

/// The deliveries of a call back from its items: the same boxes when the handler kept no
/// item past its call (the common case), copies of them otherwise.
// The boxes travel back to the lanes for reuse: boxed on purpose.
#[allow(clippy::vec_box)]
fn taken_back(members: Arc<Members>) -> Vec<Box<Incoming>> {
    match Arc::try_unwrap(members) {
        Ok(Members(boxes)) => boxes,
        Err(kept) => kept.0.iter().map(|incoming| incoming.duplicate()).collect(),
    }
}

/// One call of the handler over `members`: its answer, or the failure every delivery
/// that decoded shares (the handler's `Err`, panic or deadline). A delivery that does not
/// decode is refused alone (in `refused`).
async fn call<S: CallBatch>(
    shared: &Shared<S>,
    members: &Arc<Members>,
    refused: &mut Vec<Option<Rejection>>,
) -> Result<BatchOutcome, Ended> {
    match shared.service.call_batch(members, refused) {
        // Nothing decoded, so no call (never an empty batch): every one is refused, and
        // this outcome is never read.
        None => Ok(BatchOutcome::ack_all()),
        Some(call) => {
            if let Some(metrics) = &shared.metrics {
                metrics.observe_batch(refused.iter().filter(|r| r.is_none()).count());
            }
            let future = pin!(CatchUnwind(pin!(call)));
            match lane::within_deadline(shared, future).await {
                Ok(Ok(outcome)) => Ok(outcome),
                Ok(Err(completion)) => Err((completion, None)),
                Err(failed) => Err(failed),
            }
        }
    }
}

/// The call's result spread over its deliveries, in order: a refusal for each that did
/// not decode; for the others, the handler's outcome (by index among those handed) or
/// the call's failure.
struct Spread<'r> {
    answer: Result<BatchOutcome, Completion>,
    /// The panic's report (its backtrace), given once, with the first delivery.
    report: Option<Box<Report>>,
    refused: std::vec::Drain<'r, Option<Rejection>>,
    /// The next handed delivery's index in the handler's batch, and how many there were.
    index: usize,
    handed: usize,
}

impl<'r> Spread<'r> {
    fn new<S>(
        result: Result<BatchOutcome, Ended>,
        refused: &'r mut Vec<Option<Rejection>>,
        shared: &Shared<S>,
    ) -> Self {
        let handed = refused.iter().filter(|r| r.is_none()).count();
        let mut report = None;
        let answer = result.map_err(|(failure, caught)| {
            report = caught;
            failure
        });
        if let Ok(outcome) = &answer
            && !outcome.covers(handed)
        {
            tracing::error!(
                registration = &*shared.registration,
                batch = handed,
                "the batch handler gave no outcome for some messages of its batch; those are retried"
            );
        }
        Self {
            answer,
            report,
            refused: refused.drain(..),
            index: 0,
            handed,
        }
    }
}

impl Iterator for Spread<'_> {
    type Item = Ended;

    #[inline]
    fn next(&mut self) -> Option<Ended> {
        if let Some(rejection) = self.refused.next()? {
            return Some((Completion::Rejected(rejection), None));
        }
        let at = self.index;
        self.index += 1;
        Some(match &self.answer {
            Ok(outcome) => match outcome.get(at) {
                Some(given) => (Completion::Outcome(given), None),
                None => {
                    let missing = format!(
                        "the batch handler gave no outcome for message {at} of {}",
                        self.handed
                    );
                    (Completion::Failed(Cause::new(missing)), None)
                }
            },
            Err(failure) => (failure.clone(), self.report.take()),
        })
    }
}
