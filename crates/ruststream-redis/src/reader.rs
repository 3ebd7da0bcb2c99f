//! The reader task of a Redis subscription: it reads the group (`XREADGROUP … >` on a
//! connection of its own, so its blocking read holds up no other command) into the
//! channel the subscription takes from, claims entries other consumers left idle for the
//! claim timeout, and keeps this service's live entries from being claimed (S5).

use std::collections::{HashMap, HashSet};
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use redis::aio::ConnectionManager;
use ruststream_core::SubscribeError;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::entry::{Entry, EntryId, entries, pending, read_reply};

/// How long the reader waits after a failed command before it tries again.
const PAUSE: Duration = Duration::from_millis(200);
/// The longest one blocking read waits, so timed work is never late by more.
pub(crate) const LONGEST_BLOCK: Duration = Duration::from_secs(1);
/// How many ids one keepalive or claim command names at most.
const CHUNK: usize = 256;

/// What the reader task and the subscription share.
pub(crate) struct Shared {
    pub(crate) stream: Arc<str>,
    pub(crate) group: String,
    pub(crate) consumer: String,
    /// The consumer was named here (`<hostname>-<pid>-<n>`): removed at a stop when it
    /// holds nothing pending.
    pub(crate) named_here: bool,
    pub(crate) claim_timeout: Duration,
    pub(crate) batch: usize,
    /// Where the group begins when it has to be created (`0` or `$`).
    pub(crate) start: String,
    /// Entries live in this service (read ahead, running, waiting out `retry_after`):
    /// kept alive, and never claimed again by this service's own recovery.
    pub(crate) known: Mutex<HashSet<EntryId>>,
    /// Whether the reader's last command went through (readiness).
    pub(crate) up: AtomicBool,
    /// Set by `close`: the reader ends at its next turn.
    pub(crate) closing: AtomicBool,
    /// The reader connection's `CLIENT ID` (0 unknown), so `close` can end its blocking
    /// read at once (`CLIENT UNBLOCK`) rather than leave it to take entries for a consumer
    /// that is going away.
    pub(crate) reader_id: AtomicI64,
}

impl Shared {
    pub(crate) fn known(&self) -> std::sync::MutexGuard<'_, HashSet<EntryId>> {
        self.known.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn error(&self, what: &str, e: &redis::RedisError) -> SubscribeError {
        SubscribeError::new(&*self.stream, format!("{what}: {e}"))
    }
}

/// Creates `group` on `stream` (and the stream) at `start`; an existing group is left as
/// it is.
pub(crate) async fn create_group(
    commands: &mut ConnectionManager,
    stream: &str,
    group: &str,
    start: &str,
) -> Result<(), redis::RedisError> {
    let created = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(stream)
        .arg(group)
        .arg(start)
        .arg("MKSTREAM")
        .query_async::<()>(commands)
        .await;
    match created {
        // The group is there already: it keeps its position.
        Err(e) if e.code() == Some("BUSYGROUP") => Ok(()),
        other => other,
    }
}

/// After a command failed because the group is gone (a server restarted without its
/// data, the group destroyed), creates it again at the start position.
async fn recreate_if_gone(
    shared: &Shared,
    commands: &mut ConnectionManager,
    e: &redis::RedisError,
) {
    if e.code() != Some("NOGROUP") {
        return;
    }
    tracing::warn!(
        stream = &*shared.stream,
        group = &shared.group,
        start = %shared.start,
        "the consumer group is gone (a server that lost its data?): creating it again"
    );
    if let Err(e) = create_group(commands, &shared.stream, &shared.group, &shared.start).await {
        tracing::debug!(stream = &*shared.stream, error = %e, "creating the group again failed");
    }
}

