//! The runtime against a transport written outside the crate, through the public
//! contract only: a descriptor that reads several addresses (like `KafkaTopics` or
//! `CoreWildcard`) and so has no single retry address.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use ruststream::core::{
    BoxFuture, Capabilities, DeadLetters, Declaration, DelayedRedelivery, Descriptor, Outgoing,
    Publish, PublishError, SubscribeError, Verb,
};
use ruststream::extract::Incoming;
use ruststream::memory::{MemoryBroker, MemorySubscription, MemoryTopic};
use ruststream::middleware::Completion;
use ruststream::middleware::{Layer, Service, TraceLayer};
use ruststream::testing::TestApp;
use ruststream::{App, HandlerOutcome, Payload, RETRY_COUNT_HEADER, on};

/// Reads one memory address but claims, like a multi-topic read, that no single publish
/// reaches what it reads, on a broker that counts nothing (Kafka-like).
#[derive(Clone)]
struct SeveralAddresses(MemoryTopic);

impl Descriptor for SeveralAddresses {
    type Subscription = MemorySubscription;

    fn address(&self) -> &str {
        "orders.*"
    }
    fn retry_address(&self) -> Option<&str> {
        None
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::NOTHING
            .with_ack(Verb::Native)
            .with_drop(Verb::AsAck)
            .with_redeliver(Verb::Native)
            .with_delayed_redelivery(DelayedRedelivery::Unsupported)
            .with_native_count(false)
            .with_dead_letters(DeadLetters::Runtime)
            .with_holds_original(true)
            .with_redeliver_in_place(false)
            .with_rewinds(false)
    }
    fn publisher(&self) -> Arc<dyn Publish> {
        self.0.publisher()
    }
    async fn open(self, declaration: &Declaration) -> Result<MemorySubscription, SubscribeError> {
        self.0.open(declaration).await
    }
}

async fn retry(Payload(_p): Payload) -> HandlerOutcome {
    HandlerOutcome::retry()
}

