//! Kafka: the settlement table (K2, K3, K4, K6) and the retries diagram (K7, K8).

use super::*;

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
        max_in_flight: None,
        ..Declaration::default()
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
