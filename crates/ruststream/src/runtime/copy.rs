//! Publishing retry copies and dead letters, confirmed before the original settles, and
//! what happens to the original when the broker refuses the copy (SPEC G3).

use std::fmt;
use std::time::Duration;

use ruststream_core::{
    Capabilities, CopyTarget, Declaration, DelayedRedelivery, Delivery, Outgoing, PlannedCopy,
    Publish, PublishError, PublishErrorKind, RETRY_COUNT_HEADER, Settle, Verb, Verdict, plan,
};
use tokio::sync::watch;

use super::shared::Shared;
use super::why::{self, Why};
use crate::backoff::{Backoff, REFUSAL_BACKOFF};
use crate::ops::{CopyFailure, Instruments, Published};

/// A transient failure (timeout, lost connection) is tried this often, with these waits
/// between tries, before it counts as a refusal.
const TRIES: u32 = 4;
const TRANSIENT_BACKOFF: Backoff =
    Backoff::exponential(Duration::from_millis(50), Duration::from_secs(2));

/// How long one try of a copy waits for the broker's confirmation: past it the try
/// counts as a timeout (transient), so a broker that never answers (a RabbitMQ memory
/// alarm blocks publishers; a stalled connection) holds no delivery for ever.
pub const COPY_CONFIRM_TIMEOUT: Duration = Duration::from_secs(30);

/// Builds the copy the plan asks for; a dead letter also says why (`why`, its reason cut
/// to `limit` bytes; `None`: exactly as it arrived).
pub(crate) fn outgoing(
    delivery: &Delivery,
    copy: &PlannedCopy,
    declaration: &Declaration,
    (why, limit): (Why<'_>, Option<usize>),
) -> Result<Outgoing, PublishError> {
    let missing = |what: &str| {
        PublishError::new(
            delivery.address(),
            PublishErrorKind::Rejected,
            format!("the registration declares no {what} address"),
        )
    };
    let (address, headers) = match copy.target {
        CopyTarget::DeadLetter => {
            let address = declaration
                .dead_letter
                .as_deref()
                .ok_or_else(|| missing("dead-letter"))?;
            // As it arrived: payload, key and headers unchanged (SPEC N6, K7), the
            // dead-letter headers added beside them (D6).
            let mut headers = delivery.headers().clone();
            why::stamp(&mut headers, delivery, why, limit);
            (address, headers)
        }
        CopyTarget::Retry { retry_count } => {
            let address = declaration
                .retry_address
                .as_deref()
                .ok_or_else(|| missing("retry"))?;
            let mut headers = delivery.headers().clone();
            headers.insert(RETRY_COUNT_HEADER, retry_count.to_string());
            (address, headers)
        }
    };
    let mut copy = Outgoing::new(address, delivery.payload().clone());
    copy.headers = headers;
    copy.key = delivery.key().cloned();
    Ok(copy)
}

/// What becomes of an original whose copy the broker would not take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GiveBack {
    /// The broker redelivers it after a delay (JetStream `-NAK` with delay; Pulsar held).
    RedeliverAfter(Option<Duration>),
    /// The original stays unsettled here while the copy is tried again later (Kafka
    /// `Tracked` and `Transactional`: the position waits).
    Hold,
    /// The read position moves back to it (Kafka `Auto`), after a wait.
    Rewind,
    /// Nothing can bring it back (Core NATS): it is lost, and said so.
    Lost,
}

fn give_back(capabilities: &Capabilities) -> GiveBack {
    match capabilities.delayed_redelivery {
        DelayedRedelivery::Native => GiveBack::RedeliverAfter(None),
        DelayedRedelivery::Held { limit } => GiveBack::RedeliverAfter(limit),
        DelayedRedelivery::Unsupported if capabilities.holds_original => GiveBack::Hold,
        DelayedRedelivery::Unsupported if capabilities.rewinds => GiveBack::Rewind,
        DelayedRedelivery::Unsupported => GiveBack::Lost,
    }
}

/// Waits `delay`, or less when the app is asked to stop; true when the wait ran out.
pub(crate) async fn wait_unless_stopped(stop: &watch::Receiver<bool>, delay: Duration) -> bool {
    let mut stop = stop.clone();
    tokio::select! {
        biased;
        () = tokio::time::sleep(delay) => true,
        _ = stop.wait_for(|stopped| *stopped) => false,
    }
}

