//! Running registrations: one driver task per subscription, lanes, plan execution.

mod batch;
mod batches;
mod copy;
mod driver;
mod lane;
mod lanes;
pub(crate) mod mount;
mod quiet;
mod refusals;
mod shared;
mod unwind;
mod work;

use std::sync::Arc;

use ruststream_core::{BoxFuture, Descriptor, SubscribeError, Subscription};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::batch::{BatchService, CallBatch};
use crate::registration::BatchLimits;

use crate::extract::Context;
use crate::middleware::Service;
use crate::publisher::Publisher;
use crate::registration::Registration;
use crate::state::StateMap;

use crate::in_flight::InFlight;
use mount::Started;
pub(crate) use mount::{Env, Mount, Observe};
pub(crate) use shared::Shared;
pub(crate) use unwind::quiet_handler_panics;

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

    fn start(self: Box<Self>, env: Env) -> BoxFuture<'static, Result<Started, SubscribeError>> {
        Box::pin(async move {
            let (opened, started) = open(*self, env).await?;
            let Opened {
                subscription,
                shared,
                lanes,
                stop,
                deadlines,
                ..
            } = opened;
            let driver = tokio::spawn(driver::drive(subscription, shared, lanes, stop, deadlines));
            Ok(started(driver))
        })
    }
}

/// A batch registration ([`on_batch`](crate::on_batch)), as the app holds it.
impl<D, H, T, C, Args> Mount for Registration<D, BatchService<H, T, C, Args>>
where
    D: Descriptor,
    BatchService<H, T, C, Args>: CallBatch,
{
    fn name(&self) -> &str {
        &self.name
    }

    fn address(&self) -> &str {
        self.descriptor.address()
    }

    fn violations(&self, state: &StateMap) -> Vec<String> {
        Registration::violations(self, state)
    }

    fn start(self: Box<Self>, env: Env) -> BoxFuture<'static, Result<Started, SubscribeError>> {
        Box::pin(async move {
            let (opened, started) = open(*self, env).await?;
            let Opened {
                subscription,
                shared,
                lanes,
                stop,
                deadlines,
                batch,
            } = opened;
            let limits = batch.unwrap_or_default();
            let driver = tokio::spawn(driver::drive_batches(
                subscription,
                shared,
                lanes,
                limits,
                stop,
                deadlines,
            ));
            Ok(started(driver))
        })
    }
}

/// An opened registration, ready for its driver.
struct Opened<Sub, S> {
    subscription: Sub,
    shared: Arc<Shared<S>>,
    lanes: driver::Lanes,
    stop: watch::Receiver<bool>,
    deadlines: driver::Deadlines,
    batch: Option<BatchLimits>,
}

/// Opens the registration's subscription and makes what its driver shares with its
/// lanes; the second value makes the started registration of its driver's task.
async fn open<D: Descriptor, S: Send + Sync + 'static>(
    this: Registration<D, S>,
    env: Env,
) -> Result<
    (
        Opened<D::Subscription, S>,
        impl FnOnce(JoinHandle<()>) -> Started,
    ),
    SubscribeError,
> {
    let deadline = this.options.timeout.unwrap_or(env.handler_timeout);
    let mut declaration = this.declaration();
    declaration.handler_timeout = Some(deadline);
    declaration.max_in_flight = Some(this.options.max_in_flight);
    let capabilities = this.descriptor.capabilities();
    let transport = this.descriptor.transport();
    let copies = this.descriptor.publisher();
    let registration: Arc<str> = Arc::from(this.name.as_str());
    let in_flight = Arc::new(InFlight::new(
        Arc::clone(&registration),
        this.descriptor.address().to_owned(),
    ));
    let subscription = this.descriptor.open(&declaration).await?;
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
    // `ack()` and `drop()` plan alike for every delivery of a registration.
    let planned = shared::Planned::for_registration(&declaration, &capabilities);
    let shared = Arc::new(Shared {
        planned,
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
    let opened = Opened {
        subscription,
        shared,
        lanes: driver::Lanes {
            count: this.options.lanes.max(1),
            key: this.options.lane_key,
        },
        stop: env.stop,
        deadlines: driver::Deadlines {
            drain: env.drain_timeout,
            close: env.close_timeout,
        },
        batch: this.options.batch,
    };
    Ok((opened, move |driver| Started { driver, in_flight }))
}
