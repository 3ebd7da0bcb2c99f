//! The driver's turn on its thread: how many deliveries it fetches in one poll of its
//! task before it gives the thread back.

use std::future::Future;
use std::pin::pin;
use std::task::Context;

/// Deliveries the driver fetches before it gives its thread back: as many as tokio's
/// cooperative budget has units for one poll of a task.
const TURN: u32 = 128;

/// The driver's turn on its thread. A broker with a backlog answers every fetch at once,
/// and most clients' fetches (librdkafka's queue, the memory broker) take nothing from
/// tokio's cooperative budget: without a turn, the thread's other tasks (timers, handler
/// deadlines, other registrations, the health endpoint) would wait until the backlog is
/// gone. After [`TURN`] deliveries the driver yields as `tokio::task::yield_now` does:
/// woken again at once, behind the others, once the runtime has polled its I/O and
/// timers. Counted here, not as a unit of tokio's budget per fetch: each unit costs
/// thread-local round trips, about 30 instructions a delivery (BENCHMARKS.md).
pub(super) struct Turn {
    left: u32,
    /// The last look ended the turn: this task is to be polled again.
    pub(super) yielded: bool,
}

impl Turn {
    pub(super) fn new() -> Self {
        Self {
            left: TURN,
            yielded: false,
        }
    }

    /// Whether the driver may fetch now. When its turn is over, this task is woken again
    /// behind the others (not at once), and its next poll begins a new turn.
    #[inline]
    pub(super) fn proceed(&mut self, cx: &mut Context<'_>) -> bool {
        self.yielded = self.left == 0;
        if self.yielded {
            self.left = TURN;
            // Its first poll hands the waker to the runtime to wake after the others.
            let _ = pin!(tokio::task::yield_now()).poll(cx);
        }
        !self.yielded
    }

    /// A fetch gave something.
    #[inline]
    pub(super) fn made_progress(&mut self) {
        self.left = self.left.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use std::future::poll_fn;
    use std::task::Poll;

    use super::{TURN, Turn};

    /// The driver's turn: [`TURN`] deliveries in one poll, then the task yields, and the
    /// runtime polls it again (a yield that forgot the waker would hang the driver).
    #[tokio::test]
    async fn a_turn_ends_after_its_deliveries_and_the_task_is_polled_again() {
        let mut turn = Turn::new();
        let mut fetched_per_poll = Vec::new();
        let polled = poll_fn(|cx| {
            let mut fetched = 0;
            while turn.proceed(cx) {
                turn.made_progress();
                fetched += 1;
                if !fetched_per_poll.is_empty() && fetched == 5 {
                    fetched_per_poll.push(fetched);
                    return Poll::Ready(());
                }
            }
            assert!(turn.yielded, "a turn that ends says so");
            fetched_per_poll.push(fetched);
            Poll::Pending
        });
        tokio::time::timeout(std::time::Duration::from_secs(10), polled)
            .await
            .expect("the task is polled again after its turn");
        assert_eq!(fetched_per_poll, [TURN, 5]);
    }
}
