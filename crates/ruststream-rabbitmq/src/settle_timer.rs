//! One timer bounding every RabbitMQ settlement in time (lapin can wait forever on a
//! channel whose connection died).

use std::pin::Pin;
use std::time::Duration;

use ruststream_core::AckError;
use tokio::time::{Instant, Sleep};

/// How long an acknowledgement may take before it counts as failed: at least half of
/// this, at most all of it (see `SettleTimer`).
pub(crate) const SETTLE_TIMEOUT: Duration = Duration::from_secs(10);

/// Bounds settlements in time (lapin can wait forever on a channel whose connection
/// died) with one timer for all of them, re-armed to `SETTLE_TIMEOUT` only when less than
/// half of it is left: each settlement gets at least half of it, and the common case
/// reads the clock instead of putting a timer into tokio's wheel and taking it out again
/// (about 400 instructions a settlement).
pub(crate) struct SettleTimer(Pin<Box<Sleep>>);

impl SettleTimer {
    pub(crate) fn new() -> Self {
        Self(Box::pin(tokio::time::sleep(SETTLE_TIMEOUT)))
    }

    pub(crate) async fn bound(
        &mut self,
        settling: impl Future<Output = lapin::Result<()>>,
    ) -> Result<(), AckError> {
        let now = Instant::now();
        if self.0.deadline() < now + SETTLE_TIMEOUT / 2 {
            self.0.as_mut().reset(now + SETTLE_TIMEOUT);
        }
        tokio::select! {
            biased;
            settled = settling => settled.map_err(AckError::failed),
            () = self.0.as_mut() => Err(AckError::failed(format!(
                "no answer from RabbitMQ within {:?}",
                SETTLE_TIMEOUT / 2
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{SETTLE_TIMEOUT, SettleTimer};
    use tokio::time::Instant;

    async fn never() -> lapin::Result<()> {
        std::future::pending().await
    }

    /// An acknowledgement lapin never answers fails after at least half of the timeout and
    /// at most all of it, however long after the last re-arm it starts; one answered at
    /// once goes through.
    #[tokio::test(start_paused = true)]
    async fn a_settlement_never_answered_fails_between_half_and_all_of_the_timeout() {
        let mut timer = SettleTimer::new();
        assert!(timer.bound(async { Ok(()) }).await.is_ok());
        for idle in [0, 1, 4, 5, 6, 9, 10, 30] {
            tokio::time::sleep(std::time::Duration::from_secs(idle)).await;
            let started = Instant::now();
            let error = timer.bound(never()).await.expect_err("never answered");
            let waited = started.elapsed();
            assert!(
                waited >= SETTLE_TIMEOUT / 2 && waited <= SETTLE_TIMEOUT,
                "failed after {waited:?} (idle {idle} s before)"
            );
            assert!(
                error.to_string().contains("no answer from RabbitMQ"),
                "{error}"
            );
            assert!(timer.bound(async { Ok(()) }).await.is_ok(), "usable after");
        }
    }
}
