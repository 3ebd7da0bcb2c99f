//! JetStream: a durable pull consumer whose deliveries the server settles (SPEC N1, N4-N7).

use std::future::poll_fn;
use std::ops::ControlFlow;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use async_nats::jetstream::AckKind;
use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, pull};
use async_nats::{Client, Subject};
use bytes::Bytes;
use futures_util::StreamExt;
use ruststream_core::{
    AckError, Backlog, BacklogProbe, Capabilities, Cause, DeadLetters, Declaration,
    DelayedRedelivery, Delivery, Descriptor, LinkProbe, Publish, Settle, StartAt, SubscribeError,
    Subscription, Verb,
};
use tokio::task::JoinHandle;

use crate::ack_reply::AckReader;
use crate::headers::from_nats;
use crate::keepalive::{InProgress, Running, keep_alive, lock};
use crate::publish::NatsPublisher;
use crate::subject;

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
            .create_consumer(self.pull_config(declaration.max_in_flight))
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
        })
    }
}

impl JetStreamConsumer {
    /// The durable pull consumer this descriptor creates (or updates).
    /// The consumer's configuration; `max_ack_pending` defaults to `max_in_flight`.
    fn pull_config(&self, max_in_flight: Option<usize>) -> pull::Config {
        let in_flight = max_in_flight.map(|most| i64::try_from(most).unwrap_or(i64::MAX));
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

/// A delivery's consumer sequence (unique per delivery) and its ack subject.
type Receipt = (u64, Subject);

/// An open JetStream subscription.
pub struct JetStreamSubscription {
    client: Client,
    stream_name: Arc<str>,
    consumer_name: Arc<str>,
    messages: pull::Stream,
    address: Arc<str>,
    /// The subject of the last delivery, shared by the deliveries that follow on it.
    last_subject: Arc<str>,
    double_ack: bool,
    /// Reads each delivery's reply subject.
    acks: AckReader,
    /// The last delivery's key in the keepalive's map.
    tags: u64,
    /// Deliveries not done at once, when the keepalive is on.
    in_progress: Option<InProgress>,
    /// How many of those are in it (only this subscription adds and removes them): a
    /// settlement looks at the map only when there are some.
    kept_alive: usize,
    keepalive: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for JetStreamSubscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JetStreamSubscription")
            .field("address", &self.address)
            .finish()
    }
}

impl JetStreamSubscription {
    /// Hands `receipt`'s delivery to the keepalive (when it is on), which keeps it alive: within its handler deadline from now when it `runs`,
    /// without a limit while it waits (for its lane, or for a delayed copy's timer).
    fn keep_alive(&mut self, (tag, reply): &Receipt, runs: bool) {
        let Some(progress) = &self.in_progress else {
            return;
        };
        let now = progress.ticks.load(Ordering::Relaxed);
        let since = runs.then_some(now);
        let mut running = lock(progress);
        if let Some(known) = running.get_mut(tag) {
            // It waited and starts now: its deadline counts from here.
            known.since = since;
            return;
        }
        running.insert(
            *tag,
            Running {
                reply: reply.clone(),
                since,
                told: now,
            },
        );
        self.kept_alive += 1;
    }

    /// A settled delivery is no longer kept alive.
    #[inline]
    fn forget_kept_alive(&mut self, tag: u64) {
        if self.kept_alive > 0
            && let Some(running) = &self.in_progress
            && lock(running).remove(&tag).is_some()
        {
            self.kept_alive -= 1;
        }
    }

    /// The fetch, for both `next_into` (the driver's context) and `next_now` (a context
    /// that wakes no one): the next JetStream delivery in the client's buffer, written
    /// into `slot`.
    #[inline(always)]
    fn take(
        &mut self,
        cx: &mut Context<'_>,
        slot: &mut Delivery,
    ) -> Poll<Option<Result<Receipt, SubscribeError>>> {
        loop {
            let message = match std::task::ready!(self.messages.poll_next_unpin(cx)) {
                None => return Poll::Ready(None),
                Some(Ok(message)) => message,
                Some(Err(e)) => {
                    return Poll::Ready(Some(Err(SubscribeError::new(&*self.address, e))));
                }
            };
            if let Some(receipt) = self.fill(message, slot) {
                return Poll::Ready(Some(Ok(receipt)));
            }
        }
    }

