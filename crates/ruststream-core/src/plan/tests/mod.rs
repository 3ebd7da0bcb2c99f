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
    positions_name_messages: true,
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
    positions_name_messages: true,
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
    positions_name_messages: true,
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
    positions_name_messages: true,
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
    positions_name_messages: true,
};

const D: Duration = Duration::from_millis(250);

fn undeclared(retry_address: Option<&str>) -> Declaration {
    Declaration {
        max_attempts: None,
        dead_letter: None,
        retry_address: retry_address.map(Arc::from),
        handler_timeout: None,
        max_in_flight: None,
        ..Declaration::default()
    }
}

fn capped(max: u32, dead_letter: Option<&str>) -> Declaration {
    Declaration {
        max_attempts: Some(max),
        dead_letter: dead_letter.map(Arc::from),
        retry_address: Some(Arc::from("orders")),
        handler_timeout: None,
        max_in_flight: None,
        ..Declaration::default()
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

/// The runtime plans `ack()` and `drop()` once per registration (at attempt 1) and uses
/// that plan for every delivery: it holds only while neither plan depends on the
/// attempt, on any broker, whatever the declaration.
#[test]
fn ack_and_drop_plans_do_not_depend_on_the_attempt() {
    let brokers = [
        KAFKA_AUTO,
        KAFKA_TRACKED,
        KAFKA_TRANSACTIONAL,
        JETSTREAM,
        CORE,
        PULSAR_SHARED,
        PULSAR_EXCLUSIVE,
        REDIS,
    ];
    let declarations = [
        undeclared(None),
        undeclared(Some("orders.retry")),
        capped(1, None),
        capped(3, Some("orders.dead")),
    ];
    for caps in &brokers {
        for decl in &declarations {
            for outcome in [HandlerOutcome::ack(), HandlerOutcome::drop()] {
                let once = run(outcome, 1, decl, caps);
                assert!(once.copy.is_none(), "{outcome} copies nothing: {caps:?}");
                for attempt in [2, 3, 4, 10, 1_000, u32::MAX] {
                    assert_eq!(
                        run(outcome, attempt, decl, caps),
                        once,
                        "{outcome} at attempt {attempt} on {caps:?} with {decl:?}"
                    );
                }
            }
        }
    }
}

mod elsewhere;
mod kafka;
mod nats;
