//! An open RabbitMQ subscription: a consumer on its own channel with manual
//! acknowledgements, and (quorum queues) `retry_after` waits held until their nack.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::StreamExt;
use lapin::options::{BasicAckOptions, BasicCancelOptions, BasicNackOptions, BasicRejectOptions};
use lapin::types::ShortString;
use lapin::{Channel, Consumer};
use ruststream_core::{
    AckError, Attempt, Delivery, Metadata, Settle, SubscribeError, Subscription,
};
use tokio::time::Instant;

use crate::publish::{from_table, number};

/// What settles one delivery: its tag on the subscription's channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct RabbitReceipt {
    tag: u64,
}

/// The open subscription (its driver task is the only caller).
pub struct RabbitSubscription {
    channel: Channel,
    consumer: Consumer,
    address: Arc<str>,
    quorum: bool,
    /// Quorum queues: `retry_after` waits, nacked by `next` once due.
    held: BinaryHeap<Reverse<(Instant, RabbitReceipt)>>,
}

impl std::fmt::Debug for RabbitSubscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RabbitSubscription")
            .field("address", &self.address)
            .finish()
    }
}

impl RabbitSubscription {
    pub(crate) fn new(channel: Channel, consumer: Consumer, address: &str, quorum: bool) -> Self {
        Self {
            channel,
            consumer,
            address: Arc::from(address),
            quorum,
            held: BinaryHeap::new(),
        }
    }

    fn delivery(&self, message: lapin::message::Delivery) -> (Delivery, RabbitReceipt) {
        let table = message.properties.headers().as_ref();
        let headers = from_table(table);
        let attempt = if self.quorum {
            // The broker's count of earlier deliveries (absent on the first).
            let before = number(table, "x-delivery-count").unwrap_or(0);
            Attempt::from_broker(u32::try_from(before).unwrap_or(u32::MAX - 1) + 1)
        } else {
            let (attempt, malformed) = Attempt::from_headers(&headers);
            if let Some(e) = malformed {
                tracing::warn!(address = &*self.address, error = %e, "read as the first attempt");
            }
            attempt
        };
        let delivery = Delivery::new(Arc::clone(&self.address), Bytes::from(message.data))
            .with_headers(headers)
            .with_metadata(Metadata::sequence(message.delivery_tag))
            .with_attempt(attempt);
        (
            delivery,
            RabbitReceipt {
                tag: message.delivery_tag,
            },
        )
    }

    async fn nack(&self, receipt: RabbitReceipt) -> Result<(), AckError> {
        self.channel
            .basic_nack(
                receipt.tag,
                BasicNackOptions {
                    multiple: false,
                    requeue: true,
                },
            )
            .await
            .map_err(AckError::failed)
    }
}

impl Subscription for RabbitSubscription {
    type Receipt = RabbitReceipt;

    async fn next(&mut self) -> Option<Result<(Delivery, RabbitReceipt), SubscribeError>> {
        loop {
            if let Some(Reverse((due, receipt))) = self.held.peek().copied()
                && due <= Instant::now()
            {
                // Popped once nacked: a `next` cut short leaves it held for the next call.
                let nacked = self.nack(receipt).await;
                self.held.pop();
                if let Err(e) = nacked {
                    tracing::warn!(address = &*self.address, error = %e, "nack after retry_after failed");
                }
                continue;
            }
            let due = self.held.peek().map(|Reverse((due, _))| *due);
            let next = match due {
                None => self.consumer.next().await,
                Some(due) => tokio::select! {
                    message = self.consumer.next() => message,
                    () = tokio::time::sleep_until(due) => continue,
                },
            };
            return match next {
                Some(Ok(message)) => Some(Ok(self.delivery(message))),
                Some(Err(e)) => Some(Err(SubscribeError::new(&*self.address, e))),
                None => Some(Err(SubscribeError::new(
                    &*self.address,
                    "the consumer was cancelled or its connection lost",
                ))),
            };
        }
    }

    async fn settle(&mut self, receipt: RabbitReceipt, settle: Settle) -> Result<(), AckError> {
        match settle {
            Settle::Nothing => Ok(()),
            Settle::Ack => self
                .channel
                .basic_ack(receipt.tag, BasicAckOptions::default())
                .await
                .map_err(AckError::failed),
            // To the queue's dead-letter exchange if it has one, else discarded (R1).
            Settle::Drop => self
                .channel
                .basic_reject(receipt.tag, BasicRejectOptions { requeue: false })
                .await
                .map_err(AckError::failed),
            Settle::Redeliver => self.nack(receipt).await,
            Settle::RedeliverAfter(delay) => {
                // Held unacknowledged here; `next` nacks it once due. A crash gives it back
                // at once (the channel closes), a stop likewise: the wait is lost, not
                // the message (R4).
                self.held.push(Reverse((Instant::now() + delay, receipt)));
                Ok(())
            }
        }
    }

    fn holding(&self) -> usize {
        self.held.len()
    }

    async fn close(self) {
        let tag = self.consumer.tag();
        let closing = async {
            let _ = self
                .channel
                .basic_cancel(tag, BasicCancelOptions::default())
                .await;
            // Closing the channel gives every unacknowledged delivery back to the queue.
            let _ = self.channel.close(200, ShortString::from("stopped")).await;
        };
        if tokio::time::timeout(std::time::Duration::from_secs(10), closing)
            .await
            .is_err()
        {
            tracing::warn!(address = &*self.address, "closing the channel timed out");
        }
    }
}
