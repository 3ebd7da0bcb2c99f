//! The three Kafka descriptors: one topic, a set of topics, explicit partitions.

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::Consumer;
use rdkafka::{Offset, TopicPartitionList};
use ruststream_core::{Capabilities, Declaration, Descriptor, Publish, StartAt, SubscribeError};

use crate::Kafka;
use crate::config::{Commit, Mode, Settings};
use crate::context::{KafkaContext, TrackingContext};
use crate::subscription::KafkaSubscription;
use crate::window::Window;

/// How long closing a consumer may take before it is left behind (one consumer's part of
/// a stop; the app's own `close_timeout` bounds the whole close).
pub const DEFAULT_CONSUMER_CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone)]
enum Selection {
    Topic(String),
    Topics(Vec<String>),
    Partitions(Vec<(String, i32, Offset)>),
}

/// What every descriptor carries.
#[derive(Debug, Clone)]
struct Source {
    kafka: Kafka,
    selection: Selection,
    address: String,
    group: String,
    commit: Commit,
    settings: Settings,
    close_timeout: Duration,
    start_at: StartAt,
}

impl Source {
    fn new(kafka: Kafka, selection: Selection, address: String) -> Self {
        Self {
            kafka,
            selection,
            address,
            group: String::new(),
            commit: Commit::Auto,
            settings: Settings::default(),
            close_timeout: DEFAULT_CONSUMER_CLOSE_TIMEOUT,
            start_at: StartAt::Earliest,
        }
    }

    /// The subscription as the service describes itself: its group, client id and
    /// commit mode on top of the publisher's server.
    fn describe(&self, server: ruststream_core::Described) -> ruststream_core::Described {
        let mut described = server
            .group(&self.group)
            .setting("commit", format!("{:?}", self.commit.mode()).to_lowercase());
        described.client_id = self.settings.values.get("client.id").cloned();
        described
    }

    /// Why `consumers` consumers cannot share this subscription, if they cannot.
    fn consumers_rule(&self, consumers: usize) -> Option<String> {
        if consumers < 2 {
            return None;
        }
        if self.settings.values.contains_key("group.instance.id") {
            return Some(format!(
                "consumers({consumers}) with a group.instance.id: the members would share one \
                 static identity and fence each other; give each process its own and use \
                 consumers(1)"
            ));
        }
        if let Selection::Partitions(_) = self.selection {
            return Some(format!(
                "consumers({consumers}) on explicitly assigned partitions: each consumer would \
                 read every one of them; let the group share the topic's partitions instead"
            ));
        }
        matches!(self.commit, Commit::Transactional(_)).then(|| {
            format!(
                "consumers({consumers}) under Commit::Transactional: one EosPipeline commits \
                 for one consumer; run more processes, each with its own transactional id"
            )
        })
    }

    fn check(&self) -> Vec<String> {
        let mut broken = self.settings.contradictions(self.commit.mode());
        if self.group.is_empty() {
            broken.push(
                "a Kafka subscription needs a non-empty consumer group: .group(name)".to_owned(),
            );
        }
        if let StartAt::Time(_) = self.start_at {
            broken.push(
                "start_at(StartAt::Time(..)) is refused on Kafka: a real cluster can start a \
                 group at a time (offsets for times), but the broker ruststream is tested on \
                 (tansu) answers every time lookup with offset 0, so it cannot be shown to \
                 work; read explicit offsets with KafkaPartitions"
                    .to_owned(),
            );
        }
        if self.settings.values.contains_key("auto.offset.reset") {
            broken.push("set where a new group starts with .start_at(..), not the auto.offset.reset setting".to_owned());
        }
        match &self.selection {
            Selection::Topic(t) if t.is_empty() => {
                broken.push("the topic name is empty".to_owned())
            }
            Selection::Topics(ts) if ts.is_empty() => broken.push("no topic to read".to_owned()),
            Selection::Partitions(ps) if ps.is_empty() => {
                broken.push("no partition to read".to_owned())
            }
            _ => {}
        }
        broken
    }

    /// Asks the cluster for its metadata, within the connect timeout: an unreachable
    /// cluster fails the start, naming the bootstrap servers, instead of a consumer that
    /// logs errors for ever (SPEC G7).
    async fn reachable(&self) -> Result<(), SubscribeError> {
        let timeout = self.kafka.connect_timeout_value();
        let Some(warn_every) = self.kafka.wait_for_cluster_value() else {
            return self.answers_within(timeout).await.map(drop);
        };
        ruststream_core::wait_for_broker(
            "Kafka",
            self.kafka.brokers(),
            warn_every,
            // Refused credentials or TLS do not get better by waiting.
            |e: &SubscribeError| !e.to_string().contains("refused the connection"),
            || async { self.answers_within(timeout.min(warn_every)).await.map(drop) },
            tokio::time::sleep,
        )
        .await
    }

