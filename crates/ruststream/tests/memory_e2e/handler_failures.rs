//! E2: a handler that panics (running or extracting) or returns an error is a failed
//! attempt, logged, and the service goes on.

use std::sync::atomic::{AtomicUsize, Ordering};

use ruststream::core::Settle;
use ruststream::memory::MemoryBroker;
use ruststream::middleware::Completion;
use ruststream::testing::TestApp;
use ruststream::{App, HandlerOutcome, Message, Meta, on};

use crate::support::{Order, order};

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

/// A value whose decoding panics the first time (a codec or `Deserialize` impl with a
/// bug in it).
struct Touchy;

static DECODES: AtomicUsize = AtomicUsize::new(0);
static BATCHED: AtomicUsize = AtomicUsize::new(0);

impl<'de> serde::Deserialize<'de> for Touchy {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let _ = <serde::de::IgnoredAny as serde::Deserialize>::deserialize(d)?;
        assert!(DECODES.fetch_add(1, Ordering::SeqCst) != 0, "decoder boom");
        Ok(Self)
    }
}

async fn takes_touchy(batch: ruststream::batch::Batch<Touchy>) -> ruststream::BatchOutcome {
    BATCHED.fetch_add(batch.len(), Ordering::SeqCst);
    ruststream::BatchOutcome::ack_all()
}

/// A batch's values are decoded before its handler runs: a panic there fails the batch
/// as a panic in the handler would, and the registration goes on.
#[tokio::test(start_paused = true)]
async fn e2_a_panic_while_decoding_a_batch_is_a_failed_attempt_too() {
    let broker = MemoryBroker::recording();
    let app = App::new().register(ruststream::on_batch(broker.topic("orders"), takes_touchy));
    let test = TestApp::recording(app, &broker).await.unwrap();
    test.publish("orders", &order(1)).await;
    tokio::time::timeout(std::time::Duration::from_secs(60), test.settled())
        .await
        .expect("settled: the registration went on after the panic");
    assert_eq!(
        DECODES.load(Ordering::SeqCst),
        2,
        "decoded again on its retry"
    );
    assert_eq!(BATCHED.load(Ordering::SeqCst), 1, "handled once it decoded");
    test.stop().await;
}
