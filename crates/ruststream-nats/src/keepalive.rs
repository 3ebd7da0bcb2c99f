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
    /// The keepalive's tick when it was found not done at once.
    pub(crate) since: u64,
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
/// wait for its lane (at hand-over), or when its handler did not finish in its first
/// poll. One waiting for its lane may wait behind one running and one queued delivery,
/// each cut at the deadline, so a delivery is kept alive for at most three deadlines
/// from then. A handler that blocks its thread in its first poll is not told about
/// while it blocks (nothing runs on the driver's thread meanwhile), which is what D3
/// asks: the server redelivers it after `ack_wait`.
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
    let limit = deadline.map(|d| ticks_in(d * 3));
    let mut interval = tokio::time::interval(tick);
    loop {
        interval.tick().await;
        let now = progress.ticks.fetch_add(1, Ordering::Relaxed) + 1;
        let due: Vec<Subject> = lock(&progress)
            .values_mut()
            .filter(|r| now - r.told >= half)
            .filter(|r| limit.is_none_or(|limit| now - r.since < limit))
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
