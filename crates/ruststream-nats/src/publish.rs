//! Publishing on NATS: confirmed Core publishes, JetStream publishes with their publish
//! acknowledgement (and `Nats-Msg-Id` deduplication), typed request/reply.

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_nats::jetstream::context::{
    GetStreamByNameError, GetStreamByNameErrorKind, PublishAckFuture,
    PublishErrorKind as JsPublishErrorKind, RequestErrorKind as JsRequestErrorKind,
};
use async_nats::{Client, RequestErrorKind, Subject};
use bytes::Bytes;
use ruststream_core::{
    BoxFuture, Cause, Headers, Outgoing, Publish, PublishError, PublishErrorKind,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::headers::to_nats;

/// Publishes to NATS. Through the [`Publish`] contract a message goes to JetStream when a
/// stream captures its subject (confirmed by the stream's publish acknowledgement), and
/// otherwise is published on Core NATS and confirmed by a flush: the client has written
/// it to its connection. Core NATS acknowledges nothing, so a server that stopped reading
/// (or dies before it does) can still lose a confirmed message.
#[derive(Clone, Debug)]
pub struct NatsPublisher {
    client: Client,
    jetstream: async_nats::jetstream::Context,
    /// Whether a stream captures a subject, as the server said, and when it said so.
    routes: Arc<Mutex<HashMap<String, (bool, Instant)>>>,
}

/// How long the answer to "does a stream capture this subject?" is trusted.
const ROUTE_TTL: Duration = Duration::from_secs(5);

/// How long a JetStream publish waits for its acknowledgement: the client's own wait (its
/// default, the context's timeout being unset), which `publish_all` counts from each
/// message's send. (JetStream API questions follow the connection's request timeout.)
const ACK_TIMEOUT: Duration = Duration::from_secs(5);

/// What JetStream said about a stored message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// The stream that stored it.
    pub stream: String,
    /// Its stream sequence.
    pub sequence: u64,
    /// True when the stream had already stored a message with the same `Nats-Msg-Id`.
    pub duplicate: bool,
}

/// A failed request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// Nobody subscribes to the subject: the server said so at once.
    #[error("no responders on `{subject}`")]
    NoResponders {
        /// The request subject.
        subject: String,
    },
    /// No reply within the caller's timeout.
    #[error("no reply on `{subject}` within {timeout:?}")]
    TimedOut {
        /// The request subject.
        subject: String,
        /// The caller's timeout.
        timeout: Duration,
    },
    /// The request could not be encoded, or the reply decoded.
    #[error("request on `{subject}`: {source}")]
    Codec {
        /// The request subject.
        subject: String,
        /// What failed: the codec's error.
        #[source]
        source: Cause,
    },
    /// The connection failed.
    #[error("request on `{subject}` failed: {source}")]
    Failed {
        /// The request subject.
        subject: String,
        /// The client's error.
        #[source]
        source: Cause,
    },
}

impl NatsPublisher {
    pub(crate) fn new(client: Client) -> Self {
        let jetstream = async_nats::jetstream::new(client.clone());
        Self {
            client,
            jetstream,
            routes: Arc::default(),
        }
    }

    /// True when a JetStream stream captures `subject`. Asked of the server (a JetStream
    /// publish cannot probe it: a Core subscriber on the subject would receive the probe).
    ///
    /// Only an answer is trusted (and kept for [`ROUTE_TTL`]): a stream named, none
    /// matching, or no JetStream on the server. A question that went unanswered (the
    /// server restarting, a timeout) is an error: taking it for "no stream" would publish
    /// a JetStream-bound message (a dead letter, a retry copy) on Core NATS, where nothing
    /// keeps it.
    async fn in_stream(&self, subject: &str) -> Result<bool, PublishError> {
        let now = Instant::now();
        let cached = self
            .routes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(subject)
            .filter(|(_, at)| now.duration_since(*at) < ROUTE_TTL)
            .map(|(in_stream, _)| *in_stream);
        if let Some(in_stream) = cached {
            return Ok(in_stream);
        }
        let in_stream = match self.jetstream.stream_by_subject(subject).await {
            Ok(_) => true,
            Err(e) if answered(&e) => false,
            Err(e) => {
                return Err(PublishError::new(
                    subject,
                    unanswered_kind(&e),
                    format!("could not ask the server whether a stream captures the subject: {e}"),
                ));
            }
        };
        self.routes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(subject.to_owned(), (in_stream, now));
        Ok(in_stream)
    }

