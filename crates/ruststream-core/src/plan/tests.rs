//! One test per row of the seeds' tables and diagrams, named by the SPEC id it checks.
//! The capability sets here are the ones the transports declare; each transport's own
//! tests check that it declares exactly these.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::capabilities::{Capabilities, DeadLetters, DelayedRedelivery, Verb};

const KAFKA_AUTO: Capabilities = Capabilities {
    ack: Verb::Implicit,
    drop: Verb::Implicit,
    redeliver: Verb::Unsupported,
    delayed_redelivery: DelayedRedelivery::Unsupported,
    native_count: false,
    dead_letters: DeadLetters::Runtime,
    holds_original: false,
    redeliver_in_place: false,
    rewinds: false,
};
const KAFKA_TRACKED: Capabilities = Capabilities {
    ack: Verb::Native,
    drop: Verb::AsAck,
    redeliver: Verb::Native,
    delayed_redelivery: DelayedRedelivery::Unsupported,
    native_count: false,
    dead_letters: DeadLetters::Runtime,
    holds_original: true,
    redeliver_in_place: true,
    rewinds: false,
};
// Transactional settles like Tracked; its `Redeliver` aborts the open window.
const KAFKA_TRANSACTIONAL: Capabilities = KAFKA_TRACKED;
const JETSTREAM: Capabilities = Capabilities {
    ack: Verb::Native,
    drop: Verb::Native,
    redeliver: Verb::Native,
    delayed_redelivery: DelayedRedelivery::Native,
    native_count: true,
    dead_letters: DeadLetters::Runtime,
    holds_original: true,
    redeliver_in_place: false,
    rewinds: false,
};
const CORE: Capabilities = Capabilities::NOTHING;
const PULSAR_SHARED: Capabilities = Capabilities {
    ack: Verb::Native,
    drop: Verb::AsAck,
    redeliver: Verb::Native,
    delayed_redelivery: DelayedRedelivery::Held {
        limit: Some(Duration::from_secs(30)),
    },
    native_count: true,
    dead_letters: DeadLetters::Broker,
    holds_original: true,
    redeliver_in_place: false,
    rewinds: false,
};
const PULSAR_EXCLUSIVE: Capabilities = Capabilities {
    native_count: false,
    ..PULSAR_SHARED
};

const REDIS: Capabilities = Capabilities {
    ack: Verb::Native,
    drop: Verb::Native,
    redeliver: Verb::Native,
    delayed_redelivery: DelayedRedelivery::Held { limit: None },
    native_count: true,
    dead_letters: DeadLetters::Subscription,
    holds_original: true,
    redeliver_in_place: false,
    rewinds: false,
};

const D: Duration = Duration::from_millis(250);

fn undeclared(retry_address: Option<&str>) -> Declaration {
    Declaration {
        max_attempts: None,
        dead_letter: None,
        retry_address: retry_address.map(Arc::from),
        handler_timeout: None,
    }
}

fn capped(max: u32, dead_letter: Option<&str>) -> Declaration {
    Declaration {
        max_attempts: Some(max),
        dead_letter: dead_letter.map(Arc::from),
        retry_address: Some(Arc::from("orders")),
        handler_timeout: None,
    }
}

fn run(outcome: HandlerOutcome, attempt: u32, decl: &Declaration, caps: &Capabilities) -> Plan {
    plan(Verdict::Outcome(outcome), attempt, decl, caps)
}

fn settle_only(settle: Settle) -> Plan {
    Plan {
        copy: None,
        settle,
        error: None,
    }
}

fn unsupported(verb: &'static str) -> Plan {
    Plan {
        copy: None,
        settle: Settle::Nothing,
        error: Some(AckError::Unsupported { verb }),
    }
}

fn retry_copy(retry_count: u32, delay: Duration, settle: Settle) -> Plan {
    Plan {
        copy: Some(PlannedCopy {
            target: CopyTarget::Retry { retry_count },
            delay,
        }),
        settle,
        error: None,
    }
}

fn dead_letter_then(settle: Settle) -> Plan {
    Plan {
        copy: Some(PlannedCopy {
            target: CopyTarget::DeadLetter,
            delay: Duration::ZERO,
        }),
        settle,
        error: None,
    }
}

