//! Producing to Pulsar, confirmed by the broker's send receipt.

use std::sync::Arc;

use pulsar::TokioExecutor;
use pulsar::producer::{Message, MultiTopicProducer};
use ruststream_core::{BoxFuture, Headers, Outgoing, Publish, PublishError, PublishErrorKind};
use tokio::sync::Mutex;

/// Publishes to any topic (one producer per topic, made on first use). Cheap to clone.
#[derive(Clone)]
pub struct PulsarPublisher {
    producers: Arc<Mutex<MultiTopicProducer<TokioExecutor>>>,
    /// The URL connected to (empty for a client the caller made), never holding
    /// credentials: Pulsar's connect refuses a URL with user-info.
    pub(crate) server: Arc<str>,
}

impl std::fmt::Debug for PulsarPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PulsarPublisher")
    }
}

impl PulsarPublisher {
    pub(crate) fn new(client: pulsar::Pulsar<TokioExecutor>) -> Self {
        // A full outbound queue (the client's default holds 100 messages) waits for room
        // instead of failing the publish with `SlowDown`: many publishes at once
        // (`send_all`, retry copies under load) are slowed, never refused.
        let options = pulsar::producer::ProducerOptions {
            block_queue_if_full: true,
            ..Default::default()
        };
        Self {
            producers: Arc::new(Mutex::new(
                client.producer().with_options(options).build_multi_topic(),
            )),
            server: Arc::from(""),
        }
    }

    /// Sends `payload` to `topic` with a key and properties and waits for the receipt.
    /// Properties are text in Pulsar: a header that is not UTF-8 is refused by name.
    pub async fn send(
        &self,
        topic: &str,
        key: Option<&[u8]>,
        headers: &Headers,
        payload: Vec<u8>,
    ) -> Result<(), PublishError> {
        let message = message_of(topic, key, headers, payload)?;
        let receipt = {
            let mut producers = self.producers.lock().await;
            start(&mut producers, topic, message).await?
        };
        received(topic, receipt).await
    }
}

/// Messages `publish_all` makes ready before it takes the producers' lock to hand them
/// over: the caller's iterator runs outside the lock, which is taken once per chunk.
const CHUNK: usize = 256;

/// A send started: its receipt to come.
type Receipt = pulsar::producer::SendFuture;

/// What Pulsar carries of a message: properties and the partition key are text, so a
/// header or key that is not UTF-8 is refused by name; so is an empty topic name (the
/// client would send it somewhere no registration reads).
fn message_of(
    topic: &str,
    key: Option<&[u8]>,
    headers: &Headers,
    payload: Vec<u8>,
) -> Result<Message, PublishError> {
    let refuse = |detail: String| PublishError::new(topic, PublishErrorKind::Rejected, detail);
    if topic.is_empty() {
        return Err(refuse("the topic name is empty".to_owned()));
    }
    let mut properties = std::collections::HashMap::with_capacity(headers.len());
    for (name, value) in headers.iter() {
        let text = std::str::from_utf8(value).map_err(|_| {
            refuse(format!(
                "header `{name}` is not valid UTF-8, which Pulsar properties need"
            ))
        })?;
        properties.insert(name.to_owned(), text.to_owned());
    }
    let partition_key = match key {
        None => None,
        Some(key) => Some(String::from_utf8(key.to_vec()).map_err(|_| {
            refuse("the key is not valid UTF-8, which Pulsar partition keys need".to_owned())
        })?),
    };
    Ok(Message {
        payload,
        properties,
        partition_key,
        ..Default::default()
    })
}

/// Hands `message` to `topic`'s producer (waiting for room in its queue); its receipt.
async fn start(
    producers: &mut MultiTopicProducer<TokioExecutor>,
    topic: &str,
    message: Message,
) -> Result<Receipt, PublishError> {
    producers
        .send_non_blocking(topic, message)
        .await
        .map_err(|e| PublishError::new(topic, kind(&e, PublishErrorKind::Disconnected), e))
}

/// The broker's receipt for a send.
async fn received(topic: &str, receipt: Receipt) -> Result<(), PublishError> {
    receipt
        .await
        .map(drop)
        .map_err(|e| PublishError::new(topic, kind(&e, PublishErrorKind::Rejected), e))
}

/// What a failed send was: the connection timing out or going away is transient
/// (`Timeout`, `Disconnected`: a broker that stopped answering fails a send after the
/// client's operation timeout, 30 s); anything else is `otherwise`.
fn kind(error: &pulsar::Error, otherwise: PublishErrorKind) -> PublishErrorKind {
    use pulsar::error::{ConnectionError, ProducerError};
    let io = |e: &std::io::Error| match e.kind() {
        std::io::ErrorKind::TimedOut => PublishErrorKind::Timeout,
        _ => PublishErrorKind::Disconnected,
    };
    let connection = |e: &ConnectionError| match e {
        ConnectionError::Io(e) => Some(io(e)),
        ConnectionError::Disconnected => Some(PublishErrorKind::Disconnected),
        ConnectionError::SlowDown => Some(PublishErrorKind::Timeout),
        _ => None,
    };
    let found = match error {
        pulsar::Error::Connection(e) => connection(e),
        pulsar::Error::Producer(ProducerError::Connection(e)) => connection(e),
        pulsar::Error::Producer(ProducerError::Io(e)) => Some(io(e)),
        pulsar::Error::Producer(ProducerError::Closed) => Some(PublishErrorKind::Disconnected),
        pulsar::Error::Producer(ProducerError::Batch(e)) => Some(kind(e, otherwise)),
        _ => None,
    };
    found.unwrap_or(otherwise)
}