    /// The cluster's answer: the topics it has.
    async fn answers_within(&self, timeout: Duration) -> Result<Vec<String>, SubscribeError> {
        let brokers = self.kafka.brokers().to_owned();
        let mut config = self.kafka.client_config();
        config.set_log_level(RDKafkaLogLevel::Critical);
        let context = self.kafka.context().recording_errors();
        let probe: Result<rdkafka::consumer::BaseConsumer<KafkaContext>, _> =
            config.create_with_context(context.clone());
        let probe = probe.map_err(|e| SubscribeError::new(&self.address, e))?;
        let serve_token = self.kafka.context().has_token_callback();
        let answer = crate::close::off_runtime(
            "ask the Kafka cluster for its metadata",
            timeout + Duration::from_secs(1),
            move || {
                if serve_token {
                    // librdkafka asks for an OAUTHBEARER token through an event that only
                    // a poll serves, and connects only once it has one.
                    let _ = probe.poll(Duration::from_millis(200));
                }
                let answer = probe.fetch_metadata(None, timeout).map(|metadata| {
                    let topics = metadata.topics().iter();
                    topics.map(|t| t.name().to_owned()).collect::<Vec<_>>()
                });
                if answer.is_err() {
                    // Error events (authentication, TLS) reach the context in a poll.
                    let _ = probe.poll(Duration::from_millis(100));
                }
                answer
            },
        )
        .await;
        let failed = |said: String| {
            let reason = match context.last_error() {
                Some(last) if is_refusal(&last) => {
                    format!("Kafka at `{brokers}` refused the connection: {last}")
                }
                Some(last) => format!("{said}; librdkafka's last error: {last}"),
                None => said,
            };
            Err(SubscribeError::new(&self.address, reason))
        };
        match answer {
            Some(Ok(topics)) => Ok(topics),
            Some(Err(e)) => failed(format!(
                "cannot reach Kafka at `{brokers}` within {timeout:?}: {e}"
            )),
            None => failed(format!(
                "cannot reach Kafka at `{brokers}` within {timeout:?}"
            )),
        }
    }

    /// The cluster answers and has every topic this subscription names (a pattern is
    /// not checked): `check --connect`.
    async fn verify(&self) -> Result<(), String> {
        let topics = self
            .answers_within(self.kafka.connect_timeout_value())
            .await
            .map_err(|e| e.to_string())?;
        let named: Vec<&str> = match &self.selection {
            Selection::Topic(t) => vec![t.as_str()],
            Selection::Topics(ts) => ts.iter().map(String::as_str).collect(),
            Selection::Partitions(ps) => ps.iter().map(|(t, _, _)| t.as_str()).collect(),
        };
        let missing: Vec<&str> = named
            .into_iter()
            .filter(|t| !t.starts_with('^') && !topics.iter().any(|have| have == t))
            .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "Kafka at `{}` has no topic `{}`",
                self.kafka.brokers(),
                missing.join("`, `")
            ))
        }
    }

    /// True when `topic` is one this subscription reads. A pattern (`^...`) is a regular
    /// expression librdkafka evaluates; only a topic it names literally is seen here.
    fn reads(&self, topic: &str) -> bool {
        match &self.selection {
            Selection::Topic(t) => t == topic,
            Selection::Topics(ts) => ts.iter().any(|t| t == topic),
            Selection::Partitions(ps) => ps.iter().any(|(t, _, _)| t == topic),
        }
    }

    fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", self.kafka.brokers())
            .set("group.id", &self.group)
            .set(
                "enable.auto.commit",
                if self.commit.mode() == Mode::Transactional {
                    "false"
                } else {
                    "true"
                },
            )
            .set(
                "auto.offset.reset",
                match self.start_at {
                    StartAt::Latest => "latest",
                    _ => "earliest",
                },
            )
            .set("enable.partition.eof", "false")
            // Commit::Auto stores each offset itself when it hands the record over (what
            // librdkafka's automatic store does), so that it can store a record's offset
            // back when its copy is refused (SPEC G3).
            .set("enable.auto.offset.store", "false");
        for (key, value) in self.kafka.settings().iter().chain(&self.settings.values) {
            config.set(key, value);
        }
        // librdkafka's own log goes to `tracing` (target `librdkafka`); its debug contexts
        // only when asked for with the `debug` setting.
        let debugging = config.get("debug").is_some();
        config.set_log_level(if debugging {
            RDKafkaLogLevel::Debug
        } else {
            RDKafkaLogLevel::Info
        });
        config
    }

    async fn open(self) -> Result<KafkaSubscription, SubscribeError> {
        let window = match self.commit.pipeline() {
            Some(pipeline) => {
                Some(Window::start(pipeline.clone(), &self.address, self.close_timeout).await?)
            }
            None => None,
        };
        self.reachable().await?;
        let fail = |e: rdkafka::error::KafkaError| SubscribeError::new(&self.address, e);
        let context = TrackingContext::new(Arc::default(), self.kafka.context());
        let (consumer, wakeup) =
            crate::queue::consumer(&self.client_config(), context).map_err(fail)?;
        match &self.selection {
            Selection::Topic(topic) => consumer.subscribe(&[topic]).map_err(fail)?,
            Selection::Topics(topics) => {
                let topics: Vec<&str> = topics.iter().map(String::as_str).collect();
                consumer.subscribe(&topics).map_err(fail)?;
            }
            Selection::Partitions(partitions) => {
                let mut list = TopicPartitionList::new();
                for (topic, partition, offset) in partitions {
                    list.add_partition_offset(topic, *partition, *offset)
                        .map_err(fail)?;
                }
                consumer.assign(&list).map_err(fail)?;
            }
        }
        Ok(KafkaSubscription::new(
            consumer,
            wakeup,
            self.commit.mode(),
            // A name beginning with `^` is a pattern librdkafka matches against many.
            match &self.selection {
                Selection::Topic(topic) if !topic.starts_with('^') => Some(topic.as_str()),
                _ => None,
            },
            &self.address,
            self.close_timeout,
            window,
        ))
    }
}

