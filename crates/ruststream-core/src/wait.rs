//! Waiting for a broker at start, when asked to (SPEC G7).

use std::fmt::Display;
use std::time::{Duration, Instant};

/// The pace of attempts while waiting: one at most every second.
const ATTEMPT_EVERY: Duration = Duration::from_secs(1);

/// Tries `attempt` until it succeeds or fails for good, for a transport's opt-in "wait
/// for the broker" start (SPEC G7). While the broker does not answer it logs one WARN per
/// `warn_every` naming the broker and address, the time waited and the last error (DEBUG
/// for the attempts in between), and tries again at most once a second;
/// once through, an INFO says how long it took.
///
/// `lasting` says which errors are worth waiting out (an unreachable address is; bad
/// credentials or a malformed URL are not: those are returned at once). `sleep` is the
/// runtime's timer (this crate knows no async runtime).
pub async fn wait_for_broker<T, E, Attempt, Sleep>(
    broker: &str,
    address: &str,
    warn_every: Duration,
    lasting: impl Fn(&E) -> bool,
    mut attempt: impl FnMut() -> Attempt,
    sleep: impl Fn(Duration) -> Sleep,
) -> Result<T, E>
where
    E: Display,
    Attempt: Future<Output = Result<T, E>>,
    Sleep: Future<Output = ()>,
{
    let started = Instant::now();
    let mut warned: Option<Instant> = None;
    let mut failures = 0u64;
    loop {
        let tried = Instant::now();
        let error = match attempt().await {
            Ok(connected) => {
                if failures > 0 {
                    tracing::info!(
                        broker,
                        address,
                        waited_s = started.elapsed().as_secs(),
                        "the broker answers; starting"
                    );
                }
                return Ok(connected);
            }
            Err(error) if !lasting(&error) => return Err(error),
            Err(error) => error,
        };
        failures += 1;
        if warned.is_none_or(|at| at.elapsed() >= warn_every) {
            warned = Some(Instant::now());
            tracing::warn!(
                broker,
                address,
                waited_s = started.elapsed().as_secs(),
                attempts = failures,
                %error,
                "the broker does not answer; waiting for it"
            );
        } else {
            tracing::debug!(broker, address, %error, "the broker does not answer yet");
        }
        if let Some(rest) = ATTEMPT_EVERY.checked_sub(tried.elapsed()) {
            sleep(rest).await;
        }
    }
}
