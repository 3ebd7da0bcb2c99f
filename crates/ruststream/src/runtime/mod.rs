//! Running registrations: one driver task per subscription, lanes, plan execution.

mod copy;
mod driver;
mod lane;
mod lanes;
mod refusals;
mod unwind;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ruststream_core::{BoxFuture, Delivery, Descriptor, Plan, Subscription};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::extract::Context;
use crate::handler::Completion;
use crate::middleware::Service;
use crate::ops::{Health, Metrics};
use crate::publisher::Publisher;
use crate::registration::Registration;
use crate::state::StateMap;

pub(crate) use driver::Shared;
pub(crate) use unwind::quiet_handler_panics;

/// One subscription's deliveries fetched and not settled yet (SPEC G5, G6).
#[derive(Debug)]
pub(crate) struct InFlight {
    pub(crate) registration: Arc<str>,
    pub(crate) address: String,
    count: AtomicUsize,
    /// Of those, how many a handler is running for (kept only when metrics are on).
    pub(crate) running: AtomicUsize,
}

impl InFlight {
    pub(crate) fn running(&self) -> usize {
        self.running.load(Ordering::Relaxed)
    }

    pub(crate) fn count(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }
}

/// A started registration: its driver task and what it holds.
pub(crate) struct Started {
    pub(crate) driver: JoinHandle<()>,
    pub(crate) in_flight: Arc<InFlight>,
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

/// A registration with its types erased, as the app holds it.
pub(crate) trait Mount: Send {
    fn name(&self) -> &str;
    fn address(&self) -> &str;
    fn violations(&self, state: &StateMap) -> Vec<String>;
    /// Opens the subscription and spawns its driver.
    fn start(self: Box<Self>, env: Env) -> BoxFuture<'static, Result<Started, String>>;
}

impl<D: Descriptor, S: Service> Mount for Registration<D, S> {
    fn name(&self) -> &str {
        &self.name
    }

    fn address(&self) -> &str {
        self.descriptor.address()
    }

    fn violations(&self, state: &StateMap) -> Vec<String> {
        Registration::violations(self, state)
    }

    fn start(self: Box<Self>, env: Env) -> BoxFuture<'static, Result<Started, String>> {
        Box::pin(async move {
            let this = *self;
            let deadline = this.options.timeout.unwrap_or(env.handler_timeout);
            let mut declaration = this.declaration();
            declaration.handler_timeout = Some(deadline);
            let capabilities = this.descriptor.capabilities();
            let transport = this.descriptor.transport();
            let copies = this.descriptor.publisher();
            let registration: Arc<str> = Arc::from(this.name.as_str());
            let in_flight = Arc::new(InFlight {
                registration: Arc::clone(&registration),
                address: this.descriptor.address().to_owned(),
                count: AtomicUsize::new(0),
                running: AtomicUsize::new(0),
            });
            let subscription = this
                .descriptor
                .open(&declaration)
                .await
                .map_err(|e| e.to_string())?;
            let health = env.health.add(
                Arc::clone(&registration),
                in_flight.address.clone(),
                subscription.link(),
            );
            let metrics = env.metrics.as_ref().map(|m| {
                m.instruments(
                    &registration,
                    &in_flight.address,
                    transport,
                    Arc::clone(&in_flight),
                    subscription.backlog(),
                )
            });
            let shared = Arc::new(Shared {
                context: Arc::new(Context {
                    registration: Arc::clone(&registration),
                    state: env.state,
                    publisher: Publisher::new(Arc::clone(&copies)),
                }),
                service: this.service,
                declaration,
                capabilities,
                copies,
                failure_policy: this.options.failure_policy,
                deadline,
                backoff: this.options.backoff,
                refusals: refusals::Refusals::default(),
                stop: env.stop.clone(),
                observer: env.observer,
                in_flight: Arc::clone(&in_flight),
                max_in_flight: this.options.max_in_flight,
                metrics,
                health,
                registration,
            });
            let lanes = driver::Lanes {
                count: this.options.lanes.max(1),
                key: this.options.lane_key,
            };
            let driver = tokio::spawn(driver::drive(
                subscription,
                shared,
                lanes,
                env.stop,
                driver::Deadlines {
                    drain: env.drain_timeout,
                    close: env.close_timeout,
                },
            ));
            Ok(Started { driver, in_flight })
        })
    }
}
