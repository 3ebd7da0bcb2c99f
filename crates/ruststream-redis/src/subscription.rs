//! An open Redis Streams subscription.
//!
//! A reader task of its own reads the group (`XREADGROUP … >` on a connection of its
//! own, so its blocking read holds up no other command) into a channel the driver takes
//! from, which keeps `next` cancel safe: an entry read is never lost between a read and
//! a dropped `next`. The same task claims entries other consumers left idle for the claim
//! timeout, and keeps this service's live entries from being claimed (S5). Settlements
//! go through the shared command connection.

use std::collections::VecDeque;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::Poll;
use std::time::Duration;

use redis::aio::ConnectionManager;
use ruststream_core::{
    AckError, Attempt, DEAD_LETTER_ENTRY, DEAD_LETTER_PREFIX, Delivery, Headers, Held, Metadata,
    Settle, SubscribeError, Subscription,
};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::entry::{Entry, EntryId, entries};
use crate::reader::{LONGEST_BLOCK, Shared};

/// What settles one entry: its id and the attempt it was delivered as.
#[derive(Debug, Clone, Copy)]
pub struct RedisReceipt {
    id: EntryId,
    attempt: u32,
}

/// How many acknowledgements are gathered at most before they are sent.
const ACKS_AT_ONCE: usize = 256;

/// The open subscription (its driver task is the only caller).
pub struct RedisSubscription {
    shared: Arc<Shared>,
    commands: ConnectionManager,
    rx: mpsc::Receiver<Result<Entry, SubscribeError>>,
    /// Claimed again by `retry()` or a due `retry_after`: delivered before anything read.
    ready: VecDeque<Entry>,
    /// Acknowledged (or dropped) since the last `XACK`: sent together, before `next`
    /// waits for more and at a stop (S2).
    acks: Vec<EntryId>,
    /// `retry_after` waits: pending in Redis, claimed again once due.
    held: Held<Instant, RedisReceipt>,
    reader: tokio::task::JoinHandle<()>,
    dead_letter: Option<Arc<str>>,
    /// What the next dead letter adds (SPEC D6), for the entry it is given for.
    why: Option<(EntryId, Headers)>,
}

impl std::fmt::Debug for RedisSubscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSubscription")
            .field("stream", &self.shared.stream)
            .field("group", &self.shared.group)
            .field("consumer", &self.shared.consumer)
            .finish()
    }
}

impl RedisSubscription {
    /// The subscription over a group whose reader task runs already: `rx` is what it
    /// reads, `reader` the task.
    pub(crate) fn new(
        shared: Arc<Shared>,
        commands: ConnectionManager,
        rx: mpsc::Receiver<Result<Entry, SubscribeError>>,
        reader: tokio::task::JoinHandle<()>,
        dead_letter: Option<Arc<str>>,
    ) -> Self {
        Self {
            shared,
            commands,
            rx,
            ready: VecDeque::new(),
            acks: Vec::new(),
            held: Held::new(),
            reader,
            dead_letter,
            why: None,
        }
    }

    fn delivery(&self, entry: Entry, slot: &mut Delivery) -> RedisReceipt {
        let receipt = RedisReceipt {
            id: entry.id,
            attempt: entry.count.max(1),
        };
        let (payload, headers, found) = entry.split();
        if !found {
            // A typed handler's decode fails on it (E1); the dead letter keeps its fields.
            tracing::warn!(
                stream = &*self.shared.stream,
                entry = %receipt.id,
                "the entry has no `payload` field: delivered with an empty payload"
            );
        }
        slot.refill(&self.shared.stream, payload)
            .set_headers(headers)
            // The entry id, `<ms>-<seq>`: its milliseconds and its sequence.
            .set_metadata(
                Metadata::sequence(receipt.id.seq)
                    .with_timestamp_ms(i64::try_from(receipt.id.ms).ok()),
            )
            .set_attempt(Attempt::from_broker(receipt.attempt));
        receipt
    }

    /// Claims the earliest held wait again if it is due (`None` when none is). Popped once
    /// claimed: a call cut short leaves it held for the next call, whose claim sets the
    /// same delivery count (Redis runs a command once sent, even if its reply is dropped).
    async fn claim_due(&mut self) -> Option<Result<(), SubscribeError>> {
        let receipt = *self.held.due_at(Instant::now())?;
        let claimed = self.claim_again(receipt).await;
        self.held.pop();
        Some(claimed.map_err(|e| {
            SubscribeError::new(
                &*self.shared.stream,
                format!("claiming {} after retry_after: {e}", receipt.id),
            )
        }))
    }