    /// [`in_stream`](Self::in_stream) for `publish_all`: a subject the server did not
    /// answer for earlier in the call fails at once, and one it does not answer now is
    /// added to `unanswered`.
    async fn route_in(
        &self,
        subject: &Arc<str>,
        unanswered: &mut Vec<(Arc<str>, PublishErrorKind)>,
    ) -> Result<bool, PublishError> {
        if let Some((_, kind)) = unanswered.iter().find(|(s, _)| s == subject) {
            let why = "not sent: the server did not answer whether a stream captures the \
                       subject for an earlier message of this call";
            return Err(PublishError::new(&**subject, *kind, why));
        }
        let route = self.in_stream(subject).await;
        if let Err(e) = &route {
            unanswered.push((Arc::clone(subject), e.kind()));
        }
        route
    }

    /// Publishes on Core NATS and waits until the client has written it to its connection
    /// (a flush; Core NATS has no acknowledgement from the server).
    pub async fn core(
        &self,
        subject: &str,
        headers: &Headers,
        payload: Bytes,
    ) -> Result<(), PublishError> {
        self.send_core(subject, Subject::from(subject), headers, payload)
            .await?;
        self.flushed(subject).await
    }

    /// Hands a Core message to the client for `subject` (not yet known to the server);
    /// `to` is the client's form of the subject, which a run of messages to one subject
    /// shares.
    async fn send_core(
        &self,
        subject: &str,
        to: Subject,
        headers: &Headers,
        payload: Bytes,
    ) -> Result<(), PublishError> {
        match to_nats(headers, subject)? {
            Some(map) => self.client.publish_with_headers(to, map, payload).await,
            None => self.client.publish(to, payload).await,
        }
        .map_err(|e| core_failed(subject, e))
    }

    /// Waits until what was handed to the client is written to its connection (a flush).
    async fn flushed(&self, subject: &str) -> Result<(), PublishError> {
        self.client
            .flush()
            .await
            .map_err(|e| PublishError::new(subject, PublishErrorKind::Disconnected, e))
    }

    /// Publishes to the JetStream stream that captures `subject` and waits for its
    /// publish acknowledgement. `msg_id` sets `Nats-Msg-Id`: the stream stores a message
    /// id once within its duplicate window.
    pub async fn jetstream(
        &self,
        subject: &str,
        headers: &Headers,
        payload: Bytes,
        msg_id: Option<&str>,
    ) -> Result<Stored, PublishError> {
        let ack = self
            .send_jetstream(subject, headers, payload, msg_id)
            .await?;
        stored(subject, ack).await
    }

    /// Sends a message to the JetStream stream that captures `subject`: its publish
    /// acknowledgement, to await.
    async fn send_jetstream(
        &self,
        subject: &str,
        headers: &Headers,
        payload: Bytes,
        msg_id: Option<&str>,
    ) -> Result<PublishAckFuture, PublishError> {
        let mut message = async_nats::jetstream::message::PublishMessage::build().payload(payload);
        if let Some(map) = to_nats(headers, subject)? {
            message = message.headers(map);
        }
        if let Some(id) = msg_id {
            message = message.message_id(id);
        }
        self.jetstream
            .send_publish(subject.to_owned(), message)
            .await
            .map_err(|e| PublishError::new(subject, js_kind(&e), e))
    }

    /// Sends `request` as JSON to `subject` and decodes the JSON reply, waiting at most
    /// `timeout`. Fails at once with [`RequestError::NoResponders`] when nobody listens.
    pub async fn request<Req: Serialize + ?Sized, Resp: DeserializeOwned>(
        &self,
        subject: &str,
        request: &Req,
        timeout: Duration,
    ) -> Result<Resp, RequestError> {
        let codec = |what: &str, e: serde_json::Error| RequestError::Codec {
            subject: subject.to_owned(),
            source: Cause::context(what, e),
        };
        let payload = serde_json::to_vec(request).map_err(|e| codec("encode", e))?;
        let message = async_nats::Request::new()
            .payload(payload.into())
            .timeout(Some(timeout));
        let reply = self
            .client
            .send_request(subject.to_owned(), message)
            .await
            .map_err(|e| match e.kind() {
                RequestErrorKind::NoResponders => RequestError::NoResponders {
                    subject: subject.to_owned(),
                },
                RequestErrorKind::TimedOut => RequestError::TimedOut {
                    subject: subject.to_owned(),
                    timeout,
                },
                _ => RequestError::Failed {
                    subject: subject.to_owned(),
                    source: Cause::new(e),
                },
            })?;
        serde_json::from_slice(&reply.payload).map_err(|e| codec("decode reply", e))
    }
}

