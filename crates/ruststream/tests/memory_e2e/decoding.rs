//! E1: an undecodable payload is dead-lettered unchanged, dropped without a dead letter,
//! or retried under the failure policy.

use std::sync::atomic::{AtomicUsize, Ordering};

use ruststream::core::{Plan, Settle};
use ruststream::memory::MemoryBroker;
use ruststream::middleware::Completion;
use ruststream::testing::TestApp;
use ruststream::{App, FailurePolicy, HandlerOutcome, Message, on};

use crate::support::Order;

static DECODED: AtomicUsize = AtomicUsize::new(0);

async fn counts_decoded(Message(_o): Message<Order>) -> HandlerOutcome {
    DECODED.fetch_add(1, Ordering::SeqCst);
    HandlerOutcome::ack()
}

#[tokio::test(start_paused = true)]
async fn e1_undecodable_payload_goes_to_the_dead_letter_unchanged() {
    let broker = MemoryBroker::recording();
    let app = App::new().register(
        on(broker.topic("orders"), counts_decoded)
            .max_attempts(5)
            .dead_letter("orders.dead"),
    );
    let test = TestApp::recording(app, &broker).await.unwrap();
    test.publisher()
        .to("orders")
        .header("h", "v")
        .send_bytes(&b"{not json"[..])
        .await
        .unwrap();
    test.settled().await;
    assert_eq!(
        DECODED.load(Ordering::SeqCst),
        0,
        "the handler never sees it"
    );
    let dead = test.published("orders.dead");
    assert_eq!(dead.len(), 1);
    assert_eq!(&dead[0].payload[..], b"{not json");
    assert_eq!(dead[0].headers.get_str("h"), Some("v"));
    assert_eq!(test.calls().len(), 1);
    assert!(matches!(
        test.calls()[0].completion,
        Completion::Rejected(_)
    ));
    test.stop().await;
}

#[tokio::test(start_paused = true)]
async fn e1_undecodable_payload_without_dead_letter_is_dropped_not_redelivered() {
    ruststream_test_support::capture_logs("info");
    let broker = MemoryBroker::recording();
    let app = App::new().register(on(broker.topic("orders"), counts_decoded));
    let test = TestApp::recording(app, &broker).await.unwrap();
    test.publisher()
        .to("orders")
        .send_bytes(&b"\xff\xfe"[..])
        .await
        .unwrap();
    test.settled().await;
    let calls = test.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(
        calls[0].plan,
        Plan {
            copy: None,
            settle: Settle::Drop,
            error: None
        }
    );
    test.stop().await;
    // Dropped, not silently: an ERROR naming the address and the decode error.
    let logs = ruststream_test_support::logs();
    let line = logs
        .lines()
        .find(|l| l.contains("ERROR") && l.contains("orders") && l.contains("decode"))
        .unwrap_or_else(|| {
            panic!("no ERROR line naming the address and the decode error:\n{logs}")
        });
    assert!(
        line.contains("expected value"),
        "serde_json's reason: {line}"
    );
}

#[tokio::test(start_paused = true)]
async fn e1_failure_policy_retry_counts_attempts_to_the_dead_letter() {
    let broker = MemoryBroker::recording();
    let app = App::new().register(
        on(broker.topic("orders"), counts_decoded)
            .max_attempts(2)
            .dead_letter("orders.dead")
            .on_failure(FailurePolicy::Retry),
    );
    let test = TestApp::recording(app, &broker).await.unwrap();
    test.publisher()
        .to("orders")
        .send_bytes(&b"[]"[..])
        .await
        .unwrap();
    test.settled().await;
    assert_eq!(test.calls().len(), 2);
    assert_eq!(test.published("orders.dead").len(), 1);
    test.stop().await;
}
