//! A registration with its types erased, as the app holds it, and what starting one
//! shares with the app.

use std::sync::Arc;
use std::time::Duration;

use ruststream_core::{BoxFuture, Delivery, LetterBox, Plan, Publish, SubscribeError};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::asyncapi::Entry;
use crate::in_flight::InFlight;
use crate::middleware::Completion;
use crate::ops::{Health, Metrics};
use crate::state::StateMap;

/// A started registration: its driver task and what it holds.
pub(crate) struct Started {
    pub(crate) driver: JoinHandle<()>,
    pub(crate) in_flight: Arc<InFlight>,
}

/// What every started registration shares with the app.
#[derive(Clone)]
pub(crate) struct Env {
    pub(crate) state: Arc<StateMap>,
    pub(crate) stop: watch::Receiver<bool>,
    pub(crate) drain_timeout: Duration,
    pub(crate) close_timeout: Duration,
    pub(crate) handler_timeout: Duration,
    pub(crate) observer: Option<Arc<dyn Observe>>,
    pub(crate) metrics: Option<Arc<Metrics>>,
    pub(crate) health: Arc<Health>,
}

/// What the app asks of every registration, whatever runs it (the single path or
/// batches): one blanket implementation (`runtime/mod.rs`).
pub(crate) trait Registered: Send {
    fn name(&self) -> &str;
    fn address(&self) -> &str;
    fn violations(&self, state: &StateMap) -> Vec<String>;
    /// The registration in the service's description (AsyncAPI).
    fn describe(&self, app_timeout: Duration) -> Entry;
    /// Asks the broker whether it answers and has what the registration reads.
    fn verify(&self) -> BoxFuture<'_, Result<(), String>>;
    /// The broker's confirmed publish.
    fn publisher(&self) -> Arc<dyn Publish>;
    /// The dead letters at the registration's dead-letter address, read back.
    fn dead_letters(&self) -> BoxFuture<'_, Result<Box<dyn LetterBox>, String>>;
}

/// A registration with its types erased, as the app holds it.
pub(crate) trait Mount: Registered {
    /// Opens the registration's subscriptions (one per consumer) and spawns their
    /// drivers, each added to `started` as soon as it runs.
    fn start<'a>(
        self: Box<Self>,
        env: Env,
        started: &'a mut Vec<Started>,
    ) -> BoxFuture<'a, Result<(), SubscribeError>>;
}

/// One handled delivery, as an observer sees it.
pub(crate) struct Handled<'a> {
    pub(crate) registration: &'a str,
    pub(crate) delivery: &'a Delivery,
    pub(crate) completion: &'a Completion,
    pub(crate) plan: &'a Plan,
}

/// Sees every handled delivery (the test harness records them).
pub(crate) trait Observe: Send + Sync + 'static {
    fn handled(&self, event: &Handled<'_>);
}
