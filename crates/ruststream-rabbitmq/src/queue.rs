//! A queue as the broker has it: its kind, its declaration, a passive look at it.

use lapin::options::QueueDeclareOptions;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use ruststream_core::SubscribeError;

/// What kind of queue is read: it decides who counts attempts and how `retry_after`
/// waits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum QueueKind {
    /// A classic queue: it flags a redelivery but counts nothing, so under
    /// `max_attempts` retries are copies counted in `x-ruststream-retry-count`, and
    /// `retry_after(d)` publishes a copy after d (the original stays unacknowledged until
    /// the copy is confirmed).
    #[default]
    Classic,
    /// A quorum queue: the broker counts deliveries (`x-delivery-count`), which is the
    /// attempt number; `retry_after(d)` holds the delivery unacknowledged for d, then
    /// `basic.nack(requeue=true)`.
    Quorum,
}

/// Declares `queue` (durable, of `kind`) when `create`, else checks that it exists (a
/// passive declare); either on a channel of its own, which a refusal closes. A quorum
/// queue created on RabbitMQ 4.0 or later (`version`) gets `x-delivery-limit` `-1`, no
/// limit there, so the broker's default of 20 never cuts the runtime's attempts short
/// (on 3.x there is no default, and `-1` would drop a message after one delivery).
pub(crate) async fn declare(
    connection: &lapin::Connection,
    queue: &str,
    kind: QueueKind,
    create: bool,
    version: Option<(u32, u32)>,
) -> Result<(), SubscribeError> {
    let unlimited = create
        && kind == QueueKind::Quorum
        && version.is_some_and(|(major, _)| major >= 4)
        && !exists(connection, queue).await;
    let channel = connection
        .create_channel()
        .await
        .map_err(|e| SubscribeError::new(queue, e))?;
    let mut arguments = FieldTable::default();
    if create {
        let kind_name = match kind {
            QueueKind::Classic => "classic",
            QueueKind::Quorum => "quorum",
        };
        arguments.insert(
            ShortString::from("x-queue-type"),
            AMQPValue::LongString(LongString::from(kind_name)),
        );
        if unlimited {
            arguments.insert(
                ShortString::from("x-delivery-limit"),
                AMQPValue::LongLongInt(-1),
            );
        }
    }
    let options = QueueDeclareOptions {
        passive: !create,
        durable: true,
        ..QueueDeclareOptions::default()
    };
    channel
        .queue_declare(ShortString::from(queue), options, arguments)
        .await
        .map_err(|e| {
            let why = if create {
                format!("declaring the queue (durable, {kind:?}): {e}")
            } else {
                format!("the queue does not exist (or cannot be read); `.declare(true)` declares it: {e}")
            };
            SubscribeError::new(queue, why)
        })?;
    let _ = channel.close(200, ShortString::from("declared")).await;
    Ok(())
}

/// Whether `queue` exists (a passive declare on a channel of its own, which a refusal
/// closes).
async fn exists(connection: &lapin::Connection, queue: &str) -> bool {
    looked_up(connection, queue).await.is_ok()
}

/// `queue` as the broker tells it (a passive declare, on a channel of its own which a
/// refusal closes): its ready messages and consumers.
pub(crate) async fn looked_up(
    connection: &lapin::Connection,
    queue: &str,
) -> Result<lapin::Queue, lapin::Error> {
    let channel = connection.create_channel().await?;
    let passive = QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    };
    let state = channel
        .queue_declare(ShortString::from(queue), passive, FieldTable::default())
        .await?;
    let _ = channel.close(200, ShortString::from("looked")).await;
    Ok(state)
}
