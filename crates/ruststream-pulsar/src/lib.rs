//! Apache Pulsar transport for ruststream over the `pulsar` crate (tokio).
//!
//! The guide's page on Pulsar (`docs/pulsar.md` in the repository) tells the same with a
//! diagram.
//!
//! What each outcome becomes (SPEC P1-P7): `ack` and `drop` → `ack_with_id` (Pulsar has
//! no reject-for-good command); `retry` → `nack_with_id`, redelivered at once; `retry_after(d)`
//! → the delivery is held unacknowledged for d, then `nack_with_id`; no outcome → nothing
//! (the ack timeout, or a disconnect, brings it back). Every call is made by the
//! subscription's driver task, and acknowledgements are always individual.
//!
//! A registration's `max_attempts` and dead letter become the client's dead-letter policy
//! (`max_redeliver_count = max_attempts`): the handler sees a message at most
//! `max_attempts` times, then the client produces it to the dead-letter topic with
//! `REAL_TOPIC` and `ORIGIN_MESSAGE_ID` and acknowledges the original. Declaring one
//! without the other, or a cap on an Exclusive or Failover subscription (which count no
//! redeliveries), refuses to start. A `retry_after` delay not shorter than the
//! subscription's `ack_timeout` is refused, at startup when the registration declares its
//! longest delay (`longest_delay`), else when the handler returns it.
//!
//! The attempt number: the broker sends a redelivery count on Shared and KeyShared, but
//! the Rust client does not expose it, so the subscription counts deliveries per message
//! id itself. The two agree while the subscription's consumer receives the redeliveries;
//! a message redelivered to another consumer of the subscription starts again at 1 there
//! (the client's dead-letter policy still uses the broker's count).
//!
//! ```no_run
//! use std::time::Duration;
//! use ruststream::{on, App, HandlerOutcome, Message};
//! use ruststream_pulsar::{Pulsar, SubType};
//!
//! async fn bill(Message(order): Message<u64>) -> HandlerOutcome {
//!     if order % 2 == 0 { HandlerOutcome::ack() } else { HandlerOutcome::retry_after(Duration::from_secs(5)) }
//! }
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let pulsar = Pulsar::connect("pulsar://127.0.0.1:6650").await?;
//! App::new()
//!     .register(on(
//!         pulsar.topic("persistent://public/default/orders")
//!             .subscription("billing")
//!             .subscription_type(SubType::Shared)
//!             .ack_timeout(Duration::from_secs(30)),
//!         bill,
//!     )
//!     .max_attempts(5)
//!     .dead_letter("persistent://public/default/orders-dead"))
//!     .run()
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! # Guard rails (SPEC G1-G8): deadlines, refused copies, bounds, start position
//!
//! - Handlers run within the registration's `timeout` (the app's default is 30 s); past
//!   it the attempt counts as failed: a `nack`.
//! - A `backoff` turns `retry()` into a held `retry_after`; a backoff whose ceiling is not
//!   shorter than `ack_timeout` is refused at start.
//! - The runtime publishes no copies on Pulsar: the client's dead-letter policy moves
//!   exhausted messages (P5), so there is no refused copy to handle here; a dead-letter
//!   topic the subscription reads itself is refused at start.
//!
//! - A new subscription starts at the earliest message (`StartAt::Earliest`, the same
//!   default as every transport, where the client's own default is the latest);
//!   `.start_at(StartAt::Latest)` skips the backlog. `Pulsar::connect` fails after 10 s
//!   with the address named (`Pulsar::connect_waiting` waits for the broker instead, one
//!   WARN per interval). Held `retry_after` waits count toward `max_in_flight`.
//!
//! # What it cannot promise (measured in RELIABILITY.md)
//!
//! - At-least-once: after a crash or a broker restart some messages are handled twice.
//! - Properties are text: a header value that is not UTF-8 is refused at publish, named.
//! - Exclusive and Failover subscriptions count no attempts (P4) and take no cap (P6).
//! - A `retry_after` wait lives in the process (P1): a crash loses the wait, not the
//!   message, which the broker delivers again once the connection is gone (P7).
//! - When the client's consumer stream ends (its connection died, e.g. a broker restart),
//!   the subscription subscribes again by itself (at most once a second, retrying while
//!   the broker is away). What the old consumer delivered and nobody acknowledged comes
//!   back from the broker, counted as a new attempt; a message that was waiting in
//!   `retry_after` is held again for the rest of its delay. Settlements made while no
//!   consumer is open fail (logged); the broker delivers those messages again.

// No function over 80 lines of code (clippy.toml), in library code (ARCHITECTURE.md).
#![deny(clippy::too_many_lines)]

mod descriptor;
mod letters;
mod publish;
mod security;
pub mod subscription;

pub use descriptor::PulsarTopic;
pub use letters::DEAD_LETTER_SUBSCRIPTION;
pub use publish::PulsarPublisher;
pub use pulsar;
pub use pulsar::message::proto::command_subscribe::SubType;

pub use security::Security;

use ruststream_core::Cause;

/// A Pulsar cluster connection, shared by descriptors and publishers.
#[derive(Clone)]
pub struct Pulsar {
    client: pulsar::Pulsar<pulsar::TokioExecutor>,
    publisher: PulsarPublisher,
}

impl std::fmt::Debug for Pulsar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Pulsar")
    }
}

/// The connection could not be made: the broker's URL (password masked) and why.
pub use ruststream_core::ConnectError;