impl Publish for PulsarPublisher {
    fn describe(&self) -> ruststream_core::Described {
        ruststream_core::Described::new("pulsar", &self.server)
    }

    fn publish(&self, message: Outgoing) -> BoxFuture<'_, Result<(), PublishError>> {
        Box::pin(async move {
            self.send(
                &message.address,
                message.key.as_deref(),
                &message.headers,
                message.payload.to_vec(),
            )
            .await
        })
    }

    /// Messages made ready (in order) outside the producers' lock, up to 256 at a
    /// time, then handed to their producers under one hold of it (each waiting for room
    /// in its queue); the receipts are awaited after every message is handed over. The
    /// caller's iterator never runs under the lock. Once a topic's producer fails a send
    /// (a broker away), the call's later messages to that topic are not tried: each
    /// fails at once, saying so (the lock is not held for a timeout per message, and
    /// nothing to that topic goes out after a failure).
    fn publish_all<'a>(
        &'a self,
        mut messages: Box<dyn Iterator<Item = Outgoing> + Send + 'a>,
    ) -> BoxFuture<'a, Vec<Result<(), PublishError>>> {
        Box::pin(async move {
            let mut started = Vec::with_capacity(messages.size_hint().0);
            let mut failed: Vec<(Arc<str>, PublishErrorKind)> = Vec::new();
            let mut ready = Vec::with_capacity(CHUNK);
            loop {
                ready.extend(messages.by_ref().take(CHUNK).map(|message| {
                    let topic = Arc::clone(&message.address);
                    let payload = message.payload.to_vec();
                    let made =
                        message_of(&topic, message.key.as_deref(), &message.headers, payload);
                    (topic, made)
                }));
                if ready.is_empty() {
                    break;
                }
                let mut producers = self.producers.lock().await;
                for (topic, made) in ready.drain(..) {
                    let sent = match (made, failed.iter().find(|(t, _)| *t == topic)) {
                        (Err(refused), _) => Err(refused),
                        (Ok(_), Some((_, kind))) => {
                            let why =
                                "not sent: an earlier message of this batch to the topic failed";
                            Err(PublishError::new(&*topic, *kind, why))
                        }
                        (Ok(m), None) => start(&mut producers, &topic, m).await,
                    };
                    if let Err(e) = &sent
                        && e.kind().is_transient()
                    {
                        failed.push((Arc::clone(&topic), e.kind()));
                    }
                    started.push((sent, topic));
                }
            }
            let mut results = Vec::with_capacity(started.len());
            for (receipt, topic) in started {
                results.push(match receipt {
                    Ok(receipt) => received(&topic, receipt).await,
                    Err(e) => Err(e),
                });
            }
            results
        })
    }
}

#[cfg(test)]
mod tests {
    use pulsar::error::{ConnectionError, ProducerError};

    use super::*;

    fn io(kind: std::io::ErrorKind) -> std::io::Error {
        std::io::Error::new(kind, "as the client reports it")
    }

    /// Seen in a user trial: a send to a frozen broker failed after 30 s as `Rejected`
    /// (permanent), so a caller checking `is_transient` would not have tried again.
    #[test]
    fn a_connection_that_times_out_or_goes_away_is_transient() {
        let timed_out = pulsar::Error::Producer(ProducerError::Connection(ConnectionError::Io(
            io(std::io::ErrorKind::TimedOut),
        )));
        assert_eq!(
            kind(&timed_out, PublishErrorKind::Rejected),
            PublishErrorKind::Timeout
        );
        let recreated = pulsar::Error::Producer(ProducerError::Batch(Arc::new(timed_out)));
        assert_eq!(
            kind(&recreated, PublishErrorKind::Rejected),
            PublishErrorKind::Timeout
        );
        for gone in [
            pulsar::Error::Connection(ConnectionError::Disconnected),
            pulsar::Error::Producer(ProducerError::Closed),
            pulsar::Error::Producer(ProducerError::Io(io(std::io::ErrorKind::BrokenPipe))),
        ] {
            let found = kind(&gone, PublishErrorKind::Rejected);
            assert_eq!(found, PublishErrorKind::Disconnected, "{gone}");
            assert!(found.is_transient());
        }
    }

    #[test]
    fn a_refusal_keeps_the_kind_it_is_given() {
        let refused = pulsar::Error::Producer(ProducerError::Custom("refused".into()));
        assert_eq!(
            kind(&refused, PublishErrorKind::Rejected),
            PublishErrorKind::Rejected
        );
    }
}
