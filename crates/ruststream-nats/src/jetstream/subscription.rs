//! An open JetStream subscription: pull, keep alive, acknowledge.

use crate::ack_reply::AckReader;
use crate::headers::from_nats;
use crate::keepalive::{InProgress, Running, lock};
use async_nats::jetstream::AckKind;
use async_nats::jetstream::consumer::pull;
use async_nats::{Client, Subject};
use bytes::Bytes;
use futures_util::StreamExt;
use ruststream_core::{
    AckError, Backlog, BacklogProbe, Delivery, LinkProbe, Settle, StillHeld, SubscribeError,
    Subscription,
};
use std::collections::VecDeque;
use std::future::poll_fn;
use std::ops::ControlFlow;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, Waker};
use tokio::task::JoinHandle;

/// A delivery's consumer sequence (unique per delivery) and its ack subject.
type Receipt = (u64, Subject);

/// An open JetStream subscription.
pub struct JetStreamSubscription {
    pub(super) client: Client,
    pub(super) stream_name: Arc<str>,
    pub(super) consumer_name: Arc<str>,
    pub(super) messages: pull::Stream,
    pub(super) address: Arc<str>,
    /// The subject of the last delivery, shared by the deliveries that follow on it.
    pub(super) last_subject: Arc<str>,
    pub(super) double_ack: bool,
    /// Reads each delivery's reply subject.
    pub(super) acks: AckReader,
    /// The last delivery's key in the keepalive's map.
    pub(super) tags: u64,
    /// Deliveries not done at once, when the keepalive is on.
    pub(super) in_progress: Option<InProgress>,
    /// How many of those are in it (only this subscription adds and removes them): a
    /// settlement looks at the map only when there are some.
    pub(super) kept_alive: usize,
    pub(super) keepalive: Option<JoinHandle<()>>,
    /// What the client pulled ahead, taken from its buffer while a delivery waited for
    /// its lane and kept alive since (each under its keepalive tag): handed out first.
    pub(super) read_ahead: VecDeque<(u64, async_nats::jetstream::Message)>,
    /// The most it holds; past it, what the client pulled stays in its buffer.
    pub(super) read_ahead_limit: usize,
    /// The end (`None`) or error the client's stream gave while it was read ahead,
    /// handed out after what was read.
    pub(super) ahead_end: Option<Option<SubscribeError>>,
}

impl std::fmt::Debug for JetStreamSubscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JetStreamSubscription")
            .field("address", &self.address)
            .finish()
    }
}

impl JetStreamSubscription {
    /// Hands `receipt`'s delivery to the keepalive (when it is on), which keeps it alive: within its handler deadline from now when it `runs`,
    /// without a limit while it waits (for its lane, or for a delayed copy's timer).
    fn keep_alive(&mut self, (tag, reply): &Receipt, runs: bool) {
        let Some(progress) = &self.in_progress else {
            return;
        };
        let now = progress.ticks.load(Ordering::Relaxed);
        let since = runs.then_some(now);
        let mut running = lock(progress);
        if let Some(known) = running.get_mut(tag) {
            // It waited and starts now: its deadline counts from here.
            known.since = since;
            return;
        }
        running.insert(
            *tag,
            Running {
                reply: reply.clone(),
                since,
                told: now,
            },
        );
        self.kept_alive += 1;
    }

    /// A settled delivery is no longer kept alive.
    #[inline]
    fn forget_kept_alive(&mut self, tag: u64) {
        if self.kept_alive > 0
            && let Some(running) = &self.in_progress
            && lock(running).remove(&tag).is_some()
        {
            self.kept_alive -= 1;
        }
    }

    /// The fetch, for both `next_into` (the driver's context) and `next_now` (a context
    /// that wakes no one): the next JetStream delivery in the client's buffer, written
    /// into `slot`.
    #[inline(always)]
    fn take(
        &mut self,
        cx: &mut Context<'_>,
        slot: &mut Delivery,
    ) -> Poll<Option<Result<Receipt, SubscribeError>>> {
        if (!self.read_ahead.is_empty() || self.ahead_end.is_some())
            && let Some(next) = self.take_ahead(slot)
        {
            return Poll::Ready(next);
        }
        loop {
            let message = match std::task::ready!(self.messages.poll_next_unpin(cx)) {
                None => return Poll::Ready(None),
                Some(Ok(message)) => message,
                Some(Err(e)) => {
                    return Poll::Ready(Some(Err(SubscribeError::new(&*self.address, e))));
                }
            };
            self.tags += 1;
            if let Some(receipt) = self.fill(message, slot, self.tags) {
                return Poll::Ready(Some(Ok(receipt)));
            }
        }
    }

