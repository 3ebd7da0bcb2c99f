//! JetStream: a durable pull consumer whose deliveries the server settles (SPEC N1, N4-N7).

use std::sync::Arc;
use std::time::Duration;

use async_nats::Client;
use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, pull};
use ruststream_core::{
    Capabilities, Cause, DeadLetters, Declaration, DelayedRedelivery, Descriptor, Publish, StartAt,
    SubscribeError, Verb,
};

use crate::ack_reply::AckReader;
use crate::keepalive::{InProgress, keep_alive};
use crate::publish::NatsPublisher;
use crate::subject;

mod letters;
mod subscription;

pub use subscription::JetStreamSubscription;

/// The dead letters on `subject`, from the stream that captures it.
pub(crate) async fn letters_of(
    client: &Client,
    subject: &str,
) -> Result<Box<dyn ruststream_core::LetterBox>, String> {
    Ok(Box::new(
        letters::JetStreamLetters::open(client, subject).await?,
    ))
}

/// Messages asked for per pull request unless set: async-nats's own default.
pub const DEFAULT_BATCH: usize = 200;

/// The server's default `ack_wait`.
pub const DEFAULT_ACK_WAIT: Duration = Duration::from_secs(30);

/// What JetStream can do for a subscription: every verb, its own `delivered` count and
/// delayed redelivery (`-NAK {"delay"}`); dead letters are the runtime's (N7).
pub const CAPABILITIES: Capabilities = Capabilities::NOTHING
    .with_ack(Verb::Native)
    .with_drop(Verb::Native)
    .with_redeliver(Verb::Native)
    .with_delayed_redelivery(DelayedRedelivery::Native)
    .with_native_count(true)
    .with_dead_letters(DeadLetters::Runtime)
    .with_holds_original(true)
    .with_redeliver_in_place(false)
    .with_rewinds(false);

/// A JetStream stream read through a durable pull consumer, created (or updated) on
/// start. A missing stream is a startup error naming it. `max_deliver` is left unset
/// (SPEC N7): the registration's `max_attempts` caps attempts, counted by the server's
/// `delivered`.
#[derive(Debug, Clone)]
pub struct JetStreamConsumer {
    client: Client,
    stream: String,
    consumer: String,
    filter_subject: Option<String>,
    ack_wait: Duration,
    max_ack_pending: Option<i64>,
    deliver_policy: DeliverPolicy,
    double_ack: bool,
    keepalive: bool,
    batch: usize,
}

impl JetStreamConsumer {
    pub(crate) fn new(client: Client, stream: String, consumer: String) -> Self {
        Self {
            client,
            stream,
            consumer,
            filter_subject: None,
            ack_wait: DEFAULT_ACK_WAIT,
            max_ack_pending: None,
            deliver_policy: DeliverPolicy::All,
            double_ack: false,
            keepalive: true,
            batch: DEFAULT_BATCH,
        }
    }

    /// Reads only subjects matching `subject` from the stream.
    pub fn filter_subject(mut self, subject: impl Into<String>) -> Self {
        self.filter_subject = Some(subject.into());
        self
    }

    /// How long the server waits for a settlement before it redelivers (default 30 s).
    pub fn ack_wait(mut self, ack_wait: Duration) -> Self {
        self.ack_wait = ack_wait;
        self
    }

    /// Most deliveries the server lets the consumer hold unsettled. The default is the
    /// registration's `max_in_flight` (SPEC G5): the server sends no more than the runtime
    /// takes at once, so no delivery waits in the client's buffer, where nothing keeps it
    /// alive, while its `ack_wait` runs out. A larger value brings that wait back (with
    /// slow handlers, deliveries handled twice); a smaller one holds fewer in flight.
    pub fn max_ack_pending(mut self, max: i64) -> Self {
        self.max_ack_pending = Some(max);
        self
    }

    /// Where a new durable consumer starts (default [`StartAt::Earliest`]: all of the
    /// stream); an existing consumer resumes where it was (SPEC G8).
    pub fn start_at(mut self, start: StartAt) -> Self {
        self.deliver_policy = match start {
            StartAt::Latest => DeliverPolicy::New,
            StartAt::Time(at) => DeliverPolicy::ByStartTime {
                start_time: time::OffsetDateTime::from(at),
            },
            _ => DeliverPolicy::All,
        };
        self
    }

