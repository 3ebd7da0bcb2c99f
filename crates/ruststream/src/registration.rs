//! A registration binds a handler to a subscription descriptor, with its retry rules.

use std::any::type_name;
use std::sync::Arc;
use std::time::Duration;

use ruststream_core::{DeadLetters, Declaration, DelayedRedelivery, Descriptor, may_copy};
use serde::de::DeserializeOwned;

use crate::asyncapi::{Entry, MessageSchema};
use crate::backoff::Backoff;
use crate::batch::{BatchHandler, BatchService, DEFAULT_MAX_BATCH, DEFAULT_MAX_WAIT};
use crate::codec::Codec;

use crate::handler::{Handler, HandlerService};
use crate::middleware::{Layer, Service};
use crate::runtime::mount::Mount;
use crate::state::StateMap;

/// What happens to a delivery an extractor refuses (an undecodable payload, SPEC E1).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FailurePolicy {
    /// To the dead-letter address when one is declared, else dropped with an error log
    /// naming the address and the decode error. The default.
    #[default]
    DeadLetter,
    /// Treated as `retry()`: counts as a failed attempt against `max_attempts`.
    Retry,
    /// Dropped with an error log.
    Drop,
}

/// How deliveries are spread over lanes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LaneKey {
    /// By the delivery's key: one key, one lane, in order. A keyless delivery starts on
    /// the first free lane (never queued behind a running one). The default.
    #[default]
    Key,
    /// By Kafka partition (falls back to the key where there is none).
    Partition,
}

/// Binds `handler` to `descriptor`. Configure it, then give it to
/// [`App::register`](crate::App::register).
///
/// ```
/// use ruststream::{on, HandlerOutcome, Message, memory::MemoryBroker};
///
/// async fn handle(Message(n): Message<u32>) -> HandlerOutcome {
///     HandlerOutcome::ack()
/// }
///
/// let broker = MemoryBroker::new();
/// let registration = on(broker.topic("numbers"), handle)
///     .max_attempts(3)
///     .dead_letter("numbers.dead")
///     .lanes(4);
/// ```
pub fn on<D, H, Args>(descriptor: D, handler: H) -> Registration<D, HandlerService<H, Args>>
where
    D: Descriptor,
    H: Handler<Args>,
    Args: 'static,
{
    Registration {
        name: short_type_name::<H>(),
        descriptor,
        service: HandlerService::new(handler),
        requirements: H::requirements,
        options: Options::default(),
        mount: |registration| Box::new(registration),
    }
}

