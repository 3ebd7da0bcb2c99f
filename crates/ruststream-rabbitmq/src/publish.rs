//! Publishing to a queue through the default exchange, confirmed by the broker.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use bytes::Bytes;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, PublisherConfirm};
use ruststream_core::{BoxFuture, Headers, Outgoing, Publish, PublishError, PublishErrorKind};

use crate::link::{Link, LinkError};

/// Publishes to queues by name (the default exchange, the queue's name as routing key),
/// persistent, with publisher confirms and `mandatory`: a message no queue takes is an
/// error. Cheap to clone: the clones share one channel, opened again (on a new
/// connection if need be) by the first send after it was lost.
///
/// lapin hands a `basic.return` to whichever confirmation it completes next, so on a
/// channel with several publishes in flight a refusal can land on another message (one
/// no queue took reported sent, one stored reported refused). A queue is therefore
/// reached first on a channel of its own, one message at a time and in order; once one
/// is stored, its publishes share the pipelined channel. A queue deleted while messages
/// to it are in flight there can still have its refusal reported on another message.
#[derive(Clone)]
pub struct RabbitPublisher {
    inner: Arc<Inner>,
}

struct Inner {
    link: Arc<Link>,
    channel: Mutex<Option<Channel>>,
    /// Held while a channel is being opened: one attempt at a time.
    opening: tokio::sync::Mutex<()>,
    /// The connection's negotiated `frame_max` (0 until a channel is open).
    frame_max: AtomicU32,
    /// Queues a message was stored in since the shared channel was opened: publishes
    /// to them are pipelined on it.
    routed: Mutex<HashSet<String>>,
    /// Per queue not yet routed: its publishes go one at a time, in order.
    probing: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Confirming channels with nothing in flight, for publishes to such queues.
    idle_probes: Mutex<Vec<Channel>>,
}

fn locked<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl std::fmt::Debug for RabbitPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RabbitPublisher")
    }
}

impl RabbitPublisher {
    pub(crate) async fn open(link: Arc<Link>) -> Result<Self, LinkError> {
        let publisher = Self {
            inner: Arc::new(Inner {
                link,
                channel: Mutex::default(),
                opening: tokio::sync::Mutex::default(),
                frame_max: AtomicU32::new(0),
                routed: Mutex::default(),
                probing: Mutex::default(),
                idle_probes: Mutex::default(),
            }),
        };
        publisher.channel(Instant::now()).await?;
        Ok(publisher)
    }

    fn open_channel(&self) -> Option<Channel> {
        let channel = self
            .inner
            .channel
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        channel
            .as_ref()
            .filter(|channel| channel.status().connected())
            .cloned()
    }

    /// The confirm channel, opened again when it was lost (for a send made at `asked`).
    async fn channel(&self, asked: Instant) -> Result<Channel, LinkError> {
        if let Some(channel) = self.open_channel() {
            return Ok(channel);
        }
        let _one_at_a_time = self.inner.opening.lock().await;
        if let Some(channel) = self.open_channel() {
            return Ok(channel);
        }
        let connection = self.inner.link.connected_for(asked).await?;
        let frame_max = connection.configuration().frame_max();
        self.inner.frame_max.store(frame_max, Ordering::Relaxed);
        let channel = confirming(&connection).await?;
        // A new channel may be on a new broker: what was routed is learnt again.
        locked(&self.inner.routed).clear();
        *locked(&self.inner.channel) = Some(channel.clone());
        Ok(channel)
    }

    /// A confirming channel with nothing in flight: an idle one, or a new one (for a
    /// send made at `asked`).
    async fn probe_channel(&self, asked: Instant) -> Result<Channel, LinkError> {
        while let Some(channel) = locked(&self.inner.idle_probes).pop() {
            if channel.status().connected() {
                return Ok(channel);
            }
        }
        confirming(&*self.inner.link.connected_for(asked).await?).await
    }