// ---- Kafka settlement table (K2, K3, K4, K6) ----

#[test]
fn k2_auto_ack_does_nothing() {
    let d = undeclared(Some("orders"));
    assert_eq!(
        run(HandlerOutcome::ack(), 1, &d, &KAFKA_AUTO),
        settle_only(Settle::Nothing)
    );
}

#[test]
fn k2_auto_drop_does_nothing() {
    let d = undeclared(Some("orders"));
    assert_eq!(
        run(HandlerOutcome::drop(), 1, &d, &KAFKA_AUTO),
        settle_only(Settle::Nothing)
    );
}

#[test]
fn k2_auto_retry_without_declaration_is_unsupported() {
    let d = undeclared(Some("orders"));
    assert_eq!(
        run(HandlerOutcome::retry(), 1, &d, &KAFKA_AUTO),
        unsupported("retry")
    );
}

#[test]
fn k3_tracked_ack_settles_the_offset() {
    let d = undeclared(Some("orders"));
    assert_eq!(
        run(HandlerOutcome::ack(), 1, &d, &KAFKA_TRACKED),
        settle_only(Settle::Ack)
    );
}

#[test]
fn k3_tracked_drop_settles_the_offset_as_ack() {
    let d = undeclared(Some("orders"));
    assert_eq!(
        run(HandlerOutcome::drop(), 1, &d, &KAFKA_TRACKED),
        settle_only(Settle::Ack)
    );
}

#[test]
fn k4_tracked_retry_delivers_again() {
    let d = undeclared(Some("orders"));
    assert_eq!(
        run(HandlerOutcome::retry(), 1, &d, &KAFKA_TRACKED),
        settle_only(Settle::Redeliver)
    );
}

#[test]
fn k6_transactional_ack_settles_for_the_next_window() {
    let d = undeclared(Some("orders"));
    assert_eq!(
        run(HandlerOutcome::ack(), 1, &d, &KAFKA_TRANSACTIONAL),
        settle_only(Settle::Ack)
    );
}

#[test]
fn k6_transactional_drop_settles_as_ack() {
    let d = undeclared(Some("orders"));
    assert_eq!(
        run(HandlerOutcome::drop(), 1, &d, &KAFKA_TRANSACTIONAL),
        settle_only(Settle::Ack)
    );
}

#[test]
fn k6_transactional_retry_aborts_the_window() {
    let d = undeclared(Some("orders"));
    assert_eq!(
        run(HandlerOutcome::retry(), 1, &d, &KAFKA_TRANSACTIONAL),
        settle_only(Settle::Redeliver)
    );
}

// ---- Kafka retries diagram (K7) ----

#[test]
fn k7_retry_after_below_cap_copies_to_topic() {
    let d = capped(3, Some("orders.dlq"));
    assert_eq!(
        run(HandlerOutcome::retry_after(D), 1, &d, &KAFKA_TRACKED),
        retry_copy(1, D, Settle::Ack)
    );
    assert_eq!(
        run(HandlerOutcome::retry_after(D), 1, &d, &KAFKA_AUTO),
        retry_copy(1, D, Settle::Nothing)
    );
}

#[test]
fn k7_retry_after_without_declaration_still_copies_in_every_mode() {
    let d = undeclared(Some("orders"));
    for caps in [KAFKA_AUTO, KAFKA_TRACKED, KAFKA_TRANSACTIONAL] {
        let p = run(HandlerOutcome::retry_after(D), 1, &d, &caps);
        assert_eq!(
            p.copy,
            Some(PlannedCopy {
                target: CopyTarget::Retry { retry_count: 1 },
                delay: D
            })
        );
        assert_eq!(p.error, None);
    }
}

#[test]
fn k7_declared_retry_below_cap_copies_at_once_with_count_one_higher() {
    let d = capped(5, None);
    // attempt 3 arrived with header 2: the copy carries 3.
    assert_eq!(
        run(HandlerOutcome::retry(), 3, &d, &KAFKA_AUTO),
        retry_copy(3, Duration::ZERO, Settle::Nothing)
    );
    assert_eq!(
        run(HandlerOutcome::retry(), 3, &d, &KAFKA_TRACKED),
        retry_copy(3, Duration::ZERO, Settle::Ack)
    );
}

