//! The settlement planner: one pure function from (outcome, attempt, declaration,
//! capabilities) to what the driver must do. It does no I/O; transports and the runtime
//! share it so there is one truth about what each outcome becomes.

use std::time::Duration;

use crate::capabilities::{Capabilities, DeadLetters, DelayedRedelivery, Verb};
use crate::declaration::Declaration;
use crate::error::AckError;
use crate::outcome::{HandlerOutcome, OutcomeKind};

#[cfg(test)]
mod tests;

/// What the runtime decided about a delivery, as the planner's input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The handler returned this outcome (errors and panics arrive as `retry()`).
    Outcome(HandlerOutcome),
    /// The delivery cannot be handled at all (an undecodable payload under the default
    /// failure policy): dead-letter it when a dead letter is declared, else drop it.
    Reject,
}

/// The settle operation on the original delivery, performed by the subscription's driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// Send nothing.
    Nothing,
    /// Done (JetStream `+ACK`, Kafka store offset, Pulsar `ack_with_id`).
    Ack,
    /// Done for good, never again (JetStream `+TERM`).
    Drop,
    /// Deliver the same message again now (JetStream `-NAK`, Kafka Tracked seek back,
    /// Kafka Transactional abort of the window, Pulsar `nack_with_id`).
    Redeliver,
    /// Deliver the same message again after the delay (JetStream `-NAK {"delay"}`,
    /// Pulsar: held, then `nack_with_id`).
    RedeliverAfter(Duration),
    /// Move it, exactly as it arrived, to the registration's dead-letter address and
    /// settle it, in one step; only asked of subscriptions whose capabilities say
    /// [`DeadLetters::Subscription`].
    DeadLetter,
}

/// Where a copy of the delivery goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyTarget {
    /// The retry address, with `x-ruststream-retry-count` set to `retry_count`.
    Retry {
        /// The header value the copy carries (the original's count + 1).
        retry_count: u32,
    },
    /// The dead-letter address, exactly as the delivery arrived.
    DeadLetter,
}

/// A copy the runtime publishes (and has confirmed) before the original is settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlannedCopy {
    /// Retry or dead letter.
    pub target: CopyTarget,
    /// How long to wait before publishing (zero: at once).
    pub delay: Duration,
}

/// What the driver does for one delivery: publish the copy (if any) and wait for the
/// broker's confirmation, then settle the original; report `error` (logged, never fatal).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// A copy to publish first.
    pub copy: Option<PlannedCopy>,
    /// The settlement of the original, after the copy is confirmed.
    pub settle: Settle,
    /// What could not be done as asked, for the log.
    pub error: Option<AckError>,
}

impl Plan {
    const fn settle(settle: Settle) -> Self {
        Self {
            copy: None,
            settle,
            error: None,
        }
    }

    const fn refuse(error: AckError) -> Self {
        Self {
            copy: None,
            settle: Settle::Nothing,
            error: Some(error),
        }
    }
}

/// Plans the settlement of one delivery. `attempt` is the delivery's attempt number
/// (1 for the first delivery).
pub fn plan(
    verdict: Verdict,
    attempt: u32,
    declaration: &Declaration,
    capabilities: &Capabilities,
) -> Plan {
    match verdict {
        Verdict::Reject => exhausted(declaration, capabilities),
        Verdict::Outcome(outcome) => match outcome.kind() {
            OutcomeKind::Ack => by_verb(capabilities.ack, Settle::Ack, "ack"),
            OutcomeKind::Drop => by_verb(capabilities.drop, Settle::Drop, "drop"),
            OutcomeKind::Retry { delay } => retry(delay, attempt, declaration, capabilities),
        },
    }
}

