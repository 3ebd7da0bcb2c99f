//! Core NATS subscriptions: at-most-once, nothing to settle (SPEC N2, N3).

use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use async_nats::{Client, Subscriber};
use futures_util::StreamExt;
use ruststream_core::{
    AckError, Attempt, Backlog, BacklogProbe, Capabilities, Declaration, Delivery, Descriptor,
    LinkProbe, Publish, Settle, SubscribeError, Subscription,
};

use crate::drops::{SlowConsumers, sid_of};
use crate::headers::from_nats;
use crate::publish::NatsPublisher;
use crate::subject;

/// One Core subject, optionally in a queue group. Its retry address is the subject
/// itself: a retry copy is published there (SPEC N5).
#[derive(Debug, Clone)]
pub struct CoreSubject {
    client: Client,
    subject: String,
    queue_group: Option<String>,
    drops: Arc<SlowConsumers>,
}

/// A Core subject pattern with `*` or `>`, optionally in a queue group. It matches many
/// subjects and publishes to none, so a registration that may publish retry copies names
/// their subject with `.retry_to(..)`, or the app refuses to start (SPEC N5).
#[derive(Debug, Clone)]
pub struct CoreWildcard {
    client: Client,
    pattern: String,
    queue_group: Option<String>,
    drops: Arc<SlowConsumers>,
}

impl CoreSubject {
    pub(crate) fn new(client: Client, subject: String, drops: Arc<SlowConsumers>) -> Self {
        Self {
            client,
            subject,
            queue_group: None,
            drops,
        }
    }

    /// Joins queue group `group`: each message goes to one member of the group.
    pub fn queue_group(mut self, group: impl Into<String>) -> Self {
        self.queue_group = Some(group.into());
        self
    }
}

impl CoreWildcard {
    pub(crate) fn new(client: Client, pattern: String, drops: Arc<SlowConsumers>) -> Self {
        Self {
            client,
            pattern,
            queue_group: None,
            drops,
        }
    }

    /// Joins queue group `group`: each message goes to one member of the group.
    pub fn queue_group(mut self, group: impl Into<String>) -> Self {
        self.queue_group = Some(group.into());
        self
    }
}

/// Several consumers of a Core subscription share its messages only as members of one
/// queue group: without one, each would receive every message.
fn consumers_rule(subject: &str, queue_group: Option<&str>, consumers: usize) -> Option<String> {
    (consumers > 1 && queue_group.is_none()).then(|| {
        format!(
            "consumers({consumers}) on `{subject}` without a queue group: every consumer would \
             receive every message; name one with .queue_group(name)"
        )
    })
}

fn wildcard_rule(subject: &str, wildcard: bool) -> Vec<String> {
    let has_wildcard = subject.split('.').any(|t| t == "*" || t == ">");
    match (wildcard, has_wildcard) {
        (false, true) => vec![format!(
            "`{subject}` contains a wildcard token; read it with CoreWildcard"
        )],
        (true, false) => vec![format!(
            "`{subject}` has no `*` or `>` token; read it with CoreSubject"
        )],
        _ if subject.is_empty() || subject.contains(char::is_whitespace) => {
            vec![format!("{subject:?} is not a valid NATS subject")]
        }
        _ => Vec::new(),
    }
}

async fn subscribe(
    client: &Client,
    subject: &str,
    queue_group: Option<&str>,
    drops: Arc<SlowConsumers>,
) -> Result<CoreSubscription, SubscribeError> {
    let subscriber = match queue_group {
        Some(group) => {
            client
                .queue_subscribe(subject.to_owned(), group.to_owned())
                .await
        }
        None => client.subscribe(subject.to_owned()).await,
    }
    .map_err(|e| SubscribeError::new(subject, e))?;
    let sid = sid_of(&subscriber);
    if let Some(sid) = sid {
        drops.register(sid, subject);
    }
    Ok(CoreSubscription {
        subject: Arc::from(subject),
        client: client.clone(),
        subscriber,
        last_subject: Arc::from(""),
        drops: sid.map(|sid| (sid, drops)),
    })
}

impl Descriptor for CoreSubject {
    type Subscription = CoreSubscription;

