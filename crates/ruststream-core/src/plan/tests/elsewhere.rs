//! Pulsar settlement (P1, P2) and retries (P4, P5), Redis, and what holds everywhere (E1).

use super::*;

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
        max_in_flight: None,
        ..Declaration::default()
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
