//! An open RabbitMQ subscription: a consumer on its own channel with manual
//! acknowledgements, and (quorum queues) `retry_after` waits held until their nack.
//! A lost channel or connection is opened again by the next `next` (see `link`).

use std::ops::ControlFlow;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions,
    BasicRejectOptions,
};
use lapin::types::{FieldTable, ShortString};
use lapin::{Channel, Consumer};
use ruststream_core::{
    AckError, Attempt, Delivery, Held, MESSAGE_ID_HEADER, Metadata, Settle, StillHeld,
    SubscribeError, Subscription,
};
use tokio::time::{Instant, Sleep};

use crate::acks::Unacked;
use crate::link::Link;
use crate::publish::{from_table, number};
use crate::requeue::{self, Requeues};
use crate::settle_timer::{SETTLE_TIMEOUT, SettleTimer};

/// What settles one delivery: its tag on the channel it came on. Settled on that
/// channel's own `basic.ack`/`nack`/`reject` (one hop to lapin's I/O loop, where the
/// delivery's `Acker` takes two: its internal RPC queue first, which halved the rate);
/// refused, rather than sent as a stale tag on a new channel, once that channel was lost.
#[derive(Debug, Clone, Copy)]
pub struct RabbitReceipt {
    tag: u64,
    /// Which session (channel) it came on.
    session: u64,
    /// Classic queues: how often it came back requeued, and its identity then.
    requeued: u32,
    key: u64,
}

/// The open subscription (its driver task is the only caller).
pub struct RabbitSubscription {
    link: Arc<Link>,
    /// The channel and its consumer; `None` once lost, until `next` opens them again.
    session: Option<Session>,
    address: Arc<str>,
    prefetch: u16,
    quorum: bool,
    /// Quorum queues' `retry_after` waits, and classic queues' requeues waiting out
    /// their floor: nacked by `next` once due.
    held: Held<Instant, RabbitReceipt>,
    /// When `next` looks at the channel's state next.
    watchdog: Pin<Box<Sleep>>,
    /// Bounds every acknowledgement in time.
    settle_timer: SettleTimer,
    /// How many sessions were opened: the current one's number.
    sessions: u64,
    /// Classic queues: requeues counted per message (the broker counts none).
    requeues: Requeues,
    /// The current channel's unsettled deliveries, and the acks waiting to be sent.
    unacked: Unacked,
    /// Acks taken out of `unacked` and on their way: kept here, so that a fetch the
    /// runtime drops halfway (a lane finished first) leaves them to the next call
    /// instead of forgetting them.
    sending: Option<Sending>,
    /// A consumer being opened again, kept likewise: dropped after its `basic.consume`
    /// went out, it would leave a consumer on the channel that nobody reads.
    opening: Option<Opening>,
}

/// A channel and consumer being opened (see `RabbitSubscription::reopened`).
type Opening = Pin<Box<dyn Future<Output = Result<Session, String>> + Send>>;

/// Acks on their way to the broker (see `RabbitSubscription::flush_acks`).
type Sending = Pin<Box<dyn Future<Output = ()> + Send>>;

/// How often a waiting `next` checks that its channel is still open.
const WATCHDOG_PERIOD: Duration = Duration::from_secs(1);

/// Sleeps until `due`, or forever without one.
async fn sleep_until_some(due: Option<Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due).await,
        None => std::future::pending().await,
    }
}

impl std::fmt::Debug for RabbitSubscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RabbitSubscription")
            .field("address", &self.address)
            .finish()
    }
}

impl RabbitSubscription {
    /// Opens the consumer on `queue` (the first channel: its failure fails the start).
    pub(crate) async fn open(
        link: Arc<Link>,
        queue: &str,
        prefetch: u16,
        quorum: bool,
    ) -> Result<Self, SubscribeError> {
        let session = Session::open(&link, queue, prefetch)
            .await
            .map_err(|e| SubscribeError::new(queue, e))?;
        Ok(Self {
            link,
            session: Some(session),
            address: Arc::from(queue),
            prefetch,
            quorum,
            held: Held::new(),
            watchdog: Box::pin(tokio::time::sleep(WATCHDOG_PERIOD)),
            settle_timer: SettleTimer::new(),
            sessions: 1,
            requeues: Requeues::default(),
            unacked: Unacked::default(),
            sending: None,
            opening: None,
        })
    }

