//! E4, G4: registrations refused at start, every broken rule listed.

use ruststream::memory::MemoryBroker;
use ruststream::{App, HandlerOutcome, State, on};

use crate::Missing;
use crate::support::always_ack;

async fn needs_state(State(_m): State<Missing>) -> HandlerOutcome {
    HandlerOutcome::ack()
}

#[tokio::test]
async fn e4_refusal_lists_every_broken_rule_of_every_registration() {
    let broker = MemoryBroker::new();
    let app = App::new()
        .register(
            on(broker.topic("a"), always_ack)
                .name("zero")
                .max_attempts(0)
                .lanes(0),
        )
        .register(on(broker.topic("b"), needs_state).name("state"))
        .register(
            on(broker.topic("c"), always_ack)
                .name("loop")
                .dead_letter("c"),
        )
        .register(on(broker.topic("d"), always_ack).name("fine"));
    let err = app.start().await.unwrap_err();
    let ruststream::StartError::Invalid(violations) = &err else {
        panic!("expected a validation error, got {err}");
    };
    let names: Vec<(&str, &str)> = violations
        .iter()
        .map(|v| (v.registration.as_str(), v.address.as_str()))
        .collect();
    assert_eq!(
        names,
        vec![
            ("zero", "a"),
            ("zero", "a"),
            ("state", "b"),
            ("loop", "c"),
            ("loop", "c")
        ]
    );
    let text = err.to_string();
    assert!(text.contains("max_attempts must be at least 1"), "{text}");
    assert!(text.contains("lanes must be at least 1"), "{text}");
    assert!(text.contains("State<memory_e2e::Missing>"), "{text}");
    assert!(text.contains("dead-letter address `c`"), "{text}");
    assert!(!text.contains("fine"), "{text}");
}

/// Issue #46, item 12: a retry address that is also the dead-letter address is refused
/// at start, beside the other rules (SPEC G4, E4).
#[tokio::test]
async fn g4_retry_address_equal_to_dead_letter_is_refused() {
    let broker = MemoryBroker::new();
    let app = App::new()
        .register(
            on(broker.topic("orders"), always_ack)
                .name("same")
                .max_attempts(3)
                .retry_to("orders.parked")
                .dead_letter("orders.parked"),
        )
        .register(
            on(broker.topic("bills"), always_ack)
                .name("apart")
                .max_attempts(3)
                .retry_to("bills.retry")
                .dead_letter("bills.dead"),
        );
    let err = app.validate().unwrap_err();
    let ruststream::StartError::Invalid(violations) = &err else {
        panic!("expected a validation error, got {err}");
    };
    assert_eq!(violations.len(), 1, "{err}");
    assert_eq!(violations[0].registration, "same");
    assert!(
        violations[0]
            .rule
            .contains("`orders.parked` is also the dead-letter address"),
        "{err}"
    );
}
