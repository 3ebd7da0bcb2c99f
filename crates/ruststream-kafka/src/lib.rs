//! Kafka transport for ruststream over `rdkafka`.
//!
//! The guide's page on Kafka (`docs/kafka.md` in the repository) tells the same with
//! diagrams: the outcome flow, the Tracked positions, the EOS window.
//!
//! Kafka commits one offset per partition and group instead of acknowledging records, so
//! what an outcome becomes depends on the subscription's [`Commit`] mode (SPEC K1-K9):
//!
//! | outcome | `Commit::Auto` (default) | `Commit::Tracked` | `Commit::Transactional` |
//! |---|---|---|---|
//! | `ack`, `drop` | nothing: the offset was stored when the record was handed over | the offset settles; the stored position moves up to just below the lowest record still running | the offset settles; the [`EosPipeline`] commits it with its next window |
//! | `retry()` | `AckError::Unsupported`, logged: nothing brings the record back | handled again at once, before the next record of its lane; the position waits | the open window cannot commit: it aborts and is read again |
//! | `retry_after(d)`, or `retry()` under `max_attempts`/dead letter | a copy (same key, payload, headers, `x-ruststream-retry-count` + 1) after d to the subscription's own topic (every group reading it sees the copy; `retry_to(..)` names another), confirmed by its delivery report; at the cap a copy to the dead-letter topic | the same; the original stays unsettled until its copy is confirmed, so a crash during the wait brings the original back | the same, the copy produced inside the window's transaction |
//!
//! Under `Commit::Auto` the delayed copy waits in the process while the original's offset
//! is already stored: a crash before the timer fires loses the retry (the seed's loss
//! window). `Commit::Tracked` closes that window.
//!
//! ```no_run
//! use std::time::Duration;
//! use ruststream::{on, App, HandlerOutcome, Message};
//! use ruststream_kafka::{Commit, Kafka};
//!
//! async fn bill(Message(order): Message<u64>) -> HandlerOutcome {
//!     if order % 2 == 0 { HandlerOutcome::ack() } else { HandlerOutcome::retry_after(Duration::from_secs(5)) }
//! }
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let kafka = Kafka::connect("127.0.0.1:9092")?;
//! App::new()
//!     .register(on(kafka.topic("orders").group("billing").commit(Commit::Tracked), bill)
//!         .max_attempts(5)
//!         .dead_letter("orders.dead")
//!         .lanes(8))
//!     .run()
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! # Guard rails (SPEC G1-G8): deadlines, refused copies, bounds, start position
//!
//! - Handlers run within the registration's `timeout` (the app's default is 30 s); past
//!   it the attempt counts as failed.
//! - Under `Commit::Tracked` an undeclared `retry()` runs the record again in place after a
//!   floor of 10 ms doubling to 1 s, so a handler that always retries does not spin.
//! - A copy the broker refuses for good (`MSG_SIZE_TOO_LARGE`, unknown topic, not
//!   authorized) is not retried in a loop. A retry copy too large goes to the dead-letter
//!   topic instead. Otherwise, under `Tracked` and `Transactional` the original stays
//!   unsettled (the partition's position waits) and the copy is tried again after 1 s
//!   doubling to 5 min; under `Auto` the record's offset is stored back and the partition
//!   sought back to it, so it is read again after that wait (and after a graceful
//!   restart): later records of the partition come again too. To make that possible,
//!   `Auto` stores each offset itself at hand-over (`enable.auto.offset.store` is off and
//!   may not be turned on).
//! - A dead-letter topic the registration reads (its topic, a topic of its list) and a
//!   topic name Kafka refuses are refused at start. Topics matched by a `^pattern` are not
//!   checked.
//!
//! - A new group starts at the earliest record (`StartAt::Earliest`, the same default as
//!   every transport; `.start_at(StartAt::Latest)` to skip the backlog). A subscription
//!   whose cluster does not answer within `Kafka::connect_timeout` (10 s) fails the start,
//!   naming the bootstrap servers (`Kafka::wait_for_cluster` waits for it instead, one
//!   WARN per interval). At `max_in_flight` the assigned partitions are paused
//!   (librdkafka drops what it had prefetched for them) and the consumer is still polled,
//!   so the group keeps its member however long deliveries wait; fetching resumes from
//!   the next record as deliveries settle.
//!
//! # What it cannot promise (measured in RELIABILITY.md)
//!
//! - `Commit::Auto`: librdkafka stores each offset when it hands the record over (K2), so
//!   records in flight at a crash, and retry copies waiting in `retry_after` (K7), are
//!   lost. `Commit::Tracked` loses neither (the position waits for them).
//! - Every commit mode but `Transactional` is at-least-once: after a crash, a rebalance or
//!   a broker outage some records are handled twice.
//! - On tansu (the broker the tests use) aborted transactions stay visible to
//!   `read_committed` readers, so the exactly-once read (K6) is checked only against a
//!   real Kafka (`RUSTSTREAM_REAL_KAFKA_BROKERS`); tansu also keeps nothing across a
//!   restart, so the broker-restart fault test uses librdkafka's mock cluster.