    /// The channel was lost: what it held unacknowledged (held waits included) the broker
    /// gives back by itself, and the receipts from it refuse to settle.
    fn lost(&mut self, why: &str) -> SubscribeError {
        self.session = None;
        self.held.clear();
        self.unacked.clear();
        self.sending = None;
        SubscribeError::new(
            &*self.address,
            format!("{why}; consuming again once the broker takes the consumer"),
        )
    }

    /// Nacks the earliest held wait if it is due; whether one was. Popped before the
    /// nack: lapin queues the frame at the first poll, so a call cut short after it has
    /// still nacked (a second nack of the tag would close the channel). Held waits are
    /// cleared with a lost session, so these belong to the current one.
    async fn nack_due(&mut self) -> bool {
        if self.held.due_at(Instant::now()).is_none() {
            return false;
        }
        let Some(first) = self.held.pop() else {
            return false;
        };
        self.unacked.settled(first.tag);
        let nacked = match &self.session {
            Some(session) => nack(&mut self.settle_timer, &session.channel, first.tag).await,
            None => Ok(()),
        };
        if let Err(e) = nacked {
            tracing::warn!(address = &*self.address, error = %e, "nack after retry_after failed");
        }
        true
    }

    /// Sends the acks gathered since the last flush: the run at the front of the
    /// channel's unsettled deliveries as one `multiple` ack, the others alone (R1). A
    /// send cut short (the caller's future dropped) is finished by the next call. A
    /// failure is logged: the channel is failing, and the broker gives back what it held.
    async fn flush_acks(&mut self) {
        loop {
            if self.sending.is_none() && self.unacked.waiting() > 0 {
                self.sending = self.sent_acks();
            }
            let Some(sending) = &mut self.sending else {
                return;
            };
            sending.as_mut().await;
            self.sending = None;
        }
    }

    /// Opens the channel and consumer again after the last was lost (an opening cut
    /// short is finished by the next call).
    async fn reopened(&mut self) -> Result<(), String> {
        let opening = self.opening.get_or_insert_with(|| {
            let (link, queue) = (Arc::clone(&self.link), Arc::clone(&self.address));
            let prefetch = self.prefetch;
            Box::pin(async move { Session::open(&link, &queue, prefetch).await })
        });
        let opened = opening.await;
        self.opening = None;
        self.session = Some(opened?);
        self.sessions += 1;
        tracing::info!(address = &*self.address, "consuming again");
        Ok(())
    }

    /// What sends the acks gathered now, if the channel is still there.
    fn sent_acks(&mut self) -> Option<Sending> {
        let flush = self.unacked.flush();
        let channel = self.session.as_ref()?.channel.clone();
        let address = Arc::clone(&self.address);
        Some(Box::pin(async move {
            let bounded = |tag, multiple| {
                tokio::time::timeout(
                    SETTLE_TIMEOUT,
                    channel.basic_ack(tag, BasicAckOptions { multiple }),
                )
            };
            let through = flush.through.map(|(tag, covered)| (tag, covered > 1));
            let alone = flush.alone.into_iter().map(|tag| (tag, false));
            for (tag, multiple) in through.into_iter().chain(alone) {
                let failed = match bounded(tag, multiple).await {
                    Ok(Ok(())) => continue,
                    Ok(Err(e)) => e.to_string(),
                    Err(_) => format!("no answer from RabbitMQ within {SETTLE_TIMEOUT:?}"),
                };
                tracing::warn!(address = &*address, error = %failed, "acknowledging failed; the broker delivers those again");
                return;
            }
        }))
    }