    /// The first of what was read ahead, or the stream's end or error after it; `None`
    /// when nothing is left of it.
    #[cold]
    fn take_ahead(
        &mut self,
        slot: &mut Delivery,
    ) -> Option<Option<Result<Receipt, SubscribeError>>> {
        while let Some((tag, message)) = self.read_ahead.pop_front() {
            if let Some(receipt) = self.fill(message, slot, tag) {
                return Some(Some(Ok(receipt)));
            }
            self.forget_kept_alive(tag);
        }
        self.ahead_end.take().map(|end| end.map(Err))
    }

    /// Takes what the client has in its buffer now, each kept alive from now on (with
    /// no limit, as a delivery waiting for its lane), until its buffer is empty or the
    /// read-ahead holds `max_in_flight`: the client's pull goes on meanwhile, woken by
    /// the driver's context.
    fn read_ahead_now(&mut self, cx: &mut Context<'_>) {
        while self.ahead_end.is_none() && self.read_ahead.len() < self.read_ahead_limit {
            let message = match self.messages.poll_next_unpin(cx) {
                Poll::Pending => return,
                Poll::Ready(None) => {
                    self.ahead_end = Some(None);
                    return;
                }
                Poll::Ready(Some(Err(e))) => {
                    self.ahead_end = Some(Some(SubscribeError::new(&*self.address, e)));
                    return;
                }
                Poll::Ready(Some(Ok(message))) => message,
            };
            self.tags += 1;
            let tag = self.tags;
            // One without a reply subject is skipped (and said) when it is handed out.
            if let Some(reply) = message.message.reply.clone() {
                self.keep_alive(&(tag, reply), false);
            }
            self.read_ahead.push_back((tag, message));
        }
    }

    /// The acknowledgement `kind` on `reply`: a publish into the client's queue, or with
    /// double acks a request that waits for the server's reply.
    async fn acknowledge(&self, reply: Subject, kind: AckKind) -> Result<(), AckError> {
        let payload = Bytes::from(kind);
        if self.double_ack {
            let reply = self.client.request(reply, payload).await;
            reply.map(drop).map_err(AckError::failed)
        } else {
            let published = self.client.publish(reply, payload).await;
            published.map_err(AckError::failed)
        }
    }

    /// Writes a message from the client into `slot`: its receipt, or `None` (said in the
    /// log) for one that is not a JetStream delivery, which is skipped.
    #[inline(always)]
    fn fill(
        &mut self,
        message: async_nats::jetstream::Message,
        slot: &mut Delivery,
        tag: u64,
    ) -> Option<Receipt> {
        // Taken apart at once: the client's message is large, and every move of it is a
        // copy.
        let async_nats::Message {
            subject,
            reply,
            payload,
            headers,
            ..
        } = message.message;
        let Some(reply) = reply else {
            tracing::warn!(
                address = &*self.address,
                "skipping a message without a JetStream reply subject"
            );
            return None;
        };
        // Deliveries in a row mostly share their subject: one string for all of them.
        if *self.last_subject != *subject.as_str() {
            self.last_subject = Arc::from(subject.as_str());
        }
        // The reply's numbers (attempt, stream sequence, time) are read when someone
        // asks for them, once the subject is known to be of the form the last one
        // read whole had; the first one, and any other, are read whole now.
        if let Some(numbers) = self.acks.later(&reply) {
            slot.refill(&self.last_subject, payload)
                .set_position_from(numbers);
        } else {
            let Some(info) = self.acks.read(reply.as_str()) else {
                tracing::warn!(
                    address = &*self.address,
                    reply = reply.as_str(),
                    "skipping a message whose reply subject is not JetStream's"
                );
                return None;
            };
            let (metadata, attempt) = info.position();
            slot.refill(&self.last_subject, payload)
                .set_metadata(metadata)
                .set_attempt(attempt);
        }
        if headers.is_some() {
            slot.set_headers(from_nats(headers.as_ref()));
        }
        // `tag` is the keepalive's key for it (the consumer sequence would need the
        // numbers).
        Some((tag, reply))
    }
}

/// The acknowledgement a settlement sends; `None` for none (the server redelivers after
/// `ack_wait`, N1).
fn ack_kind(settle: Settle) -> Result<Option<AckKind>, AckError> {
    Ok(Some(match settle {
        Settle::Nothing => return Ok(None),
        Settle::Ack => AckKind::Ack,
        Settle::Drop => AckKind::Term,
        Settle::Redeliver => AckKind::Nak(None),
        Settle::RedeliverAfter(delay) => AckKind::Nak(Some(delay)),
        Settle::DeadLetter => {
            return Err(AckError::Unsupported {
                verb: "dead letter",
            });
        }
    }))
}

impl Subscription for JetStreamSubscription {
    type Receipt = Receipt;

    fn link(&self) -> Option<LinkProbe> {
        Some(crate::link::link(&self.client))
    }