    /// The acknowledgement `kind` on `reply`: a publish into the client's queue, or with
    /// double acks a request that waits for the server's reply.
    async fn acknowledge(&self, reply: Subject, kind: AckKind) -> Result<(), AckError> {
        let payload = Bytes::from(kind);
        if self.double_ack {
            let reply = self.client.request(reply, payload).await;
            reply.map(drop).map_err(AckError::failed)
        } else {
            let published = self.client.publish(reply, payload).await;
            published.map_err(AckError::failed)
        }
    }

    /// Writes a message from the client into `slot`: its receipt, or `None` (said in the
    /// log) for one that is not a JetStream delivery, which is skipped.
    #[inline(always)]
    fn fill(
        &mut self,
        message: async_nats::jetstream::Message,
        slot: &mut Delivery,
    ) -> Option<Receipt> {
        // Taken apart at once: the client's message is large, and every move of it is a
        // copy.
        let async_nats::Message {
            subject,
            reply,
            payload,
            headers,
            ..
        } = message.message;
        let Some(reply) = reply else {
            tracing::warn!(
                address = &*self.address,
                "skipping a message without a JetStream reply subject"
            );
            return None;
        };
        // Deliveries in a row mostly share their subject: one string for all of them.
        if *self.last_subject != *subject.as_str() {
            self.last_subject = Arc::from(subject.as_str());
        }
        // The reply's numbers (attempt, stream sequence, time) are read when someone
        // asks for them, once the subject is known to be of the form the last one
        // read whole had; the first one, and any other, are read whole now.
        if let Some(numbers) = self.acks.later(&reply) {
            slot.refill(&self.last_subject, payload)
                .set_position_from(numbers);
        } else {
            let Some(info) = self.acks.read(reply.as_str()) else {
                tracing::warn!(
                    address = &*self.address,
                    reply = reply.as_str(),
                    "skipping a message whose reply subject is not JetStream's"
                );
                return None;
            };
            let (metadata, attempt) = info.position();
            slot.refill(&self.last_subject, payload)
                .set_metadata(metadata)
                .set_attempt(attempt);
        }
        if headers.is_some() {
            slot.set_headers(from_nats(headers.as_ref()));
        }
        // The keepalive's key for it (the consumer sequence would need the numbers).
        self.tags += 1;
        let tag = self.tags;
        Some((tag, reply))
    }
}

/// The acknowledgement a settlement sends; `None` for none (the server redelivers after
/// `ack_wait`, N1).
fn ack_kind(settle: Settle) -> Result<Option<AckKind>, AckError> {
    Ok(Some(match settle {
        Settle::Nothing => return Ok(None),
        Settle::Ack => AckKind::Ack,
        Settle::Drop => AckKind::Term,
        Settle::Redeliver => AckKind::Nak(None),
        Settle::RedeliverAfter(delay) => AckKind::Nak(Some(delay)),
        Settle::DeadLetter => {
            return Err(AckError::Unsupported {
                verb: "dead letter",
            });
        }
    }))
}

impl Subscription for JetStreamSubscription {
    type Receipt = Receipt;

    fn link(&self) -> Option<LinkProbe> {
        Some(crate::link::link(&self.client))
    }