    /// Where a new consumer starts, in JetStream's own terms (by sequence, last per
    /// subject...); [`start_at`](Self::start_at) covers the common cases.
    pub fn deliver_policy(mut self, policy: DeliverPolicy) -> Self {
        self.deliver_policy = policy;
        self
    }

    /// Waits for the server to confirm every settlement (double ack): a settlement that
    /// the server did not take is logged as failed instead of lost silently.
    pub fn double_ack(mut self, on: bool) -> Self {
        self.double_ack = on;
        self
    }

    /// Sends `+WPI` (work in progress) for deliveries whose handler runs longer than half
    /// of `ack_wait`, so a slow handler does not burn attempts (default on).
    pub fn keepalive(mut self, on: bool) -> Self {
        self.keepalive = on;
        self
    }

    /// Messages asked for per pull request (default [`DEFAULT_BATCH`], the client's own
    /// default, never above the registration's `max_in_flight`). With the default
    /// `max_ack_pending` the server never sends more than the runtime takes at once, and
    /// the runtime keeps every delivery it holds alive, so a large batch with slow
    /// handlers costs no duplicates.
    pub fn batch(mut self, batch: usize) -> Self {
        self.batch = batch.max(1);
        self
    }
}

impl Descriptor for JetStreamConsumer {
    type Subscription = JetStreamSubscription;

    fn address(&self) -> &str {
        self.filter_subject.as_deref().unwrap_or(&self.stream)
    }

    fn transport(&self) -> &'static str {
        "jetstream"
    }

    fn retry_address(&self) -> Option<&str> {
        // Never needed: the server redelivers; nothing is copied (N1, N5).
        None
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    fn reads(&self, address: &str) -> bool {
        // Without a filter the stream's subjects decide; `open` asks the server.
        self.filter_subject
            .as_deref()
            .is_some_and(|filter| subject::matches(filter, address))
    }

    fn address_rule(&self, address: &str) -> Option<String> {
        subject::publish_rule(address)
    }

    fn check(&self, _declaration: &Declaration) -> Vec<String> {
        let mut broken = Vec::new();
        if self.ack_wait.is_zero() {
            broken.push("ack_wait must be longer than zero".to_owned());
        }
        if self.consumer.is_empty() || self.consumer.contains(['.', '*', '>', ' ']) {
            broken.push(format!(
                "{:?} is not a valid durable consumer name",
                self.consumer
            ));
        }
        broken
    }

    fn publisher(&self) -> Arc<dyn Publish> {
        Arc::new(NatsPublisher::new(self.client.clone()))
    }

    fn describe(&self) -> ruststream_core::Described {
        self.publisher()
            .describe()
            .group(&self.consumer)
            .setting("kind", "jetstream")
            .setting("stream", &self.stream)
    }

    /// The stream that captures the dead-letter subject, read from the oldest.
    async fn dead_letters(
        &self,
        address: &str,
    ) -> Result<Box<dyn ruststream_core::LetterBox>, String> {
        letters_of(&self.client, address).await
    }

    /// The stream exists (the durable is made at start when missing).
    async fn verify(&self) -> Result<(), String> {
        let jetstream = async_nats::jetstream::new(self.client.clone());
        let asked = jetstream.get_stream(&self.stream);
        match tokio::time::timeout(Duration::from_secs(5), asked).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(format!("JetStream stream `{}`: {e}", self.stream)),
            Err(_) => Err(format!(
                "JetStream did not answer within 5s about stream `{}`",
                self.stream
            )),
        }
    }

    async fn open(
        self,
        declaration: &Declaration,
    ) -> Result<JetStreamSubscription, SubscribeError> {
        let address = self.address().to_owned();
        let jetstream = async_nats::jetstream::new(self.client.clone());
        if let Some(dead) = declaration.dead_letter.as_deref() {
            warn_if_no_stream_keeps(&jetstream, dead, &address).await;
        }
        let failed = |what: String, e: Box<dyn std::error::Error + Send + Sync>| {
            SubscribeError::new(&address, Cause::context(what, e))
        };
        let mut stream = jetstream.get_stream(&self.stream).await.map_err(|e| {
            failed(
                format!("JetStream stream `{}` cannot be read", self.stream),
                e.into(),
            )
        })?;
        if let (None, Some(dead)) = (&self.filter_subject, declaration.dead_letter.as_deref()) {
            self.refuse_own_capture(&mut stream, dead, &address).await?;
        }
        let consumer: async_nats::jetstream::consumer::PullConsumer = stream
            .create_consumer(self.pull_config(declaration))
            .await
            .map_err(|e| {
                let what = format!("consumer `{}` on stream `{}`", self.consumer, self.stream);
                failed(what, e.into())
            })?;
        let messages = consumer
            .stream()
            .max_messages_per_batch(
                declaration
                    .max_in_flight
                    .map_or(self.batch, |most| self.batch.min(most.max(1))),
            )
            .messages()
            .await
            .map_err(|e| failed(format!("pulling from `{}`", self.consumer), e.into()))?;
        // Running deliveries are tracked only for the keepalive.
        let in_progress: Option<InProgress> = self.keepalive.then(Default::default);
        let deadline = declaration.handler_timeout;
        let keepalive = in_progress.as_ref().map(|running| {
            tokio::spawn(keep_alive(
                self.client.clone(),
                Arc::clone(running),
                self.ack_wait,
                deadline,
            ))
        });
        Ok(JetStreamSubscription {
            client: self.client,
            stream_name: Arc::from(self.stream.as_str()),
            consumer_name: Arc::from(self.consumer.as_str()),
            messages,
            last_subject: Arc::from(address.as_str()),
            address: Arc::from(address.as_str()),
            double_ack: self.double_ack,
            acks: AckReader::default(),
            tags: 0,
            in_progress,
            kept_alive: 0,
            keepalive,
            read_ahead: std::collections::VecDeque::new(),
            // As many as the registration may hold: bounded even where `max_ack_pending`
            // lets the server send more.
            read_ahead_limit: declaration.max_in_flight.unwrap_or(self.batch).max(1),
            ahead_end: None,
        })
    }
}

