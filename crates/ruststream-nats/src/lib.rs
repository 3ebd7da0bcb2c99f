//! NATS transport for ruststream: Core NATS and JetStream over `async-nats`.
//!
//! The guide's page on NATS (`docs/nats.md` in the repository) tells the same with a
//! diagram.
//!
//! - [`CoreSubject`] and [`CoreWildcard`] read Core NATS: at-most-once, nothing to
//!   settle. `ack`, `drop` and `retry` answer `AckError::Unsupported` (logged);
//!   `retry_after(d)`, and `retry()` under a declared cap or dead letter, publish a copy
//!   with `x-ruststream-retry-count` (SPEC N2, N3, N5). A copy waiting for its delay lives
//!   in the process: a crash before it fires loses it (N8); a graceful stop publishes it
//!   early instead.
//! - [`JetStreamConsumer`] reads a stream through a durable pull consumer: `ack` → `+ACK`,
//!   `retry` → `-NAK`, `retry_after(d)` → `-NAK {"delay": nanos}`, `drop` → `+TERM`, no
//!   outcome → nothing (redelivered after `ack_wait`). Attempts are the server's
//!   `delivered` (N1, N4); `max_deliver` stays unset (N7). At the cap the delivery is
//!   published to the dead-letter subject unchanged, confirmed (by the stream's publish
//!   acknowledgement when a stream captures that subject), then terminated (N6).
//!
//! ```no_run
//! use std::time::Duration;
//! use ruststream::{on, App, HandlerOutcome, Message, Publisher, ReplyTo};
//! use ruststream_nats::Nats;
//!
//! #[derive(serde::Deserialize, serde::Serialize)]
//! struct Order { id: u64 }
//!
//! // JetStream: the server counts attempts and holds delayed redeliveries.
//! async fn bill(Message(order): Message<Order>) -> HandlerOutcome {
//!     if order.id % 2 == 0 { HandlerOutcome::ack() } else { HandlerOutcome::retry_after(Duration::from_secs(5)) }
//! }
//!
//! // Core: answer requests on `orders.price`.
//! async fn price(Message(order): Message<Order>, reply: ReplyTo, publisher: Publisher) -> HandlerOutcome {
//!     let _ = publisher.to(&*reply.0).send(&(order.id * 100)).await;
//!     HandlerOutcome::ack()
//! }
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let nats = Nats::connect("nats://127.0.0.1:4222").await?;
//! App::new()
//!     .register(on(nats.consumer("ORDERS", "billing").filter_subject("orders.new"), bill)
//!         .max_attempts(5)
//!         .dead_letter("orders.dead"))
//!     .register(on(nats.subject("orders.price").queue_group("pricing"), price))
//!     .run()
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! # Guard rails (SPEC G1-G8): deadlines, refused copies, bounds, start position
//!
//! - Handlers run within the registration's `timeout` (the app's default is 30 s). The
//!   `+WPI` keepalive covers only deliveries that are not done at once (one waiting for
//!   its lane, from hand-over; one whose handler yields, from its first poll) and is never
//!   sent for one past the deadline (at most three deadlines, since a delivery may wait
//!   behind one running and one queued in its lane), so a handler that cannot be
//!   cancelled still gets the delivery redelivered after `ack_wait`.
//! - A dead letter JetStream refuses (the stream full with discard-new, the message over
//!   the stream's size limit, no stream) is not retried in a loop: the original is
//!   `-NAK`ed with a delay of 1 s doubling to 5 min per refusal in a row, and comes back.
//!   A timeout or lost connection is tried again first.
//! - Core NATS holds nothing: a retry copy over the server's `max_payload` goes to the
//!   dead letter instead (the message as it arrived fits); a copy refused otherwise is
//!   lost, logged at ERROR with "lost", the subject and the reason.
//! - A dead-letter subject the registration reads (the subject, a match of its wildcard
//!   or JetStream filter, or, unfiltered, a subject its stream captures) is refused at
//!   start, as are subjects with whitespace, empty tokens or wildcards.
//!
//! - A new durable consumer reads the stream from its start (`StartAt::Earliest`, the same
//!   default as every transport); `.start_at(StartAt::Latest)` or `StartAt::Time(t)` choose
//!   otherwise. `Nats::connect` fails after at most 10 s with the address named
//!   (`Nats::connect_waiting` waits for the server instead, one WARN per interval); Core
//!   slow-consumer drops are counted per subject (`Nats::slow_consumer_drops_on`) and
//!   logged at WARN naming the subject.
//!
//! # What it cannot promise (measured in RELIABILITY.md)
//!
//! - Core NATS is at-most-once (N2): a message the process received and had not finished
//!   when it died is gone (the fault test measures about three quarters of a 200-message
//!   batch lost when the service is SIGKILLed a quarter of the way through), and a retry
//!   copy waiting for its delay dies with the process (N8). A graceful stop publishes
//!   waiting copies early instead.
//! - JetStream is at-least-once: after a crash or a server restart some messages are
//!   handled twice; make handlers idempotent.
//! - NATS headers are text: a value that is not UTF-8 or holds a line break, or a name
//!   NATS cannot carry, is refused at publish with the header named.
//! - A publish through the `Publish` contract asks the server which stream captures the
//!   subject; when no answer comes (the server restarting), the publish fails rather
//!   than going out on Core NATS, so the original stays unsettled and comes back.

