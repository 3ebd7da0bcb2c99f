//! What a batch lane does with one batch: decode each delivery, call the handler once,
//! and conclude each delivery alone, as a single delivery's lane would
//! ([`lane::conclude`]).

use std::pin::pin;
use std::sync::Arc;

use ruststream_core::Cause;

use super::lane::{self, Concluded};
use super::lanes::Finished;
use super::outlined::Outlined;
use super::quiet;
use super::refusals;
use super::shared::{Fate, Shared};
use super::unwind::{CatchUnwind, Report};
use crate::batch::{BatchOutcome, CallBatch, Members, Refused};
use crate::extract::{Incoming, Rejection};
use crate::middleware::{Chain, Completion};
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
    let mut finished: Vec<Finished> = Vec::with_capacity(count);
    // Where each delivery called sits in the batch: `None` while that is its place in
    // the call (the common case: none owes a dead letter, none runs again).
    let (mut at, mut todo) = if members
        .iter()
        .any(|m| refusals::owes_dead_letter(shared, m.delivery()))
    {
        Outlined(pin!(dead_letters_first(shared, members, &mut finished))).await
    } else {
        (None, members)
    };
    let (mut reruns, mut refused) = (0, Vec::new());
    while !todo.is_empty() {
        let called = shared.metrics.as_ref().map(Instruments::now);
        let members = Arc::new(Members(std::mem::take(&mut todo)));
        let mut result = call(shared, &members, &mut refused).await;
        // A failed call is reported once for its batch, each message's report then quiet.
        let told = if let Err((failure, report)) = &mut result {
            report_failed_call(shared, &members, &refused, failure, report.take());
            true
        } else {
            false
        };
        let ended = Spread::new(result, &mut refused, members.0.len(), shared);
        let (mut again_at, mut again) = (Vec::new(), Vec::new());
        for (k, (incoming, (completion, report))) in
            taken_back(members).into_iter().zip(ended).enumerate()
        {
            let i = at.as_ref().map_or(k, |at: &Vec<usize>| at[k]);
            if let Some(settle) = lane::settled_as_planned(shared, incoming.delivery(), &completion)
            {
                put(&mut finished, i, (Fate::Settle(settle), Some(incoming)));
                continue;
            }
            match lane::conclude(shared, incoming, completion, report, called, told).await {
                Concluded::Finished(done) => put(&mut finished, i, done),
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
                put(&mut finished, i, (Fate::HandedBack, Some(incoming)));
            }
            break;
        }
        for incoming in &mut again {
            incoming.count_attempt();
        }
        (at, todo) = (Some(again_at), again);
    }
    debug_assert_eq!(finished.len(), count, "one conclusion per delivery");
    finished
}

/// Deliveries back past their cap whose dead letter is owed (SPEC G3) go to it without a
/// call, their conclusions put in `finished`; the others are called, at the places given.
// The boxes travel back to the lanes for reuse: boxed on purpose.
#[allow(clippy::vec_box)]
async fn dead_letters_first<S>(
    shared: &Shared<S>,
    members: Vec<Box<Incoming>>,
    finished: &mut Vec<Finished>,
) -> (Option<Vec<usize>>, Vec<Box<Incoming>>) {
    let (mut at, mut todo) = (Vec::with_capacity(members.len()), Vec::new());
    for (i, incoming) in members.into_iter().enumerate() {
        if refusals::owes_dead_letter(shared, incoming.delivery()) {
            let fate = refusals::dead_letter_again(shared, incoming.delivery()).await;
            put(finished, i, (fate, Some(incoming)));
        } else {
            at.push(i);
            todo.push(incoming);
        }
    }
    (Some(at), todo)
}

/// Puts delivery `i`'s conclusion in its place: pushed when the ones before it are in
/// (the common case), else over the place kept for it.
#[inline]
fn put(finished: &mut Vec<Finished>, i: usize, done: Finished) {
    if i == finished.len() {
        finished.push(done);
    } else {
        put_out_of_order(finished, i, done);
    }
}

#[cold]
fn put_out_of_order(finished: &mut Vec<Finished>, i: usize, done: Finished) {
    if i < finished.len() {
        finished[i] = done;
    } else {
        finished.resize_with(i, || (Fate::HandedBack, None));
        finished.push(done);
    }
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
    refused: &mut Refused,
) -> Result<BatchOutcome, Ended> {
    // Decoding and extracting run in the call's first poll, inside the catch and the
    // deadline: a codec or extractor that panics fails the batch as its handler's panic
    // would (E2), instead of ending the registration's driver.
    let future = pin!(CatchUnwind(pin!(async {
        let call = shared.service.call_batch(members, refused)?;
        if let Some(metrics) = &shared.metrics {
            metrics.observe_batch(members.0.len() - refused.len());
        }
        Some(call.await)
    })));
    match lane::within_deadline(shared, future).await {
        // Nothing decoded, so no call (never an empty batch): every one is refused, and
        // this outcome is never read.
        Ok(None) => Ok(BatchOutcome::ack_all()),
        Ok(Some(Ok(outcome))) => Ok(outcome),
        Ok(Some(Err(completion))) => Err((completion, None)),
        Err(failed) => Err(failed),
    }
}