/// A Pulsar URL with user-info is refused before anything connects: Pulsar reads no
/// credentials from a URL, and the `pulsar` crate prints the URL it was given in its own
/// logs (at ERROR on every reconnect), so a password there would be both ignored and
/// leaked. Credentials go in [`Security`].
fn refuse_userinfo(url: &str) -> Result<(), ConnectError> {
    match ruststream_core::split_userinfo(url) {
        None => Ok(()),
        Some(_) => Err(ConnectError::new(
            "Pulsar",
            url,
            "a Pulsar URL carries no credentials: Pulsar ignores them there and its client \
             prints the URL in its logs; give a token with `Security::token` instead",
        )),
    }
}

/// How long [`Pulsar::connect`] waits for the broker (SPEC G7).
pub const DEFAULT_CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

impl Pulsar {
    /// Connects to `url` (`pulsar://host:port`), failing after
    /// [`DEFAULT_CONNECT_TIMEOUT`] (10 s) when the broker does not answer.
    pub async fn connect(url: &str) -> Result<Self, ConnectError> {
        Self::connect_within(url, DEFAULT_CONNECT_TIMEOUT).await
    }

    /// Connects to `url`, failing after `timeout` with an error naming it (SPEC G7). The
    /// client's own retries (it tries again for about 40 s by default) stop at the deadline.
    pub async fn connect_within(
        url: &str,
        timeout: std::time::Duration,
    ) -> Result<Self, ConnectError> {
        Self::connect_with(url, &Security::none(), timeout).await
    }

    /// Connects to `url` with a token and/or TLS trust ([`Security`]), failing after
    /// `timeout`. The token goes only to the client; errors print the URL masked.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// use ruststream_core::Secret;
    /// use ruststream_pulsar::{Pulsar, Security};
    ///
    /// let security = Security::token(Secret::new("eyJhbGciOi...")).with_ca("/etc/ssl/pulsar-ca.pem");
    /// let url = "pulsar+ssl://pulsar.internal:6651";
    /// let pulsar = Pulsar::connect_with(url, &security, ruststream_pulsar::DEFAULT_CONNECT_TIMEOUT).await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect_with(
        url: &str,
        security: &Security,
        timeout: std::time::Duration,
    ) -> Result<Self, ConnectError> {
        let fail = |source: Cause| ConnectError::new("Pulsar", url, source);
        refuse_userinfo(url)?;
        let builder = security
            .apply(pulsar::Pulsar::builder(url, pulsar::TokioExecutor))
            .map_err(|e| fail(Cause::new(e)))?;
        let build = builder.build();
        let client = tokio::time::timeout(timeout, build)
            .await
            .map_err(|_| fail(Cause::new(format!("no answer within {timeout:?}"))))?
            .map_err(|e| fail(Cause::new(e)))?;
        let mut pulsar = Self::from_client(client);
        pulsar.publisher.server = std::sync::Arc::from(url);
        Ok(pulsar)
    }

    /// Connects with settings from environment variables (the convention every
    /// transport shares, [`Env`](ruststream_core::Env)): `{PREFIX}_URL` (required) and
    /// the token and CA bundle [`Security::from_env`] reads; fails after
    /// [`DEFAULT_CONNECT_TIMEOUT`].
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// use ruststream_core::Env;
    /// let pulsar = ruststream_pulsar::Pulsar::connect_from_env(&Env::new("RUSTSTREAM_PULSAR")).await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect_from_env(
        env: &ruststream_core::Env,
    ) -> Result<Self, ruststream_core::FromEnvError<ConnectError>> {
        let url = env.require("URL")?;
        Self::connect_with(&url, &Security::from_env(env), DEFAULT_CONNECT_TIMEOUT)
            .await
            .map_err(ruststream_core::FromEnvError::Connect)
    }

    /// Like [`Pulsar::connect`], but a broker that does not answer is waited for (SPEC G7,
    /// opt-in): one WARN per `warn_every` names the address and the time waited, and
    /// attempts go on (each within `warn_every`, at most 10 s) until the broker answers.
    /// Every error is waited out: the client's errors do not tell an unreachable broker
    /// from a URL or credentials it refuses, so check the URL when the WARN repeats.
    pub async fn connect_waiting(
        url: &str,
        warn_every: std::time::Duration,
    ) -> Result<Self, ConnectError> {
        refuse_userinfo(url)?;
        ruststream_core::wait_for_broker(
            "Pulsar",
            &ruststream_core::redact_url(url),
            warn_every,
            |_: &ConnectError| true,
            || Self::connect_within(url, warn_every.min(DEFAULT_CONNECT_TIMEOUT)),
            tokio::time::sleep,
        )
        .await
    }

    /// Wraps a client configured by the caller.
    pub fn from_client(client: pulsar::Pulsar<pulsar::TokioExecutor>) -> Self {
        let publisher = PulsarPublisher::new(client.clone());
        Self { client, publisher }
    }

    /// The underlying client.
    pub fn client(&self) -> &pulsar::Pulsar<pulsar::TokioExecutor> {
        &self.client
    }

    /// A subscription on `topic` (set its name and type on the descriptor).
    pub fn topic(&self, topic: impl Into<String>) -> PulsarTopic {
        PulsarTopic::new(self.clone(), vec![topic.into()])
    }

    /// A subscription on several topics.
    pub fn topics<I: IntoIterator<Item = T>, T: Into<String>>(&self, topics: I) -> PulsarTopic {
        PulsarTopic::new(self.clone(), topics.into_iter().map(Into::into).collect())
    }

    /// Publishes with keys and properties, confirmed by the broker's receipt.
    pub fn publisher(&self) -> PulsarPublisher {
        self.publisher.clone()
    }

    /// The confirmed publish, for `ruststream::Publisher::new`: the one publishing shape
    /// of every transport (`.to(topic).key(..).header(..).send(&v)`; headers are the
    /// message's properties).
    pub fn publish_handle(&self) -> std::sync::Arc<dyn ruststream_core::Publish> {
        std::sync::Arc::new(self.publisher())
    }
}