#[test]
fn k7_dead_letter_alone_puts_retry_on_the_copy_path() {
    let d = Declaration {
        max_attempts: None,
        dead_letter: Some(Arc::from("orders.dlq")),
        retry_address: Some(Arc::from("orders")),
        handler_timeout: None,
    };
    assert_eq!(
        run(HandlerOutcome::retry(), 7, &d, &KAFKA_AUTO),
        retry_copy(7, Duration::ZERO, Settle::Nothing)
    );
}

#[test]
fn k7_at_cap_copies_to_dead_letter_topic() {
    let d = capped(3, Some("orders.dlq"));
    assert_eq!(
        run(HandlerOutcome::retry(), 3, &d, &KAFKA_TRACKED),
        dead_letter_then(Settle::Ack)
    );
    assert_eq!(
        run(HandlerOutcome::retry_after(D), 3, &d, &KAFKA_AUTO),
        dead_letter_then(Settle::Nothing)
    );
}

#[test]
fn k7_at_cap_without_dead_letter_settles_and_copies_nothing() {
    let d = capped(3, None);
    assert_eq!(
        run(HandlerOutcome::retry(), 3, &d, &KAFKA_TRACKED),
        settle_only(Settle::Ack)
    );
    assert_eq!(
        run(HandlerOutcome::retry(), 4, &d, &KAFKA_AUTO),
        settle_only(Settle::Nothing)
    );
}

#[test]
fn k7_transactional_declared_retry_copies_instead_of_aborting() {
    let d = capped(3, Some("orders.dlq"));
    assert_eq!(
        run(HandlerOutcome::retry(), 1, &d, &KAFKA_TRANSACTIONAL),
        retry_copy(1, Duration::ZERO, Settle::Ack)
    );
}

#[test]
fn k8_copy_without_retry_address_is_refused_not_lost() {
    let d = undeclared(None);
    assert_eq!(
        run(HandlerOutcome::retry_after(D), 1, &d, &KAFKA_TRACKED),
        unsupported("retry_after")
    );
    assert!(may_copy(&d, &KAFKA_TRACKED));
}

// ---- NATS JetStream table (N1) and retries (N4-N7) ----

#[test]
fn n1_ack_sends_plus_ack() {
    let d = undeclared(Some("orders"));
    assert_eq!(
        run(HandlerOutcome::ack(), 1, &d, &JETSTREAM),
        settle_only(Settle::Ack)
    );
}

#[test]
fn n1_retry_sends_nak() {
    let d = undeclared(Some("orders"));
    assert_eq!(
        run(HandlerOutcome::retry(), 1, &d, &JETSTREAM),
        settle_only(Settle::Redeliver)
    );
}

#[test]
fn n1_retry_after_sends_nak_with_delay_and_no_copy() {
    let d = undeclared(Some("orders"));
    assert_eq!(
        run(HandlerOutcome::retry_after(D), 1, &d, &JETSTREAM),
        settle_only(Settle::RedeliverAfter(D))
    );
}

#[test]
fn n1_drop_sends_term() {
    let d = undeclared(Some("orders"));
    assert_eq!(
        run(HandlerOutcome::drop(), 1, &d, &JETSTREAM),
        settle_only(Settle::Drop)
    );
}

#[test]
fn n5_jetstream_below_cap_naks_with_delay() {
    let d = capped(3, Some("orders.dlq"));
    assert_eq!(
        run(HandlerOutcome::retry_after(D), 2, &d, &JETSTREAM),
        settle_only(Settle::RedeliverAfter(D))
    );
    assert_eq!(
        run(HandlerOutcome::retry(), 2, &d, &JETSTREAM),
        settle_only(Settle::Redeliver)
    );
}

#[test]
fn n6_jetstream_at_cap_dead_letters_then_terminates() {
    let d = capped(3, Some("orders.dlq"));
    assert_eq!(
        run(HandlerOutcome::retry(), 3, &d, &JETSTREAM),
        dead_letter_then(Settle::Drop)
    );
}

