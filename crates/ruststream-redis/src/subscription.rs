//! An open Redis Streams subscription.
//!
//! A reader task of its own reads the group (`XREADGROUP … >` on a connection of its
//! own, so its blocking read holds up no other command) into a channel the driver takes
//! from, which keeps `next` cancel safe: an entry read is never lost between a read and
//! a dropped `next`. The same task claims entries other consumers left idle for the claim
//! timeout, and keeps this service's live entries from being claimed (S5). Settlements
//! go through the shared command connection.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use redis::aio::ConnectionManager;
use ruststream_core::{
    AckError, Attempt, Declaration, Delivery, Due, Metadata, Settle, SubscribeError, Subscription,
};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::descriptor::{RedisStream, StartAt};
use crate::entry::{Entry, EntryId, entries, pending, read_reply};

/// What settles one entry: its id and the attempt it was delivered as.
#[derive(Debug, Clone, Copy)]
pub struct RedisReceipt {
    id: EntryId,
    attempt: u32,
}

/// How long the reader waits after a failed command before it tries again.
const PAUSE: Duration = Duration::from_millis(200);
/// The longest one blocking read waits, so timed work is never late by more.
const LONGEST_BLOCK: Duration = Duration::from_secs(1);
/// How many ids one keepalive or claim command names at most.
const CHUNK: usize = 256;

/// Moves one entry, as stored, to the dead-letter stream and acknowledges it, atomically
/// (a script runs alone on the server, as a `MULTI`/`EXEC` would): both or neither.
/// Returns 1 when the entry was moved, 0 when it was no longer in the stream (trimmed).
const DEAD_LETTER: &str = r"
local found = redis.call('XRANGE', KEYS[1], ARGV[2], ARGV[2])
local moved = 0
if #found > 0 then
  redis.call('XADD', KEYS[2], '*', unpack(found[1][2]))
  moved = 1
end
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
return moved
";

/// What the reader task and the subscription share.
struct Shared {
    stream: Arc<str>,
    group: String,
    consumer: String,
    claim_timeout: Duration,
    batch: usize,
    /// Entries live in this service (read ahead, running, waiting out `retry_after`):
    /// kept alive, and never claimed again by this service's own recovery.
    known: Mutex<HashSet<EntryId>>,
    /// Whether the reader's last command went through (readiness).
    up: AtomicBool,
}

impl Shared {
    fn known(&self) -> std::sync::MutexGuard<'_, HashSet<EntryId>> {
        self.known.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn error(&self, what: &str, e: &redis::RedisError) -> SubscribeError {
        SubscribeError::new(&*self.stream, format!("{what}: {e}"))
    }
}

/// The open subscription (its driver task is the only caller).
pub struct RedisSubscription {
    shared: Arc<Shared>,
    commands: ConnectionManager,
    rx: mpsc::Receiver<Result<Entry, SubscribeError>>,
    /// Claimed again by `retry()` or a due `retry_after`: delivered before anything read.
    ready: VecDeque<Entry>,
    /// `retry_after` waits: pending in Redis, claimed again once due.
    held: BinaryHeap<Reverse<Due<Instant, RedisReceipt>>>,
    reader: tokio::task::JoinHandle<()>,
    dead_letter: Option<Arc<str>>,
    script: redis::Script,
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
    pub(crate) async fn open(
        descriptor: RedisStream,
        declaration: &Declaration,
    ) -> Result<Self, SubscribeError> {
        let stream = descriptor.stream.as_str();
        let mut commands = descriptor.redis.connection();
        let start = match descriptor.start {
            StartAt::Earliest => "0",
            StartAt::Latest => "$",
        };
        let created = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(stream)
            .arg(&descriptor.group)
            .arg(start)
            .arg("MKSTREAM")
            .query_async::<()>(&mut commands)
            .await;
        match created {
            Ok(()) => {}
            // The group is there already: it keeps its position.
            Err(e) if e.code() == Some("BUSYGROUP") => {}
            Err(e) => {
                return Err(SubscribeError::new(
                    stream,
                    format!("creating consumer group `{}`: {e}", descriptor.group),
                ));
            }
        }
        let reader = descriptor
            .redis
            .reader()
            .await
            .map_err(|e| SubscribeError::new(stream, e))?;
        let shared = Arc::new(Shared {
            stream: Arc::from(stream),
            group: descriptor.group.clone(),
            consumer: descriptor.consumer_name(),
            claim_timeout: descriptor.claim_timeout,
            batch: descriptor.batch,
            known: Mutex::default(),
            up: AtomicBool::new(true),
        });
        let (tx, rx) = mpsc::channel(descriptor.batch);
        let reading = read_loop(Arc::clone(&shared), reader, commands.clone(), tx);
        Ok(Self {
            shared,
            commands,
            rx,
            ready: VecDeque::new(),
            held: BinaryHeap::new(),
            reader: tokio::spawn(reading),
            dead_letter: declaration.dead_letter.clone(),
            script: redis::Script::new(DEAD_LETTER),
        })
    }

