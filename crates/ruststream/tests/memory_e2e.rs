//! End-to-end behaviour on the memory broker, through the production runtime.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ruststream::core::{Plan, Settle};
use ruststream::memory::MemoryBroker;
use ruststream::middleware::Completion;
use ruststream::testing::TestApp;
use ruststream::{
    App, FailurePolicy, HandlerOutcome, Headers, Message, Meta, Payload, Publisher,
    RETRY_COUNT_HEADER, State, on,
};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct Order {
    id: u64,
    key: String,
}

async fn always_ack(Message(_o): Message<Order>) -> HandlerOutcome {
    HandlerOutcome::ack()
}

async fn always_retry(Message(_o): Message<Order>) -> HandlerOutcome {
    HandlerOutcome::retry()
}

fn order(id: u64) -> Order {
    Order {
        id,
        key: format!("k{}", id % 8),
    }
}

#[tokio::test(start_paused = true)]
async fn ack_is_handled_once_and_settled() {
    let broker = MemoryBroker::recording();
    let app = App::new().register(on(broker.topic("orders"), always_ack));
    let test = TestApp::recording(app, &broker).await.unwrap();
    test.publish("orders", &order(1)).await;
    test.settled().await;
    let calls = test.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(
        calls[0].completion,
        Completion::Outcome(HandlerOutcome::ack())
    );
    assert_eq!(calls[0].plan.settle, Settle::Ack);
    assert_eq!(broker.depth("orders", "default"), 0);
    test.stop().await;
}