/// What a failed JetStream publish was: the stream's own refusal (its error code names
/// it) is permanent; a failure without the server's answer is transient (SPEC G3).
fn js_kind(e: &async_nats::jetstream::context::PublishError) -> PublishErrorKind {
    use async_nats::jetstream::ErrorCode;
    match e.kind() {
        JsPublishErrorKind::TimedOut => return PublishErrorKind::Timeout,
        JsPublishErrorKind::BrokenPipe => return PublishErrorKind::Disconnected,
        JsPublishErrorKind::StreamNotFound => return PublishErrorKind::NoSuchAddress,
        JsPublishErrorKind::MaxPayloadExceeded => return PublishErrorKind::TooLarge,
        _ => {}
    }
    let mut link = std::error::Error::source(e);
    while let Some(error) = link {
        if let Some(js) = error.downcast_ref::<async_nats::jetstream::Error>() {
            return match js.error_code() {
                ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM => PublishErrorKind::TooLarge,
                ErrorCode::STREAM_STORE_FAILED
                | ErrorCode::STORAGE_RESOURCES_EXCEEDED
                | ErrorCode::MEMORY_RESOURCES_EXCEEDED
                | ErrorCode::ACCOUNT_RESOURCES_EXCEEDED => PublishErrorKind::Full,
                ErrorCode::STREAM_NOT_FOUND => PublishErrorKind::NoSuchAddress,
                _ => PublishErrorKind::Rejected,
            };
        }
        link = error.source();
    }
    // No answer from the stream: the request did not get through.
    PublishErrorKind::Disconnected
}

/// True when the failed "which stream captures this subject?" question was answered: no
/// stream matches, the subject is invalid, the server answered with an error (JetStream
/// not enabled for the account), or nothing serves JetStream there (no responders).
/// False when no answer came (a timeout, a lost connection).
///
/// async-nats wraps the request's error more than once (the stream-name page, then the
/// lookup), so the whole chain of sources is searched.
fn answered(e: &GetStreamByNameError) -> bool {
    if !matches!(e.kind(), GetStreamByNameErrorKind::Request) {
        return true;
    }
    let mut link = std::error::Error::source(e);
    while let Some(error) = link {
        if error.is::<async_nats::jetstream::Error>() {
            return true;
        }
        if let Some(request) = error.downcast_ref::<async_nats::jetstream::context::RequestError>()
            && matches!(request.kind(), JsRequestErrorKind::NoResponders)
        {
            return true;
        }
        link = error.source();
    }
    false
}

/// Why a question went unanswered: the server did not answer in time, or the
/// connection failed.
fn unanswered_kind(e: &GetStreamByNameError) -> PublishErrorKind {
    let mut link = std::error::Error::source(e);
    while let Some(error) = link {
        if let Some(request) = error.downcast_ref::<async_nats::jetstream::context::RequestError>()
            && matches!(request.kind(), JsRequestErrorKind::TimedOut)
        {
            return PublishErrorKind::Timeout;
        }
        link = error.source();
    }
    PublishErrorKind::Disconnected
}

/// A publish acknowledgement of `publish_all`, awaited until [`ACK_TIMEOUT`] after its
/// message was sent (at most a tenth more): the client's own timeout counts from the
/// await, so acknowledgements awaited one after another (a server that stopped
/// answering) would each wait it in full.
/// Core messages handed to the client: runs of places in a `send_all` sent one after
/// another to one subject, with that subject.
type CoreRuns = Vec<(Range<usize>, Arc<str>)>;

/// Notes that the message at place `i` went to the client for `subject`: it extends the
/// last run when it follows it to the same subject.
#[inline]
fn handed_to_client(core: &mut CoreRuns, i: usize, subject: Arc<str>) {
    match core.last_mut() {
        Some((run, to)) if run.end == i && same(to, &subject) => run.end += 1,
        _ => core.push((i..i + 1, subject)),
    }
}