    fn delivery(&self, entry: Entry) -> (Delivery, RedisReceipt) {
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
        let delivery = Delivery::new(Arc::clone(&self.shared.stream), payload)
            .with_headers(headers)
            .with_metadata(Metadata::default().with_timestamp_ms(i64::try_from(receipt.id.ms).ok()))
            .with_attempt(Attempt::from_broker(receipt.attempt));
        (delivery, receipt)
    }

    /// Claims `receipt`'s entry to this consumer now (counted by Redis) and queues it to be
    /// delivered next; an entry gone from the stream is forgotten.
    async fn claim_again(&mut self, receipt: RedisReceipt) -> Result<(), AckError> {
        let claimed = redis::cmd("XCLAIM")
            .arg(&*self.shared.stream)
            .arg(&self.shared.group)
            .arg(&self.shared.consumer)
            .arg(0)
            .arg(receipt.id)
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

impl Subscription for RedisSubscription {
    type Receipt = RedisReceipt;

    async fn next(&mut self) -> Option<Result<(Delivery, RedisReceipt), SubscribeError>> {
        loop {
            if let Some(entry) = self.ready.pop_front() {
                return Some(Ok(self.delivery(entry)));
            }
            if let Some(Reverse(first)) = self.held.peek()
                && first.due <= Instant::now()
            {
                // Popped once claimed: a `next` cut short leaves it held for the next call.
                let receipt = first.item;
                let claimed = self.claim_again(receipt).await;
                self.held.pop();
                if let Err(e) = claimed {
                    return Some(Err(SubscribeError::new(
                        &*self.shared.stream,
                        format!("claiming {} after retry_after: {e}", receipt.id),
                    )));
                }
                continue;
            }
            let due = self.held.peek().map(|Reverse(held)| held.due);
            return tokio::select! {
                biased;
                read = self.rx.recv() => match read? {
                    Ok(entry) => Some(Ok(self.delivery(entry))),
                    Err(e) => Some(Err(e)),
                },
                () = sleep_until_some(due) => continue,
            };
        }
    }

    async fn settle(&mut self, receipt: RedisReceipt, settle: Settle) -> Result<(), AckError> {
        let id = receipt.id;
        match settle {
            // No outcome: another consumer (or this one) claims it once idle (S2).
            Settle::Nothing => {
                self.shared.known().remove(&id);
                Ok(())
            }
            // The entry stays in the stream either way (S2).
            Settle::Ack | Settle::Drop => {
                // Forgotten even when the XACK fails: then it is claimed again, never kept
                // alive without an owner.
                self.shared.known().remove(&id);
                redis::cmd("XACK")
                    .arg(&*self.shared.stream)
                    .arg(&self.shared.group)
                    .arg(id)
                    .query_async::<i64>(&mut self.commands)
                    .await
                    .map(drop)
                    .map_err(AckError::failed)
            }
            Settle::Redeliver => self.claim_again(receipt).await,
            Settle::RedeliverAfter(delay) => {
                // Pending in Redis and kept alive meanwhile; a crash loses the wait only.
                self.held.push(Reverse(Due {
                    due: Instant::now() + delay,
                    item: receipt,
                }));
                Ok(())
            }
            Settle::DeadLetter => {
                self.shared.known().remove(&id);
                let Some(dead) = self.dead_letter.as_deref() else {
                    return Err(AckError::failed("no dead-letter stream is declared"));
                };
                self.script
                    .key(&*self.shared.stream)
                    .key(dead)
                    .arg(&self.shared.group)
                    .arg(id)
                    .invoke_async::<i64>(&mut self.commands)
                    .await
                    .map(|moved| {
                        if moved == 0 {
                            tracing::warn!(stream = &*self.shared.stream, entry = %id, "the entry was trimmed from the stream before it could be dead-lettered; acknowledged");
                        }
                    })
                    .map_err(AckError::failed)
            }
        }
    }

    fn holding(&self) -> usize {
        self.held.len()
    }

    fn link(&self) -> Option<ruststream_core::LinkProbe> {
        let shared = Arc::clone(&self.shared);
        Some(Arc::new(move || shared.up.load(Ordering::Relaxed)))
    }

    async fn close(self) {
        // Entries read ahead and not handed over stay pending for this consumer: another
        // consumer claims them after the claim timeout (this one, at once, when it comes
        // back under the same consumer name).
        self.reader.abort();
    }
}

/// Sleeps until `due`, or forever without one.
async fn sleep_until_some(due: Option<Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due).await,
        None => std::future::pending().await,
    }
}