async fn retry_three_times_then_dead_letter(runtime_retries: bool) {
    let broker = MemoryBroker::recording();
    let topic = broker.topic("orders");
    let topic = if runtime_retries {
        topic.runtime_retries()
    } else {
        topic
    };
    let app = App::new().register(
        on(topic, always_retry)
            .name("orders")
            .max_attempts(3)
            .dead_letter("orders.dead"),
    );
    let test = TestApp::recording(app, &broker).await.unwrap();
    test.publisher()
        .to("orders")
        .key("k1")
        .header("trace", "abc")
        .send(&order(7))
        .await
        .unwrap();
    test.settled().await;

    let calls = test.calls_of("orders");
    assert_eq!(
        calls.len(),
        3,
        "the handler runs exactly max_attempts times"
    );
    assert_eq!(
        calls.iter().map(|c| c.attempt).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    let dead = test.published("orders.dead");
    assert_eq!(dead.len(), 1, "exactly one dead letter");
    let original = &test.published("orders")[0];
    assert_eq!(dead[0].payload, original.payload);
    assert_eq!(dead[0].key, original.key);
    assert_eq!(dead[0].headers.get_str("trace"), Some("abc"));
    // The dead letter is the last attempt as it arrived, with what says why beside it
    // under its own prefix (D6).
    let own: Vec<(&str, &[u8])> = dead[0]
        .headers
        .iter()
        .filter(|(name, _)| !name.starts_with(ruststream::core::DEAD_LETTER_PREFIX))
        .map(|(name, value)| (name, &value[..]))
        .collect();
    let arrived: Vec<(&str, &[u8])> = calls[2]
        .headers
        .iter()
        .map(|(name, value)| (name, &value[..]))
        .collect();
    assert_eq!(own, arrived);
    assert_eq!(
        dead[0]
            .headers
            .get_str(ruststream::core::DEAD_LETTER_ATTEMPTS),
        Some("3")
    );
    assert_eq!(broker.depth("orders", "default"), 0);
    test.stop().await;
}

#[tokio::test(start_paused = true)]
async fn n6_retry_under_cap_runs_three_times_then_one_dead_letter_native_count() {
    retry_three_times_then_dead_letter(false).await;
}

#[tokio::test(start_paused = true)]
async fn k7_retry_under_cap_dead_letters_after_three_runs_with_header_count() {
    retry_three_times_then_dead_letter(true).await;
}

#[tokio::test(start_paused = true)]
async fn k7_d4_copies_carry_the_retry_count_absent_one_two() {
    let broker = MemoryBroker::recording();
    let app = App::new().register(
        on(broker.topic("orders").runtime_retries(), always_retry)
            .max_attempts(3)
            .dead_letter("orders.dead"),
    );
    let test = TestApp::recording(app, &broker).await.unwrap();
    test.publish("orders", &order(1)).await;
    test.settled().await;
    let seen: Vec<Option<String>> = test
        .calls()
        .iter()
        .map(|c| c.headers.get_str(RETRY_COUNT_HEADER).map(str::to_owned))
        .collect();
    assert_eq!(seen, vec![None, Some("1".into()), Some("2".into())]);
    // Two copies were published to the retry address besides the original.
    assert_eq!(test.published("orders").len(), 3);
    test.stop().await;
}

async fn delayed_once(Meta { attempt, .. }: Meta) -> HandlerOutcome {
    if attempt.number() == 1 {
        HandlerOutcome::retry_after(Duration::from_secs(5))
    } else {
        HandlerOutcome::ack()
    }
}

async fn retry_after_waits(runtime_retries: bool) {
    let broker = MemoryBroker::recording();
    let topic = broker.topic("orders");
    let topic = if runtime_retries {
        topic.runtime_retries()
    } else {
        topic
    };
    let app = App::new().register(on(topic, delayed_once));
    let test = TestApp::recording(app, &broker).await.unwrap();
    test.publish("orders", &order(1)).await;
    test.settled().await;
    let calls = test.calls();
    assert_eq!(calls.len(), 2);
    assert!(
        calls[1].at - calls[0].at >= Duration::from_secs(5),
        "redelivered after {:?}",
        calls[1].at - calls[0].at
    );
    test.stop().await;
}

#[tokio::test(start_paused = true)]
async fn n1_retry_after_is_redelivered_no_earlier_than_the_delay_native() {
    retry_after_waits(false).await;
}

#[tokio::test(start_paused = true)]
async fn k7_retry_after_copy_is_published_no_earlier_than_the_delay() {
    retry_after_waits(true).await;
}

#[derive(Default)]
struct Seen {
    by_key: Mutex<HashMap<String, Vec<u64>>>,
    running: AtomicUsize,
    most_at_once: AtomicUsize,
}

async fn record_order(Message(o): Message<Order>, State(seen): State<Seen>) -> HandlerOutcome {
    let now = seen.running.fetch_add(1, Ordering::SeqCst) + 1;
    seen.most_at_once.fetch_max(now, Ordering::SeqCst);
    // Different keys take different times, so lanes overtake each other.
    tokio::time::sleep(Duration::from_millis(1 + o.id % 5)).await;
    seen.by_key
        .lock()
        .unwrap()
        .entry(o.key.clone())
        .or_default()
        .push(o.id);
    seen.running.fetch_sub(1, Ordering::SeqCst);
    HandlerOutcome::ack()
}

#[tokio::test(start_paused = true)]
async fn lanes_keep_per_key_order_under_concurrent_load() {
    let broker = MemoryBroker::recording();
    let seen = Arc::new(Seen::default());
    let app = App::new()
        .state(SeenHandle(Arc::clone(&seen)))
        .register(on(broker.topic("orders"), record_order_handle).lanes(4));
    let test = TestApp::start(app, &broker).await.unwrap();
    let publisher = test.publisher();
    for id in 0..400u64 {
        let o = order(id);
        publisher
            .to("orders")
            .key(o.key.clone())
            .send(&o)
            .await
            .unwrap();
    }
    test.settled().await;
    let by_key = seen.by_key.lock().unwrap().clone();
    assert_eq!(by_key.values().map(Vec::len).sum::<usize>(), 400);
    for (key, ids) in by_key.iter() {
        assert!(
            ids.windows(2).all(|w| w[0] < w[1]),
            "key {key} out of order: {ids:?}"
        );
    }
    let most = seen.most_at_once.load(Ordering::SeqCst);
    assert!(most > 1 && most <= 4, "ran {most} at once with 4 lanes");
    test.stop().await;
}

struct SeenHandle(Arc<Seen>);

async fn record_order_handle(m: Message<Order>, State(h): State<SeenHandle>) -> HandlerOutcome {
    record_order(m, State(Arc::clone(&h.0))).await
}

async fn panics_first(Meta { attempt, .. }: Meta, Message(o): Message<Order>) -> HandlerOutcome {
    if o.id == 1 && attempt.number() == 1 {
        panic!("boom on {}", o.id);
    }
    HandlerOutcome::ack()
}

/// A user's error type with a cause of its own.
#[derive(Debug)]
struct Failure(std::io::Error);
impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("database unavailable")
    }
}
impl std::error::Error for Failure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

async fn errs_first(Meta { attempt, .. }: Meta) -> Result<HandlerOutcome, Failure> {
    if attempt.number() == 1 {
        Err(Failure(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "connection refused",
        )))
    } else {
        Ok(HandlerOutcome::ack())
    }
}