    /// The consumer's `num_pending` and `num_ack_pending`, from a consumer info request.
    fn backlog(&self) -> Option<BacklogProbe> {
        let (client, stream, consumer) = (
            self.client.clone(),
            Arc::clone(&self.stream_name),
            Arc::clone(&self.consumer_name),
        );
        Some(Arc::new(move || {
            let (client, stream, consumer) =
                (client.clone(), Arc::clone(&stream), Arc::clone(&consumer));
            Box::pin(async move {
                let stream = async_nats::jetstream::new(client)
                    .get_stream(&*stream)
                    .await
                    .map_err(|e| e.to_string())?;
                let info = stream
                    .consumer_info(&*consumer)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(vec![
                    Backlog {
                        kind: "pending",
                        partition: None,
                        value: info.num_pending,
                    },
                    Backlog {
                        kind: "ack_pending",
                        partition: None,
                        value: u64::try_from(info.num_ack_pending).unwrap_or(u64::MAX),
                    },
                ])
            })
        }))
    }

    async fn next_into(&mut self, slot: &mut Delivery) -> Option<Result<Receipt, SubscribeError>> {
        poll_fn(|cx| self.take(cx, slot)).await
    }

    /// A message already in the client's buffer (handed out in one poll: pinned by
    /// `tests/client_assumptions.rs`).
    fn next_now(&mut self, slot: &mut Delivery) -> Poll<Option<Result<Receipt, SubscribeError>>> {
        // Nothing is left waiting on this context: when it finds nothing, `next_into`
        // polls again with the driver's own.
        self.take(&mut Context::from_waker(Waker::noop()), slot)
    }

    /// Kept alive from now on (`+WPI`, D3): most deliveries are settled in their
    /// handler's first poll and never need it.
    fn running_on(&mut self, receipt: &Receipt) {
        self.keep_alive(receipt, true);
    }

    fn waiting(&mut self, receipt: &Receipt) {
        self.keep_alive(receipt, false);
    }

    /// Its retry copy waits for a timer; the original, unsettled meanwhile, is kept alive.
    fn parked(&mut self, receipt: &Receipt) {
        self.keep_alive(receipt, false);
    }

    async fn settle(&mut self, receipt: Receipt, settle: Settle) -> Result<(), AckError> {
        let (tag, reply) = match self.settle_now(receipt, settle) {
            ControlFlow::Break(result) => return result,
            ControlFlow::Continue(receipt) => receipt,
        };
        self.forget_kept_alive(tag);
        match ack_kind(settle)? {
            Some(kind) => self.acknowledge(reply, kind).await,
            // No outcome: the server redelivers after ack_wait (N1).
            None => Ok(()),
        }
    }

    /// An acknowledgement (not a double one, which waits for the server's reply) put in
    /// the client's queue at once when it has room: `acknowledge`, polled once here (a
    /// publish with room completes in one poll: pinned by `tests/client_assumptions.rs`).
    fn settle_now(
        &mut self,
        receipt: Receipt,
        settle: Settle,
    ) -> ControlFlow<Result<(), AckError>, Receipt> {
        let (false, Ok(Some(kind))) = (self.double_ack, ack_kind(settle)) else {
            return ControlFlow::Continue(receipt);
        };
        // No one is woken from this context. A full queue (or tokio's budget spent)
        // leaves the publish pending: dropped, it has sent nothing (the client's queue
        // is a tokio channel, whose send is cancel safe), and `settle` publishes again
        // and waits with the driver's own context.
        let mut cx = Context::from_waker(Waker::noop());
        let Poll::Ready(published) = pin!(self.acknowledge(receipt.1.clone(), kind)).poll(&mut cx)
        else {
            return ControlFlow::Continue(receipt);
        };
        self.forget_kept_alive(receipt.0);
        ControlFlow::Break(published)
    }

    async fn close(mut self) {
        if let Some(keepalive) = self.keepalive.take() {
            keepalive.abort();
        }
        // Settlements are plain publishes: make sure they left before the driver ends.
        if let Err(e) = self.client.flush().await {
            tracing::warn!(error = %e, "flushing settlements on close failed");
        }
    }
}

impl Drop for JetStreamSubscription {
    fn drop(&mut self) {
        if let Some(keepalive) = self.keepalive.take() {
            keepalive.abort();
        }
    }
}