    fn address(&self) -> &str {
        &self.subject
    }

    fn transport(&self) -> &'static str {
        "nats-core"
    }

    fn retry_address(&self) -> Option<&str> {
        Some(&self.subject)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::NOTHING
    }

    fn check(&self, declaration: &Declaration) -> Vec<String> {
        let mut broken = wildcard_rule(&self.subject, false);
        let (group, consumers) = (self.queue_group.as_deref(), declaration.consumer_count());
        broken.extend(consumers_rule(&self.subject, group, consumers));
        broken
    }

    fn address_rule(&self, address: &str) -> Option<String> {
        subject::publish_rule(address)
    }

    fn publisher(&self) -> Arc<dyn Publish> {
        Arc::new(NatsPublisher::new(self.client.clone()))
    }

    fn describe(&self) -> ruststream_core::Described {
        described(&self.client, self.queue_group.as_deref())
    }

    async fn verify(&self) -> Result<(), String> {
        answers(&self.client).await
    }

    /// Core NATS keeps nothing: only a JetStream stream capturing the dead-letter
    /// subject does (the publisher then stores them there).
    async fn dead_letters(
        &self,
        address: &str,
    ) -> Result<Box<dyn ruststream_core::LetterBox>, String> {
        crate::jetstream::letters_of(&self.client, address).await
    }

    async fn open(self, _declaration: &Declaration) -> Result<CoreSubscription, SubscribeError> {
        subscribe(
            &self.client,
            &self.subject,
            self.queue_group.as_deref(),
            self.drops,
        )
        .await
    }
}

impl Descriptor for CoreWildcard {
    type Subscription = CoreSubscription;

    fn address(&self) -> &str {
        &self.pattern
    }

    fn transport(&self) -> &'static str {
        "nats-core"
    }

    fn retry_address(&self) -> Option<&str> {
        None
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::NOTHING
    }

    fn check(&self, declaration: &Declaration) -> Vec<String> {
        let mut broken = wildcard_rule(&self.pattern, true);
        let (group, consumers) = (self.queue_group.as_deref(), declaration.consumer_count());
        broken.extend(consumers_rule(&self.pattern, group, consumers));
        broken
    }

    fn reads(&self, address: &str) -> bool {
        subject::matches(&self.pattern, address)
    }

    fn address_rule(&self, address: &str) -> Option<String> {
        subject::publish_rule(address)
    }

    fn publisher(&self) -> Arc<dyn Publish> {
        Arc::new(NatsPublisher::new(self.client.clone()))
    }

    fn describe(&self) -> ruststream_core::Described {
        described(&self.client, self.queue_group.as_deref())
    }

    async fn verify(&self) -> Result<(), String> {
        answers(&self.client).await
    }

    /// Core NATS keeps nothing: only a JetStream stream capturing the dead-letter
    /// subject does (the publisher then stores them there).
    async fn dead_letters(
        &self,
        address: &str,
    ) -> Result<Box<dyn ruststream_core::LetterBox>, String> {
        crate::jetstream::letters_of(&self.client, address).await
    }

    async fn open(self, _declaration: &Declaration) -> Result<CoreSubscription, SubscribeError> {
        subscribe(
            &self.client,
            &self.pattern,
            self.queue_group.as_deref(),
            self.drops,
        )
        .await
    }
}

/// The attempt of a message without the retry-count header.
const FIRST_BY_HEADER: Attempt = Attempt::from_header_count(0);

/// An open Core subscription.
#[derive(Debug)]
pub struct CoreSubscription {
    /// The subject or pattern subscribed to.
    subject: Arc<str>,
    client: Client,
    subscriber: Subscriber,
    /// The subject of the last message, shared by the deliveries that follow on it.
    last_subject: Arc<str>,
    /// Its sid, registered with the connection's slow-consumer counts.
    drops: Option<(u64, Arc<SlowConsumers>)>,
}

impl CoreSubscription {
    /// The fetch, for both `next_into` (the driver's context) and `next_now` (a context
    /// that wakes no one): the next message in the client's buffer, written into `slot`.
    #[inline(always)]
    fn take(
        &mut self,
        cx: &mut Context<'_>,
        slot: &mut Delivery,
    ) -> Poll<Option<Result<(), SubscribeError>>> {
        let Some(message) = std::task::ready!(self.subscriber.poll_next_unpin(cx)) else {
            return Poll::Ready(None);
        };
        self.fill(message, slot);
        Poll::Ready(Some(Ok(())))
    }