/// Why `topic` is not a valid Kafka topic name (Kafka's own rule: 1 to 249 of
/// `[a-zA-Z0-9._-]`, not `.` or `..`), or `None`.
fn topic_rule(topic: &str) -> Option<String> {
    if topic.is_empty() || topic.len() > 249 {
        return Some("a Kafka topic name has 1 to 249 characters".to_owned());
    }
    if topic == "." || topic == ".." {
        return Some("`.` and `..` are not Kafka topic names".to_owned());
    }
    if let Some(bad) = topic
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Some(format!(
            "{bad:?} is not allowed in a Kafka topic name (only ASCII letters, digits, `.`, `_` and `-`)"
        ));
    }
    None
}

/// A Kafka descriptor that has no consumer group yet: it is not a descriptor until
/// `.group(name)` names one, so registering it does not compile (the compiler says
/// `Descriptor` is implemented for `KafkaTopic<Grouped>`).
///
/// ```compile_fail
/// # use ruststream::{App, HandlerOutcome, Message, on};
/// # async fn handle(Message(_n): Message<u64>) -> HandlerOutcome { HandlerOutcome::ack() }
/// # fn app(kafka: ruststream_kafka::Kafka) -> App {
/// App::new().register(on(kafka.topic("orders"), handle)) // no .group(..)
/// # }
/// ```
///
/// ```
/// # use ruststream::{App, HandlerOutcome, Message, on};
/// # async fn handle(Message(_n): Message<u64>) -> HandlerOutcome { HandlerOutcome::ack() }
/// # fn app(kafka: ruststream_kafka::Kafka) -> App {
/// App::new().register(on(kafka.topic("orders").group("billing"), handle))
/// # }
/// ```
#[derive(Debug, Clone, Copy)]
pub struct NeedsGroup;

/// A Kafka descriptor with its consumer group: one that can be registered.
#[derive(Debug, Clone, Copy)]
pub struct Grouped;

