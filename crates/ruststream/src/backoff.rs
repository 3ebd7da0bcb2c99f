//! How long a delivery waits before it comes back (SPEC G2, G3).

use std::time::Duration;

/// Delays that grow with the attempt number, for [`Registration::backoff`]: a `retry()`
/// then waits before the delivery comes back, through the transport's own delay path
/// (JetStream `-NAK` with a delay, a Pulsar held nack, a delayed retry copy on Kafka and
/// Core NATS), exactly as if the handler had returned `retry_after(delay)`.
///
/// ```
/// use std::time::Duration;
/// use ruststream::Backoff;
///
/// let backoff = Backoff::exponential(Duration::from_millis(100), Duration::from_secs(5));
/// assert_eq!(backoff.delay(1), Duration::from_millis(100));
/// assert_eq!(backoff.delay(3), Duration::from_millis(400));
/// assert_eq!(backoff.delay(30), Duration::from_secs(5));
///
/// // Up to a quarter shorter at random, so retries of many messages spread out.
/// let spread = backoff.jitter(0.25);
/// assert!(spread.delay(3) <= Duration::from_millis(400));
/// assert!(spread.delay(3) >= Duration::from_millis(300));
/// ```
///
/// [`Registration::backoff`]: crate::Registration::backoff
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    jitter: f64,
}

impl Backoff {
    /// `first` after attempt 1, doubling with each attempt, never above `max`.
    pub const fn exponential(first: Duration, max: Duration) -> Self {
        Self {
            first,
            max,
            jitter: 0.0,
        }
    }

    /// The same delay after every attempt.
    pub const fn fixed(delay: Duration) -> Self {
        Self::exponential(delay, delay)
    }

    /// Shortens each delay by a random part of up to `fraction` of it (clamped to 0..=1).
    pub fn jitter(mut self, fraction: f64) -> Self {
        self.jitter = if fraction.is_nan() {
            0.0
        } else {
            fraction.clamp(0.0, 1.0)
        };
        self
    }

    /// The longest delay it gives.
    pub const fn max(&self) -> Duration {
        self.max
    }

    /// The delay after attempt `attempt` (1 for the first delivery) failed.
    pub fn delay(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(1).min(40);
        let full = self
            .first
            .checked_mul(1u32 << doublings.min(31))
            .and_then(|d| if doublings > 31 { None } else { Some(d) })
            .map_or(self.max, |d| d.min(self.max));
        if self.jitter == 0.0 {
            return full;
        }
        let random = crate::seeded::random_u64();
        let share = (random >> 11) as f64 / (1u64 << 53) as f64;
        full.mul_f64(1.0 - self.jitter * share)
    }
}

/// An in-place rerun (Kafka `Commit::Tracked` `retry()`, the memory broker with runtime
/// retries) waits at least this, doubling per rerun of the same delivery up to a second:
/// a handler that keeps retrying never spins a core (SPEC G2).
pub(crate) const RERUN_FLOOR: Backoff =
    Backoff::exponential(Duration::from_millis(10), Duration::from_secs(1));

/// How long a delivery whose copy the broker refused waits before it comes back (or the
/// copy is tried again), by the number of refusals in a row (SPEC G3).
pub(crate) const REFUSAL_BACKOFF: Backoff =
    Backoff::exponential(Duration::from_secs(1), Duration::from_secs(300));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn g2_exponential_doubles_to_its_ceiling_without_overflow() {
        let b = Backoff::exponential(Duration::from_millis(10), Duration::from_secs(1));
        let delays: Vec<u64> = (1..=9).map(|a| b.delay(a).as_millis() as u64).collect();
        assert_eq!(delays, [10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(1));
        assert_eq!(b.delay(0), Duration::from_millis(10));
        let big = Backoff::exponential(Duration::from_secs(u64::MAX / 4), Duration::MAX);
        assert_eq!(big.delay(5), Duration::MAX);
    }

    #[test]
    fn g2_jitter_only_shortens() {
        let b = Backoff::fixed(Duration::from_secs(1)).jitter(0.5);
        for _ in 0..100 {
            let d = b.delay(1);
            assert!(
                d <= Duration::from_secs(1) && d >= Duration::from_millis(500),
                "{d:?}"
            );
        }
        assert_eq!(
            Backoff::fixed(Duration::from_secs(1))
                .jitter(f64::NAN)
                .delay(1),
            Duration::from_secs(1)
        );
    }
}