/// The reader task: this consumer's own forgotten entries first, then new entries, with
/// the keepalive and the claiming of idle entries in between.
async fn read_loop(
    shared: Arc<Shared>,
    mut reader: ConnectionManager,
    mut commands: ConnectionManager,
    tx: mpsc::Sender<Result<Entry, SubscribeError>>,
) {
    let keep_every = (shared.claim_timeout / 3).max(Duration::from_millis(10));
    let claim_every = (shared.claim_timeout / 2).max(Duration::from_millis(10));
    let mut next_keepalive = Instant::now() + keep_every;
    let mut next_claim = Instant::now() + claim_every;
    // At start and after a failed read: entries pending for this consumer name that the
    // service does not know (a previous life's, or read by a reply that was lost).
    let mut recover = true;
    loop {
        if recover {
            match claim(&shared, &mut commands, None).await {
                Ok(found) => {
                    recover = false;
                    shared.up.store(true, Ordering::Relaxed);
                    if !send_all(&tx, found).await {
                        return;
                    }
                }
                Err(e) => {
                    if !failed(
                        &shared,
                        &tx,
                        shared.error("claiming this consumer's pending entries", &e),
                    )
                    .await
                    {
                        return;
                    }
                    continue;
                }
            }
        }
        let now = Instant::now();
        if now >= next_keepalive {
            if let Err(e) = keepalive(&shared, &mut commands).await {
                tracing::debug!(stream = &*shared.stream, error = %e, "keepalive failed");
            }
            next_keepalive = now + keep_every;
        }
        if now >= next_claim {
            match claim(&shared, &mut commands, Some(shared.claim_timeout)).await {
                Ok(found) => {
                    if !send_all(&tx, found).await {
                        return;
                    }
                }
                Err(e) => {
                    tracing::debug!(stream = &*shared.stream, error = %e, "claiming idle entries failed");
                }
            }
            next_claim = now + claim_every;
        }
        let Ok(permits) = tx.reserve_many(shared.batch).await else {
            return;
        };
        let block = next_keepalive
            .min(next_claim)
            .saturating_duration_since(Instant::now())
            .clamp(Duration::from_millis(1), LONGEST_BLOCK);
        let read = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(&shared.group)
            .arg(&shared.consumer)
            .arg("COUNT")
            .arg(shared.batch)
            .arg("BLOCK")
            .arg(u64::try_from(block.as_millis()).unwrap_or(u64::MAX))
            .arg("STREAMS")
            .arg(&*shared.stream)
            .arg(">")
            .query_async::<redis::Value>(&mut reader)
            .await;
        match read {
            Ok(value) => {
                shared.up.store(true, Ordering::Relaxed);
                let read = read_reply(value);
                shared.known().extend(read.iter().map(|entry| entry.id));
                for (permit, entry) in permits.zip(read) {
                    permit.send(Ok(entry));
                }
            }
            Err(e) => {
                drop(permits);
                recover = true;
                if !failed(&shared, &tx, shared.error("reading the group", &e)).await {
                    return;
                }
            }
        }
    }
}

