//! A dead-letter queue read back: `basic.get` without auto-ack on a channel of its own,
//! so what is read stays in the queue, unacknowledged, until a replay acknowledges it;
//! the rest goes back when the channel closes (at the end of the command, or when the
//! process dies).

use lapin::Channel;
use lapin::options::{BasicAckOptions, BasicGetOptions};
use ruststream_core::{BoxFuture, Letter, LetterBox};

use crate::link::Link;
use crate::publish::from_table;

/// The dead letters in one queue. Ids are positions in the order read (`1`, `2`...):
/// RabbitMQ gives a message no id of its own.
pub(crate) struct RabbitLetters {
    channel: Channel,
    queue: String,
    /// The delivery tag of each letter read, by position.
    tags: Vec<u64>,
}

impl RabbitLetters {
    pub(crate) async fn open(link: &Link, queue: &str) -> Result<Self, String> {
        let connection = link.connected().await.map_err(|e| e.to_string())?;
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| e.to_string())?;
        Ok(Self {
            channel,
            queue: queue.to_owned(),
            tags: Vec::new(),
        })
    }
}

impl LetterBox for RabbitLetters {
    fn peek(&mut self, limit: usize) -> BoxFuture<'_, Result<Vec<Letter>, String>> {
        Box::pin(async move {
            let mut letters = Vec::new();
            while letters.len() < limit {
                let got = self
                    .channel
                    .basic_get(
                        self.queue.as_str().into(),
                        BasicGetOptions { no_ack: false },
                    )
                    .await
                    .map_err(|e| format!("reading queue `{}`: {e}", self.queue))?;
                let Some(got) = got else { break };
                let delivery = got.delivery;
                self.tags.push(delivery.delivery_tag);
                letters.push(Letter {
                    id: self.tags.len().to_string(),
                    key: None,
                    headers: from_table(delivery.properties.headers().as_ref()),
                    payload: delivery.data.into(),
                });
            }
            Ok(letters)
        })
    }

    fn remove<'a>(&'a mut self, letter: &'a Letter) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let tag = letter
                .id
                .parse::<usize>()
                .ok()
                .and_then(|n| self.tags.get(n.checked_sub(1)?).copied())
                .ok_or_else(|| format!("no letter `{}` was read here", letter.id))?;
            self.channel
                .basic_ack(tag, BasicAckOptions::default())
                .await
                .map_err(|e| {
                    format!(
                        "acknowledging letter {} in `{}`: {e}",
                        letter.id, self.queue
                    )
                })
        })
    }
}

impl Drop for RabbitLetters {
    /// Closed when dropped unclosed, too (the connection's end would close it anyway).
    fn drop(&mut self) {
        let channel = self.channel.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = channel.close(200, "dead letters read".into()).await;
            });
        }
    }
}
