//! Running registrations: one driver task per subscription, lanes, plan execution.

mod batch;
mod batches;
mod copy;
mod driver;
mod lane;
mod lanes;
pub(crate) mod mount;
mod outlined;
mod quiet;
mod refusals;
mod shared;
mod unwind;
mod why;
mod work;

use std::sync::Arc;

use ruststream_core::{BoxFuture, Declaration, Descriptor, SubscribeError, Subscription};
use tokio::sync::watch;

use crate::batch::{BatchService, CallBatch};

use crate::extract::Context;
use crate::middleware::Service;
use crate::publisher::Publisher;
use crate::registration::{Options, Registration};
use crate::state::StateMap;

use crate::in_flight::InFlight;
pub use copy::COPY_CONFIRM_TIMEOUT;
use mount::Started;
pub(crate) use mount::{Env, Mount, Observe, Registered};
pub(crate) use shared::Shared;
pub(crate) use unwind::quiet_handler_panics;

impl<D: Descriptor, S: Send + 'static> Registered for Registration<D, S> {
    fn name(&self) -> &str {
        &self.name
    }

    fn address(&self) -> &str {
        self.descriptor.address()
    }

    fn violations(&self, state: &StateMap) -> Vec<String> {
        Registration::violations(self, state)
    }

    fn describe(&self, app_timeout: std::time::Duration) -> crate::asyncapi::Entry {
        self.entry(app_timeout)
    }

    fn verify(&self) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(self.descriptor.verify())
    }

    fn publisher(&self) -> Arc<dyn ruststream_core::Publish> {
        self.descriptor.publisher()
    }

    fn dead_letters(&self) -> BoxFuture<'_, Result<Box<dyn ruststream_core::LetterBox>, String>> {
        let (name, descriptor) = (self.name.clone(), self.descriptor.clone());
        Box::pin(dead_letters(
            name,
            descriptor,
            self.options.dead_letter.clone(),
        ))
    }
}

impl<D: Descriptor, S: Service> Mount for Registration<D, S> {
    fn start<'a>(
        self: Box<Self>,
        env: Env,
        started: &'a mut Vec<Started>,
    ) -> BoxFuture<'a, Result<(), SubscribeError>> {
        Box::pin(start_each(*self, env, started, |opened| {
            driver::drive(
                opened.subscription,
                opened.shared,
                opened.lanes,
                opened.stop,
                opened.deadlines,
            )
        }))
    }
}

/// The dead letters of registration `name`, read back from `address`.
async fn dead_letters<D: Descriptor>(
    name: String,
    descriptor: D,
    address: Option<String>,
) -> Result<Box<dyn ruststream_core::LetterBox>, String> {
    let Some(address) = address else {
        return Err(format!("registration `{name}` has no dead-letter address"));
    };
    descriptor.dead_letters(&address).await
}

/// A batch registration ([`on_batch`](crate::on_batch)), as the app holds it.
impl<D, H, T, C, Args> Mount for Registration<D, BatchService<H, T, C, Args>>
where
    D: Descriptor,
    BatchService<H, T, C, Args>: CallBatch,
{
    fn start<'a>(
        self: Box<Self>,
        env: Env,
        started: &'a mut Vec<Started>,
    ) -> BoxFuture<'a, Result<(), SubscribeError>> {
        let limits = self.options.batch.unwrap_or_default();
        Box::pin(start_each(*self, env, started, move |opened| {
            driver::drive_batches(
                opened.subscription,
                opened.shared,
                opened.lanes,
                limits,
                opened.stop,
                opened.deadlines,
            )
        }))
    }
}

/// An opened subscription of a registration, ready for its driver.
struct Opened<Sub, S> {
    subscription: Sub,
    shared: Arc<Shared<S>>,
    lanes: driver::Lanes,
    stop: watch::Receiver<bool>,
    deadlines: driver::Deadlines,
}