    /// Writes a message from the client into `slot`.
    #[inline]
    fn fill(&mut self, message: async_nats::Message, slot: &mut Delivery) {
        if *self.last_subject != *message.subject.as_str() {
            self.last_subject = Arc::from(message.subject.as_str());
        }
        slot.refill(&self.last_subject, message.payload)
            .set_reply_to(message.reply.map(|r| Arc::from(r.as_str())));
        match message.headers {
            // Most Core messages carry no headers: the first attempt, nothing to convert.
            None => {
                slot.set_attempt(FIRST_BY_HEADER);
            }
            Some(map) => {
                let headers = from_nats(Some(&map));
                let (attempt, malformed) = Attempt::from_headers(&headers);
                if let Some(error) = malformed {
                    tracing::warn!(subject = message.subject.as_str(), %error, "counting it as the first attempt");
                }
                slot.set_headers(headers).set_attempt(attempt);
            }
        }
    }
}

impl Subscription for CoreSubscription {
    type Receipt = ();

    fn link(&self) -> Option<LinkProbe> {
        Some(crate::link::link(&self.client))
    }

    /// Messages the client dropped for this subscription since the start (slow consumer).
    fn backlog(&self) -> Option<BacklogProbe> {
        let (_, drops) = self.drops.as_ref()?;
        let (drops, subject) = (Arc::clone(drops), Arc::clone(&self.subject));
        Some(Arc::new(move || {
            let value = drops.on(&subject);
            Box::pin(async move {
                Ok(vec![Backlog {
                    kind: "slow_consumer_dropped",
                    partition: None,
                    value,
                }])
            })
        }))
    }

    async fn next_into(&mut self, slot: &mut Delivery) -> Option<Result<(), SubscribeError>> {
        std::future::poll_fn(|cx| self.take(cx, slot)).await
    }

    /// A message already in the client's buffer (handed out in one poll: pinned by
    /// `tests/client_assumptions.rs`).
    fn next_now(&mut self, slot: &mut Delivery) -> Poll<Option<Result<(), SubscribeError>>> {
        // Nothing is left waiting on this context: when it finds nothing, `next_into`
        // polls again with the driver's own.
        self.take(&mut Context::from_waker(Waker::noop()), slot)
    }

    async fn settle(&mut self, _receipt: (), settle: Settle) -> Result<(), AckError> {
        // The planner never asks Core for a verb (its capabilities have none); say so if
        // something else does.
        match settle {
            Settle::Nothing => Ok(()),
            _ => Err(AckError::Unsupported { verb: "settle" }),
        }
    }

    async fn close(mut self) {
        if let Some((sid, drops)) = &self.drops {
            drops.unregister(*sid);
        }
        if let Err(e) = self.subscriber.unsubscribe().await {
            tracing::debug!(error = %e, "unsubscribe on close failed");
        }
    }
}

/// A Core subscription as the service describes itself: the server, its queue group.
fn described(client: &Client, queue_group: Option<&str>) -> ruststream_core::Described {
    let mut described = NatsPublisher::new(client.clone()).describe();
    described.group = queue_group.map(str::to_owned);
    described.setting("kind", "core")
}

/// The server answers within 5 s (`check --connect`): a request to a subject nobody
/// serves comes back from the server itself as "no responders", a round trip a flush of
/// the client's connection would not show (Core NATS acknowledges no publish).
async fn answers(client: &Client) -> Result<(), String> {
    use async_nats::RequestErrorKind;
    let nobody = client.new_inbox();
    let asked = client.request(nobody, bytes::Bytes::new());
    match tokio::time::timeout(std::time::Duration::from_secs(5), asked).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) if e.kind() == RequestErrorKind::NoResponders => Ok(()),
        Ok(Err(e)) => Err(format!("the NATS server did not answer: {e}")),
        Err(_) => Err("the NATS server did not answer within 5s".to_owned()),
    }
}