#[test]
fn n6_jetstream_at_cap_without_dead_letter_terminates() {
    let d = capped(3, None);
    assert_eq!(
        run(HandlerOutcome::retry_after(D), 3, &d, &JETSTREAM),
        settle_only(Settle::Drop)
    );
}

#[test]
fn n7_jetstream_never_copies() {
    let d = capped(3, Some("orders.dlq"));
    assert!(!may_copy(&d, &JETSTREAM));
}

// ---- NATS Core table (N2, N3) and retries (N5, N6) ----

#[test]
fn n2_core_ack_is_unsupported() {
    let d = undeclared(Some("orders"));
    assert_eq!(run(HandlerOutcome::ack(), 1, &d, &CORE), unsupported("ack"));
}

#[test]
fn n2_core_drop_is_unsupported() {
    let d = undeclared(Some("orders"));
    assert_eq!(
        run(HandlerOutcome::drop(), 1, &d, &CORE),
        unsupported("drop")
    );
}

#[test]
fn n2_core_retry_without_declaration_is_unsupported() {
    let d = undeclared(Some("orders"));
    assert_eq!(
        run(HandlerOutcome::retry(), 1, &d, &CORE),
        unsupported("retry")
    );
}

#[test]
fn n3_core_declared_retry_is_unsupported_and_copies_at_once() {
    let d = capped(3, None);
    let p = run(HandlerOutcome::retry(), 1, &d, &CORE);
    assert_eq!(
        p.copy,
        Some(PlannedCopy {
            target: CopyTarget::Retry { retry_count: 1 },
            delay: Duration::ZERO
        })
    );
    assert_eq!(p.settle, Settle::Nothing);
    assert_eq!(p.error, Some(AckError::Unsupported { verb: "retry" }));
}

#[test]
fn n3_core_retry_after_copies_after_the_delay() {
    let d = undeclared(Some("orders"));
    let p = run(HandlerOutcome::retry_after(D), 1, &d, &CORE);
    assert_eq!(
        p.copy,
        Some(PlannedCopy {
            target: CopyTarget::Retry { retry_count: 1 },
            delay: D
        })
    );
    assert_eq!(p.settle, Settle::Nothing);
    // Every outcome on Core reports Unsupported: the server settles nothing.
    assert_eq!(
        p.error,
        Some(AckError::Unsupported {
            verb: "retry_after"
        })
    );
}

#[test]
fn n5_core_below_cap_copies_to_the_retry_address() {
    let d = capped(3, Some("orders.dlq"));
    let p = run(HandlerOutcome::retry_after(D), 2, &d, &CORE);
    assert_eq!(
        p.copy,
        Some(PlannedCopy {
            target: CopyTarget::Retry { retry_count: 2 },
            delay: D
        })
    );
}

#[test]
fn n5_core_wildcard_without_retry_address_may_copy_so_needs_one() {
    assert!(may_copy(&undeclared(None), &CORE));
}

#[test]
fn n6_core_at_cap_publishes_dead_letter() {
    let d = capped(3, Some("orders.dlq"));
    let p = run(HandlerOutcome::retry(), 3, &d, &CORE);
    assert_eq!(
        p.copy,
        Some(PlannedCopy {
            target: CopyTarget::DeadLetter,
            delay: Duration::ZERO
        })
    );
    assert_eq!(p.settle, Settle::Nothing);
}

#[test]
fn n6_core_at_cap_without_dead_letter_lets_it_go() {
    let d = capped(3, None);
    let p = run(HandlerOutcome::retry(), 3, &d, &CORE);
    assert_eq!(p.copy, None);
    assert_eq!(p.settle, Settle::Nothing);
}

// ---- Pulsar settlement (P1, P2) and retries (P4, P5) ----

#[test]
fn p1_ack_is_ack_with_id() {
    let d = undeclared(None);
    assert_eq!(
        run(HandlerOutcome::ack(), 1, &d, &PULSAR_SHARED),
        settle_only(Settle::Ack)
    );
}