// No function over 80 lines of code (clippy.toml), in library code (ARCHITECTURE.md).
#![deny(clippy::too_many_lines)]

mod ack_reply;
mod core_subject;
mod drop_log;
mod drops;
mod headers;
mod jetstream;
mod keepalive;
mod link;
mod publish;
mod subject;

use std::sync::Arc;

pub use async_nats;
pub use core_subject::{CoreSubject, CoreWildcard};
pub use drop_log::slow_consumer_layer;
use drops::SlowConsumers;

/// The open subscriptions the descriptors make: the runtime drives them, a service never
/// names them.
pub mod subscription {
    pub use crate::core_subject::CoreSubscription;
    pub use crate::jetstream::JetStreamSubscription;
}
pub use jetstream::{
    CAPABILITIES as JETSTREAM_CAPABILITIES, DEFAULT_ACK_WAIT, DEFAULT_BATCH, JetStreamConsumer,
};
pub use publish::{MessageId, NatsPublisher, RequestError, Stored};
use ruststream_core::Publish;

/// One NATS connection: descriptors and publishers share it.
#[derive(Clone, Debug)]
pub struct Nats {
    client: async_nats::Client,
    drops: Arc<SlowConsumers>,
}

/// How long [`Nats::connect`] waits for the server (SPEC G7).
pub const DEFAULT_CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The connection could not be made.
#[derive(Debug, thiserror::Error)]
#[error("cannot connect to NATS at `{url}`: {source}")]
pub struct ConnectError {
    url: String,
    #[source]
    source: async_nats::ConnectError,
    unreachable: bool,
}

impl ConnectError {
    /// The server address, its password or token masked (`nats://***@host`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The server did not answer (waiting may help), rather than refusing the client.
    pub fn is_unreachable(&self) -> bool {
        self.unreachable
    }
}

impl Nats {
    /// Connects to `url` (`nats://host:port`), failing after [`DEFAULT_CONNECT_TIMEOUT`]
    /// (10 s) with an error naming the address when the server does not answer. The client
    /// reconnects by itself after. Slow-consumer drops on Core subscriptions are counted
    /// ([`Nats::slow_consumer_drops`]) and logged at WARN, at most once per 10 s.
    pub async fn connect(url: &str) -> Result<Self, ConnectError> {
        let options = async_nats::ConnectOptions::new().connection_timeout(DEFAULT_CONNECT_TIMEOUT);
        Self::connect_with(url, options).await
    }

