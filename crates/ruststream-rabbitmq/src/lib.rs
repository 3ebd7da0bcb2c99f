//! RabbitMQ transport for ruststream over `lapin` (AMQP 0-9-1).
//!
//! A [`RabbitQueue`] reads one queue with manual acknowledgements and a prefetch
//! (`basic.qos`) as the bound on unacknowledged deliveries. What each outcome becomes
//! (SPEC R1-R7, in `docs/spec.md`):
//!
//! | outcome | classic queue | quorum queue |
//! |---|---|---|
//! | `ack()` | `basic.ack`, gathered: a run of acked deliveries as one `multiple` ack before the next fetch waits | the same |
//! | `drop()` | `basic.reject(requeue=false)`: to the queue's dead-letter exchange if it has one, else discarded | the same |
//! | `retry()` | `basic.nack(requeue=true)`, back at once | the same; the broker counts it (`x-delivery-count`) |
//! | `retry_after(d)` | a copy to the queue after d (`x-ruststream-retry-count` + 1), confirmed before the original is acknowledged: the original stays unacknowledged meanwhile, so a crash brings it back | held unacknowledged in the service for d, then `basic.nack(requeue=true)`: a crash gives it back at once |
//! | at `max_attempts` | the delivery, as it arrived, to the dead-letter queue, confirmed, then `basic.ack` | the same |
//!
//! Attempts: a quorum queue counts deliveries itself (`x-delivery-count`, so attempt =
//! count + 1, kept across restarts of the service); a classic queue only flags
//! `redelivered`, so under `max_attempts` retries go through copies that carry the count
//! in `x-ruststream-retry-count`, and an undeclared `retry()` (a plain requeue) is counted
//! by the service per message, each requeue after the first waiting a floor (10 ms
//! doubling to 1 s) so it never spins.
//!
//! Settlements when the connection fails: a delivery whose channel was lost is not
//! settled (the broker delivers it again by itself), and a settlement RabbitMQ does not
//! answer fails after 5 to 10 seconds instead of waiting forever; both are logged and
//! counted in `ruststream_settle_errors_total{kind="failed"}` when the app collects
//! metrics.
//!
//! Publishing goes to the default exchange with the queue's name as routing key, with
//! publisher confirms and the `mandatory` flag: a message no queue takes is an error
//! (`NoSuchAddress`), never a silent drop.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use ruststream::{App, HandlerOutcome, Message, on};
//! use ruststream_rabbitmq::{QueueKind, RabbitMq};
//!
//! async fn bill(Message(order): Message<u64>) -> HandlerOutcome {
//!     let _ = order;
//!     HandlerOutcome::ack()
//! }
//!
//! let rabbit = RabbitMq::connect("amqp://guest:guest@127.0.0.1:5672/%2f").await?;
//! App::new()
//!     .register(
//!         on(rabbit.queue("orders").kind(QueueKind::Quorum).declare(true), bill)
//!             .max_attempts(5)
//!             .dead_letter("orders.dead"),
//!     )
//!     .run()
//!     .await?;
//! # Ok(()) }
//! ```

// No function over 80 lines of code (clippy.toml), in library code (ARCHITECTURE.md).
#![deny(clippy::too_many_lines)]

mod acks;
mod descriptor;
mod letters;
mod link;
mod probe;
mod publish;
mod queue;
mod requeue;
mod settle_timer;
pub mod subscription;
mod version;

use std::sync::Arc;
use std::time::Duration;

pub use descriptor::{DEFAULT_PREFETCH, RabbitQueue};
pub use lapin;
pub use lapin::ExchangeKind;
use link::Link;
pub use publish::RabbitPublisher;
pub use queue::QueueKind;
use ruststream_core::Cause;

/// How long [`RabbitMq::connect`] waits for the broker (SPEC G7).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A RabbitMQ connection, shared by descriptors and publishers. Cheap to clone.
#[derive(Clone)]
pub struct RabbitMq {
    link: Arc<Link>,
    publisher: RabbitPublisher,
}

impl std::fmt::Debug for RabbitMq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RabbitMq")
            .field("url", &self.link.shown())
            .finish()
    }
}

/// The connection could not be made: the broker's URL (password masked) and why.
pub use ruststream_core::ConnectError;

impl RabbitMq {
    /// Connects to `url` (`amqp://user:password@host:5672/%2f`), failing after
    /// [`DEFAULT_CONNECT_TIMEOUT`] with an error naming the address (password masked).
    pub async fn connect(url: &str) -> Result<Self, ConnectError> {
        Self::connect_within(url, DEFAULT_CONNECT_TIMEOUT).await
    }

    /// Connects to `url`, failing after `timeout`.
    ///
    /// A connection lost later (the broker restarted, the network cut) is made again on
    /// first use, within the same `timeout` per attempt: each subscription opens its
    /// consumer again (what was delivered and not acknowledged comes back from the
    /// broker) and the publisher its confirm channel, trying again while the broker
    /// refuses. Readiness reports the registration down meanwhile.
    pub async fn connect_within(url: &str, timeout: Duration) -> Result<Self, ConnectError> {
        let fail = |source: Cause| ConnectError::new("RabbitMQ", url, source);
        let link = Arc::new(
            Link::open(url, timeout)
                .await
                .map_err(|e| fail(Cause::new(e)))?,
        );
        let publisher = RabbitPublisher::open(Arc::clone(&link))
            .await
            .map_err(|e| fail(Cause::new(e)))?;
        Ok(Self { link, publisher })
    }

    /// Connects with the URL from the environment (the convention every transport
    /// shares, [`Env`](ruststream_core::Env)): `{PREFIX}_URL`, credentials inside it
    /// (`amqp://user:password@host:5672/%2f`, `amqps://` for TLS). The password is masked
    /// in every error.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use ruststream_core::Env;
    /// let rabbit = ruststream_rabbitmq::RabbitMq::connect_from_env(&Env::new("RUSTSTREAM_RABBITMQ")).await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect_from_env(
        env: &ruststream_core::Env,
    ) -> Result<Self, ruststream_core::FromEnvError<ConnectError>> {
        let url = env.require("URL")?;
        Self::connect(&url)
            .await
            .map_err(ruststream_core::FromEnvError::Connect)
    }

    /// The connection in use (a new one replaces it once it was lost).
    pub fn connection(&self) -> Arc<lapin::Connection> {
        self.link.current()
    }

    /// A subscription on `queue` (a classic queue unless told; see [`RabbitQueue`]).
    pub fn queue(&self, queue: impl Into<String>) -> RabbitQueue {
        RabbitQueue::new(self.clone(), queue.into())
    }

    /// Declares a durable queue of `kind` (nothing changes when it exists with that kind;
    /// a different kind is an error naming the queue): for the dead-letter and retry
    /// queues a registration publishes to, which ruststream does not create.
    pub async fn declare_queue(
        &self,
        queue: &str,
        kind: QueueKind,
    ) -> Result<(), ruststream_core::SubscribeError> {
        let connection = self
            .link
            .connected()
            .await
            .map_err(|e| ruststream_core::SubscribeError::new(queue, e))?;
        queue::declare(&connection, queue, kind, true, None).await
    }

    /// Publishes to a queue by name, with publisher confirms.
    pub fn publisher(&self) -> RabbitPublisher {
        self.publisher.clone()
    }

    /// The confirmed publish, for `ruststream::Publisher::new`: the one publishing shape of
    /// every transport (`.to(queue).header(..).send(&v)`).
    pub fn publish_handle(&self) -> Arc<dyn ruststream_core::Publish> {
        Arc::new(self.publisher.clone())
    }
}