pub(crate) fn short_type_name<T>() -> String {
    let full = type_name::<T>();
    // `my_crate::orders::on_order` → `orders::on_order`; closures keep their full path.
    let parts: Vec<&str> = full.split("::").collect();
    if full.contains('{') || parts.len() < 3 {
        full.to_owned()
    } else {
        parts[parts.len() - 2..].join("::")
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Options {
    pub(crate) max_attempts: Option<u32>,
    pub(crate) dead_letter: Option<String>,
    pub(crate) retry_to: Option<String>,
    pub(crate) lanes: usize,
    /// Subscriptions opened, each with its own driver task.
    pub(crate) consumers: usize,
    pub(crate) lane_key: LaneKey,
    pub(crate) failure_policy: FailurePolicy,
    pub(crate) timeout: Option<Duration>,
    pub(crate) backoff: Option<Backoff>,
    pub(crate) max_in_flight: usize,
    /// How batches are cut (a batch registration, [`on_batch`](crate::on_batch)).
    pub(crate) batch: Option<BatchLimits>,
    /// The payload's type, for the service's description (AsyncAPI).
    pub(crate) schema: Option<MessageSchema>,
    /// What the registration's layers refuse of its descriptor ([`Layer::check`]).
    pub(crate) layer_rules: Vec<String>,
}

impl Options {
    /// The numbers out of their bounds (SPEC E4), one string each.
    fn out_of_bounds(&self) -> Vec<String> {
        let mut broken = Vec::new();
        if self.max_attempts == Some(0) {
            broken.push(
                "max_attempts must be at least 1 (the first delivery is attempt 1)".to_owned(),
            );
        }
        if self.lanes == 0 {
            broken.push("lanes must be at least 1".to_owned());
        }
        if self.lanes > MAX_LANES {
            broken.push(format!(
                "lanes({}) is above the bound of {MAX_LANES}; split the work over registrations",
                self.lanes
            ));
        }
        if self.consumers == 0 {
            broken.push("consumers must be at least 1".to_owned());
        }
        if self.consumers > MAX_CONSUMERS {
            broken.push(format!(
                "consumers({}) is above the bound of {MAX_CONSUMERS}; run more processes instead",
                self.consumers
            ));
        }
        if self.max_in_flight == 0 {
            broken.push("max_in_flight must be at least 1".to_owned());
        }
        broken.extend(
            self.batch
                .and_then(|limits| limits.violation(self.max_in_flight)),
        );
        if self.timeout.is_some_and(|d| d.is_zero()) {
            broken.push("the handler timeout must be longer than zero".to_owned());
        }
        broken
    }
}

/// How many deliveries a subscription holds at most unless set (SPEC G5).
pub const DEFAULT_MAX_IN_FLIGHT: usize = 1024;

/// The most lanes one registration may run (SPEC G4): lanes are futures of one task, and
/// past this a registration is better split.
pub const MAX_LANES: usize = 1024;

/// The most consumers one registration may open in one process (SPEC G4): each is a
/// subscription of its own on the broker, and a task.
pub const MAX_CONSUMERS: usize = 256;

impl Default for Options {
    fn default() -> Self {
        Self {
            max_attempts: None,
            dead_letter: None,
            retry_to: None,
            lanes: 1,
            consumers: 1,
            lane_key: LaneKey::Key,
            failure_policy: FailurePolicy::DeadLetter,
            timeout: None,
            backoff: None,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            batch: None,
            schema: None,
            layer_rules: Vec::new(),
        }
    }
}

/// A handler bound to a descriptor; see [`on`].
pub struct Registration<D, S> {
    pub(crate) name: String,
    pub(crate) descriptor: D,
    pub(crate) service: S,
    pub(crate) requirements: fn(&StateMap) -> Vec<String>,
    pub(crate) options: Options,
    /// Erases its types, made where they are known to fit (in [`on`] and
    /// [`layer`](Registration::layer)), so the app takes a registration with no bound
    /// of its own: a handler that is not one is reported once, at `on`.
    pub(crate) mount: fn(Self) -> Box<dyn Mount>,
}

impl<D: Descriptor, S> Registration<D, S> {
    /// Names the registration in logs and errors (default: the handler's path).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The cap: a retry at this attempt goes to the dead letter (or is let go). The first
    /// delivery is attempt 1.
    pub fn max_attempts(mut self, max: u32) -> Self {
        self.options.max_attempts = Some(max);
        self
    }

    /// Where exhausted and undecodable deliveries go.
    pub fn dead_letter(mut self, address: impl Into<String>) -> Self {
        self.options.dead_letter = Some(address.into());
        self
    }

    /// Where retry copies go; required when the descriptor reads several addresses and
    /// the broker cannot redeliver by itself (`KafkaTopics`, `CoreWildcard`).
    pub fn retry_to(mut self, address: impl Into<String>) -> Self {
        self.options.retry_to = Some(address.into());
        self
    }

    /// Runs up to `n` deliveries concurrently, keeping per-key order (default 1, at most
    /// [`MAX_LANES`]). Lanes share one task: they overlap while handlers wait on I/O, not
    /// while a handler computes or blocks (move such work to `spawn_blocking`). The task
    /// gives its thread back to the runtime every 128 deliveries (as many as tokio's
    /// cooperative budget allows a task per poll), also while a backlog answers every
    /// fetch at once, so other registrations, timers and the health endpoint on the same
    /// thread keep running.
    pub fn lanes(mut self, n: usize) -> Self {
        self.options.lanes = n;
        self
    }

    /// Opens `n` subscriptions of this registration (default 1, at most
    /// [`MAX_CONSUMERS`]), each with its own driver task, so on a multi-threaded runtime
    /// `n` handlers compute at once: Kafka `n` members of the group, JetStream `n` pullers
    /// on the durable consumer, RabbitMQ `n` consumers each on its own channel, Redis `n`
    /// consumer names in the group, Pulsar `n` consumers of a `Shared` or `KeyShared`
    /// subscription, Core NATS `n` members of the queue group, the memory broker `n`
    /// competing consumers. `lanes`, `max_in_flight` and per-key order are each
    /// consumer's; metrics and health count them as one registration. See the guide's
    /// "Scaling a service".
    pub fn consumers(mut self, n: usize) -> Self {
        self.options.consumers = n;
        self
    }

    /// The handler deadline (SPEC G1; default the app's
    /// [`handler_timeout`](crate::App::handler_timeout), 30 s unless set). A call still
    /// running past it is cancelled (its future dropped), logged with the registration,
    /// address, attempt and deadline, and counts as a failed attempt: a `retry()` under
    /// the registration's `max_attempts` and dead letter. A JetStream keepalive stops at
    /// the deadline too.
    pub fn timeout(mut self, deadline: Duration) -> Self {
        self.options.timeout = Some(deadline);
        self
    }

    /// Turns every `retry()` (and every error, panic and timeout, which count as one)
    /// into `retry_after(backoff.delay(attempt))`, so a failing delivery comes back later
    /// through the transport's own delay path instead of at once (SPEC G2). Without it a
    /// `retry()` is redelivered at once, as the spec names for each broker; an in-place
    /// rerun (Kafka `Commit::Tracked`) still waits a floor of 10 ms doubling to 1 s.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.options.backoff = Some(backoff);
        self
    }

    /// The most deliveries each consumer of this registration holds at once: running,
    /// queued for a lane, and waiting for a `retry_after` (default
    /// [`DEFAULT_MAX_IN_FLIGHT`], 1024). At the
    /// bound it stops fetching and goes on as deliveries settle (SPEC G5), so memory stays
    /// bounded whatever the handlers return. Per-key order and Kafka positions are kept:
    /// nothing is skipped, only read later.
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.options.max_in_flight = n;
        self
    }

    /// How deliveries are assigned to lanes.
    pub fn lane_by(mut self, key: LaneKey) -> Self {
        self.options.lane_key = key;
        self
    }

    /// Declares the payload's type for the service's description: the AsyncAPI document
    /// ([`App::asyncapi`](crate::App::asyncapi)) shows its JSON Schema for what this
    /// registration reads, retries and dead-letters. Any type deriving
    /// [`schemars::JsonSchema`] (re-exported as `ruststream::schemars`); without it the
    /// document says any payload.
    pub fn schema<T: schemars::JsonSchema>(mut self) -> Self {
        self.options.schema = Some(MessageSchema::of::<T>());
        self
    }

    /// What happens to deliveries an extractor refuses.
    pub fn on_failure(mut self, policy: FailurePolicy) -> Self {
        self.options.failure_policy = policy;
        self
    }

    /// Wraps the handler in a middleware layer; the last layer added runs first.
    pub fn layer<L: Layer<S>>(self, layer: L) -> Registration<D, L::Service>
    where
        S: Service,
    {
        let mut options = self.options;
        let capabilities = self.descriptor.capabilities();
        options
            .layer_rules
            .extend(layer.check(self.descriptor.transport(), &capabilities));
        Registration {
            name: self.name,
            descriptor: self.descriptor,
            service: layer.layer(self.service),
            requirements: self.requirements,
            options,
            mount: |registration| Box::new(registration),
        }
    }

    /// The declaration the planner sees, with the retry address resolved.
    pub(crate) fn declaration(&self) -> Declaration {
        let retry = self
            .options
            .retry_to
            .as_deref()
            .or_else(|| self.descriptor.retry_address());
        let mut declaration = Declaration::default();
        declaration.max_attempts = self.options.max_attempts;
        declaration.dead_letter = self.options.dead_letter.as_deref().map(Arc::from);
        declaration.retry_address = retry.map(Arc::from);
        declaration.consumers = self.options.consumers;
        declaration
    }

    /// The registration as the service's description shows it.
    pub(crate) fn entry(&self, app_timeout: Duration) -> Entry {
        use serde_json::json;
        let declaration = self.declaration();
        let capabilities = self.descriptor.capabilities();
        let options = &self.options;
        let retry = declaration
            .retry_address
            .as_deref()
            .filter(|_| may_copy(&declaration, &capabilities));
        let mut policy = vec![
            ("max-attempts", json!(options.max_attempts)),
            ("on-failure", json!(format!("{:?}", options.failure_policy))),
            ("lanes", json!(options.lanes)),
            ("lane-by", json!(format!("{:?}", options.lane_key))),
            ("consumers", json!(options.consumers)),
            ("max-in-flight", json!(options.max_in_flight)),
            (
                "timeout-ms",
                json!(options.timeout.unwrap_or(app_timeout).as_millis() as u64),
            ),
        ];
        if let Some(limits) = options.batch {
            policy.push(("max-batch", json!(limits.max_batch)));
            policy.push(("max-wait-ms", json!(limits.max_wait.as_millis() as u64)));
        }
        Entry {
            name: self.name.clone(),
            address: self.descriptor.address().to_owned(),
            server: self.descriptor.describe(),
            retry: retry.map(str::to_owned),
            dead_letter: options.dead_letter.clone(),
            dead_letter_by: match capabilities.dead_letters {
                DeadLetters::Runtime => "runtime",
                DeadLetters::Broker => "broker",
                DeadLetters::Subscription => "subscription",
            },
            schema: options.schema.clone(),
            policy,
        }
    }

    /// Every rule this registration breaks (SPEC E4), one string each.
    pub(crate) fn violations(&self, state: &StateMap) -> Vec<String> {
        let declaration = self.declaration();
        let capabilities = self.descriptor.capabilities();
        let mut broken = Vec::new();
        broken.extend(self.options.out_of_bounds());
        broken.extend(self.options.layer_rules.iter().cloned());
        if let (Some(backoff), DelayedRedelivery::Held { limit: Some(limit) }) =
            (self.options.backoff, capabilities.delayed_redelivery)
            && backoff.max() >= limit
        {
            broken.push(format!(
                "the backoff reaches {:?}, not shorter than the subscription's limit of {limit:?} \
                 (the broker would bring the message back first)",
                backoff.max()
            ));
        }
        if declaration.retry_address.is_none() && may_copy(&declaration, &capabilities) {
            broken.push(
                "the descriptor reads several addresses and this broker brings messages back by \
                 publishing copies, so name the copies' destination with .retry_to(address)"
                    .to_owned(),
            );
        }
        if let Some(dead) = &self.options.dead_letter {
            if dead.is_empty() {
                broken.push("the dead-letter address is empty".to_owned());
            } else if let Some(rule) = self.descriptor.address_rule(dead) {
                broken.push(format!("the dead-letter address `{dead}`: {rule}"));
            }
            if self.descriptor.reads(dead) {
                broken.push(format!(
                    "the dead-letter address `{dead}` is read by this registration itself, \
                     so every dead letter would be handled again without end"
                ));
            }
            // The broker's own dead-letter policy (Pulsar) says this its own way (P6).
            if self.options.max_attempts.is_none()
                && capabilities.dead_letters != DeadLetters::Broker
            {
                broken.push(format!(
                    "a dead letter (`{dead}`) without max_attempts is never reached: a failing \
                     delivery is retried forever; set .max_attempts(n)"
                ));
            }
        }
        match self.options.retry_to.as_deref() {
            Some("") => broken.push("the retry address is empty".to_owned()),
            Some(retry) => {
                if let Some(rule) = self.descriptor.address_rule(retry) {
                    broken.push(format!("the retry address `{retry}`: {rule}"));
                }
                if self.options.dead_letter.as_deref() == Some(retry) {
                    broken.push(format!(
                        "the retry address `{retry}` is also the dead-letter address, so retry \
                         copies and dead letters could not be told apart; give each its own"
                    ));
                }
            }
            None => {}
        }
        broken.extend(self.descriptor.check(&declaration));
        broken.extend((self.requirements)(state));
        broken
    }
}