/// True when a registration on these capabilities may publish retry copies, and so
/// needs a retry address: `retry_after` has no native form, or `retry()` under a
/// declaration goes through copies because the broker counts nothing.
pub fn may_copy(declaration: &Declaration, capabilities: &Capabilities) -> bool {
    capabilities.dead_letters != DeadLetters::Broker
        && (capabilities.delayed_redelivery == DelayedRedelivery::Unsupported
            || (!capabilities.native_count && declaration.declares_retries()))
}

fn by_verb(verb: Verb, settle: Settle, name: &'static str) -> Plan {
    match verb {
        Verb::Native => Plan::settle(settle),
        Verb::AsAck => Plan::settle(Settle::Ack),
        Verb::Implicit => Plan::settle(Settle::Nothing),
        Verb::Unsupported => Plan::refuse(AckError::Unsupported { verb: name }),
    }
}

fn retry(
    delay: Option<Duration>,
    attempt: u32,
    declaration: &Declaration,
    capabilities: &Capabilities,
) -> Plan {
    if capabilities.dead_letters == DeadLetters::Broker {
        // The broker counts and moves exhausted messages; the runtime only asks again.
        return redeliver(delay, capabilities);
    }
    if declaration.max_attempts.is_some_and(|cap| attempt >= cap) {
        return exhausted(declaration, capabilities);
    }
    if capabilities.native_count && natively_redeliverable(delay, capabilities) {
        return redeliver(delay, capabilities);
    }
    if delay.is_none() && !declaration.declares_retries() {
        return redeliver(None, capabilities);
    }
    copy_to_retry(delay, attempt, declaration, capabilities)
}

fn natively_redeliverable(delay: Option<Duration>, capabilities: &Capabilities) -> bool {
    capabilities.redeliver == Verb::Native
        && (delay.is_none() || capabilities.delayed_redelivery != DelayedRedelivery::Unsupported)
}

fn redeliver(delay: Option<Duration>, capabilities: &Capabilities) -> Plan {
    let Some(delay) = delay else {
        return by_verb(capabilities.redeliver, Settle::Redeliver, "retry");
    };
    match capabilities.delayed_redelivery {
        DelayedRedelivery::Native => Plan::settle(Settle::RedeliverAfter(delay)),
        DelayedRedelivery::Held { limit: Some(limit) } if delay >= limit => {
            Plan::refuse(AckError::DelayTooLong { delay, limit })
        }
        DelayedRedelivery::Held { .. } => Plan::settle(Settle::RedeliverAfter(delay)),
        DelayedRedelivery::Unsupported => Plan::refuse(AckError::Unsupported {
            verb: "retry_after",
        }),
    }
}

fn copy_to_retry(
    delay: Option<Duration>,
    attempt: u32,
    declaration: &Declaration,
    capabilities: &Capabilities,
) -> Plan {
    let verb = if delay.is_some() {
        "retry_after"
    } else {
        "retry"
    };
    if declaration.retry_address.is_none() {
        // Startup validation refuses such registrations; stay total anyway.
        return Plan::refuse(AckError::Unsupported { verb });
    }
    let copy = PlannedCopy {
        target: CopyTarget::Retry {
            retry_count: attempt,
        },
        delay: delay.unwrap_or(Duration::ZERO),
    };
    // The copy carries the work on; the original is done once the copy is confirmed.
    with_copy(copy, by_verb(capabilities.ack, Settle::Ack, verb))
}

fn exhausted(declaration: &Declaration, capabilities: &Capabilities) -> Plan {
    let settle = by_verb(capabilities.drop, Settle::Drop, "drop");
    if declaration.dead_letter.is_none() {
        return settle;
    }
    if capabilities.dead_letters == DeadLetters::Subscription {
        return Plan::settle(Settle::DeadLetter);
    }
    let copy = PlannedCopy {
        target: CopyTarget::DeadLetter,
        delay: Duration::ZERO,
    };
    with_copy(copy, settle)
}

fn with_copy(copy: PlannedCopy, settle: Plan) -> Plan {
    Plan {
        copy: Some(copy),
        ..settle
    }
}
