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
    AckError, Attempt, Delivery, Due, Metadata, Settle, SubscribeError, Subscription,
};
use tokio::time::Instant;

use crate::publish::{from_table, number};

/// What settles one delivery: lapin's acker for it, which refuses (rather than sends a
/// stale tag on a recovered channel) once the connection it came on was lost.
#[derive(Debug, Clone)]
pub struct RabbitReceipt {
    acker: lapin::Acker,
}

/// The open subscription (its driver task is the only caller).
pub struct RabbitSubscription {
    connection: Arc<lapin::Connection>,
    channel: Channel,
    consumer: Consumer,
    address: Arc<str>,
    quorum: bool,
    /// Quorum queues: `retry_after` waits, nacked by `next` once due.
    held: BinaryHeap<Reverse<Due<Instant, RabbitReceipt>>>,
}

impl std::fmt::Debug for RabbitSubscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RabbitSubscription")
            .field("address", &self.address)
            .finish()
    }
}

impl RabbitSubscription {
    pub(crate) fn new(
        connection: Arc<lapin::Connection>,
        channel: Channel,
        consumer: Consumer,
        address: &str,
        quorum: bool,
    ) -> Self {
        Self {
            connection,
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
                acker: message.acker,
            },
        )
    }

    async fn nack(&self, receipt: &RabbitReceipt) -> Result<(), AckError> {
        receipt
            .acker
            .nack(BasicNackOptions {
                multiple: false,
                requeue: true,
            })
            .await
            .map(drop)
            .map_err(AckError::failed)
    }
}

impl Subscription for RabbitSubscription {
    type Receipt = RabbitReceipt;

    async fn next(&mut self) -> Option<Result<(Delivery, RabbitReceipt), SubscribeError>> {
        loop {
            if let Some(Reverse(first)) = self.held.peek()
                && first.due <= Instant::now()
            {
                // Popped once nacked: a `next` cut short leaves it held for the next call.
                let receipt = first.item.clone();
                let nacked = self.nack(&receipt).await;
                self.held.pop();
                if let Err(e) = nacked {
                    tracing::warn!(address = &*self.address, error = %e, "nack after retry_after failed");
                }
                continue;
            }
            let due = self.held.peek().map(|Reverse(held)| held.due);
            let next = match due {
                None => self.consumer.next().await,
                Some(due) => tokio::select! {
                    message = self.consumer.next() => message,
                    () = tokio::time::sleep_until(due) => continue,
                },
            };
            return match next {
                Some(Ok(message)) => Some(Ok(self.delivery(message))),
                Some(Err(e)) => {
                    // The connection was lost: lapin reconnects and declares the consumer
                    // again (auto-recovery); what was delivered and not acknowledged comes
                    // back from the broker, and its old receipts refuse to settle.
                    tracing::warn!(address = &*self.address, error = %e, "connection lost; waiting for it to recover");
                    match self.channel.wait_for_recovery(e).await {
                        Ok(()) => {
                            // Held waits belong to the lost channel: the broker gives
                            // those deliveries back by itself.
                            self.held.clear();
                            tracing::info!(
                                address = &*self.address,
                                "connection recovered; consuming again"
                            );
                            continue;
                        }
                        Err(e) => Some(Err(SubscribeError::new(&*self.address, e))),
                    }
                }
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
            Settle::Ack => receipt
                .acker
                .ack(BasicAckOptions::default())
                .await
                .map(drop)
                .map_err(AckError::failed),
            // To the queue's dead-letter exchange if it has one, else discarded (R1).
            Settle::Drop => receipt
                .acker
                .reject(BasicRejectOptions { requeue: false })
                .await
                .map(drop)
                .map_err(AckError::failed),
            Settle::Redeliver => self.nack(&receipt).await,
            Settle::RedeliverAfter(delay) => {
                // Held unacknowledged here; `next` nacks it once due. A crash gives it back
                // at once (the channel closes), a stop likewise: the wait is lost, not
                // the message (R4).
                self.held.push(Reverse(Due {
                    due: Instant::now() + delay,
                    item: receipt,
                }));
                Ok(())
            }
        }
    }

    fn holding(&self) -> usize {
        self.held.len()
    }

    fn link(&self) -> Option<ruststream_core::LinkProbe> {
        let connection = Arc::clone(&self.connection);
        Some(Arc::new(move || connection.status().connected()))
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