/// The reader task's state: its connections, the channel, and when timed work is due.
pub(crate) struct Reader {
    shared: Arc<Shared>,
    /// The connection of the blocking reads.
    reader: ConnectionManager,
    commands: ConnectionManager,
    tx: mpsc::Sender<Result<Entry, SubscribeError>>,
    claim_every: Duration,
    keepalive: Keepalive,
    next_claim: Instant,
    /// At start and after a failed read: entries pending for this consumer name that the
    /// service does not know (a previous life's, or read by a reply that was lost) are
    /// claimed before anything new is read.
    recover: bool,
}

impl Reader {
    pub(crate) fn new(
        shared: Arc<Shared>,
        reader: ConnectionManager,
        commands: ConnectionManager,
        tx: mpsc::Sender<Result<Entry, SubscribeError>>,
    ) -> Self {
        let keep_every = (shared.claim_timeout / 3).max(Duration::from_millis(10));
        let claim_every = (shared.claim_timeout / 2).max(Duration::from_millis(10));
        Self {
            shared,
            reader,
            commands,
            tx,
            claim_every,
            keepalive: Keepalive {
                next: Instant::now() + keep_every,
                every: keep_every,
            },
            // A consumer joining looks for idle entries at once.
            next_claim: Instant::now(),
            recover: true,
        }
    }

    /// This consumer's own forgotten entries first, then new entries, with the keepalive
    /// and the claiming of idle entries in between; until the subscription closes or its
    /// channel is dropped.
    pub(crate) async fn run(mut self) {
        loop {
            if self.shared.closing.load(Ordering::Relaxed) {
                return;
            }
            if self.recover {
                match self.recover_own().await {
                    ControlFlow::Break(()) => return,
                    ControlFlow::Continue(true) => {}
                    ControlFlow::Continue(false) => continue,
                }
            }
            if self.upkeep().await.is_break() || self.read().await.is_break() {
                return;
            }
        }
    }

    /// Claims this consumer's pending entries the service does not know; `true` once done.
    async fn recover_own(&mut self) -> ControlFlow<(), bool> {
        if let Ok(id) = redis::cmd("CLIENT")
            .arg("ID")
            .query_async::<i64>(&mut self.reader)
            .await
        {
            self.shared.reader_id.store(id, Ordering::Relaxed);
        }
        match claim(&self.shared, &mut self.commands, None).await {
            Ok(found) => {
                self.recover = false;
                succeeded(&self.shared);
                self.hand_over(found).await?;
                ControlFlow::Continue(true)
            }
            Err(e) => {
                recreate_if_gone(&self.shared, &mut self.commands, &e).await;
                let error = self
                    .shared
                    .error("claiming this consumer's pending entries", &e);
                failed(&self.shared, &self.tx, error).await?;
                ControlFlow::Continue(false)
            }
        }
    }

    /// The keepalive of live entries and the claiming of idle ones, when due.
    async fn upkeep(&mut self) -> ControlFlow<()> {
        let now = Instant::now();
        if now >= self.keepalive.next {
            self.keepalive.run(&self.shared, &mut self.commands).await;
        }
        if now >= self.next_claim {
            let shared = &*self.shared;
            match claim(shared, &mut self.commands, Some(shared.claim_timeout)).await {
                Ok(found) => self.hand_over(found).await?,
                Err(e) => {
                    tracing::debug!(stream = &*shared.stream, error = %e, "claiming idle entries failed");
                }
            }
            self.next_claim = now + self.claim_every;
        }
        ControlFlow::Continue(())
    }

    /// Hands claimed entries to the subscription, keeping the live ones alive while it
    /// waits for room.
    async fn hand_over(&mut self, found: Vec<Entry>) -> ControlFlow<()> {
        for entry in found {
            let reserve = || self.tx.reserve();
            let Some(permit) = self
                .keepalive
                .until(reserve, &self.shared, &mut self.commands)
                .await
            else {
                return ControlFlow::Break(());
            };
            permit.send(Ok(entry));
        }
        ControlFlow::Continue(())
    }