#[tokio::test(start_paused = true)]
async fn e2_a_panicking_handler_is_a_failed_attempt_and_the_service_goes_on() {
    ruststream_test_support::capture_logs("info");
    let broker = MemoryBroker::recording();
    let app = App::new().register(on(broker.topic("orders"), panics_first).name("p"));
    let test = TestApp::recording(app, &broker).await.unwrap();
    test.publish("orders", &order(1)).await;
    test.publish("orders", &order(2)).await;
    test.settled().await;
    let calls = test.calls();
    assert_eq!(calls.len(), 3);
    assert_eq!(
        calls[0].completion,
        Completion::Panicked("boom on 1".into())
    );
    assert_eq!(calls[0].plan.settle, Settle::Redeliver);
    assert!(
        calls[1..]
            .iter()
            .all(|c| c.completion == Completion::Outcome(HandlerOutcome::ack()))
    );
    test.stop().await;
    // Logged with the panic message and the address.
    let logs = ruststream_test_support::logs();
    assert!(
        logs.lines().any(|l| l.contains("boom on 1")
            && l.contains("orders")
            && (l.contains("ERROR") || l.contains("WARN"))),
        "no log line with the panic message and the address:\n{logs}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_err_handler_is_logged_with_its_causes_and_retried() {
    ruststream_test_support::capture_logs("info");
    let broker = MemoryBroker::recording();
    let app = App::new().register(on(broker.topic("orders"), errs_first));
    let test = TestApp::recording(app, &broker).await.unwrap();
    test.publish("orders", &order(1)).await;
    test.settled().await;
    let calls = test.calls();
    assert_eq!(calls.len(), 2);
    assert_eq!(
        calls[0].completion,
        Completion::Failed(ruststream::core::Cause::new("database unavailable"))
    );
    // The error itself reaches middleware, its source chain intact.
    let Completion::Failed(error) = &calls[0].completion else {
        unreachable!("compared above")
    };
    let failure = error
        .downcast_ref::<Failure>()
        .expect("the handler's own type");
    assert_eq!(failure.0.kind(), std::io::ErrorKind::ConnectionRefused);
    let source = error.as_error().source().expect("a source");
    assert_eq!(source.to_string(), "connection refused");
    let logs = ruststream_test_support::logs();
    assert!(
        logs.lines()
            .any(|l| l.contains("WARN") && l.contains("database unavailable: connection refused")),
        "no warning with the error and its cause:\n{logs}"
    );
    assert_eq!(calls[1].attempt, 2);
    test.stop().await;
}

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

struct Missing;

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

#[tokio::test(start_paused = true)]
async fn a_delayed_copy_held_at_stop_is_handed_back_not_lost() {
    let broker = MemoryBroker::recording();
    let app = App::new().register(on(broker.topic("orders").runtime_retries(), delayed_once));
    let test = TestApp::recording(app, &broker).await.unwrap();
    test.publish("orders", &order(1)).await;
    while test.calls().is_empty() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    test.stop().await;
    // The copy was never published, and the original is back in the queue.
    assert_eq!(broker.published("orders").len(), 1);
    assert_eq!(broker.depth("orders", "default"), 1);
}

static STARTED: AtomicUsize = AtomicUsize::new(0);

async fn blocks(State(gate): State<Arc<tokio::sync::Semaphore>>) -> HandlerOutcome {
    STARTED.fetch_add(1, Ordering::SeqCst);
    let _permit = gate.acquire().await;
    HandlerOutcome::ack()
}

#[tokio::test(start_paused = true)]
async fn a_slow_handler_back_pressures_fetching_and_publishing() {
    let broker = MemoryBroker::with_capacity(8);
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let app = App::new()
        .state(Arc::clone(&gate))
        .register(on(broker.topic("jobs"), blocks));
    let running = app.start().await.unwrap();
    let publisher = broker.publisher();
    let publishing = tokio::spawn(async move {
        for i in 0..20 {
            publisher.to("jobs").send(&i).await.unwrap();
        }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        STARTED.load(Ordering::SeqCst),
        1,
        "one handler runs, nothing else starts"
    );
    assert_eq!(
        broker.depth("jobs", "default"),
        8,
        "the group holds its capacity"
    );
    assert!(!publishing.is_finished(), "the publisher waits for room");
    gate.add_permits(100);
    publishing.await.unwrap();
    running.stop().await;
}

async fn forwards(
    Message(o): Message<Order>,
    publisher: Publisher,
    headers: Headers,
) -> HandlerOutcome {
    let result = publisher
        .to("shipments")
        .key(o.key.clone())
        .header("from", headers.get("trace").cloned().unwrap_or_default())
        .send(&o)
        .await;
    match result {
        Ok(()) => HandlerOutcome::ack(),
        Err(_) => HandlerOutcome::retry(),
    }
}

#[tokio::test(start_paused = true)]
async fn handlers_publish_with_key_and_headers() {
    let broker = MemoryBroker::recording();
    let app = App::new().register(on(broker.topic("orders"), forwards));
    let test = TestApp::start(app, &broker).await.unwrap();
    test.publisher()
        .to("orders")
        .header("trace", "t-1")
        .send(&order(3))
        .await
        .unwrap();
    test.settled().await;
    let out = test.published("shipments");
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].key.as_deref(), Some(&b"k3"[..]));
    assert_eq!(out[0].headers.get_str("from"), Some("t-1"));
    assert_eq!(
        serde_json::from_slice::<Order>(&out[0].payload).unwrap(),
        order(3)
    );
    test.stop().await;
}