// No function over 80 lines of code (clippy.toml), in library code (ARCHITECTURE.md).
#![deny(clippy::too_many_lines)]

mod book;
mod close;
mod config;
mod context;
mod descriptor;
mod eos;
mod lag;
mod letters;
mod paused;
mod publish;
mod queue;
mod receipt;
mod security;
pub mod subscription;
mod tracker;
mod window;

use std::collections::BTreeMap;
use std::sync::Arc;

pub use config::{AUTO_CAPABILITIES, Commit, TRACKED_CAPABILITIES, TRANSACTIONAL_CAPABILITIES};
pub use context::KafkaContext;
pub use descriptor::{
    DEFAULT_CONSUMER_CLOSE_TIMEOUT, Grouped, KafkaPartitions, KafkaTopic, KafkaTopics, NeedsGroup,
};
pub use eos::{DEFAULT_COMMIT_INTERVAL, EosPipeline, EosPublisher, WindowReport};
pub use letters::DEAD_LETTER_GROUP;
pub use publish::{DELIVERY_TIMEOUT, KafkaPublisher, Landed, Partition};
pub use rdkafka;
pub use rdkafka::Offset;
use rdkafka::config::ClientConfig;
use rdkafka::producer::FutureProducer;

pub use security::{BearerToken, OAuthBearer, Sasl, Security, Tls};

/// A Kafka cluster: its address, settings shared by every client, and one producer.
#[derive(Clone)]
pub struct Kafka {
    brokers: String,
    settings: Arc<BTreeMap<String, String>>,
    producer: Arc<FutureProducer<KafkaContext>>,
    context: KafkaContext,
    connect_timeout: std::time::Duration,
    wait_for_cluster: Option<std::time::Duration>,
}

/// How long a subscription waits at start for the cluster to answer, unless set (SPEC G7).
pub const DEFAULT_CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

impl std::fmt::Debug for Kafka {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kafka")
            .field("brokers", &self.brokers)
            .finish()
    }
}

/// The producer could not be created.
#[derive(Debug, thiserror::Error)]
#[error("cannot set up a Kafka client for `{brokers}`: {source}")]
pub struct SetupError {
    brokers: String,
    #[source]
    source: rdkafka::error::KafkaError,
}

impl SetupError {
    /// The bootstrap servers.
    pub fn brokers(&self) -> &str {
        &self.brokers
    }
}

impl Kafka {
    /// A cluster at `brokers` (`host:port[,host:port]`). Connections are made lazily.
    pub fn connect(brokers: &str) -> Result<Self, SetupError> {
        Self::with_settings(brokers, BTreeMap::new())
    }

    /// Like [`Kafka::connect`], with librdkafka settings for every consumer and the producer.
    pub fn with_settings(
        brokers: &str,
        settings: BTreeMap<String, String>,
    ) -> Result<Self, SetupError> {
        Self::made(brokers, settings, KafkaContext::default())
    }

    fn made(
        brokers: &str,
        settings: BTreeMap<String, String>,
        context: KafkaContext,
    ) -> Result<Self, SetupError> {
        let mut config = config_for(brokers, &settings);
        publish::bound_delivery(&mut config, &settings);
        let producer = config
            .create_with_context(context.clone())
            .map_err(|source| SetupError {
                brokers: brokers.to_owned(),
                source,
            })?;
        Ok(Self {
            brokers: brokers.to_owned(),
            settings: Arc::new(settings),
            producer: Arc::new(producer),
            context,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            wait_for_cluster: None,
        })
    }

    /// Like [`Kafka::with_settings`], encrypted and authenticated as `security` says, for
    /// the producer and every consumer (the settings it stands for win over `settings`).
    ///
    /// ```no_run
    /// use ruststream_core::Secret;
    /// use ruststream_kafka::{Kafka, Sasl, Security, Tls};
    ///
    /// # fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// // In code; `Kafka::from_env` reads the same from the environment.
    /// let security = Security::SaslTls(
    ///     Sasl::ScramSha512 { user: "billing".into(), password: Secret::new("s3cret") },
    ///     Tls::with_ca("/etc/ssl/kafka-ca.pem"),
    /// );
    /// let kafka = Kafka::with_security("broker-1.internal:9093", Default::default(), &security)?;
    /// # Ok(()) }
    /// ```
    pub fn with_security(
        brokers: &str,
        mut settings: BTreeMap<String, String>,
        security: &Security,
    ) -> Result<Self, SetupError> {
        for (key, value) in security.settings() {
            settings.insert(key.to_owned(), value);
        }
        Self::made(
            brokers,
            settings,
            KafkaContext::new(security.oauth().cloned()),
        )
    }