/// Publishes the copy and says how to settle the original: as planned once the broker
/// confirmed the copy. When the broker refuses it (SPEC G3), a retry copy too large for
/// the broker goes to the dead letter instead; otherwise the original comes back later
/// with a growing delay where the transport can bring it back, and only where nothing
/// can (Core NATS) is it lost, logged as such.
pub(crate) async fn deliver<S>(
    shared: &Shared<S>,
    delivery: &Delivery,
    mut copy: PlannedCopy,
    mut planned: Settle,
    reason: &(dyn fmt::Display + Sync),
) -> Settle {
    let mut held = 0;
    // Made only for a dead letter; shortened, then left out, when it makes one too large.
    let outcome = reason;
    let mut reason = (copy.target == CopyTarget::DeadLetter).then(|| outcome.to_string());
    let mut limit = Some(why::REASON_LIMIT);
    loop {
        let why = Why {
            reason: reason.as_deref().unwrap_or_default(),
            registration: &shared.registration,
            stream_sequence: shared.stream_sequence,
        };
        let result = match outgoing(delivery, &copy, &shared.declaration, (why, limit)) {
            Ok(message) => {
                publish_with_tries(shared.copies.as_ref(), message, shared.metrics.as_ref()).await
            }
            Err(e) => Err(e),
        };
        let error = match result {
            Ok(()) => {
                shared.refusals.confirmed(delivery);
                let dead_letter = copy.target == CopyTarget::DeadLetter;
                if let (Some(metrics), false) = (&shared.metrics, dead_letter) {
                    metrics.published(Published::RetryCopy);
                }
                if dead_letter {
                    dead_lettered(shared, Some(delivery));
                }
                return planned;
            }
            Err(error) => error,
        };
        if error.kind() == PublishErrorKind::TooLarge
            && copy.target == CopyTarget::DeadLetter
            && limit.is_some()
        {
            // What the dead letter says about itself made it too large: a short reason,
            // then none (the message as it arrived fits where it came from).
            let long = reason.as_ref().is_some_and(|r| r.len() > why::SHORT_REASON);
            limit = limit
                .filter(|l| *l > why::SHORT_REASON && long)
                .map(|_| why::SHORT_REASON);
            continue;
        }
        if let Some(metrics) = &shared.metrics {
            metrics.copy_failed(match give_back(&shared.capabilities) {
                GiveBack::Lost => CopyFailure::Lost,
                _ => CopyFailure::Refused,
            });
        }
        if let Some(settle) = too_large_to_retry(shared, delivery, &copy, &error) {
            (copy, planned) = (DEAD_LETTER_NOW, settle);
            reason = Some(format!(
                "{outcome}; the retry copy was too large for the broker: {error}"
            ));
            continue;
        }
        let refused = Refused {
            delivery,
            copy: &copy,
            error: &error,
        };
        if let Some(settle) = refused.give_back(shared, planned, &mut held).await {
            return settle;
        }
    }
}

/// A dead letter published at once.
const DEAD_LETTER_NOW: PlannedCopy = PlannedCopy {
    target: CopyTarget::DeadLetter,
    delay: Duration::ZERO,
};

/// A retry copy the retry header made too large for the broker, under a declared dead
/// letter: the message as it arrived fits where it came from, so it goes to the dead
/// letter instead; how the original then settles.
fn too_large_to_retry<S>(
    shared: &Shared<S>,
    delivery: &Delivery,
    copy: &PlannedCopy,
    error: &PublishError,
) -> Option<Settle> {
    if error.kind() != PublishErrorKind::TooLarge
        || !matches!(copy.target, CopyTarget::Retry { .. })
        || shared.declaration.dead_letter.is_none()
    {
        return None;
    }
    let attempt = delivery.attempt().number();
    tracing::warn!(
        registration = &*shared.registration,
        address = delivery.address(),
        attempt,
        %error,
        "the retry copy is too large for the broker; dead-lettering the message as it arrived"
    );
    let reject = plan(
        Verdict::Reject,
        attempt,
        &shared.declaration,
        &shared.capabilities,
    );
    Some(reject.settle)
}