/// The flush that confirms the Core messages failed: each fails, naming its subject.
#[cold]
fn not_flushed(results: &mut [Result<(), PublishError>], core: CoreRuns, e: &PublishError) {
    for (run, address) in core {
        for at in run {
            results[at] = Err(PublishError::new(&*address, e.kind(), e.to_string()));
        }
    }
}

/// Whether two addresses are the same: most often the same `Arc` (messages sent to one
/// place share one), compared by pointer before by content (`Arc<str>`'s own `==`
/// compares the contents: std's pointer shortcut is for sized types only).
#[inline]
fn same(a: &Arc<str>, b: &Arc<str>) -> bool {
    Arc::ptr_eq(a, b) || a == b
}

async fn stored_by(
    subject: &str,
    ack: PublishAckFuture,
    sent: Instant,
) -> Result<Stored, PublishError> {
    // Awaited soon after its send (the common case), the client's own wait is bound
    // enough, and no second timer is set.
    if sent.elapsed() < ACK_TIMEOUT / 10 {
        return stored(subject, ack).await;
    }
    let deadline = tokio::time::Instant::from_std(sent + ACK_TIMEOUT);
    match tokio::time::timeout_at(deadline, stored(subject, ack)).await {
        Ok(stored) => stored,
        Err(_) => Err(PublishError::new(
            subject,
            PublishErrorKind::Timeout,
            format!("no publish acknowledgement within {ACK_TIMEOUT:?} of sending"),
        )),
    }
}

/// A JetStream publish acknowledgement, awaited.
async fn stored(subject: &str, ack: PublishAckFuture) -> Result<Stored, PublishError> {
    let ack = ack
        .await
        .map_err(|e| PublishError::new(subject, js_kind(&e), e))?;
    Ok(Stored {
        stream: ack.stream,
        sequence: ack.sequence,
        duplicate: ack.duplicate,
    })
}

/// JetStream acknowledgements `publish_all` keeps in flight (the client bounds how many
/// it holds unawaited).
const ACK_WINDOW: usize = 1_000;

/// The `Nats-Msg-Id` of a message published to a JetStream stream, as an option of a
/// published message (`Outgoing::extras`, `PublishBuilder::with`): the stream stores one
/// message per id within its duplicate window. Ignored on a Core subject (nothing
/// there deduplicates).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageId(pub String);

impl Publish for NatsPublisher {
    /// The server as it announces itself (the client keeps no URL).
    fn describe(&self) -> ruststream_core::Described {
        let info = self.client.server_info();
        ruststream_core::Described::new("nats", &format!("{}:{}", info.host, info.port))
    }