macro_rules! descriptor {
    ($(#[$doc:meta])* $name:ident, retry_address: $retry:expr) => {
        $(#[$doc])*
        ///
        /// Its consumer group is required, and checked by the compiler: the descriptor
        /// is a [`Descriptor`] only once `.group(name)` named it.
        #[derive(Debug, Clone)]
        pub struct $name<G = NeedsGroup> {
            source: Source,
            group: PhantomData<G>,
        }

        impl<G> $name<G> {
            /// Reads as consumer group `group` (required: before it, this is not a
            /// descriptor).
            pub fn group(mut self, group: impl Into<String>) -> $name<Grouped> {
                self.source.group = group.into();
                $name {
                    source: self.source,
                    group: PhantomData,
                }
            }

            /// The commit mode (default [`Commit::Auto`]); `Commit::Transactional` holds
            /// the [`EosPipeline`](crate::EosPipeline) it commits through.
            pub fn commit(mut self, commit: Commit) -> Self {
                self.source.commit = commit;
                self
            }

            /// Passes a setting to librdkafka's consumer. Settings that contradict the
            /// commit mode make the app refuse to start.
            pub fn set(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
                self.source.settings.set(key.into(), value.into());
                self
            }

            /// Where a new group starts reading (default [`StartAt::Earliest`]); a group
            /// with committed offsets resumes from them (SPEC G8).
            pub fn start_at(mut self, start: StartAt) -> Self {
                self.source.start_at = start;
                self
            }

            /// How long closing this consumer may take on stop (default
            /// [`DEFAULT_CONSUMER_CLOSE_TIMEOUT`], 10 s); not to be mixed up with the app's
            /// `close_timeout`, which bounds the whole close after the drain.
            pub fn consumer_close_timeout(mut self, timeout: Duration) -> Self {
                self.source.close_timeout = timeout;
                self
            }
        }

        impl Descriptor for $name<Grouped> {
            type Subscription = KafkaSubscription;

            fn address(&self) -> &str {
                &self.source.address
            }

            fn transport(&self) -> &'static str {
                "kafka"
            }

            fn retry_address(&self) -> Option<&str> {
                let retry: fn(&Source) -> Option<&str> = $retry;
                retry(&self.source)
            }

            fn capabilities(&self) -> Capabilities {
                self.source.commit.capabilities()
            }

            fn check(&self, declaration: &Declaration) -> Vec<String> {
                let mut broken = self.source.check();
                broken.extend(self.source.consumers_rule(declaration.consumer_count()));
                broken
            }

            fn reads(&self, address: &str) -> bool {
                self.source.reads(address)
            }

            fn address_rule(&self, address: &str) -> Option<String> {
                topic_rule(address)
            }

            fn publisher(&self) -> Arc<dyn Publish> {
                // Under Commit::Transactional handlers and copies produce in the window.
                match self.source.commit.pipeline() {
                    Some(pipeline) => Arc::new(pipeline.publisher()),
                    None => Arc::new(self.source.kafka.publisher()),
                }
            }

            fn describe(&self) -> ruststream_core::Described {
                self.source.describe(self.publisher().describe())
            }

            async fn verify(&self) -> Result<(), String> {
                self.source.verify().await
            }

            async fn dead_letters(&self, address: &str) -> Result<Box<dyn ruststream_core::LetterBox>, String> {
                let letters = crate::letters::KafkaLetters::open(&self.source.kafka, address).await?;
                Ok(Box::new(letters))
            }

            async fn open(self, _declaration: &Declaration) -> Result<KafkaSubscription, SubscribeError> {
                self.source.open().await
            }
        }
    };
}

descriptor!(
    /// One topic. Its retry address is the topic itself: a retry copy keeps the key and
    /// lands on the key's partition behind the records written since (K8, K9).
    KafkaTopic,
    retry_address: |s| match &s.selection {
        Selection::Topic(t) => Some(t.as_str()),
        _ => None,
    }
);

descriptor!(
    /// Several topics, or a pattern (`^orders\..*`). No single publish reaches them, so a
    /// registration that may publish retry copies names their topic with `.retry_to(..)`
    /// or the app refuses to start (K8).
    KafkaTopics,
    retry_address: |_| None
);

descriptor!(
    /// Explicit partitions with start offsets (no group rebalancing). No single publish
    /// reaches them, so a registration that may publish retry copies names their topic
    /// with `.retry_to(..)` or the app refuses to start (K8).
    KafkaPartitions,
    retry_address: |_| None
);

impl KafkaTopic {
    pub(crate) fn new(kafka: Kafka, topic: String) -> Self {
        Self {
            source: Source::new(kafka, Selection::Topic(topic.clone()), topic),
            group: PhantomData,
        }
    }
}

impl KafkaTopics {
    pub(crate) fn new(kafka: Kafka, topics: Vec<String>) -> Self {
        let address = topics.join(",");
        Self {
            source: Source::new(kafka, Selection::Topics(topics), address),
            group: PhantomData,
        }
    }
}

impl KafkaPartitions {
    pub(crate) fn new(kafka: Kafka, partitions: Vec<(String, i32, Offset)>) -> Self {
        let address = partitions
            .iter()
            .map(|(t, p, _)| format!("{t}/{p}"))
            .collect::<Vec<_>>()
            .join(",");
        Self {
            source: Source::new(kafka, Selection::Partitions(partitions), address),
            group: PhantomData,
        }
    }
}

/// Whether librdkafka's error says the broker was reached and refused the client (its
/// credentials, its TLS) rather than not reached.
fn is_refusal(error: &str) -> bool {
    let lower = error.to_ascii_lowercase();
    ["sasl", "authentication", "ssl", "certificate", "handshake"]
        .iter()
        .any(|word| lower.contains(word))
}