/// A dead letter the broker confirmed, whoever made it (a runtime copy of `delivery`, or
/// the subscription's one-step move, as on Redis): counted and said once, only now.
#[cold]
pub(crate) fn dead_lettered<S>(shared: &Shared<S>, delivery: Option<&Delivery>) {
    if let Some(metrics) = &shared.metrics {
        metrics.published(Published::DeadLetter);
    }
    tracing::warn!(
        registration = &*shared.registration,
        address = delivery.map(Delivery::address),
        attempt = delivery.map(|d| d.attempt().number()),
        destination = shared.declaration.dead_letter.as_deref(),
        "dead-lettered"
    );
}

/// A copy the broker refused, and the original it was made from.
struct Refused<'a> {
    delivery: &'a Delivery,
    copy: &'a PlannedCopy,
    error: &'a PublishError,
}

impl Refused<'_> {
    /// What becomes of the original, by what the transport can do (G3); `None` when the
    /// copy is to be tried again (the original held meanwhile).
    async fn give_back<S>(
        &self,
        shared: &Shared<S>,
        planned: Settle,
        held: &mut u32,
    ) -> Option<Settle> {
        let (registration, delivery, error) = (&*shared.registration, self.delivery, self.error);
        let address = delivery.address();
        let attempt = delivery.attempt().number();
        let dead_letter = self.copy.target == CopyTarget::DeadLetter;
        let what = if dead_letter {
            "dead letter"
        } else {
            "retry copy"
        };
        match give_back(&shared.capabilities) {
            GiveBack::RedeliverAfter(limit) => {
                let mut wait = REFUSAL_BACKOFF.delay(shared.refusals.in_a_row(
                    delivery,
                    dead_letter,
                    shared.declaration.max_attempts,
                ));
                if let Some(limit) = limit {
                    wait = wait.min(limit.saturating_sub(Duration::from_millis(100)));
                }
                tracing::error!(
                    registration, address, attempt, %error, comes_back_in = ?wait,
                    "the broker refused the {what}; the original comes back later"
                );
                Some(Settle::RedeliverAfter(wait))
            }
            GiveBack::Hold => {
                *held += 1;
                let wait = REFUSAL_BACKOFF.delay(*held);
                tracing::error!(
                    registration, address, attempt, %error, tries = *held, next_try_in = ?wait,
                    "the broker refused the {what}; the original is held unsettled and the {what} tried again later"
                );
                // Stopping: unsettled, the broker brings it back after the restart.
                (!wait_unless_stopped(&shared.stop, wait).await).then_some(Settle::Nothing)
            }
            GiveBack::Rewind => {
                let wait = REFUSAL_BACKOFF.delay(shared.refusals.refused(delivery, dead_letter));
                tracing::error!(
                    registration, address, attempt, %error, read_again_in = ?wait,
                    "the broker refused the {what}; the original will be read again"
                );
                // A stop cuts the wait: the position still moves back before the close.
                wait_unless_stopped(&shared.stop, wait).await;
                Some(Settle::Redeliver)
            }
            GiveBack::Lost => {
                tracing::error!(
                    registration,
                    address,
                    attempt,
                    destination = error.address(),
                    reason = %error.kind(),
                    %error,
                    "the broker refused the {what} and nothing can bring the original back: the message is lost"
                );
                Some(if shared.capabilities.redeliver == Verb::Native {
                    Settle::Redeliver
                } else {
                    planned
                })
            }
        }
    }
}

async fn publish_with_tries(
    publisher: &dyn Publish,
    message: Outgoing,
    metrics: Option<&Instruments>,
) -> Result<(), PublishError> {
    let mut tried = 1;
    loop {
        let confirmed =
            tokio::time::timeout(COPY_CONFIRM_TIMEOUT, publisher.publish(message.clone()))
                .await
                .unwrap_or_else(|_| {
                    Err(PublishError::new(
                        &message.address,
                        PublishErrorKind::Timeout,
                        format!("no confirmation within {COPY_CONFIRM_TIMEOUT:?}"),
                    ))
                });
        match confirmed {
            Ok(()) => return Ok(()),
            Err(e) if !e.kind().is_transient() || tried >= TRIES => return Err(e),
            Err(e) => {
                if let Some(metrics) = metrics {
                    metrics.copy_failed(CopyFailure::Transient);
                }
                tracing::warn!(address = %message.address, error = %e, tried, "copy not confirmed; trying again");
                tokio::time::sleep(TRANSIENT_BACKOFF.delay(tried)).await;
                tried += 1;
            }
        }
    }
}