    /// Like [`Nats::connect`], but a server that does not answer is waited for (SPEC G7,
    /// opt-in): one WARN per `warn_every` names the address and the time waited, and
    /// attempts go on once a second until the server answers. Errors waiting cannot fix
    /// (a malformed URL, refused credentials, TLS) are returned at once.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), ruststream_nats::ConnectError> {
    /// use std::time::Duration;
    /// let nats = ruststream_nats::Nats::connect_waiting("nats://127.0.0.1:4222", Duration::from_secs(30)).await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect_waiting(
        url: &str,
        warn_every: std::time::Duration,
    ) -> Result<Self, ConnectError> {
        ruststream_core::wait_for_broker(
            "NATS",
            &ruststream_core::redact_url(url),
            warn_every,
            ConnectError::is_unreachable,
            || {
                let options = async_nats::ConnectOptions::new()
                    .connection_timeout(warn_every.min(DEFAULT_CONNECT_TIMEOUT));
                Self::connect_with(url, options)
            },
            tokio::time::sleep,
        )
        .await
    }

    /// Like [`Nats::connect`], with the client's options (credentials, TLS, timeouts);
    /// ruststream adds its slow-consumer counting. Credentials inside the URL
    /// (`nats://user:password@host`, `nats://token@host`) are taken out of it and given
    /// to the client as options, so the client's own logs, which print the server
    /// address, never hold them.
    pub async fn connect_with(
        url: &str,
        options: async_nats::ConnectOptions,
    ) -> Result<Self, ConnectError> {
        let (bare, credentials) = split_credentials(url);
        let options = match credentials {
            Some(Credentials::UserPassword(user, password)) => {
                options.user_and_password(user, password.expose().to_owned())
            }
            Some(Credentials::Token(token)) => options.token(token.expose().to_owned()),
            None => options,
        };
        let drops = Arc::new(SlowConsumers::default());
        let counted = Arc::clone(&drops);
        let client = options
            .event_callback(move |event| {
                let counted = Arc::clone(&counted);
                async move {
                    if let async_nats::Event::SlowConsumer(sid) = event {
                        counted.record(sid);
                    }
                }
            })
            .connect(bare.as_str())
            .await
            .map_err(|e| {
                use async_nats::ConnectErrorKind as Kind;
                ConnectError {
                    url: ruststream_core::redact_url(url).into_owned(),
                    unreachable: matches!(e.kind(), Kind::TimedOut | Kind::Io | Kind::Dns),
                    source: e,
                }
            })?;
        Ok(Self { client, drops })
    }

    /// Connects with settings from environment variables (the convention every
    /// transport shares, [`Env`](ruststream_core::Env)), so a service moves between
    /// clusters without a code change. With `Env::new("RUSTSTREAM_NATS")`:
    ///
    /// | variable | meaning |
    /// |---|---|
    /// | `RUSTSTREAM_NATS_URL` | the server(s), required |
    /// | `RUSTSTREAM_NATS_USER` + `_PASSWORD` | user and password |
    /// | `RUSTSTREAM_NATS_TOKEN` | a token |
    /// | `RUSTSTREAM_NATS_NKEY` | an nkey seed (`SU...`) |
    /// | `RUSTSTREAM_NATS_CREDS` | a `.creds` file (user JWT and seed) |
    /// | `RUSTSTREAM_NATS_CA` | CA bundle (PEM) to trust; TLS is then required |
    /// | `RUSTSTREAM_NATS_CERT` + `_KEY` | client certificate and key (PEM) |
    ///
    /// At most one kind of credentials; a missing half of a pair, several kinds, or an
    /// unreadable `.creds` file is an [`EnvError`](ruststream_core::EnvError) naming the
    /// variables (never their values).
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use ruststream_core::Env;
    /// let nats = ruststream_nats::Nats::connect_from_env(&Env::new("RUSTSTREAM_NATS")).await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect_from_env(
        env: &ruststream_core::Env,
    ) -> Result<Self, ruststream_core::FromEnvError<ConnectError>> {
        let url = env.require("URL")?;
        let mut options =
            async_nats::ConnectOptions::new().connection_timeout(DEFAULT_CONNECT_TIMEOUT);
        // A user without a password (or the reverse) is refused by `both`, whichever
        // other kind is set; the password stands for the pair among the kinds.
        let user = env.both("USER", "PASSWORD")?;
        options = match env.one_of(&["PASSWORD", "TOKEN", "NKEY", "CREDS"])? {
            Some("PASSWORD") => {
                let (user, password) = user.unwrap_or_default();
                options.user_and_password(user, password)
            }
            Some("TOKEN") => options.token(env.require("TOKEN")?),
            Some("NKEY") => options.nkey(env.require("NKEY")?),
            Some(_) => {
                let path = env.require("CREDS")?;
                options.credentials_file(&path).await.map_err(|e| {
                    env.invalid(
                        &["CREDS"],
                        format!("cannot read the credentials file `{path}`: {e}"),
                    )
                })?
            }
            None => options,
        };
        if let Some(ca) = env.path("CA") {
            options = options.add_root_certificates(ca).require_tls(true);
        }
        if let Some((certificate, key)) = env.both("CERT", "KEY")? {
            options = options.add_client_certificate(certificate.into(), key.into());
        }
        Self::connect_with(&url, options)
            .await
            .map_err(ruststream_core::FromEnvError::Connect)
    }

    /// Wraps a client configured by the caller (its slow-consumer events are the
    /// caller's to watch).
    pub fn from_client(client: async_nats::Client) -> Self {
        Self {
            client,
            drops: Arc::default(),
        }
    }

    /// How many slow-consumer drops the client reported on this connection so far: exact
    /// with [`slow_consumer_layer`] installed, else a lower bound (the client reports
    /// them through a bounded channel it fills without waiting).
    pub fn slow_consumer_drops(&self) -> u64 {
        self.drops.total()
    }

    /// Like [`Nats::slow_consumer_drops`], for the Core subscriptions of one registration's
    /// subject (or pattern) on this connection.
    pub fn slow_consumer_drops_on(&self, subject: &str) -> u64 {
        self.drops.on(subject)
    }

    /// The underlying client.
    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }

    /// A Core subscription on one subject.
    pub fn subject(&self, subject: impl Into<String>) -> CoreSubject {
        CoreSubject::new(self.client.clone(), subject.into(), Arc::clone(&self.drops))
    }

    /// A Core subscription on a pattern with `*` or `>`.
    pub fn wildcard(&self, pattern: impl Into<String>) -> CoreWildcard {
        CoreWildcard::new(self.client.clone(), pattern.into(), Arc::clone(&self.drops))
    }

    /// A JetStream subscription: durable pull consumer `consumer` on `stream`.
    pub fn consumer(
        &self,
        stream: impl Into<String>,
        consumer: impl Into<String>,
    ) -> JetStreamConsumer {
        JetStreamConsumer::new(self.client.clone(), stream.into(), consumer.into())
    }

    /// Core, JetStream and request/reply publishing.
    pub fn publisher(&self) -> NatsPublisher {
        NatsPublisher::new(self.client.clone())
    }

    /// The confirmed publish, for `ruststream::Publisher::new`: the one publishing shape
    /// of every transport (`.to(subject).header(..).with(MessageId(..)).send(&v)`).
    pub fn publish_handle(&self) -> Arc<dyn Publish> {
        Arc::new(self.publisher())
    }
}