    /// A cluster from environment variables (the convention every transport shares,
    /// [`Env`](ruststream_core::Env)): `{PREFIX}_BROKERS` (required) and the security
    /// settings [`Security::from_env`] reads. A missing or unusable setting is an
    /// [`EnvError`](ruststream_core::EnvError) naming the variables, never their values.
    ///
    /// ```no_run
    /// use ruststream_core::Env;
    /// let kafka = ruststream_kafka::Kafka::from_env(&Env::new("RUSTSTREAM_KAFKA"))?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_env(
        env: &ruststream_core::Env,
    ) -> Result<Self, ruststream_core::FromEnvError<SetupError>> {
        let brokers = env.require("BROKERS")?;
        let made = match Security::from_env(env)? {
            Some(security) => Self::with_security(&brokers, BTreeMap::new(), &security),
            None => Self::connect(&brokers),
        };
        made.map_err(ruststream_core::FromEnvError::Connect)
    }

    /// A librdkafka configuration with this cluster's brokers and settings (security
    /// included), for clients of the caller's own: an admin client creating topics, say.
    /// With [`Sasl::OAuthBearer`], create it with [`Kafka::context`] so it gets tokens.
    pub fn client_config(&self) -> ClientConfig {
        config_for(&self.brokers, &self.settings)
    }

    /// The context this crate's clients are made with (librdkafka's logs to `tracing`,
    /// OAUTHBEARER tokens from the callback), for `client_config().create_with_context(..)`.
    pub fn context(&self) -> KafkaContext {
        self.context.clone()
    }

    /// How long each subscription waits at start for the cluster to answer (default
    /// [`DEFAULT_CONNECT_TIMEOUT`], 10 s): an unreachable cluster makes the app's start
    /// fail with an error naming the bootstrap servers (SPEC G7).
    pub fn connect_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Waits at start for a cluster that does not answer instead of failing (SPEC G7,
    /// opt-in): each subscription asks again once a second and logs one WARN per
    /// `warn_every` naming the bootstrap servers and the time waited; the app's start
    /// returns once every subscription's cluster answered.
    pub fn wait_for_cluster(mut self, warn_every: std::time::Duration) -> Self {
        self.wait_for_cluster = Some(warn_every);
        self
    }

    pub(crate) fn wait_for_cluster_value(&self) -> Option<std::time::Duration> {
        self.wait_for_cluster
    }

    pub(crate) fn connect_timeout_value(&self) -> std::time::Duration {
        self.connect_timeout
    }

    pub(crate) fn brokers(&self) -> &str {
        &self.brokers
    }

    pub(crate) fn settings(&self) -> &BTreeMap<String, String> {
        &self.settings
    }

    /// A subscription on one topic.
    pub fn topic(&self, topic: impl Into<String>) -> KafkaTopic {
        KafkaTopic::new(self.clone(), topic.into())
    }

    /// A subscription on several topics, or on the topics matching a pattern that starts
    /// with `^`.
    pub fn topics<I, T>(&self, topics: I) -> KafkaTopics
    where
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        KafkaTopics::new(self.clone(), topics.into_iter().map(Into::into).collect())
    }

    /// A subscription on explicit partitions, each from its start offset.
    pub fn partitions<I, T>(&self, partitions: I) -> KafkaPartitions
    where
        I: IntoIterator<Item = (T, i32, Offset)>,
        T: Into<String>,
    {
        KafkaPartitions::new(
            self.clone(),
            partitions
                .into_iter()
                .map(|(t, p, o)| (t.into(), p, o))
                .collect(),
        )
    }

    /// The confirmed producer, with Kafka's own answers (where a record landed).
    pub fn publisher(&self) -> KafkaPublisher {
        KafkaPublisher::new(Arc::clone(&self.producer), Arc::from(self.brokers.as_str()))
    }

    /// The confirmed publish, for `ruststream::Publisher::new`: the one publishing shape
    /// of every transport (`.to(topic).key(..).header(..).with(Partition(3)).send(&v)`).
    pub fn publish_handle(&self) -> Arc<dyn ruststream_core::Publish> {
        Arc::new(self.publisher())
    }
}

/// librdkafka's configuration for `brokers` with `settings`.
fn config_for(brokers: &str, settings: &BTreeMap<String, String>) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", brokers);
    for (key, value) in settings {
        config.set(key, value);
    }
    config
}