    /// Sends `payload` to `queue` with `headers` and waits for the broker's confirm.
    pub async fn send(
        &self,
        queue: &str,
        headers: &Headers,
        payload: &[u8],
    ) -> Result<(), PublishError> {
        let asked = Instant::now();
        let properties = BasicProperties::default()
            .with_delivery_mode(2) // persistent
            .with_headers(to_table(headers));
        let channel = self.channel(asked).await.map_err(|e| {
            PublishError::new(
                queue,
                PublishErrorKind::Disconnected,
                format!(
                    "no channel to RabbitMQ at `{}`: {e}",
                    self.inner.link.shown()
                ),
            )
        })?;
        // Headers are not split over frames as a body is: past `frame_max` the broker
        // closes the whole connection (FRAME_ERROR), taking every delivery on it along.
        let frame_max = self.inner.frame_max.load(Ordering::Relaxed);
        let header_frame = header_frame_size(headers);
        if frame_max != 0 && header_frame > frame_max as usize {
            return Err(PublishError::new(
                queue,
                PublishErrorKind::TooLarge,
                format!(
                    "its headers take {header_frame} bytes in one frame, above the connection's frame_max of {frame_max}"
                ),
            ));
        }
        if locked(&self.inner.routed).contains(queue) {
            let confirm = publish(&channel, queue, payload, properties).await?;
            return self.confirmed(queue, confirm.await);
        }
        // Not yet routed: one at a time per queue, each on a channel of its own.
        let turn = Arc::clone(
            locked(&self.inner.probing)
                .entry(queue.to_owned())
                .or_default(),
        );
        let held = turn.lock().await;
        let result = self
            .probe_send(&channel, queue, payload, properties, held, asked)
            .await;
        // The queue's turn is forgotten once nobody else waits for it (a queue that
        // stays missing keeps no entry).
        let mut probing = locked(&self.inner.probing);
        if probing
            .get(queue)
            .is_some_and(|t| Arc::ptr_eq(t, &turn) && Arc::strong_count(t) == 2)
        {
            probing.remove(queue);
        }
        result
    }

    /// Sends to a queue not known routed, holding its turn: on the shared channel if it
    /// became routed meanwhile, else alone on a probe channel.
    async fn probe_send(
        &self,
        channel: &Channel,
        queue: &str,
        payload: &[u8],
        properties: BasicProperties,
        turn: tokio::sync::MutexGuard<'_, ()>,
        asked: Instant,
    ) -> Result<(), PublishError> {
        if locked(&self.inner.routed).contains(queue) {
            // Routed while this one waited: its place in the queue's order is kept by
            // publishing before the turn is given up.
            let confirm = publish(channel, queue, payload, properties).await?;
            drop(turn);
            return self.confirmed(queue, confirm.await);
        }
        let probe = self
            .probe_channel(asked)
            .await
            .map_err(|e| PublishError::new(queue, PublishErrorKind::Disconnected, e.to_string()))?;
        let confirmation = publish(&probe, queue, payload, properties).await?.await;
        let result = self.confirmed(queue, confirmation);
        if result.is_ok() {
            locked(&self.inner.routed).insert(queue.to_owned());
        }
        if probe.status().connected() {
            locked(&self.inner.idle_probes).push(probe);
        }
        result
    }

    /// The result of a publish from its confirmation; a refusal makes its queue one
    /// to reach on a channel of its own again.
    fn confirmed(
        &self,
        queue: &str,
        confirmation: Result<Confirmation, lapin::Error>,
    ) -> Result<(), PublishError> {
        match confirmation.map_err(|e| PublishError::new(queue, kind_of(&e), e))? {
            Confirmation::Ack(None) => Ok(()),
            Confirmation::Ack(Some(returned)) | Confirmation::Nack(Some(returned)) => {
                let mut routed = locked(&self.inner.routed);
                routed.remove(queue);
                routed.remove(returned.delivery.routing_key.as_str());
                Err(PublishError::new(
                    queue,
                    PublishErrorKind::NoSuchAddress,
                    format!(
                        "returned by the broker: {} {} (no queue named `{queue}` took it)",
                        returned.reply_code, returned.reply_text
                    ),
                ))
            }
            Confirmation::Nack(None) => Err(PublishError::new(
                queue,
                PublishErrorKind::Rejected,
                "the broker refused to store it (basic.nack)",
            )),
            Confirmation::NotRequested => Err(PublishError::new(
                queue,
                PublishErrorKind::Rejected,
                "publisher confirms are off on this channel",
            )),
        }
    }
}

/// A new channel on `connection` with publisher confirms on.
async fn confirming(connection: &lapin::Connection) -> Result<Channel, LinkError> {
    let channel = connection.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    Ok(channel)
}

/// Sends one persistent, `mandatory` message to `queue` through the default exchange.
async fn publish(
    channel: &Channel,
    queue: &str,
    payload: &[u8],
    properties: BasicProperties,
) -> Result<PublisherConfirm, PublishError> {
    channel
        .basic_publish(
            ShortString::from(""),
            ShortString::from(queue),
            BasicPublishOptions {
                mandatory: true,
                ..BasicPublishOptions::default()
            },
            payload,
            properties,
        )
        .await
        .map_err(|e| PublishError::new(queue, kind_of(&e), e))
}

impl Publish for RabbitPublisher {
    fn describe(&self) -> ruststream_core::Described {
        ruststream_core::Described::new("amqp", self.inner.link.shown())
    }

