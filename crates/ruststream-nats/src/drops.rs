//! Core NATS messages the client dropped because a subscription's buffer was full (a slow
//! consumer), counted per subject from the client's events (SPEC G7).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

/// At most one slow-consumer warning per this interval.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// The drops of one connection. The client names a subscription by its id (sid) only;
/// each Core subscription registers its sid with its subject when it opens.
#[derive(Debug, Default)]
pub(crate) struct SlowConsumers {
    total: AtomicU64,
    book: Mutex<Book>,
}

#[derive(Debug, Default)]
struct Book {
    subjects: HashMap<u64, Arc<str>>,
    counts: HashMap<Arc<str>, u64>,
    warned: Option<Instant>,
}

impl SlowConsumers {
    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Names subscription `sid` after `subject` in warnings and counts.
    pub(crate) fn register(self: &Arc<Self>, sid: u64, subject: &str) {
        self.book().subjects.insert(sid, Arc::from(subject));
        hold(sid, self);
    }

    pub(crate) fn unregister(self: &Arc<Self>, sid: u64) {
        self.book().subjects.remove(&sid);
        release(sid, self);
    }

    /// One message dropped on subscription `sid`.
    pub(crate) fn count(&self, sid: u64) {
        self.total.fetch_add(1, Ordering::Relaxed);
        let mut book = self.book();
        if let Some(subject) = book.subjects.get(&sid).cloned() {
            *book.counts.entry(subject).or_default() += 1;
        }
    }

    /// The client's event for a drop on `sid`: counted unless the log counts it
    /// (`drop_log`), and warned about at most once per [`WARN_EVERY`].
    pub(crate) fn record(&self, sid: u64) {
        if !counted_by_log(sid, self) {
            self.count(sid);
        }
        let mut book = self.book();
        let now = Instant::now();
        if book
            .warned
            .is_none_or(|at| now.duration_since(at) >= WARN_EVERY)
        {
            book.warned = Some(now);
            let subject = book.subjects.get(&sid).cloned();
            let on_subject = subject.as_ref().and_then(|s| book.counts.get(s).copied());
            drop(book);
            tracing::warn!(
                subject = subject
                    .as_deref()
                    .unwrap_or("(not a ruststream subscription)"),
                sid,
                dropped_on_subject = on_subject.unwrap_or(0),
                dropped_on_connection = self.total(),
                "Core NATS slow consumer: the client's buffer for the subscription is full and it drops messages (at-most-once); add lanes or make handlers faster"
            );
        }
    }

    pub(crate) fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    pub(crate) fn on(&self, subject: &str) -> u64 {
        self.book().counts.get(subject).copied().unwrap_or(0)
    }
}

// Which connection holds a subscription number, for the drops read from the log
// (`drop_log`): the log names the number only.

/// Set once `slow_consumer_layer` is part of a subscriber: from then on, drops it can
/// attribute are counted from the log, not from the events.
static LOG_COUNTS: AtomicBool = AtomicBool::new(false);

/// Each subscription number held by a Core subscription, with the connections holding it.
static HOLDERS: Mutex<Option<HashMap<u64, Vec<Weak<SlowConsumers>>>>> = Mutex::new(None);

fn with_holders<T>(f: impl FnOnce(&mut HashMap<u64, Vec<Weak<SlowConsumers>>>) -> T) -> T {
    let mut holders = HOLDERS.lock().unwrap_or_else(PoisonError::into_inner);
    f(holders.get_or_insert_with(HashMap::new))
}

/// `connection` opened a Core subscription numbered `sid`.
fn hold(sid: u64, connection: &Arc<SlowConsumers>) {
    with_holders(|holders| {
        let list = holders.entry(sid).or_default();
        list.retain(|held| held.strong_count() > 0);
        list.push(Arc::downgrade(connection));
    });
}

/// `connection` closed its subscription numbered `sid`.
fn release(sid: u64, connection: &Arc<SlowConsumers>) {
    with_holders(|holders| {
        if let Some(list) = holders.get_mut(&sid) {
            list.retain(|held| {
                held.strong_count() > 0 && !held.ptr_eq(&Arc::downgrade(connection))
            });
            if list.is_empty() {
                holders.remove(&sid);
            }
        }
    });
}

/// The one connection holding `sid` when a layer is installed, else `None` (the drop is
/// then counted from the client's event).
pub(crate) fn sole_holder(sid: u64) -> Option<Arc<SlowConsumers>> {
    if !LOG_COUNTS.load(Ordering::Relaxed) {
        return None;
    }
    with_holders(|holders| match holders.get(&sid).map(Vec::as_slice) {
        Some([one]) => one.upgrade(),
        _ => None,
    })
}

/// Whether the log counts drops on `sid` for `connection` (so its event must not).
fn counted_by_log(sid: u64, connection: &SlowConsumers) -> bool {
    sole_holder(sid).is_some_and(|holder| std::ptr::eq(Arc::as_ptr(&holder), connection))
}

/// The log counts drops from now on (`slow_consumer_layer` was installed).
pub(crate) fn log_counts() {
    LOG_COUNTS.store(true, Ordering::Relaxed);
}

/// The id async-nats gave `subscriber`. The client keeps it private; its `Debug` output
/// (`Subscriber { sid: 7, .. }`) carries it. `None` when that output changes shape, and
/// the warnings then name the sid alone.
pub(crate) fn sid_of(subscriber: &async_nats::Subscriber) -> Option<u64> {
    let shown = format!("{subscriber:?}");
    let rest = &shown[shown.find("sid: ")? + 5..];
    let digits = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    rest[..digits].parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn g7_drops_are_counted_per_registered_subject() {
        let drops = Arc::new(SlowConsumers::default());
        drops.register(3, "orders");
        drops.record(3);
        drops.record(3);
        drops.record(9);
        assert_eq!(drops.total(), 3);
        assert_eq!(drops.on("orders"), 2);
        drops.unregister(3);
        drops.record(3);
        assert_eq!(
            drops.on("orders"),
            2,
            "a closed subscription counts no more"
        );
        assert_eq!(drops.total(), 4);
    }
}