    /// What the consumer's stream gave, as the next delivery (written into `slot`).
    #[inline(always)]
    fn received(
        &mut self,
        next: Option<lapin::Result<lapin::message::Delivery>>,
        slot: &mut Delivery,
    ) -> Option<Result<RabbitReceipt, SubscribeError>> {
        match next {
            Some(Ok(message)) => Some(Ok(self.delivery(message, slot))),
            Some(Err(e)) => Some(Err(self.lost(&format!("channel lost: {e}")))),
            None => Some(Err(self.lost("the broker cancelled the consumer"))),
        }
    }

    fn delivery(
        &mut self,
        message: lapin::message::Delivery,
        slot: &mut Delivery,
    ) -> RabbitReceipt {
        let table = message.properties.headers().as_ref();
        let mut headers = from_table(table);
        // The AMQP `message-id` property is the message's id where the header is absent
        // (an inbox skips what it saw; the copies the runtime publishes keep it).
        if let Some(id) = message.properties.message_id()
            && headers.get(MESSAGE_ID_HEADER).is_none()
        {
            headers.insert(
                MESSAGE_ID_HEADER,
                Bytes::copy_from_slice(id.as_str().as_bytes()),
            );
        }
        let (mut requeued, mut key) = (0, 0);
        let attempt = if self.quorum {
            // The broker's count of earlier deliveries (absent on the first).
            let before = number(table, "x-delivery-count").unwrap_or(0);
            Attempt::from_broker(u32::try_from(before).unwrap_or(u32::MAX).saturating_add(1))
        } else {
            let (attempt, malformed) = Attempt::from_headers(&headers);
            if let Some(e) = malformed {
                tracing::warn!(address = &*self.address, error = %e, "read as the first attempt");
            }
            if message.redelivered {
                // Requeued (or given back by a lost channel): counted here, on top of
                // the copies the header counts.
                key = requeue::key(&message);
                requeued = self.requeues.came_back(key);
                Attempt::from_subscription(attempt.number().saturating_add(requeued))
            } else {
                attempt
            }
        };
        self.unacked.delivered(message.delivery_tag);
        slot.refill(&self.address, Bytes::from(message.data))
            .set_headers(headers)
            .set_metadata(Metadata::sequence(message.delivery_tag))
            .set_attempt(attempt);
        RabbitReceipt {
            tag: message.delivery_tag,
            session: self.sessions,
            requeued,
            key,
        }
    }
}

impl Subscription for RabbitSubscription {
    type Receipt = RabbitReceipt;

    async fn next_into(
        &mut self,
        slot: &mut Delivery,
    ) -> Option<Result<RabbitReceipt, SubscribeError>> {
        loop {
            if self.unacked.waiting() > 0 || self.sending.is_some() {
                self.flush_acks().await;
            }
            // Nothing held, the common case: no call and no clock read per message.
            if !self.held.is_empty() && self.nack_due().await {
                continue;
            }
            let Some(session) = &mut self.session else {
                // Lost earlier: the runtime paused after that error; try again now.
                return match self.reopened().await {
                    Ok(()) => continue,
                    Err(e) => Some(Err(SubscribeError::new(
                        &*self.address,
                        format!("reopening the consumer: {e}"),
                    ))),
                };
            };
            // The consumer's stream does not always end when the connection is lost (seen
            // once in a few restarts under load): the channel's state is looked at too.
            if self.watchdog.is_elapsed() {
                if !session.channel.status().connected() {
                    return Some(Err(self.lost("channel closed")));
                }
                self.watchdog
                    .as_mut()
                    .reset(Instant::now() + WATCHDOG_PERIOD);
            }
            let due = self.held.next_due();
            let next = tokio::select! {
                biased;
                message = session.consumer.next() => message,
                () = self.watchdog.as_mut() => continue,
                () = sleep_until_some(due) => continue,
            };
            return self.received(next, slot);
        }
    }