/// Credentials found in a server URL's user-info.
enum Credentials {
    UserPassword(String, ruststream_core::Secret),
    Token(ruststream_core::Secret),
}

/// `url` without the user-info of its server addresses, and the credentials the first one
/// held (NATS reads a one-word user-info as a token). A password may hold any character:
/// a list is cut only where a `,` starts another `scheme://` address, and a user-info
/// runs to the last `@` of its address ([`ruststream_core::split_userinfo`]).
fn split_credentials(url: &str) -> (String, Option<Credentials>) {
    let mut found = None;
    let mut bare = String::with_capacity(url.len());
    for (i, one) in addresses(url).into_iter().enumerate() {
        if i > 0 {
            bare.push(',');
        }
        let Some((scheme, userinfo, rest)) = ruststream_core::split_userinfo(one) else {
            bare.push_str(one);
            continue;
        };
        if found.is_none() {
            found = Some(match userinfo.split_once(':') {
                Some((user, password)) => Credentials::UserPassword(
                    user.to_owned(),
                    ruststream_core::Secret::new(password),
                ),
                None => Credentials::Token(ruststream_core::Secret::new(userinfo)),
            });
        }
        bare.push_str(scheme);
        bare.push_str(&rest[1..]);
    }
    (bare, found)
}

/// The addresses of a server list: cut at each `,` that a NATS scheme follows, or at
/// every `,` when no address names a scheme (then no user-info may hold a `,`).
fn addresses(url: &str) -> Vec<&str> {
    const SCHEMES: [&str; 4] = ["nats://", "tls://", "ws://", "wss://"];
    if !SCHEMES.iter().any(|s| url.starts_with(s)) {
        return url.split(',').collect();
    }
    let mut cuts = vec![0];
    for (i, _) in url.match_indices(',') {
        if SCHEMES.iter().any(|s| url[i + 1..].starts_with(s)) {
            cuts.push(i + 1);
        }
    }
    cuts.push(url.len() + 1);
    cuts.windows(2).map(|w| &url[w[0]..w[1] - 1]).collect()
}

#[cfg(test)]
mod tests {
    use super::{Credentials, split_credentials};

    #[test]
    fn credentials_leave_the_url() {
        let (bare, found) = split_credentials("nats://app:pw@h:4222,nats://g:4222");
        assert_eq!(bare, "nats://h:4222,nats://g:4222");
        assert!(
            matches!(found, Some(Credentials::UserPassword(u, p)) if u == "app" && p.expose() == "pw")
        );
        let (bare, found) = split_credentials("nats://tok@h:4222");
        assert_eq!(bare, "nats://h:4222");
        assert!(matches!(found, Some(Credentials::Token(t)) if t.expose() == "tok"));
        let (bare, found) = split_credentials("nats://h:4222");
        assert_eq!(bare, "nats://h:4222");
        assert!(found.is_none());
        // Issue #46: a password holding the characters that used to end the authority.
        let (bare, found) = split_credentials("nats://g:4222,nats://app:a/b,c#d?e@f@h:4222");
        assert_eq!(bare, "nats://g:4222,nats://h:4222");
        assert!(
            matches!(found, Some(Credentials::UserPassword(u, p)) if u == "app" && p.expose() == "a/b,c#d?e@f")
        );
        let (bare, _) = split_credentials("u:p@h1:4222,h2:4222");
        assert_eq!(bare, "h1:4222,h2:4222");
    }
}
