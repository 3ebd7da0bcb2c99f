//! Failures that repeat while a broker is down (every fetch, every settlement) logged
//! without flooding: the first of a run at ERROR, then at most one a minute with how
//! many were left out, the rest at DEBUG; a success ends the run. And a delivery that
//! keeps failing, reported now and then (G2).

use std::time::Duration;

use tokio::time::Instant;

use super::shared::Shared;

/// At most one ERROR line this often while failures go on.
const ERROR_LOG_EVERY: Duration = Duration::from_secs(60);

/// When a run of failures was last logged at ERROR, and how many were not since.
#[derive(Default)]
pub(crate) struct ErrorRun {
    last: Option<Instant>,
    quiet: u64,
}

impl ErrorRun {
    /// A failure: `Some(how many were left out since the last ERROR line)` when this one
    /// is logged at ERROR, `None` when at DEBUG.
    pub(crate) fn failed(&mut self) -> Option<u64> {
        let now = Instant::now();
        match self.last {
            Some(at) if now.duration_since(at) < ERROR_LOG_EVERY => {
                self.quiet += 1;
                None
            }
            _ => {
                let quiet = self.quiet;
                *self = Self {
                    last: Some(now),
                    quiet: 0,
                };
                Some(quiet)
            }
        }
    }

    /// A success: whether it ended a run of failures (the next failure is news again).
    #[inline]
    pub(crate) fn succeeded(&mut self) -> bool {
        if self.last.is_none() {
            return false;
        }
        *self = Self::default();
        true
    }
}

/// Whether a failed attempt is reported loudly: a failing delivery nothing caps at
/// attempts 1, 10, 100... and quietly in between, so a loop never floods the log (G2); a
/// capped one on every attempt.
pub(crate) fn is_loud<S>(shared: &Shared<S>, attempt: u32) -> bool {
    shared.declaration.max_attempts.is_some() || attempt == 1 || is_power_of_ten(attempt)
}

pub(crate) fn is_power_of_ten(attempt: u32) -> bool {
    let mut n = attempt;
    if n < 10 {
        return false;
    }
    while n % 10 == 0 {
        n /= 10;
    }
    n == 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_run_is_loud_once_a_minute_and_a_success_ends_it() {
        let mut run = ErrorRun::default();
        assert_eq!(run.failed(), Some(0), "the first failure is loud");
        assert_eq!(run.failed(), None);
        assert_eq!(run.failed(), None);
        tokio::time::advance(ERROR_LOG_EVERY).await;
        assert_eq!(
            run.failed(),
            Some(2),
            "a minute on: loud, with how many were quiet"
        );
        assert!(run.succeeded(), "a success ends the run");
        assert!(!run.succeeded());
        assert_eq!(
            run.failed(),
            Some(0),
            "after a success, a failure is news again"
        );
    }

    #[test]
    fn g2_warns_at_attempts_10_100_1000() {
        let warned: Vec<u32> = (1..=20_000)
            .filter(|a| super::is_power_of_ten(*a))
            .collect();
        assert_eq!(warned, [10, 100, 1000, 10_000]);
    }
}