/// Reports a failed command to the driver and pauses; false once nobody reads.
async fn failed(
    shared: &Shared,
    tx: &mpsc::Sender<Result<Entry, SubscribeError>>,
    error: SubscribeError,
) -> bool {
    shared.up.store(false, Ordering::Relaxed);
    if tx.send(Err(error)).await.is_err() {
        return false;
    }
    tokio::time::sleep(PAUSE).await;
    true
}

async fn send_all(tx: &mpsc::Sender<Result<Entry, SubscribeError>>, found: Vec<Entry>) -> bool {
    for entry in found {
        if tx.send(Ok(entry)).await.is_err() {
            return false;
        }
    }
    true
}

/// Claims pending entries this service does not know: with `idle`, those of any consumer
/// idle at least that long; without, this consumer's own. Each is counted by Redis.
async fn claim(
    shared: &Shared,
    commands: &mut ConnectionManager,
    idle: Option<Duration>,
) -> Result<Vec<Entry>, redis::RedisError> {
    let idle_ms = idle.map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let mut query = redis::cmd("XPENDING");
    query.arg(&*shared.stream).arg(&shared.group);
    if idle.is_some() {
        query.arg("IDLE").arg(idle_ms);
    }
    query.arg("-").arg("+").arg(CHUNK);
    if idle.is_none() {
        query.arg(&shared.consumer);
    }
    let rows = pending(query.query_async::<redis::Value>(commands).await?);
    let counts: HashMap<EntryId, u32> = {
        let known = shared.known();
        rows.into_iter()
            .filter(|(id, _)| !known.contains(id))
            .collect()
    };
    if counts.is_empty() {
        return Ok(Vec::new());
    }
    let mut command = redis::cmd("XCLAIM");
    command
        .arg(&*shared.stream)
        .arg(&shared.group)
        .arg(&shared.consumer)
        .arg(idle_ms);
    for id in counts.keys() {
        command.arg(*id);
    }
    let mut found = entries(command.query_async::<redis::Value>(commands).await?, |id| {
        counts.get(&id).map_or(1, |count| count.saturating_add(1))
    });
    found.sort_by_key(|entry| entry.id);
    if !found.is_empty() {
        tracing::info!(
            stream = &*shared.stream,
            claimed = found.len(),
            "claimed pending entries {}",
            if idle.is_some() {
                "other consumers left idle"
            } else {
                "of this consumer"
            }
        );
    }
    shared.known().extend(found.iter().map(|entry| entry.id));
    Ok(found)
}

/// Resets the idle time of every entry live in this service (`XCLAIM … JUSTID`, which
/// counts nothing), so no other consumer claims them.
async fn keepalive(
    shared: &Shared,
    commands: &mut ConnectionManager,
) -> Result<(), redis::RedisError> {
    let live: Vec<EntryId> = shared.known().iter().copied().collect();
    for chunk in live.chunks(CHUNK) {
        let mut command = redis::cmd("XCLAIM");
        command
            .arg(&*shared.stream)
            .arg(&shared.group)
            .arg(&shared.consumer)
            .arg(0);
        for id in chunk {
            command.arg(*id);
        }
        command
            .arg("JUSTID")
            .query_async::<redis::Value>(commands)
            .await?;
    }
    Ok(())
}