    fn publish(&self, message: Outgoing) -> BoxFuture<'_, Result<(), PublishError>> {
        Box::pin(async move {
            if self.in_stream(&message.address).await? {
                let id = message.extras.get::<MessageId>().map(|id| id.0.as_str());
                self.jetstream(&message.address, &message.headers, message.payload, id)
                    .await
                    .map(drop)
            } else {
                // No stream captures the subject: a Core publish, confirmed by a flush.
                self.core(&message.address, &message.headers, message.payload)
                    .await
            }
        })
    }

    /// JetStream messages sent one after another with up to 1,000 acknowledgements in
    /// flight; Core messages handed to the client, then one flush confirms them all. A
    /// message is let go once sent: only its address (an `Arc`, shared by messages to one
    /// subject) waits with its acknowledgement.
    fn publish_all<'a>(
        &'a self,
        messages: Box<dyn Iterator<Item = Outgoing> + Send + 'a>,
    ) -> BoxFuture<'a, Vec<Result<(), PublishError>>> {
        Box::pin(async move {
            let mut results: Vec<Result<(), PublishError>> =
                Vec::with_capacity(messages.size_hint().0);
            let mut acks: VecDeque<(usize, Arc<str>, PublishAckFuture, Instant)> =
                VecDeque::with_capacity(ACK_WINDOW);
            // The Core messages handed to the client, as runs of places sent in a row to
            // one subject: the flush confirms them or fails them all.
            let mut core = CoreRuns::new();
            // Where the previous message went: a run to one subject asks the routes once
            // (and shares the client's form of the subject).
            let mut last: Option<(Arc<str>, bool)> = None;
            // Subjects whose route the server did not answer in this call: their later
            // messages fail at once instead of each waiting for an answer.
            let mut unanswered: Vec<(Arc<str>, PublishErrorKind)> = Vec::new();
            let mut to: Option<Subject> = None;
            for message in messages {
                let i = results.len();
                let Outgoing {
                    address: subject,
                    payload,
                    headers,
                    extras,
                    ..
                } = message;
                let route = match &last {
                    Some((previous, in_stream)) if same(previous, &subject) => Ok(*in_stream),
                    _ => {
                        to = None;
                        let route = self.route_in(&subject, &mut unanswered).await;
                        if let Ok(in_stream) = route {
                            last = Some((Arc::clone(&subject), in_stream));
                        }
                        route
                    }
                };
                let sent = match route {
                    Ok(true) => {
                        if acks.len() == ACK_WINDOW
                            && let Some((at, address, ack, sent)) = acks.pop_front()
                        {
                            results[at] = stored_by(&address, ack, sent).await.map(drop);
                        }
                        let id = extras.get::<MessageId>().map(|id| id.0.as_str());
                        self.send_jetstream(&subject, &headers, payload, id)
                            .await
                            .map(|ack| acks.push_back((i, subject, ack, Instant::now())))
                    }
                    Ok(false) => {
                        let to = to.get_or_insert_with(|| Subject::from(&*subject));
                        let sent = self
                            .send_core(&subject, to.clone(), &headers, payload)
                            .await;
                        if sent.is_ok() {
                            handed_to_client(&mut core, i, subject);
                        }
                        sent
                    }
                    Err(e) => Err(e),
                };
                results.push(sent);
            }
            for (at, address, ack, sent) in acks {
                results[at] = stored_by(&address, ack, sent).await.map(drop);
            }
            if let Some((_, first)) = core.first()
                && let Err(e) = self.flushed(first).await
            {
                not_flushed(&mut results, core, &e);
            }
            results
        })
    }
}

/// What the client's refusal of a Core message means to a caller.
#[cold]
fn core_failed(subject: &str, e: async_nats::PublishError) -> PublishError {
    let kind = match e.kind() {
        async_nats::client::PublishErrorKind::MaxPayloadExceeded => PublishErrorKind::TooLarge,
        async_nats::client::PublishErrorKind::InvalidSubject => PublishErrorKind::Rejected,
        async_nats::client::PublishErrorKind::Send => PublishErrorKind::Disconnected,
    };
    PublishError::new(subject, kind, e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_flush_fails_each_core_message_of_each_run_and_nothing_else() {
        let (a, b): (Arc<str>, Arc<str>) = (Arc::from("orders"), Arc::from("audit"));
        let mut core = CoreRuns::new();
        // Places 0-1 to `orders`, 2 refused before the client, 3 to `orders` again (its
        // own run: not next to the last), 4-5 to `audit`, 6 to an equal `orders` string.
        for (i, to) in [(0, &a), (1, &a), (3, &a), (4, &b), (5, &b)] {
            handed_to_client(&mut core, i, Arc::clone(to));
        }
        handed_to_client(&mut core, 6, Arc::from("orders"));
        assert_eq!(
            core.iter()
                .map(|(run, to)| (run.clone(), &**to))
                .collect::<Vec<_>>(),
            [
                (0..2, "orders"),
                (3..4, "orders"),
                (4..6, "audit"),
                (6..7, "orders")
            ]
        );
        let refused = PublishError::new("bad subject", PublishErrorKind::Rejected, "a space");
        let mut results: Vec<Result<(), PublishError>> = (0..7).map(|_| Ok(())).collect();
        results[2] = Err(refused.clone());
        let flush = PublishError::new("orders", PublishErrorKind::Disconnected, "closed");
        not_flushed(&mut results, core, &flush);
        let told: Vec<_> = results
            .iter()
            .map(|r| r.as_ref().map_err(|e| (e.address().to_owned(), e.kind())))
            .collect();
        let failed = |to: &str| Err((to.to_owned(), PublishErrorKind::Disconnected));
        assert_eq!(
            told,
            [
                failed("orders"),
                failed("orders"),
                Err(("bad subject".to_owned(), PublishErrorKind::Rejected)),
                failed("orders"),
                failed("audit"),
                failed("audit"),
                failed("orders"),
            ]
        );
    }
}