/// A call that failed (its `Err`, a panic, the deadline), reported once for its batch:
/// the registration, the address, how many messages the handler had and their attempts,
/// and why (a panic's backtrace with a first attempt). A failed batch of 500 is one line,
/// not 500; each message's own report is at DEBUG. As loud as one message's would be
/// (G2): under a cap on every attempt, else when some attempt is 1, 10, 100...
#[cold]
fn report_failed_call<S>(
    shared: &Shared<S>,
    members: &Members,
    refused: &Refused,
    failure: &Completion,
    report: Option<Box<Report>>,
) {
    let (mut batch, mut first, mut last, mut loud, mut address) = (0, u32::MAX, 0, false, "");
    let mut refused = refused.iter().map(|(at, _)| *at).peekable();
    let handed = members
        .0
        .iter()
        .enumerate()
        .filter(|(i, _)| refused.next_if_eq(i).is_none());
    for delivery in handed.map(|(_, incoming)| incoming.delivery()) {
        let attempt = delivery.attempt().number();
        (batch, first, last) = (batch + 1, first.min(attempt), last.max(attempt));
        loud |= quiet::is_loud(shared, attempt);
        if address.is_empty() {
            address = delivery.address();
        }
    }
    let attempts = if first == last {
        first.to_string()
    } else {
        format!("{first}-{last}")
    };
    let (what, why) = match failure {
        Completion::Failed(error) => (
            "batch handler returned an error; retrying every message of the batch",
            Chain(error.as_error()).to_string(),
        ),
        Completion::Panicked(message) => {
            let mut why = message.clone();
            if let Some(report) = report {
                why = format!("{why} at {}", report.location);
                if let (Some(backtrace), 1) = (report.backtrace, first) {
                    why = format!("{why}\n{backtrace}");
                }
            }
            (
                "batch handler panicked; retrying every message of the batch",
                why,
            )
        }
        Completion::TimedOut(deadline) => (
            "batch handler passed its deadline and was cancelled; counted as a failed attempt of every message of the batch",
            format!("deadline {deadline:?}"),
        ),
        Completion::Outcome(_) | Completion::Rejected(_) => return,
    };
    let registration = &*shared.registration;
    match failure {
        _ if !loud => tracing::debug!(registration, address, batch, %attempts, %why, "{what}"),
        Completion::Failed(_) => {
            tracing::warn!(registration, address, batch, %attempts, %why, "{what}")
        }
        _ => tracing::error!(registration, address, batch, %attempts, %why, "{what}"),
    }
}

/// The call's result spread over its deliveries, in order: a refusal for each that did
/// not decode; for the others, the handler's outcome (by index among those handed) or
/// the call's failure.
struct Spread<'r> {
    answer: Result<BatchOutcome, Completion>,
    /// The panic's report (its backtrace), given once, with the first delivery.
    report: Option<Box<Report>>,
    refused: std::iter::Peekable<std::vec::Drain<'r, (usize, Rejection)>>,
    /// The next delivery's place in the call, and how many there were.
    at: usize,
    count: usize,
    /// The next handed delivery's index in the handler's batch, and how many there were.
    index: usize,
    handed: usize,
}

impl<'r> Spread<'r> {
    fn new<S>(
        result: Result<BatchOutcome, Ended>,
        refused: &'r mut Refused,
        count: usize,
        shared: &Shared<S>,
    ) -> Self {
        let handed = count - refused.len();
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
            refused: refused.drain(..).peekable(),
            at: 0,
            count,
            index: 0,
            handed,
        }
    }
}

impl Iterator for Spread<'_> {
    type Item = Ended;

    #[inline]
    fn next(&mut self) -> Option<Ended> {
        if self.at == self.count {
            return None;
        }
        let at = self.at;
        self.at += 1;
        if let Some((_, rejection)) = self.refused.next_if(|(i, _)| *i == at) {
            return Some((Completion::Rejected(rejection), None));
        }
        let index = self.index;
        self.index += 1;
        Some(match &self.answer {
            Ok(outcome) => match outcome.get(index) {
                Some(given) => (Completion::Outcome(given), None),
                None => {
                    let missing = format!(
                        "the batch handler gave no outcome for message {index} of {}",
                        self.handed
                    );
                    (Completion::Failed(Cause::new(missing)), None)
                }
            },
            Err(failure) => (failure.clone(), self.report.take()),
        })
    }
}

#[cfg(test)]
mod tests {
    use ruststream_core::Settle;

    use super::*;

    fn settled(finished: &[Finished]) -> Vec<Option<Settle>> {
        finished
            .iter()
            .map(|(fate, _)| match fate {
                Fate::Settle(settle) => Some(*settle),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn conclusions_land_in_their_places_in_any_order() {
        let mut finished = Vec::new();
        // A dead letter owed by the third, then the others as the call concludes them,
        // the second last (run again in place).
        put(&mut finished, 2, (Fate::Settle(Settle::DeadLetter), None));
        put(&mut finished, 0, (Fate::Settle(Settle::Ack), None));
        put(&mut finished, 3, (Fate::Settle(Settle::Drop), None));
        put(&mut finished, 1, (Fate::Settle(Settle::Redeliver), None));
        assert_eq!(
            settled(&finished),
            [
                Some(Settle::Ack),
                Some(Settle::Redeliver),
                Some(Settle::DeadLetter),
                Some(Settle::Drop)
            ]
        );
    }
}