async fn raw(Payload(bytes): Payload) -> HandlerOutcome {
    if bytes.is_empty() {
        HandlerOutcome::drop()
    } else {
        HandlerOutcome::ack()
    }
}

#[tokio::test(start_paused = true)]
async fn groups_each_get_every_message_and_members_compete() {
    let broker = MemoryBroker::recording();
    let app = App::new()
        .register(on(broker.topic("orders").group("billing"), raw).name("billing-1"))
        .register(on(broker.topic("orders").group("billing"), raw).name("billing-2"))
        .register(on(broker.topic("orders").group("audit"), raw).name("audit"));
    let test = TestApp::recording(app, &broker).await.unwrap();
    for i in 0..10 {
        test.publish("orders", &i).await;
    }
    test.settled().await;
    let billing = test.calls_of("billing-1").len() + test.calls_of("billing-2").len();
    assert_eq!(billing, 10, "each message once per group");
    assert_eq!(test.calls_of("audit").len(), 10);
    test.stop().await;
}

/// An extractor that panics on a delivery's first attempt.
struct PanicsFirst;

static EXTRACTIONS: AtomicUsize = AtomicUsize::new(0);

impl ruststream::FromDelivery for PanicsFirst {
    fn from_delivery(
        _incoming: &ruststream::extract::Incoming,
    ) -> Result<Self, ruststream::extract::Rejection> {
        assert!(
            EXTRACTIONS.fetch_add(1, Ordering::SeqCst) != 0,
            "extractor boom"
        );
        Ok(Self)
    }
}

async fn extracts_panicking(_p: PanicsFirst) -> HandlerOutcome {
    HandlerOutcome::ack()
}

#[tokio::test(start_paused = true)]
async fn e2_a_panic_while_extracting_is_a_failed_attempt_too() {
    let broker = MemoryBroker::recording();
    let app = App::new().register(on(broker.topic("orders"), extracts_panicking));
    let test = TestApp::recording(app, &broker).await.unwrap();
    test.publish("orders", &order(1)).await;
    test.settled().await;
    let calls = test.calls();
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert!(
        matches!(&calls[0].completion, Completion::Panicked(m) if m.contains("extractor boom")),
        "{:?}",
        calls[0].completion
    );
    assert_eq!(calls[0].plan.settle, Settle::Redeliver);
    assert_eq!(
        calls[1].completion,
        Completion::Outcome(HandlerOutcome::ack())
    );
    test.stop().await;
}

/// `TestApp::start` is the production path: nothing observes its deliveries, so asking
/// for the recorded calls says how to get them instead of returning an empty list.
#[tokio::test(start_paused = true)]
#[should_panic(expected = "TestApp::recording(app, &broker)")]
async fn test_app_start_records_nothing_and_says_how_to_record() {
    let broker = MemoryBroker::recording();
    let app = App::new().register(on(broker.topic("plain"), |_: Message<u32>| async {
        HandlerOutcome::ack()
    }));
    let test = TestApp::start(app, &broker).await.unwrap();
    test.publish("plain", &1u32).await;
    test.settled().await;
    assert!(
        broker.is_idle(),
        "handled and settled on the production path"
    );
    let _ = test.calls();
}