    /// A delivery the consumer has at once, when nothing held waits for its nack and the
    /// channel's state is not due for a look (`next_into` does both first). That lapin
    /// hands a buffered delivery out in one poll is pinned by `tests/client_assumptions.rs`.
    fn next_now(
        &mut self,
        slot: &mut Delivery,
    ) -> Poll<Option<Result<RabbitReceipt, SubscribeError>>> {
        // Acks go out (from `next_into`) once half the prefetch waits for them, so the
        // broker keeps sending while they gather.
        if !self.held.is_empty()
            || self.watchdog.is_elapsed()
            || self.sending.is_some()
            || self.unacked.waiting() >= usize::from(self.prefetch / 2).max(1)
        {
            return Poll::Pending;
        }
        let Some(session) = &mut self.session else {
            return Poll::Pending;
        };
        // Nothing is left waiting on this context: when it finds nothing, `next_into`
        // polls again with the driver's own.
        let mut cx = Context::from_waker(Waker::noop());
        let next = std::task::ready!(session.consumer.poll_next_unpin(&mut cx));
        Poll::Ready(self.received(next, slot))
    }

    /// An ack waits for nothing: it joins the acks the next fetch sends (a run of them as
    /// one `multiple` ack, R1). Other settlements go through `settle`.
    fn settle_now(
        &mut self,
        receipt: RabbitReceipt,
        settle: Settle,
    ) -> ControlFlow<Result<(), AckError>, RabbitReceipt> {
        if settle != Settle::Ack {
            return ControlFlow::Continue(receipt);
        }
        if !self.current(&receipt) {
            return ControlFlow::Break(Err(lost_channel()));
        }
        if receipt.requeued > 0 {
            self.requeues.settled(receipt.key);
        }
        self.unacked.acked(receipt.tag);
        ControlFlow::Break(Ok(()))
    }

    async fn settle(&mut self, receipt: RabbitReceipt, settle: Settle) -> Result<(), AckError> {
        let receipt = match self.settle_now(receipt, settle) {
            ControlFlow::Break(result) => return result,
            ControlFlow::Continue(receipt) => receipt,
        };
        if matches!(settle, Settle::Nothing) {
            return Ok(());
        }
        if !self.current(&receipt) {
            return Err(lost_channel());
        }
        let tag = receipt.tag;
        if receipt.requeued > 0 {
            if settle == Settle::Redeliver {
                // Requeued before: a floor before it goes back, so a handler that always
                // retries does not spin (G2); held unacknowledged meanwhile.
                let floor = requeue::floor(receipt.requeued);
                self.held.hold(Instant::now() + floor, receipt);
                return Ok(());
            }
            self.requeues.settled(receipt.key);
        }
        let Some(session) = self.session.as_ref() else {
            return Err(lost_channel());
        };
        let (channel, timer) = (&session.channel, &mut self.settle_timer);
        let sent = match settle {
            Settle::Nothing | Settle::Ack => Ok(()),
            // To the queue's dead-letter exchange if it has one, else discarded (R1).
            Settle::Drop => {
                let reject = BasicRejectOptions { requeue: false };
                timer.bound(channel.basic_reject(tag, reject)).await
            }
            Settle::Redeliver => nack(timer, channel, tag).await,
            Settle::RedeliverAfter(delay) => {
                // Held unacknowledged here; `next` nacks it once due. A crash gives it
                // back at once (the channel closes), a stop likewise: the wait is lost,
                // not the message (R4).
                self.held.hold(Instant::now() + delay, receipt);
                return Ok(());
            }
            Settle::DeadLetter => {
                return Err(AckError::Unsupported {
                    verb: "dead letter",
                });
            }
        };
        self.unacked.settled(tag);
        sent
    }

    /// A classic queue's delayed copy: when the channel the original came on is lost
    /// during the wait, the broker gives the original back (read again, it waits again),
    /// so this wait makes no copy.
    fn parked(&mut self, receipt: &RabbitReceipt) -> Option<StillHeld> {
        let channel = self.session.as_ref()?.channel.clone();
        let current = self.current(receipt);
        Some(Box::new(move || current && channel.status().connected()))
    }

