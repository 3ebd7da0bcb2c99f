//! The JetStream keepalive: deliveries still running are told in progress (`+WPI`),
//! within the handler deadline (SPEC D3).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_nats::jetstream::AckKind;
use async_nats::{Client, Subject};
use bytes::Bytes;
use ruststream_core::hash::SpreadMap;

/// A delivery not done at once (its handler did not finish in its first poll, it waited
/// for its lane, or its retry copy waits for a timer) and not settled yet.
pub(crate) struct Running {
    pub(crate) reply: Subject,
    /// The keepalive's tick when its handler was found running (not done at once, or
    /// started after waiting for its lane); `None` while it waits for its lane or for a
    /// delayed copy's timer, when no deadline runs.
    pub(crate) since: Option<u64>,
    /// The tick when progress was last told.
    pub(crate) told: u64,
}

/// Deliveries not done at once, by the subscription's own delivery counter, and the
/// keepalive's clock: a tick count, so adding one reads an atomic instead of the system
/// clock.
#[derive(Default)]
pub(crate) struct Progress {
    pub(crate) running: Mutex<SpreadMap<u64, Running>>,
    pub(crate) ticks: AtomicU64,
}

pub(crate) type InProgress = Arc<Progress>;

pub(crate) fn lock(progress: &Progress) -> std::sync::MutexGuard<'_, SpreadMap<u64, Running>> {
    progress
        .running
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

/// Tells the server that deliveries still running after half of `ack_wait` are in
/// progress (`+WPI`), which restarts their `ack_wait`; never past the handler deadline
/// (SPEC D3), so a handler that cannot be cancelled (one that blocks its thread) still
/// lets the server redeliver after `ack_wait`. Time is counted in ticks of a quarter of
/// `ack_wait`; a delivery is told about after at most half of it.
///
/// A delivery comes here when the runtime finds it is not done at once: when it has to
/// wait for its lane (kept alive, with no limit, until it starts), when its handler did
/// not finish in its first poll or starts after waiting (kept alive for at most its
/// deadline from then: no `+WPI` is sent after it, so the server redelivers a handler
/// that outlived it within deadline + `ack_wait`), or when its retry copy waits for a
/// timer. A handler that blocks its thread in its first poll is not told about while it
/// blocks (nothing runs on the driver's thread meanwhile), which is what D3 asks too.
pub(crate) async fn keep_alive(
    client: Client,
    progress: InProgress,
    ack_wait: Duration,
    deadline: Option<Duration>,
) {
    let tick = (ack_wait / 4).max(Duration::from_millis(20));
    let ticks_in = |d: Duration| d.as_nanos().div_ceil(tick.as_nanos()) as u64;
    // Told when a tick finds it handed over (or told) this long ago, in ticks: between
    // one tick less and this many ticks of time have passed.
    let half = ticks_in(ack_wait / 2).max(1);
    // Told while less than this many ticks passed since the handler started: a tick
    // count rounds the start down, so the last `+WPI` goes out before the deadline.
    let limit = deadline.map(ticks_in);
    let mut interval = tokio::time::interval(tick);
    loop {
        interval.tick().await;
        let now = progress.ticks.fetch_add(1, Ordering::Relaxed) + 1;
        let due: Vec<Subject> = lock(&progress)
            .values_mut()
            .filter(|r| now - r.told >= half)
            .filter(|r| match (r.since, limit) {
                (Some(since), Some(limit)) => now - since < limit,
                _ => true,
            })
            .map(|r| {
                r.told = now;
                r.reply.clone()
            })
            .collect();
        for reply in due {
            if let Err(e) = client.publish(reply, Bytes::from(AckKind::Progress)).await {
                tracing::warn!(error = %e, "sending +WPI failed");
            }
        }
    }
}