    /// Claims `receipt`'s entry to this consumer now, its delivery count set to the next
    /// attempt (set, not added to: a claim sent twice counts once), and queues it to be
    /// delivered next; an entry gone from the stream is forgotten.
    async fn claim_again(&mut self, receipt: RedisReceipt) -> Result<(), AckError> {
        let claimed = redis::cmd("XCLAIM")
            .arg(&*self.shared.stream)
            .arg(&self.shared.group)
            .arg(&self.shared.consumer)
            .arg(0)
            .arg(receipt.id)
            .arg("RETRYCOUNT")
            .arg(receipt.attempt.saturating_add(1))
            .query_async::<redis::Value>(&mut self.commands)
            .await;
        match claimed {
            Ok(value) => {
                let again = entries(value, |_| receipt.attempt.saturating_add(1));
                if again.is_empty() {
                    self.shared.known().remove(&receipt.id);
                }
                self.ready.extend(again);
                Ok(())
            }
            Err(e) => {
                // Claimed by this service's recovery or another consumer later instead.
                self.shared.known().remove(&receipt.id);
                Err(AckError::failed(e))
            }
        }
    }
}

impl RedisSubscription {
    /// Sends the acknowledgements gathered so far as one `XACK`. They are forgotten by
    /// the keepalive either way: when the XACK fails, the entries idle and are claimed
    /// again (handled twice, never lost). Cancel safe: the ids are taken only once sent.
    async fn flush_acks(&mut self) {
        if self.acks.is_empty() {
            return;
        }
        let mut command = redis::cmd("XACK");
        command.arg(&*self.shared.stream).arg(&self.shared.group);
        for id in &self.acks {
            command.arg(*id);
        }
        let sent = command.query_async::<i64>(&mut self.commands).await;
        {
            let mut known = self.shared.known();
            for id in &self.acks {
                known.remove(id);
            }
        }
        if let Err(e) = sent {
            tracing::error!(
                stream = &*self.shared.stream,
                entries = self.acks.len(),
                error = %e,
                "acknowledging failed: the entries will be claimed again"
            );
        }
        self.acks.clear();
    }
}

impl Subscription for RedisSubscription {
    type Receipt = RedisReceipt;

    async fn next_into(
        &mut self,
        slot: &mut Delivery,
    ) -> Option<Result<RedisReceipt, SubscribeError>> {
        loop {
            if let Poll::Ready(next) = self.next_now(slot) {
                return next;
            }
            // Nothing held is the common case: then no clock read, no call.
            if !self.held.is_empty() {
                match self.claim_due().await {
                    Some(Ok(())) => continue,
                    Some(Err(e)) => return Some(Err(e)),
                    None => {}
                }
            }
            // Before waiting for more (or when a batch is full), the acknowledgements so
            // far are sent, as one XACK.
            self.flush_acks().await;
            let due = self.held.next_due();
            tokio::select! {
                biased;
                read = self.rx.recv() => match read? {
                    // Filled by `next_now` on the next turn: one place fills the slot.
                    Ok(entry) => self.ready.push_back(entry),
                    Err(e) => return Some(Err(e)),
                },
                () = sleep_until_some(due) => {}
            }
        }
    }

    /// An entry read already, when nothing held waits for its claim and the gathered
    /// acknowledgements are not due to go out (`next_into` does both first).
    fn next_now(
        &mut self,
        slot: &mut Delivery,
    ) -> Poll<Option<Result<RedisReceipt, SubscribeError>>> {
        if let Some(entry) = self.ready.pop_front() {
            return Poll::Ready(Some(Ok(self.delivery(entry, slot))));
        }
        if !self.held.is_empty() || self.acks.len() >= ACKS_AT_ONCE {
            return Poll::Pending;
        }
        match self.rx.try_recv() {
            Ok(read) => Poll::Ready(Some(read.map(|entry| self.delivery(entry, slot)))),
            // `next_into` sends the acknowledgements gathered, then waits.
            Err(mpsc::error::TryRecvError::Empty) => Poll::Pending,
            Err(mpsc::error::TryRecvError::Disconnected) => Poll::Ready(None),
        }
    }

    /// An ack or a drop joins the acknowledgements gathered (the entry stays in the
    /// stream either way, S2; they go out as one XACK before the next wait), unless it
    /// fills the batch (`settle` sends that); no outcome is forgotten at once (another
    /// consumer, or this one, claims it once idle).
    fn settle_now(
        &mut self,
        receipt: RedisReceipt,
        settle: Settle,
    ) -> ControlFlow<Result<(), AckError>, RedisReceipt> {
        match settle {
            Settle::Nothing => {
                self.shared.known().remove(&receipt.id);
                ControlFlow::Break(Ok(()))
            }
            Settle::Ack | Settle::Drop if self.acks.len() + 1 < ACKS_AT_ONCE => {
                self.acks.push(receipt.id);
                ControlFlow::Break(Ok(()))
            }
            _ => ControlFlow::Continue(receipt),
        }
    }