#[tokio::test]
async fn k8_several_addresses_without_retry_destination_refuse_to_start() {
    let broker = MemoryBroker::new();
    let app = App::new()
        .register(on(SeveralAddresses(broker.topic("a").runtime_retries()), retry).name("no-dest"))
        .register(
            on(SeveralAddresses(broker.topic("b").runtime_retries()), retry)
                .name("capped-no-dest")
                .max_attempts(3),
        );
    let err = app.start().await.unwrap_err().to_string();
    assert!(err.contains("2 rule(s) broken"), "{err}");
    assert!(
        err.contains("registration `no-dest` on `orders.*`"),
        "{err}"
    );
    assert!(
        err.contains("registration `capped-no-dest` on `orders.*`"),
        "{err}"
    );
    assert!(err.contains(".retry_to(address)"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn k8_named_retry_destination_receives_the_copies() {
    let broker = MemoryBroker::recording();
    let app = App::new().register(
        on(
            SeveralAddresses(broker.topic("orders.eu").runtime_retries()),
            retry,
        )
        .name("eu")
        .retry_to("orders.retry")
        .max_attempts(2),
    );
    let test = TestApp::start(app, &broker).await.unwrap();
    test.publisher()
        .to("orders.eu")
        .send_bytes("x")
        .await
        .unwrap();
    test.settled().await;
    let copies = test.published("orders.retry");
    assert_eq!(copies.len(), 1);
    assert_eq!(copies[0].headers.get_str(RETRY_COUNT_HEADER), Some("1"));
    test.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_forged_retry_count_never_crashes_and_is_counted_sanely() {
    let broker = MemoryBroker::recording();
    let app = App::new().register(
        on(broker.topic("orders").runtime_retries(), retry)
            .max_attempts(3)
            .dead_letter("orders.dead"),
    );
    let test = TestApp::recording(app, &broker).await.unwrap();
    for forged in ["-1", "banana", "99999999999999999999"] {
        test.publisher()
            .to("orders")
            .header(RETRY_COUNT_HEADER, forged)
            .send_bytes(forged)
            .await
            .unwrap();
    }
    test.settled().await;
    let dead = test.published("orders.dead");
    // Malformed counts start over at attempt 1 (3 runs each); a huge count is at the cap.
    assert_eq!(dead.len(), 3);
    let runs = |payload: &str| test.calls().iter().filter(|c| c.payload == payload).count();
    assert_eq!(runs("-1"), 3);
    assert_eq!(runs("banana"), 3);
    assert_eq!(runs("99999999999999999999"), 1);
    test.stop().await;
}

#[derive(Clone, Default)]
struct Count(Arc<AtomicUsize>);

struct Counted<S> {
    inner: S,
    count: Count,
}

impl<S: Service> Layer<S> for Count {
    type Service = Counted<S>;
    fn layer(&self, inner: S) -> Counted<S> {
        Counted {
            inner,
            count: self.clone(),
        }
    }
}

impl<S: Service> Service for Counted<S> {
    async fn call(&self, incoming: &Incoming) -> Completion {
        self.count.0.fetch_add(1, Ordering::SeqCst);
        self.inner.call(incoming).await
    }
}

async fn ack(Payload(_p): Payload) -> HandlerOutcome {
    HandlerOutcome::ack()
}

#[tokio::test(start_paused = true)]
async fn layers_wrap_the_handler_and_trace_layer_passes_outcomes_through() {
    let broker = MemoryBroker::recording();
    let count = Count::default();
    let app = App::new().register(
        on(broker.topic("orders"), ack)
            .layer(TraceLayer)
            .layer(count.clone()),
    );
    let test = TestApp::recording(app, &broker).await.unwrap();
    for _ in 0..5 {
        test.publisher().to("orders").send_bytes("x").await.unwrap();
    }
    test.settled().await;
    assert_eq!(count.0.load(Ordering::SeqCst), 5);
    assert!(
        test.calls()
            .iter()
            .all(|c| c.completion == Completion::Outcome(HandlerOutcome::ack()))
    );
    test.stop().await;
}

/// A memory topic whose publisher panics (a transport's bug), so the runtime's delayed
/// retry copy meets the panic in its timer.
#[derive(Clone)]
struct PanicsOnPublish(MemoryTopic);

struct Panicking;

impl Publish for Panicking {
    fn publish(&self, _message: Outgoing) -> BoxFuture<'_, Result<(), PublishError>> {
        Box::pin(async { panic!("the transport's publish panicked") })
    }
}

impl Descriptor for PanicsOnPublish {
    type Subscription = MemorySubscription;

    fn address(&self) -> &str {
        self.0.address()
    }
    fn retry_address(&self) -> Option<&str> {
        self.0.retry_address()
    }
    fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }
    fn publisher(&self) -> Arc<dyn Publish> {
        Arc::new(Panicking)
    }
    async fn open(self, declaration: &Declaration) -> Result<MemorySubscription, SubscribeError> {
        self.0.open(declaration).await
    }
}

/// A delayed retry copy whose publish panics in its timer still gives its place in
/// flight back (SPEC G5): at `max_in_flight(1)` the next message is fetched only then. The
/// original is left unsettled, and nothing else stops.
#[tokio::test(start_paused = true)]
async fn g5_a_delayed_copy_whose_publish_panics_gives_its_place_in_flight_back() {
    let broker = MemoryBroker::new();
    let seen = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let handler = {
        let seen = Arc::clone(&seen);
        move |Payload(payload): Payload| {
            let seen = Arc::clone(&seen);
            async move {
                let text = String::from_utf8_lossy(&payload).into_owned();
                let later = text == "later";
                seen.lock().unwrap().push(text);
                if later {
                    HandlerOutcome::retry_after(std::time::Duration::from_millis(50))
                } else {
                    HandlerOutcome::ack()
                }
            }
        }
    };
    let topic = broker.topic("orders").runtime_retries();
    let running = App::new()
        .register(on(PanicsOnPublish(topic), handler).max_in_flight(1))
        .start()
        .await
        .unwrap();
    for payload in ["later", "next"] {
        broker
            .publish(Outgoing::new("orders", bytes::Bytes::from(payload)))
            .await;
    }
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    while seen.lock().unwrap().len() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the next message was never fetched: {:?}",
            seen.lock().unwrap()
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(*seen.lock().unwrap(), ["later", "next"]);
    running.stop().await;
}
