//! NATS: the JetStream table (N1) and retries (N4-N7), the Core table (N2, N3).

use super::*;

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
