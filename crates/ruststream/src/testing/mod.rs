//! A test harness: the production app on the memory broker. [`TestApp::start`] runs
//! exactly the path a service ships; [`TestApp::recording`] also records every handler
//! call with its outcome and plan (an observer on each delivery, which the production
//! path does not have), for [`TestApp::calls`]. A [`MemoryBroker::recording`] broker
//! records every published message and dead letter either way.
//!
//! Run tests with tokio's paused clock (`#[tokio::test(start_paused = true)]`): time then
//! advances by itself whenever everything waits, so `retry_after` delays take no real
//! time and still happen in order (virtual time); `tokio::time::advance` moves it by hand.
//!
//! ```
//! use std::time::Duration;
//! use ruststream::{on, App, HandlerOutcome, Message, memory::MemoryBroker, testing::TestApp};
//!
//! async fn flaky(Message(n): Message<u32>) -> HandlerOutcome {
//!     if n == 0 { HandlerOutcome::retry() } else { HandlerOutcome::ack() }
//! }
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
//! let broker = MemoryBroker::recording();
//! let app = App::new().register(
//!     on(broker.topic("n"), flaky).max_attempts(3).dead_letter("n.dead"),
//! );
//! let test = TestApp::recording(app, &broker).await.unwrap();
//! test.publisher().to("n").send(&0u32).await.unwrap();
//! test.publisher().to("n").send(&1u32).await.unwrap();
//! test.settled().await;
//! assert_eq!(test.calls().len(), 4); // 0 three times, 1 once
//! assert_eq!(broker.published("n.dead").len(), 1);
//! test.stop().await;
//! # }
//! ```

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use ruststream_core::{Headers, Outgoing, Plan};

use crate::app::{App, Running, StartError};
use crate::memory::MemoryBroker;
use crate::middleware::Completion;
use crate::publisher::Publisher;
use crate::runtime::mount::{Handled, Observe};

#[cfg(feature = "sim")]
pub mod sim;

/// How long [`TestApp::settled`] waits, in (virtual) time, before it gives up.
pub const SETTLE_LIMIT: Duration = Duration::from_secs(3600);

/// One handler call, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The registration's name.
    pub registration: String,
    /// The address read.
    pub address: String,
    /// The attempt number.
    pub attempt: u32,
    /// The payload.
    pub payload: Bytes,
    /// The headers.
    pub headers: Headers,
    /// How the call ended.
    pub completion: Completion,
    /// What the planner decided.
    pub plan: Plan,
    /// When, on tokio's clock, relative to the harness start.
    pub at: Duration,
}

#[derive(Default)]
struct Recorder {
    calls: Mutex<Vec<Call>>,
    started: Mutex<Option<tokio::time::Instant>>,
}

impl Observe for Recorder {
    fn handled(&self, event: &Handled<'_>) {
        let started = self
            .started
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .unwrap_or_else(tokio::time::Instant::now);
        let call = Call {
            registration: event.registration.to_owned(),
            address: event.delivery.address().to_owned(),
            attempt: event.delivery.attempt().number(),
            payload: event.delivery.payload().clone(),
            headers: event.delivery.headers().clone(),
            completion: event.completion.clone(),
            plan: event.plan.clone(),
            at: started.elapsed(),
        };
        self.calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(call);
    }
}

/// A started app on a memory broker.
pub struct TestApp {
    broker: MemoryBroker,
    running: Running,
    /// The handler calls, when started with [`TestApp::recording`].
    recorder: Option<Arc<Recorder>>,
}

impl std::fmt::Debug for TestApp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestApp")
            .field("broker", &self.broker)
            .finish()
    }
}

impl TestApp {
    /// Starts `app` (whose registrations read from `broker`) as production runs it:
    /// nothing observes its deliveries, so the path under test is the one a service
    /// ships. [`TestApp::calls`] needs [`TestApp::recording`].
    pub async fn start(app: App, broker: &MemoryBroker) -> Result<Self, StartError> {
        Self::start_with(app, broker, None).await
    }

    /// Starts `app` like [`TestApp::start`], and records every handler call (attempt,
    /// payload, headers, how it ended, what the planner decided) for
    /// [`TestApp::calls`]. Use a [`MemoryBroker::recording`] broker to also see every
    /// published message.
    pub async fn recording(app: App, broker: &MemoryBroker) -> Result<Self, StartError> {
        let recorder = Arc::new(Recorder::default());
        *recorder.started.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(tokio::time::Instant::now());
        Self::start_with(app, broker, Some(recorder)).await
    }

    async fn start_with(
        app: App,
        broker: &MemoryBroker,
        recorder: Option<Arc<Recorder>>,
    ) -> Result<Self, StartError> {
        let app = match &recorder {
            Some(recorder) => app.observe(Arc::clone(recorder) as Arc<dyn Observe>),
            None => app,
        };
        let running = app.start().await?;
        Ok(Self {
            broker: broker.clone(),
            running,
            recorder,
        })
    }

    /// A publisher to the broker.
    pub fn publisher(&self) -> Publisher {
        self.broker.publisher()
    }

    /// Publishes `value` as JSON to `address`.
    pub async fn publish<T: serde::Serialize + ?Sized>(&self, address: &str, value: &T) {
        if let Err(e) = self.publisher().to(address).send(value).await {
            panic!("publishing to `{address}` failed in a test: {e}");
        }
    }

    /// Waits until nothing is left to process: no message ready, running, unsettled or
    /// waiting on a timer. Panics after [`SETTLE_LIMIT`] of tokio time.
    pub async fn settled(&self) {
        self.idle(Duration::from_millis(1)).await;
    }

    /// [`settled`](Self::settled), looking again after waits that double from 1 ms up to
    /// `longest` (the simulation lets a held handler's deadline pass in a few steps).
    pub(crate) async fn idle(&self, longest: Duration) {
        let give_up = tokio::time::Instant::now() + SETTLE_LIMIT;
        let (mut quiet_checks, mut wait) = (0, Duration::from_millis(1));
        loop {
            if self.broker.is_idle() && self.running.in_flight() == 0 {
                quiet_checks += 1;
                if quiet_checks >= 3 {
                    return;
                }
                tokio::task::yield_now().await;
                continue;
            }
            quiet_checks = 0;
            assert!(
                tokio::time::Instant::now() < give_up,
                "the app did not settle within {SETTLE_LIMIT:?}: {} in flight",
                self.running.in_flight()
            );
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(longest);
        }
    }

    /// Every handler call so far, in order of completion.
    ///
    /// # Panics
    ///
    /// When the app was started with [`TestApp::start`], which records nothing: start it
    /// with [`TestApp::recording`].
    pub fn calls(&self) -> Vec<Call> {
        let Some(recorder) = &self.recorder else {
            panic!(
                "TestApp::calls needs the recording harness: start the app with \
                 TestApp::recording(app, &broker) instead of TestApp::start"
            );
        };
        recorder
            .calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Calls of one registration.
    pub fn calls_of(&self, registration: &str) -> Vec<Call> {
        self.calls()
            .into_iter()
            .filter(|c| c.registration == registration)
            .collect()
    }

    /// Everything published to `address` (needs a recording broker).
    pub fn published(&self, address: &str) -> Vec<Outgoing> {
        self.broker.published(address)
    }

    /// The broker.
    pub fn broker(&self) -> &MemoryBroker {
        &self.broker
    }

    /// Stops the app (drains like production).
    pub async fn stop(self) {
        self.running.stop().await;
    }
}