    fn holding(&self) -> usize {
        self.held.len()
    }

    /// At `max_in_flight`, and while a delivery waits for its lane, the driver stops
    /// calling `next`: the gathered acks are sent and held waits that come due are
    /// nacked here (which frees room, G5); without it they would wait for the next
    /// fetch, or forever.
    async fn idle(&mut self) {
        if self.unacked.waiting() > 0 || self.sending.is_some() {
            self.flush_acks().await;
        }
        let Some(due) = self.held.next_due() else {
            return std::future::pending().await;
        };
        tokio::time::sleep_until(due).await;
        self.nack_due().await;
    }

    /// `pending`: the queue's ready messages, not yet delivered to any consumer (a
    /// passive `queue.declare`'s `message_count`, on a channel of its own).
    fn backlog(&self) -> Option<ruststream_core::BacklogProbe> {
        let (link, queue) = (Arc::clone(&self.link), Arc::clone(&self.address));
        Some(Arc::new(move || {
            let (link, queue) = (Arc::clone(&link), Arc::clone(&queue));
            Box::pin(async move {
                let connection = link.connected().await.map_err(|e| e.to_string())?;
                let state = crate::queue::looked_up(&connection, &queue)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(vec![ruststream_core::Backlog {
                    kind: "pending",
                    partition: None,
                    value: u64::from(state.message_count()),
                }])
            })
        }))
    }

    fn link(&self) -> Option<ruststream_core::LinkProbe> {
        let link = Arc::clone(&self.link);
        Some(Arc::new(move || link.is_up()))
    }

    async fn close(mut self) {
        // What was acked before the stop is acknowledged before the channel closes.
        self.flush_acks().await;
        let Some(session) = self.session else {
            return;
        };
        let tag = session.consumer.tag();
        let closing = async {
            let _ = session
                .channel
                .basic_cancel(tag, BasicCancelOptions::default())
                .await;
            // Closing the channel gives every unacknowledged delivery back to the queue.
            let _ = session
                .channel
                .close(200, ShortString::from("stopped"))
                .await;
        };
        if tokio::time::timeout(std::time::Duration::from_secs(10), closing)
            .await
            .is_err()
        {
            tracing::warn!(address = &*self.address, "closing the channel timed out");
        }
    }
}

/// A channel with its QoS and the consumer on the queue.
struct Session {
    channel: Channel,
    consumer: Consumer,
}

impl Session {
    async fn open(link: &Link, queue: &str, prefetch: u16) -> Result<Self, String> {
        let connection = link.connected().await.map_err(|e| e.to_string())?;
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| e.to_string())?;
        let opened = async {
            channel
                .basic_qos(prefetch, BasicQosOptions::default())
                .await?;
            channel
                .basic_consume(
                    ShortString::from(queue),
                    ShortString::from(""),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await
        };
        match opened.await {
            Ok(consumer) => Ok(Self { channel, consumer }),
            Err(e) => {
                // A refused `basic.consume` closes the channel; close it anyway.
                let _ = channel.close(200, ShortString::from("not consuming")).await;
                Err(e.to_string())
            }
        }
    }
}

impl RabbitSubscription {
    /// Whether `receipt` came on the current channel, which is still open.
    fn current(&self, receipt: &RabbitReceipt) -> bool {
        self.session.as_ref().is_some_and(|session| {
            receipt.session == self.sessions && session.channel.status().connected()
        })
    }
}

/// A settlement of a delivery whose channel is gone.
fn lost_channel() -> AckError {
    AckError::failed("the channel this delivery came on was lost; the broker delivers it again")
}

/// `basic.nack(requeue=true)`: back to the queue at once.
async fn nack(timer: &mut SettleTimer, channel: &Channel, tag: u64) -> Result<(), AckError> {
    let options = BasicNackOptions {
        multiple: false,
        requeue: true,
    };
    timer.bound(channel.basic_nack(tag, options)).await
}