    async fn settle(&mut self, receipt: RedisReceipt, settle: Settle) -> Result<(), AckError> {
        let receipt = match self.settle_now(receipt, settle) {
            ControlFlow::Break(result) => return result,
            ControlFlow::Continue(receipt) => receipt,
        };
        let id = receipt.id;
        match settle {
            Settle::Nothing => Ok(()),
            // The one that fills the batch: the batch goes out now.
            Settle::Ack | Settle::Drop => {
                self.acks.push(id);
                self.flush_acks().await;
                Ok(())
            }
            Settle::Redeliver => self.claim_again(receipt).await,
            Settle::RedeliverAfter(delay) => {
                // Pending in Redis and kept alive meanwhile; a crash loses the wait only.
                self.held.hold(Instant::now() + delay, receipt);
                Ok(())
            }
            Settle::DeadLetter => {
                self.shared.known().remove(&id);
                let Some(dead) = self.dead_letter.as_deref() else {
                    return Err(AckError::failed("no dead-letter stream is declared"));
                };
                let why = self.why.take().filter(|(of, _)| *of == id).map(|(_, h)| h);
                let moved = dead_letter(&mut self.commands, &self.shared, dead, id, why).await;
                if moved.map_err(AckError::failed)? == 0 {
                    tracing::warn!(stream = &*self.shared.stream, entry = %id, "the entry was trimmed from the stream before it could be dead-lettered; acknowledged");
                }
                Ok(())
            }
        }
    }

    fn dead_letter_headers(&mut self, receipt: &RedisReceipt, headers: Headers) {
        self.why = Some((receipt.id, headers));
    }

    fn holding(&self) -> usize {
        self.held.len()
    }

    /// At `max_in_flight`, and while a delivery waits for its lane, the driver stops
    /// calling `next`: the acknowledgements gathered are sent, and held waits that come
    /// due are claimed here (which frees room, G5); without it they would wait for the
    /// next fetch (another consumer claiming them after the claim timeout), or forever.
    async fn idle(&mut self) {
        self.flush_acks().await;
        let Some(due) = self.held.next_due() else {
            return std::future::pending().await;
        };
        tokio::time::sleep_until(due).await;
        if let Some(Err(e)) = self.claim_due().await {
            tracing::warn!(error = %e, "retry_after wait not claimed: claimed after the claim timeout instead");
        }
    }

    /// `pending`: entries of the stream the group has not read yet (`XINFO GROUPS`
    /// `lag`; unknown, so left out, after the stream was trimmed past the group's last
    /// read or on Redis before 7); `ack_pending`: entries read and not acknowledged
    /// (the group's `pending`).
    fn backlog(&self) -> Option<ruststream_core::BacklogProbe> {
        let (commands, shared) = (self.commands.clone(), Arc::clone(&self.shared));
        Some(Arc::new(move || {
            let (mut commands, shared) = (commands.clone(), Arc::clone(&shared));
            Box::pin(async move { crate::consumers::backlog(&mut commands, &shared).await })
        }))
    }

    fn link(&self) -> Option<ruststream_core::LinkProbe> {
        let shared = Arc::clone(&self.shared);
        Some(Arc::new(move || shared.up.load(Ordering::Relaxed)))
    }