    /// One blocking read of up to a batch of new entries once the channel has room for
    /// them, waiting no longer than the next timed work.
    async fn read(&mut self) -> ControlFlow<()> {
        let reserve = || self.tx.reserve_many(self.shared.batch);
        let Some(permits) = self
            .keepalive
            .until(reserve, &self.shared, &mut self.commands)
            .await
        else {
            return ControlFlow::Break(());
        };
        let shared = &*self.shared;
        if shared.closing.load(Ordering::Relaxed) {
            return ControlFlow::Break(());
        }
        let block = self
            .keepalive
            .next
            .min(self.next_claim)
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
            .query_async::<redis::Value>(&mut self.reader)
            .await;
        match read {
            Ok(value) => {
                succeeded(shared);
                let read = read_reply(value);
                shared.known().extend(read.iter().map(|entry| entry.id));
                for (permit, entry) in permits.zip(read) {
                    permit.send(Ok(entry));
                }
                ControlFlow::Continue(())
            }
            Err(e) => {
                drop(permits);
                self.recover = true;
                recreate_if_gone(shared, &mut self.commands, &e).await;
                failed(shared, &self.tx, shared.error("reading the group", &e)).await
            }
        }
    }
}

/// A failed command: readiness says so, the first failure of a run is logged at ERROR
/// (the rest at DEBUG, until a command goes through), then a pause. The driver is not
/// told: it would count the registration failed until a delivery arrives, where the
/// link probe follows the reads themselves. Breaks once nobody reads.
async fn failed(
    shared: &Shared,
    tx: &mpsc::Sender<Result<Entry, SubscribeError>>,
    error: SubscribeError,
) -> ControlFlow<()> {
    if shared.up.swap(false, Ordering::Relaxed) {
        tracing::error!(%error, "Redis refused or is unreachable; trying again");
    } else {
        tracing::debug!(%error, "still failing; trying again");
    }
    tokio::time::sleep(PAUSE).await;
    if tx.is_closed() {
        ControlFlow::Break(())
    } else {
        ControlFlow::Continue(())
    }
}

/// A command went through: readiness says so, and a recovery is logged.
fn succeeded(shared: &Shared) {
    if !shared.up.swap(true, Ordering::Relaxed) {
        tracing::info!(stream = &*shared.stream, "reading the group again");
    }
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

/// When the keepalive of live entries is due next, and how often it runs (S5).
struct Keepalive {
    next: Instant,
    every: Duration,
}

impl Keepalive {
    async fn run(&mut self, shared: &Shared, commands: &mut ConnectionManager) {
        keepalive(shared, commands).await;
        self.next = Instant::now() + self.every;
    }

    /// Waits for `room` in the subscription's channel (`None` once nobody reads), running
    /// the keepalive whenever it is due meanwhile: handlers may take long to make room,
    /// and what is live in the service (read ahead, running, held) must not be claimed
    /// by other consumers in the meantime.
    async fn until<T, E, F>(
        &mut self,
        mut room: impl FnMut() -> F,
        shared: &Shared,
        commands: &mut ConnectionManager,
    ) -> Option<T>
    where
        F: Future<Output = Result<T, E>>,
    {
        loop {
            match tokio::time::timeout_at(self.next, room()).await {
                Ok(Ok(room)) => return Some(room),
                Ok(Err(_)) => return None,
                Err(_) => self.run(shared, commands).await,
            }
        }
    }
}

/// Resets the idle time of every entry live in this service (`XCLAIM … JUSTID`, which
/// counts nothing), so no other consumer claims them.
async fn keepalive(shared: &Shared, commands: &mut ConnectionManager) {
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
        let reset = command
            .arg("JUSTID")
            .query_async::<redis::Value>(commands)
            .await;
        if let Err(e) = reset {
            tracing::debug!(stream = &*shared.stream, error = %e, "keepalive failed");
            return;
        }
    }
}