/// How a batch is cut: at `max_batch` messages, or `max_wait` after its first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BatchLimits {
    pub(crate) max_batch: usize,
    pub(crate) max_wait: std::time::Duration,
}

impl BatchLimits {
    /// What is wrong with these limits under `max_in_flight`, if anything.
    pub(crate) fn violation(self, max_in_flight: usize) -> Option<String> {
        if self.max_batch == 0 {
            return Some("max_batch must be at least 1".to_owned());
        }
        (self.max_batch > max_in_flight).then(|| {
            format!(
                "max_batch({}) is above max_in_flight({max_in_flight}), so a batch could never \
                 fill; raise max_in_flight or lower max_batch",
                self.max_batch
            )
        })
    }
}

impl Default for BatchLimits {
    fn default() -> Self {
        Self {
            max_batch: DEFAULT_MAX_BATCH,
            max_wait: DEFAULT_MAX_WAIT,
        }
    }
}

/// Binds a batch `handler` to `descriptor` (see [`batch`](crate::batch)). The registration
/// takes every option of [`on`](crate::on)'s (`max_attempts`, `dead_letter`, `lanes`,
/// `timeout`...) and [`max_batch`](Registration::max_batch) (default
/// [`DEFAULT_MAX_BATCH`]) and [`max_wait`](Registration::max_wait) (default
/// [`DEFAULT_MAX_WAIT`]); not middleware layers, which wrap one message's handling.
pub fn on_batch<D, H, T, C, Args>(
    descriptor: D,
    handler: H,
) -> Registration<D, BatchService<H, T, C, Args>>
where
    D: Descriptor,
    H: BatchHandler<T, C, Args>,
    T: DeserializeOwned + Send + 'static,
    C: Codec,
    Args: 'static,
{
    Registration {
        name: short_type_name::<H>(),
        descriptor,
        service: BatchService::new(handler),
        requirements: H::requirements,
        options: Options {
            batch: Some(BatchLimits::default()),
            ..Options::default()
        },
        mount: |registration| Box::new(registration),
    }
}

impl<D: Descriptor, H, T, C, Args> Registration<D, BatchService<H, T, C, Args>> {
    /// The most messages one batch holds (default [`DEFAULT_MAX_BATCH`]); at most
    /// `max_in_flight`.
    pub fn max_batch(mut self, n: usize) -> Self {
        if let Some(limits) = &mut self.options.batch {
            limits.max_batch = n;
        }
        self
    }

    /// How long a batch waits for more messages after its first (default
    /// [`DEFAULT_MAX_WAIT`]); zero hands over whatever was read at once.
    pub fn max_wait(mut self, wait: std::time::Duration) -> Self {
        if let Some(limits) = &mut self.options.batch {
            limits.max_wait = wait;
        }
        self
    }
}