    async fn close(mut self) {
        self.flush_acks().await;
        // End the reader: its blocking read is cut short, what it read comes through the
        // channel; then every entry read ahead and not started, and every held
        // `retry_after` wait, is marked idle for the claim timeout, so another consumer
        // claims it at its next look instead of a claim timeout later.
        self.shared.closing.store(true, Ordering::Relaxed);
        let reader_id = self.shared.reader_id.load(Ordering::Relaxed);
        if reader_id != 0 {
            let mut unblock = redis::cmd("CLIENT");
            unblock.arg("UNBLOCK").arg(reader_id);
            let unblocking = unblock.query_async::<i64>(&mut self.commands);
            let _ = tokio::time::timeout(Duration::from_secs(1), unblocking).await;
        }
        // Read ahead: the claim that delivers it again counts the attempt it never had.
        let mut give_back: Vec<(EntryId, u32)> = self
            .ready
            .drain(..)
            .map(|entry| (entry.id, entry.count.saturating_sub(1)))
            .collect();
        let deadline = Instant::now() + LONGEST_BLOCK * 2;
        // Whether the reader ended by itself: only then can no read still in flight hand
        // this consumer an entry, and may the consumer be removed.
        let mut ended = false;
        loop {
            tokio::select! {
                biased;
                read = self.rx.recv() => match read {
                    Some(Ok(entry)) => give_back.push((entry.id, entry.count.saturating_sub(1))),
                    Some(Err(_)) => {}
                    None => {
                        ended = true;
                        break;
                    }
                },
                () = tokio::time::sleep_until(deadline) => {
                    self.reader.abort();
                    break;
                }
            }
        }
        give_back.extend(
            self.held
                .drain()
                .map(|(_, receipt)| (receipt.id, receipt.attempt)),
        );
        let idle = u64::try_from(self.shared.claim_timeout.as_millis()).unwrap_or(u64::MAX);
        for (id, count) in give_back {
            let mut give = redis::cmd("XCLAIM");
            give.arg(&*self.shared.stream)
                .arg(&self.shared.group)
                .arg(&self.shared.consumer)
                .arg(0)
                .arg(id)
                .arg("IDLE")
                .arg(idle)
                .arg("RETRYCOUNT")
                .arg(count)
                .arg("JUSTID");
            let given = give.query_async::<redis::Value>(&mut self.commands);
            if let Ok(Err(e)) | Err(e) = tokio::time::timeout(Duration::from_secs(1), given)
                .await
                .map_err(|_| "no answer within 1s".to_owned())
                .map(|r| r.map_err(|e| e.to_string()))
            {
                tracing::debug!(stream = &*self.shared.stream, entry = %id, error = %e, "giving the entry back failed: claimed after the claim timeout instead");
            }
        }
        if ended && self.shared.named_here {
            let (stream, group) = (&*self.shared.stream, &self.shared.group);
            let removing = crate::consumers::remove_own(
                &mut self.commands,
                stream,
                group,
                &self.shared.consumer,
            );
            let _ = tokio::time::timeout(Duration::from_secs(1), removing).await;
        }
    }
}

/// Sleeps until `due`, or forever without one.
async fn sleep_until_some(due: Option<Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due).await,
        None => std::future::pending().await,
    }
}

/// Moves entry `id`, its fields as stored (an earlier dead letter's D6 fields replaced by
/// `why`'s), to the dead-letter stream `dead` and acknowledges it: the entry is read here
/// (`XRANGE`), then `XADD` and the acknowledgement go in one `MULTI`/`EXEC`, both or
/// neither. Redis runs the rest of a transaction when one command fails as it runs (an
/// `XADD` to a key of another type: `WRONGTYPE`), so the acknowledgement is a script
/// that acknowledges only when the dead letter is a stream ([`ACK_IF_MOVED`]): a refused
/// dead letter leaves the entry pending (G3). (The `XADD` itself cannot be a script: Lua's
/// `unpack` fails on an entry of a few thousand fields, which then could never be
/// dead-lettered.) Returns how many entries were moved: 0 when the entry was trimmed from
/// the stream meanwhile, and is only acknowledged.
async fn dead_letter(
    commands: &mut ConnectionManager,
    shared: &Shared,
    dead: &str,
    id: EntryId,
    why: Option<Headers>,
) -> redis::RedisResult<usize> {
    let stream = &*shared.stream;
    let found: Vec<(String, Vec<Vec<u8>>)> = redis::cmd("XRANGE")
        .arg(stream)
        .arg(id)
        .arg(id)
        .query_async(commands)
        .await?;
    let mut pipe = redis::pipe();
    pipe.atomic();
    if let Some((_, fields)) = found.first() {
        let xadd = pipe.cmd("XADD").arg(dead).arg("*");
        for pair in fields.chunks(2) {
            let stamped = why.is_some() && pair[0].starts_with(DEAD_LETTER_PREFIX.as_bytes());
            if !stamped {
                xadd.arg(pair);
            }
        }
        for (name, value) in why.iter().flat_map(Headers::iter) {
            xadd.arg(name).arg(value.as_ref());
        }
        if why.is_some() {
            xadd.arg(DEAD_LETTER_ENTRY).arg(id);
        }
        xadd.ignore();
    }
    if found.is_empty() {
        pipe.cmd("XACK");
    } else {
        pipe.cmd("EVAL").arg(ACK_IF_MOVED).arg(2).arg(dead);
    }
    pipe.arg(stream).arg(&shared.group).arg(id).ignore();
    let () = pipe.query_async(commands).await?;
    Ok(found.len())
}

/// The acknowledgement of a dead-lettered entry, run in the transaction after its `XADD`
/// (`KEYS`: the dead-letter stream, the stream; `ARGV`: the group, the entry's id): only
/// when the dead letter is a stream, which the `XADD` made it or found it, else an error.
const ACK_IF_MOVED: &str = "if redis.call('TYPE', KEYS[1]).ok ~= 'stream' then \
    return redis.error_reply('NOTMOVED the dead-letter key is not a stream: the entry stays pending') \
end \
return redis.call('XACK', KEYS[2], ARGV[1], ARGV[2])";
