//! A dead-letter topic read back: a consumer of the `Shared` subscription
//! `ruststream-dead-letters`, from the earliest message; a replayed letter is
//! acknowledged, the rest comes back to that subscription later (unacknowledged).

use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use pulsar::consumer::{ConsumerOptions, InitialPosition, Message};
use pulsar::{Consumer, SubType, TokioExecutor};
use ruststream_core::{BoxFuture, Headers, Letter, LetterBox};

use crate::Pulsar;

/// The subscription whose acknowledgements say which dead letters were replayed.
pub const DEAD_LETTER_SUBSCRIPTION: &str = "ruststream-dead-letters";

/// How long a read waits for the next message before taking the topic as read.
const IDLE: Duration = Duration::from_secs(3);

/// The dead letters in one topic.
pub(crate) struct PulsarLetters {
    consumer: Consumer<Vec<u8>, TokioExecutor>,
    topic: String,
    read: Vec<Message<Vec<u8>>>,
}

impl PulsarLetters {
    pub(crate) async fn open(pulsar: &Pulsar, topic: &str) -> Result<Self, String> {
        let consumer = pulsar
            .client
            .consumer()
            .with_topic(topic)
            .with_subscription(DEAD_LETTER_SUBSCRIPTION)
            .with_subscription_type(SubType::Shared)
            .with_consumer_id(crate::subscription::consumer_id())
            .with_options(ConsumerOptions {
                initial_position: InitialPosition::Earliest,
                ..ConsumerOptions::default()
            })
            .build::<Vec<u8>>()
            .await
            .map_err(|e| format!("reading Pulsar topic `{topic}`: {e}"))?;
        Ok(Self {
            consumer,
            topic: topic.to_owned(),
            read: Vec::new(),
        })
    }
}

impl LetterBox for PulsarLetters {
    fn peek(&mut self, limit: usize) -> BoxFuture<'_, Result<Vec<Letter>, String>> {
        Box::pin(async move {
            let mut letters = Vec::new();
            while letters.len() < limit {
                let Ok(next) = tokio::time::timeout(IDLE, self.consumer.next()).await else {
                    break;
                };
                let Some(message) = next else { break };
                let message = message.map_err(|e| format!("reading `{}`: {e}", self.topic))?;
                let id = message.message_id();
                let metadata = message.metadata();
                let headers: Headers = metadata
                    .properties
                    .iter()
                    .map(|kv| (kv.key.clone(), Bytes::from(kv.value.clone())))
                    .collect();
                letters.push(Letter {
                    id: format!("{}:{}", id.ledger_id, id.entry_id),
                    key: metadata.partition_key.clone().map(Bytes::from),
                    headers,
                    payload: Bytes::from(message.payload.data.clone()),
                });
                self.read.push(message);
            }
            Ok(letters)
        })
    }

    fn remove<'a>(&'a mut self, letter: &'a Letter) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let found = self.read.iter().find(|m| {
                let id = m.message_id();
                format!("{}:{}", id.ledger_id, id.entry_id) == letter.id
            });
            let Some(message) = found else {
                return Err(format!("no letter `{}` was read here", letter.id));
            };
            self.consumer
                .ack(message)
                .await
                .map_err(|e| format!("acknowledging {} in `{}`: {e}", letter.id, self.topic))
        })
    }

    /// Closing goes through the consumer's engine after the acknowledgements, so they
    /// have been sent when it returns.
    fn close(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            if let Err(e) = self.consumer.close().await {
                tracing::warn!(topic = %self.topic, error = %e, "closing the dead-letter reader failed");
            }
        })
    }
}