#[test]
fn p1_drop_is_ack_with_id_too() {
    let d = undeclared(None);
    assert_eq!(
        run(HandlerOutcome::drop(), 1, &d, &PULSAR_SHARED),
        settle_only(Settle::Ack)
    );
}

#[test]
fn p1_retry_is_nack_with_id() {
    let d = undeclared(None);
    assert_eq!(
        run(HandlerOutcome::retry(), 1, &d, &PULSAR_SHARED),
        settle_only(Settle::Redeliver)
    );
}

#[test]
fn p1_retry_after_holds_then_nacks() {
    let d = undeclared(None);
    assert_eq!(
        run(HandlerOutcome::retry_after(D), 1, &d, &PULSAR_SHARED),
        settle_only(Settle::RedeliverAfter(D))
    );
}

#[test]
fn p2_delay_not_shorter_than_ack_timeout_is_refused() {
    let d = undeclared(None);
    let limit = Duration::from_secs(30);
    assert_eq!(
        run(HandlerOutcome::retry_after(limit), 1, &d, &PULSAR_SHARED),
        Plan {
            copy: None,
            settle: Settle::Nothing,
            error: Some(AckError::DelayTooLong {
                delay: limit,
                limit
            }),
        }
    );
}

#[test]
fn p4_exclusive_retry_nacks_at_count_zero() {
    let d = undeclared(None);
    assert_eq!(
        run(HandlerOutcome::retry(), 1, &d, &PULSAR_EXCLUSIVE),
        settle_only(Settle::Redeliver)
    );
}

#[test]
fn p5_broker_dead_letter_policy_means_the_runtime_only_nacks() {
    let d = Declaration {
        max_attempts: Some(3),
        dead_letter: Some(Arc::from("orders-dlq")),
        retry_address: None,
        handler_timeout: None,
    };
    // Even at the cap the client's policy, not the runtime, moves the message.
    assert_eq!(
        run(HandlerOutcome::retry(), 3, &d, &PULSAR_SHARED),
        settle_only(Settle::Redeliver)
    );
    assert!(!may_copy(&d, &PULSAR_SHARED));
}

// ---- Everywhere (E1) ----

#[test]
fn e1_undecodable_goes_to_the_dead_letter() {
    let d = capped(3, Some("orders.dlq"));
    assert_eq!(
        plan(Verdict::Reject, 1, &d, &JETSTREAM),
        dead_letter_then(Settle::Drop)
    );
    assert_eq!(
        plan(Verdict::Reject, 1, &d, &KAFKA_TRACKED),
        dead_letter_then(Settle::Ack)
    );
}

#[test]
fn e1_undecodable_without_dead_letter_is_dropped() {
    let d = undeclared(Some("orders"));
    assert_eq!(
        plan(Verdict::Reject, 1, &d, &JETSTREAM),
        settle_only(Settle::Drop)
    );
    assert_eq!(
        plan(Verdict::Reject, 1, &d, &PULSAR_SHARED),
        settle_only(Settle::Ack)
    );
}

#[test]
fn s4_redis_retries_are_claims_never_copies() {
    let d = capped(5, Some("orders.dead"));
    assert_eq!(
        run(HandlerOutcome::retry(), 1, &d, &REDIS),
        settle_only(Settle::Redeliver)
    );
    assert_eq!(
        run(HandlerOutcome::retry_after(D), 4, &d, &REDIS),
        settle_only(Settle::RedeliverAfter(D))
    );
    assert!(!may_copy(&d, &REDIS));
}

#[test]
fn s6_at_the_cap_and_when_undecodable_the_subscription_moves_and_settles_in_one_step() {
    let d = capped(3, Some("orders.dead"));
    assert_eq!(
        run(HandlerOutcome::retry(), 3, &d, &REDIS),
        settle_only(Settle::DeadLetter)
    );
    assert_eq!(
        plan(Verdict::Reject, 1, &d, &REDIS),
        settle_only(Settle::DeadLetter)
    );
    // Without a dead letter: dropped (XACK), as everywhere.
    assert_eq!(
        run(HandlerOutcome::retry(), 3, &capped(3, None), &REDIS),
        settle_only(Settle::Drop)
    );
}
