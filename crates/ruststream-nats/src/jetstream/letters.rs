//! Dead letters read back from the JetStream stream that captures their subject: an
//! ephemeral consumer (no acks) reads them from the oldest, and a replayed one is
//! deleted from the stream by its sequence.

use std::time::Duration;

use async_nats::Client;
use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, pull};
use async_nats::jetstream::stream::Stream;
use futures_util::StreamExt;
use ruststream_core::{BoxFuture, Letter, LetterBox};

use crate::headers::from_nats;

/// The dead letters on one subject.
pub(crate) struct JetStreamLetters {
    stream: Stream,
    subject: String,
}

impl JetStreamLetters {
    /// The stream capturing `subject`; an error when none does (then nothing keeps them).
    pub(crate) async fn open(client: &Client, subject: &str) -> Result<Self, String> {
        let jetstream = async_nats::jetstream::new(client.clone());
        let name = jetstream.stream_by_subject(subject).await.map_err(|e| {
            format!(
                "no JetStream stream captures `{subject}`, so its dead letters are not kept: {e}"
            )
        })?;
        let stream = jetstream
            .get_stream(&name)
            .await
            .map_err(|e| format!("JetStream stream `{name}`: {e}"))?;
        Ok(Self {
            stream,
            subject: subject.to_owned(),
        })
    }
}

impl LetterBox for JetStreamLetters {
    fn peek(&mut self, limit: usize) -> BoxFuture<'_, Result<Vec<Letter>, String>> {
        Box::pin(async move {
            let fail = |e: &dyn std::fmt::Display| format!("reading `{}`: {e}", self.subject);
            let mut consumer = self
                .stream
                .create_consumer(pull::Config {
                    filter_subject: self.subject.clone(),
                    deliver_policy: DeliverPolicy::All,
                    ack_policy: AckPolicy::None,
                    inactive_threshold: Duration::from_secs(30),
                    ..Default::default()
                })
                .await
                .map_err(|e| fail(&e))?;
            let pending = consumer.info().await.map_err(|e| fail(&e))?.num_pending;
            let wanted = limit.min(usize::try_from(pending).unwrap_or(usize::MAX));
            let mut letters = Vec::with_capacity(wanted);
            if wanted == 0 {
                return Ok(letters);
            }
            let mut batch = consumer
                .fetch()
                .max_messages(wanted)
                .expires(Duration::from_secs(5))
                .messages()
                .await
                .map_err(|e| fail(&e))?;
            while let Some(message) = batch.next().await {
                let message = message.map_err(|e| fail(&e))?;
                let sequence = message.info().map_err(|e| fail(&e))?.stream_sequence;
                letters.push(Letter {
                    id: sequence.to_string(),
                    key: None,
                    headers: from_nats(message.headers.as_ref()),
                    payload: message.payload.clone(),
                });
            }
            Ok(letters)
        })
    }

    fn remove<'a>(&'a mut self, letter: &'a Letter) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let sequence: u64 = letter
                .id
                .parse()
                .map_err(|_| format!("`{}` is not a stream sequence", letter.id))?;
            self.stream
                .delete_message(sequence)
                .await
                .map(drop)
                .map_err(|e| format!("deleting sequence {sequence} of `{}`: {e}", self.subject))
        })
    }
}
