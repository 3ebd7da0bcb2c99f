//! The runtime's own sources of chance and of the wall clock: a backoff's jitter, a dead
//! letter's time stamp. Under a simulation (feature `sim`) both come from the schedule:
//! the jitter from its seed, the time from its paused clock, so a seed replays exactly.

use std::time::SystemTime;

#[cfg(feature = "sim")]
thread_local! {
    /// The running schedule's generator state and the clock's start, on the thread that
    /// runs it; `None` outside a simulation.
    static SCHEDULE: std::cell::Cell<Option<(u64, tokio::time::Instant)>> =
        const { std::cell::Cell::new(None) };
}

/// A random number: the schedule's next one under a simulation.
pub(crate) fn random_u64() -> u64 {
    #[cfg(feature = "sim")]
    if let Some((state, start)) = SCHEDULE.with(std::cell::Cell::get) {
        // splitmix64: one step per number drawn.
        let state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        SCHEDULE.with(|s| s.set(Some((state, start))));
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        return z ^ (z >> 31);
    }
    use std::hash::{BuildHasher, Hasher};
    std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish()
}

/// The wall clock: under a simulation, the Unix epoch plus the schedule's paused time.
pub(crate) fn now() -> SystemTime {
    #[cfg(feature = "sim")]
    if let Some((_, start)) = SCHEDULE.with(std::cell::Cell::get) {
        return SystemTime::UNIX_EPOCH + (tokio::time::Instant::now() - start);
    }
    SystemTime::now()
}

/// Makes this thread's chance and clock the schedule's, from `seed`, until the guard is
/// dropped.
#[cfg(feature = "sim")]
pub(crate) fn schedule(seed: u64) -> ScheduleGuard {
    // Apart from the scheduler's own stream of the same seed.
    let state = seed ^ 0x5EED_0FC4_A4CE;
    SCHEDULE.with(|s| s.set(Some((state, tokio::time::Instant::now()))));
    ScheduleGuard
}

/// Ends a schedule's hold on this thread's chance and clock.
#[cfg(feature = "sim")]
pub(crate) struct ScheduleGuard;

#[cfg(feature = "sim")]
impl Drop for ScheduleGuard {
    fn drop(&mut self) {
        SCHEDULE.with(|s| s.set(None));
    }
}