    /// The consumer's `num_pending` and `num_ack_pending`, from a consumer info request.
    fn backlog(&self) -> Option<BacklogProbe> {
        let (client, stream, consumer) = (
            self.client.clone(),
            Arc::clone(&self.stream_name),
            Arc::clone(&self.consumer_name),
        );
        Some(Arc::new(move || {
            let (client, stream, consumer) =
                (client.clone(), Arc::clone(&stream), Arc::clone(&consumer));
            Box::pin(async move {
                let stream = async_nats::jetstream::new(client)
                    .get_stream(&*stream)
                    .await
                    .map_err(|e| e.to_string())?;
                let info = stream
                    .consumer_info(&*consumer)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(vec![
                    Backlog {
                        kind: "pending",
                        partition: None,
                        value: info.num_pending,
                    },
                    Backlog {
                        kind: "ack_pending",
                        partition: None,
                        value: u64::try_from(info.num_ack_pending).unwrap_or(u64::MAX),
                    },
                ])
            })
        }))
    }

    async fn next_into(&mut self, slot: &mut Delivery) -> Option<Result<Receipt, SubscribeError>> {
        poll_fn(|cx| self.take(cx, slot)).await
    }

    /// A message already in the client's buffer (handed out in one poll: pinned by
    /// `tests/client_assumptions.rs`).
    fn next_now(&mut self, slot: &mut Delivery) -> Poll<Option<Result<Receipt, SubscribeError>>> {
        // Nothing is left waiting on this context: when it finds nothing, `next_into`
        // polls again with the driver's own.
        self.take(&mut Context::from_waker(Waker::noop()), slot)
    }

    /// Kept alive from now on (`+WPI`, D3): most deliveries are settled in their
    /// handler's first poll and never need it.
    fn running_on(&mut self, receipt: &Receipt) {
        self.keep_alive(receipt, true);
    }

    fn waiting(&mut self, receipt: &Receipt) {
        self.keep_alive(receipt, false);
    }

    /// The client goes on pulling ahead while a delivery waits for its lane, and what it
    /// pulled would outwait `ack_wait` in its buffer: it is taken out and kept alive
    /// (`+WPI`) until it is handed out (without the keepalive, nothing to do).
    async fn while_waiting(&mut self) {
        if self.in_progress.is_none() {
            return std::future::pending().await;
        }
        poll_fn(|cx| {
            self.read_ahead_now(cx);
            Poll::Pending
        })
        .await
    }

    /// Its retry copy waits for a timer; the original, unsettled meanwhile, is kept alive.
    fn parked(&mut self, receipt: &Receipt) -> Option<StillHeld> {
        self.keep_alive(receipt, false);
        None
    }

    async fn settle(&mut self, receipt: Receipt, settle: Settle) -> Result<(), AckError> {
        let (tag, reply) = match self.settle_now(receipt, settle) {
            ControlFlow::Break(result) => return result,
            ControlFlow::Continue(receipt) => receipt,
        };
        self.forget_kept_alive(tag);
        match ack_kind(settle)? {
            Some(kind) => self.acknowledge(reply, kind).await,
            // No outcome: the server redelivers after ack_wait (N1).
            None => Ok(()),
        }
    }

    /// An acknowledgement (not a double one, which waits for the server's reply) put in
    /// the client's queue at once when it has room: `acknowledge`, polled once here (a
    /// publish with room completes in one poll: pinned by `tests/client_assumptions.rs`).
    fn settle_now(
        &mut self,
        receipt: Receipt,
        settle: Settle,
    ) -> ControlFlow<Result<(), AckError>, Receipt> {
        let (false, Ok(Some(kind))) = (self.double_ack, ack_kind(settle)) else {
            return ControlFlow::Continue(receipt);
        };
        // No one is woken from this context. A full queue (or tokio's budget spent)
        // leaves the publish pending: dropped, it has sent nothing (the client's queue
        // is a tokio channel, whose send is cancel safe), and `settle` publishes again
        // and waits with the driver's own context.
        let mut cx = Context::from_waker(Waker::noop());
        let Poll::Ready(published) = pin!(self.acknowledge(receipt.1.clone(), kind)).poll(&mut cx)
        else {
            return ControlFlow::Continue(receipt);
        };
        self.forget_kept_alive(receipt.0);
        ControlFlow::Break(published)
    }

    async fn close(mut self) {
        if let Some(keepalive) = self.keepalive.take() {
            keepalive.abort();
        }
        // Settlements are plain publishes: make sure they left before the driver ends.
        if let Err(e) = self.client.flush().await {
            tracing::warn!(error = %e, "flushing settlements on close failed");
        }
    }
}

impl Drop for JetStreamSubscription {
    fn drop(&mut self) {
        if let Some(keepalive) = self.keepalive.take() {
            keepalive.abort();
        }
    }
}