/// Opens each of the registration's consumers in turn and spawns its driver (`drive`),
/// adding it to `started` at once, so a later consumer that fails to open leaves the
/// earlier ones to the app's stop.
async fn start_each<D, S, Run, Driven>(
    this: Registration<D, S>,
    env: Env,
    started: &mut Vec<Started>,
    drive: Run,
) -> Result<(), SubscribeError>
where
    D: Descriptor,
    S: Send + Sync + 'static,
    Run: Fn(Opened<D::Subscription, S>) -> Driven,
    Driven: Future<Output = ()> + Send + 'static,
{
    let deadline = this.options.timeout.unwrap_or(env.handler_timeout);
    let mut declaration = this.declaration();
    declaration.handler_timeout = Some(deadline);
    declaration.max_in_flight = Some(this.options.max_in_flight);
    let registration: Arc<str> = Arc::from(this.name.as_str());
    let copies = this.descriptor.publisher();
    let capabilities = this.descriptor.capabilities();
    let common = Common {
        context: Arc::new(Context {
            registration: Arc::clone(&registration),
            transport: this.descriptor.transport(),
            state: Arc::clone(&env.state),
            publisher: Publisher::new(Arc::clone(&copies)),
        }),
        service: Arc::new(this.service),
        capabilities,
        copies,
        registration,
        deadline,
        refusals: Arc::new(refusals::Refusals::new(
            capabilities.positions_name_messages,
        )),
    };
    for consumer in 0..declaration.consumer_count() {
        declaration.consumer = consumer;
        let descriptor = this.descriptor.clone();
        let (opened, in_flight) =
            open(descriptor, &declaration, &common, &this.options, &env).await?;
        started.push(Started {
            driver: tokio::spawn(drive(opened)),
            in_flight,
        });
    }
    Ok(())
}

/// What every consumer of one registration shares.
struct Common<S> {
    context: Arc<Context>,
    service: Arc<S>,
    capabilities: ruststream_core::Capabilities,
    copies: Arc<dyn ruststream_core::Publish>,
    registration: Arc<str>,
    deadline: std::time::Duration,
    /// Refused copies, remembered for the registration: a delivery whose copy was
    /// refused may come back to another of its consumers (SPEC G3).
    refusals: Arc<refusals::Refusals>,
}

/// Opens one consumer's subscription and makes what its driver shares with its lanes.
async fn open<D: Descriptor, S>(
    descriptor: D,
    declaration: &Declaration,
    common: &Common<S>,
    options: &Options,
    env: &Env,
) -> Result<(Opened<D::Subscription, S>, Arc<InFlight>), SubscribeError> {
    let transport = descriptor.transport();
    let registration = &common.registration;
    let in_flight = Arc::new(InFlight::new(
        Arc::clone(registration),
        descriptor.address().to_owned(),
    ));
    let subscription = descriptor.open(declaration).await?;
    let health = env.health.add(
        Arc::clone(registration),
        in_flight.address.clone(),
        subscription.link(),
    );
    // Every consumer's probe: a Kafka member tells its own partitions' backlog (the
    // series are per partition); a group-wide figure is only told again.
    let backlog = subscription.backlog();
    let metrics = env.metrics.as_ref().map(|m| {
        m.instruments(
            registration,
            &in_flight.address,
            transport,
            Arc::clone(&in_flight),
            backlog,
        )
    });
    // `ack()` and `drop()` plan alike for every delivery of a registration.
    let planned = shared::Planned::for_registration(declaration, &common.capabilities);
    let shared = Arc::new(Shared {
        planned,
        context: Arc::clone(&common.context),
        service: Arc::clone(&common.service),
        declaration: declaration.clone(),
        capabilities: common.capabilities,
        copies: Arc::clone(&common.copies),
        failure_policy: options.failure_policy,
        deadline: common.deadline,
        backoff: options.backoff,
        refusals: Arc::clone(&common.refusals),
        stop: env.stop.clone(),
        observer: env.observer.clone(),
        in_flight: Arc::clone(&in_flight),
        max_in_flight: options.max_in_flight,
        metrics,
        health,
        registration: Arc::clone(registration),
        stream_sequence: matches!(transport, "jetstream" | "memory"),
    });
    let opened = Opened {
        subscription,
        shared,
        lanes: driver::Lanes {
            count: options.lanes.max(1),
            key: options.lane_key,
        },
        stop: env.stop.clone(),
        deadlines: driver::Deadlines {
            drain: env.drain_timeout,
            close: env.close_timeout,
        },
    };
    Ok((opened, in_flight))
}