    fn publish(&self, message: Outgoing) -> BoxFuture<'_, Result<(), PublishError>> {
        Box::pin(async move {
            self.send(&message.address, &message.headers, &message.payload)
                .await
        })
    }
}

/// How a client error publishing reads: a frame or syntax error the broker answered
/// (the connection is closed for it) is the message's fault and permanent, as are its
/// other refusals; anything else is the connection's, and may pass when tried again.
fn kind_of(error: &lapin::Error) -> PublishErrorKind {
    use lapin::protocol::{AMQPErrorKind, AMQPHardError, AMQPSoftError};
    let lapin::ErrorKind::ProtocolError(amqp) = error.kind() else {
        return PublishErrorKind::Disconnected;
    };
    match amqp.kind() {
        AMQPErrorKind::Hard(AMQPHardError::FRAMEERROR)
        | AMQPErrorKind::Soft(AMQPSoftError::CONTENTTOOLARGE) => PublishErrorKind::TooLarge,
        AMQPErrorKind::Hard(AMQPHardError::SYNTAXERROR | AMQPHardError::COMMANDINVALID) => {
            PublishErrorKind::Encode
        }
        AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED) => PublishErrorKind::NotAuthorized,
        AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND) => PublishErrorKind::NoSuchAddress,
        AMQPErrorKind::Hard(AMQPHardError::CONNECTIONFORCED | AMQPHardError::INTERNALERROR) => {
            PublishErrorKind::Disconnected
        }
        _ => PublishErrorKind::Rejected,
    }
}

/// The size of a persistent message's content-header frame carrying `headers` as
/// [`to_table`] encodes them: frame header (7) and end (1), class, weight, body size and
/// property flags (14), the delivery mode (1), and the table (a 4-byte length, then per
/// entry a short-string name, a type octet and a long string).
pub(crate) fn header_frame_size(headers: &Headers) -> usize {
    let table: usize = headers
        .iter()
        .map(|(name, value)| 1 + name.len() + 1 + 4 + value.len())
        .sum();
    7 + 1 + 14 + 1 + 4 + table
}

/// Headers as an AMQP field table: every value a byte string, so it arrives byte for
/// byte as it was given.
pub(crate) fn to_table(headers: &Headers) -> FieldTable {
    let mut table = FieldTable::default();
    for (name, value) in headers.iter() {
        table.insert(
            ShortString::from(name),
            AMQPValue::LongString(LongString::from(value.to_vec())),
        );
    }
    table
}

/// An AMQP field table as headers: byte strings as they are, numbers and flags as text
/// (headers other clients set), nested tables and arrays left out.
pub(crate) fn from_table(table: Option<&FieldTable>) -> Headers {
    let mut headers = Headers::new();
    let Some(table) = table else {
        return headers;
    };
    for (name, value) in table.inner() {
        let bytes = match value {
            AMQPValue::LongString(s) => Bytes::copy_from_slice(s.as_bytes()),
            AMQPValue::ShortString(s) => Bytes::copy_from_slice(s.as_str().as_bytes()),
            AMQPValue::ByteArray(b) => Bytes::copy_from_slice(b.as_slice()),
            AMQPValue::Boolean(v) => Bytes::from(v.to_string()),
            AMQPValue::ShortShortInt(v) => Bytes::from(v.to_string()),
            AMQPValue::ShortShortUInt(v) => Bytes::from(v.to_string()),
            AMQPValue::ShortInt(v) => Bytes::from(v.to_string()),
            AMQPValue::ShortUInt(v) => Bytes::from(v.to_string()),
            AMQPValue::LongInt(v) => Bytes::from(v.to_string()),
            AMQPValue::LongUInt(v) => Bytes::from(v.to_string()),
            AMQPValue::LongLongInt(v) => Bytes::from(v.to_string()),
            AMQPValue::Timestamp(v) => Bytes::from(v.to_string()),
            _ => continue,
        };
        headers.insert(name.as_str(), bytes);
    }
    headers
}

/// A numeric header (`x-delivery-count`), whatever integer type the broker chose.
pub(crate) fn number(table: Option<&FieldTable>, name: &str) -> Option<u64> {
    let value = table?.inner().get(name)?;
    match value {
        AMQPValue::ShortShortInt(v) => u64::try_from(*v).ok(),
        AMQPValue::ShortShortUInt(v) => Some(u64::from(*v)),
        AMQPValue::ShortInt(v) => u64::try_from(*v).ok(),
        AMQPValue::ShortUInt(v) => Some(u64::from(*v)),
        AMQPValue::LongInt(v) => u64::try_from(*v).ok(),
        AMQPValue::LongUInt(v) => Some(u64::from(*v)),
        AMQPValue::LongLongInt(v) => u64::try_from(*v).ok(),
        _ => None,
    }
}