impl JetStreamConsumer {
    /// The durable pull consumer this descriptor creates (or updates); `max_ack_pending`
    /// defaults to `max_in_flight`.
    /// The durable consumer's configuration. Unless set, its `max_ack_pending` is what
    /// the registration's consumers hold at most together (`max_in_flight` each).
    fn pull_config(&self, declaration: &Declaration) -> pull::Config {
        let in_flight = declaration.max_in_flight.map(|most| {
            let together = most.saturating_mul(declaration.consumer_count());
            i64::try_from(together).unwrap_or(i64::MAX)
        });
        pull::Config {
            durable_name: Some(self.consumer.clone()),
            filter_subject: self.filter_subject.clone().unwrap_or_default(),
            ack_policy: AckPolicy::Explicit,
            ack_wait: self.ack_wait,
            deliver_policy: self.deliver_policy,
            max_ack_pending: self.max_ack_pending.or(in_flight).unwrap_or_default(),
            ..Default::default()
        }
    }

    /// Unfiltered, the consumer reads whatever the stream captures (SPEC G4): a
    /// dead-letter subject the stream captures would be handled again without end.
    async fn refuse_own_capture(
        &self,
        stream: &mut async_nats::jetstream::stream::Stream,
        dead: &str,
        address: &str,
    ) -> Result<(), SubscribeError> {
        let info = stream.info().await.map_err(|e| {
            SubscribeError::new(
                address,
                Cause::context(format!("stream `{}` info", self.stream), e),
            )
        })?;
        match info
            .config
            .subjects
            .iter()
            .find(|s| subject::matches(s, dead))
        {
            Some(captures) => Err(SubscribeError::new(
                address,
                format!(
                    "the dead-letter subject `{dead}` is captured by this consumer's own stream `{}` (subject `{captures}`), so every dead letter would be handled again without end",
                    self.stream
                ),
            )),
            None => Ok(()),
        }
    }
}

/// A dead-letter subject no stream captures is published on Core NATS, where nothing
/// keeps a letter nobody is listening for at that moment: said at start.
async fn warn_if_no_stream_keeps(
    jetstream: &async_nats::jetstream::Context,
    dead: &str,
    address: &str,
) {
    if let Err(e) = jetstream.stream_by_subject(dead).await
        && matches!(
            e.kind(),
            async_nats::jetstream::context::GetStreamByNameErrorKind::NotFound
        )
    {
        tracing::warn!(
            address,
            dead_letter = dead,
            "no JetStream stream captures the dead-letter subject: dead letters will go out on Core NATS and are kept only if a subscriber listens"
        );
    }
}
