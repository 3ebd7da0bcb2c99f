//! Handling and settling: acks, per-key order in lanes, back-pressure, publishing from
//! handlers, groups, and what `TestApp::start` records.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ruststream::core::Settle;
use ruststream::memory::MemoryBroker;
use ruststream::middleware::Completion;
use ruststream::testing::TestApp;
use ruststream::{App, HandlerOutcome, Headers, Message, Payload, Publisher, State, on};

use crate::support::{Order, always_ack, order};

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
