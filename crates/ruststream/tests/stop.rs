//! Stop on the memory broker, through the production runtime (SPEC E3): running handlers
//! finish and are settled, unfinished work goes back past the drain timeout, and a stop
//! is seen whenever it comes.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::Poll;
use std::time::Duration;

use ruststream::memory::MemoryBroker;
use ruststream::{App, HandlerOutcome, State, StopHandle, on};

#[derive(Default)]
struct Slow {
    started: tokio::sync::Notify,
    finished: AtomicBool,
}

async fn slow(State(s): State<Arc<Slow>>) -> HandlerOutcome {
    s.started.notify_one();
    tokio::time::sleep(Duration::from_millis(300)).await;
    s.finished.store(true, Ordering::SeqCst);
    HandlerOutcome::ack()
}

#[tokio::test]
async fn e3_stop_lets_running_handlers_finish_and_settles_them() {
    let broker = MemoryBroker::new();
    let slow_state = Arc::new(Slow::default());
    let app = App::new()
        .state(Arc::clone(&slow_state))
        .register(on(broker.topic("jobs"), slow));
    let running = app.start().await.unwrap();
    broker.publisher().to("jobs").send(&1).await.unwrap();
    slow_state.started.notified().await;
    running.stop().await;
    assert!(
        slow_state.finished.load(Ordering::SeqCst),
        "the running handler finished"
    );
    assert_eq!(
        broker.depth("jobs", "default"),
        0,
        "and its delivery was settled"
    );
}

#[tokio::test]
async fn e3_past_the_drain_timeout_unfinished_work_goes_back_to_the_broker() {
    let broker = MemoryBroker::new();
    let slow_state = Arc::new(Slow::default());
    let app = App::new()
        .state(Arc::clone(&slow_state))
        .shutdown_timeout(Duration::from_millis(20))
        .register(on(broker.topic("jobs"), slow));
    let stop = app.stop_handle();
    let run = tokio::spawn(app.run());
    broker.publisher().to("jobs").send(&1).await.unwrap();
    slow_state.started.notified().await;
    stop.stop();
    run.await.unwrap().unwrap();
    assert!(!slow_state.finished.load(Ordering::SeqCst));
    assert_eq!(
        broker.depth("jobs", "default"),
        1,
        "unsettled, so it is still there"
    );
    // A new instance picks it up.
    let app = App::new()
        .state(Arc::clone(&slow_state))
        .register(on(broker.topic("jobs"), slow));
    let running = app.start().await.unwrap();
    slow_state.started.notified().await;
    running.stop().await;
    assert_eq!(broker.depth("jobs", "default"), 0);
}

/// Retries every message at once; at its third call it spends the task's cooperative
/// budget (as tokio I/O in a handler does) and asks the app to stop.
#[derive(Default)]
struct StopsOnSpentBudget {
    calls: AtomicUsize,
    handle: OnceLock<StopHandle>,
}

async fn stops_on_a_spent_budget(State(s): State<Arc<StopsOnSpentBudget>>) -> HandlerOutcome {
    if s.calls.fetch_add(1, Ordering::SeqCst) == 2 {
        std::future::poll_fn(|cx| {
            while let Poll::Ready(unit) = tokio::task::coop::poll_proceed(cx) {
                unit.made_progress();
            }
            Poll::Ready(())
        })
        .await;
        s.handle.get().expect("set before the start").stop();
    }
    HandlerOutcome::retry()
}

/// The driver works through a backlog (here one message retried without a cap) within
/// one poll until its turn ends or, as here, a handler spends tokio's cooperative
/// budget. A stop asked when the budget is
/// spent stops the fetching all the same (it was once lost there, and the driver
/// fetched on for ever).
#[tokio::test]
async fn e3_a_stop_asked_on_a_spent_budget_stops_fetching() {
    let broker = MemoryBroker::new();
    let state = Arc::new(StopsOnSpentBudget::default());
    let app = App::new()
        .state(Arc::clone(&state))
        .register(on(broker.topic("loop"), stops_on_a_spent_budget));
    let running = app.start().await.unwrap();
    // One stop, as `Running::stop` asks it (`App::run` asks twice).
    let _ = state.handle.set(running.stop_handle());
    broker.publisher().to("loop").send(&1).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), running.wait())
        .await
        .expect("the stop was seen");
    assert!(state.calls.load(Ordering::SeqCst) >= 3);
}
