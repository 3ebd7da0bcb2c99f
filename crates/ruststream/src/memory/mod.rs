//! An in-memory broker: the same app with no server, for the quick start and for tests.
//!
//! Named addresses; every consumer group on an address gets every message, and the
//! subscriptions of one group compete for them. Deliveries are settled one by one,
//! counted (a native redelivery count) and can be redelivered after a delay, like a
//! JetStream consumer. Queues are bounded: a publish waits while a group holds
//! `capacity` unfinished messages. Messages published to an address before any group
//! exists wait there for the first group.
//!
//! An ack or drop the runtime makes is applied with the subscription's next fetch (one
//! lock instead of two per message). That fetch follows at once unless the subscription
//! is at its in-flight bound with every delivery still running; closing applies it too.
//! Until then the message counts as unfinished ([`MemoryBroker::depth`],
//! [`MemoryBroker::is_idle`]).
//!
//! [`MemoryTopic::runtime_retries`] turns the native count and delay off, so the
//! runtime's copy path (the `x-ruststream-retry-count` header) runs as on Kafka.

mod group;
mod topic;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use ruststream_core::{BoxFuture, Outgoing, Publish, PublishError, PublishErrorKind};

pub use topic::{MemorySubscription, MemoryTopic};
#[cfg(feature = "sim")]
pub(crate) use topic::{NATIVE, RUNTIME_RETRIES};

use crate::publisher::Publisher;
use group::{Group, Stored};

/// Unfinished messages a group holds before publishers wait.
pub const DEFAULT_CAPACITY: usize = 10_000;

/// The in-memory broker. Cheap to clone; clones share the broker.
#[derive(Clone, Debug)]
pub struct MemoryBroker {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    addresses: Mutex<HashMap<String, Address>>,
    capacity: usize,
    sequence: AtomicU64,
    recording: bool,
    /// How many of the next publishes through [`Publish`] to refuse (simulated faults).
    refusing: AtomicU32,
    /// How many of the next publishes through [`Publish`] never answer (simulated).
    stalling: AtomicU32,
    /// Whether those refusals are for good (`Rejected`) rather than transient.
    rejecting: std::sync::atomic::AtomicBool,
    /// What its topics say they can do, when the simulation poses as another broker.
    posing: std::sync::OnceLock<ruststream_core::Capabilities>,
}

#[derive(Debug, Default)]
struct Address {
    /// By name, in the names' order: a publish reaches the groups in an order that is
    /// the same on every run (a simulation's seed replays exactly).
    groups: BTreeMap<String, Arc<Group>>,
    /// Published before any group existed; the first group takes them.
    waiting: Vec<Stored>,
    /// Everything published here, when the broker records.
    log: Vec<Outgoing>,
}

impl Default for MemoryBroker {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryBroker {
    /// A broker with the default capacity.
    pub fn new() -> Self {
        Self::with_capacity(DEFAULT_CAPACITY)
    }

    /// A broker whose groups each hold at most `capacity` unfinished messages.
    pub fn with_capacity(capacity: usize) -> Self {
        Self::build(capacity.max(1), false)
    }

    /// A broker that also keeps every published message for [`MemoryBroker::published`].
    pub fn recording() -> Self {
        Self::build(DEFAULT_CAPACITY, true)
    }

    fn build(capacity: usize, recording: bool) -> Self {
        Self {
            inner: Arc::new(Inner {
                addresses: Mutex::default(),
                capacity,
                sequence: AtomicU64::new(1),
                recording,
                refusing: AtomicU32::new(0),
                stalling: AtomicU32::new(0),
                rejecting: std::sync::atomic::AtomicBool::new(false),
                posing: std::sync::OnceLock::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Address>> {
        self.inner
            .addresses
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// A subscription descriptor on `address` (group `default`).
    pub fn topic(&self, address: impl Into<String>) -> MemoryTopic {
        MemoryTopic::new(self.clone(), address.into())
    }

    /// A publisher to this broker.
    pub fn publisher(&self) -> Publisher {
        Publisher::new(Arc::new(self.clone()))
    }

    /// Every message published to `address` so far, in order (only on a
    /// [`recording`](MemoryBroker::recording) broker; empty otherwise).
    pub fn published(&self, address: &str) -> Vec<Outgoing> {
        self.lock()
            .get(address)
            .map(|a| a.log.clone())
            .unwrap_or_default()
    }

    /// True when no group has a message ready, unacknowledged or delayed.
    pub fn is_idle(&self) -> bool {
        self.lock()
            .values()
            .all(|a| a.groups.values().all(|g| g.is_idle()))
    }

    /// Unfinished messages of `group` on `address`.
    pub fn depth(&self, address: &str, group: &str) -> usize {
        self.lock()
            .get(address)
            .and_then(|a| a.groups.get(group))
            .map_or(0, |g| g.depth())
    }

    pub(crate) fn group(&self, address: &str, name: &str) -> Arc<Group> {
        let mut addresses = self.lock();
        let entry = addresses.entry(address.to_owned()).or_default();
        if let Some(group) = entry.groups.get(name) {
            return Arc::clone(group);
        }
        let group = Group::new(self.inner.capacity);
        for message in entry.waiting.drain(..) {
            group.push_unbounded(message);
        }
        entry.groups.insert(name.to_owned(), Arc::clone(&group));
        group
    }

    /// Publishes, waiting while a group is full.
    pub async fn publish(&self, message: Outgoing) {
        self.publish_counted(message, 0).await;
    }

    /// Publishes `message` as one delivered `earlier` times before (a simulated
    /// redelivery: the broker counts its attempts on from there).
    pub(crate) async fn publish_counted(&self, message: Outgoing, earlier: u32) {
        let stored = Stored {
            payload: message.payload.clone(),
            headers: message.headers.clone(),
            key: message.key.clone(),
            sequence: self.inner.sequence.fetch_add(1, Ordering::Relaxed),
            earlier,
        };
        // Common case without waiting: every group has room, all done under one lock
        // and without allocating. Full groups are collected and waited for after.
        let full: Vec<Arc<Group>> = {
            let mut addresses = self.lock();
            let address = match addresses.get_mut(&*message.address) {
                Some(address) => address,
                None => addresses.entry(message.address.to_string()).or_default(),
            };
            if address.groups.is_empty() {
                address.waiting.push(stored.clone());
            }
            let full = address
                .groups
                .values()
                .filter(|g| !g.try_push(&stored))
                .cloned()
                .collect();
            if self.inner.recording {
                address.log.push(message);
            }
            full
        };
        for group in full {
            group.push(stored.clone()).await;
        }
    }
}

impl MemoryBroker {
    /// The capabilities the simulation poses as, if it does.
    pub(crate) fn posed(&self) -> Option<ruststream_core::Capabilities> {
        self.inner.posing.get().copied()
    }

    /// Refuses the next `count` publishes made through [`Publish`] (a handler's
    /// publisher, the runtime's copies) as a broker gone away would; 0 stops refusing.
    #[cfg(feature = "sim")]
    pub(crate) fn refuse_next(&self, count: u32) {
        self.inner.refusing.store(count, Ordering::Relaxed);
    }

    /// Makes the next `count` publishes made through [`Publish`] never answer, as a
    /// broker that stalls; 0 stops.
    #[cfg(feature = "sim")]
    pub(crate) fn stall_next(&self, count: u32) {
        self.inner.stalling.store(count, Ordering::Relaxed);
    }

    /// Drops the messages ready on `address` (in every group) that `which` picks, by
    /// their headers: the simulation's crash on a broker that brings back only what it
    /// committed (Kafka) or nothing (Core NATS), for the messages it published itself.
    #[cfg(feature = "sim")]
    pub(crate) fn purge_ready(
        &self,
        address: &str,
        which: impl Fn(&ruststream_core::Headers) -> bool,
    ) {
        let groups: Vec<Arc<Group>> = self
            .lock()
            .get(address)
            .map(|a| a.groups.values().cloned().collect())
            .unwrap_or_default();
        for group in groups {
            group.purge_ready(&which);
        }
    }

    /// Makes every topic made from now on settle with `capabilities` (a transport's, so
    /// the runtime plans as it would there); set once.
    #[cfg(feature = "sim")]
    pub(crate) fn pose_as(&self, capabilities: ruststream_core::Capabilities) {
        let _ = self.inner.posing.set(capabilities);
    }

    /// Makes the refusals of [`refuse_next`](Self::refuse_next) the broker's refusals of
    /// the message itself (`PublishErrorKind::Rejected`: not transient) when `for_good`.
    #[cfg(feature = "sim")]
    pub(crate) fn refuse_for_good(&self, for_good: bool) {
        self.inner.rejecting.store(for_good, Ordering::Relaxed);
    }

    /// Whether a refusal or a stall set for the next publishes is still waiting for one.
    #[cfg(feature = "sim")]
    pub(crate) fn faults_unused(&self) -> bool {
        self.inner.refusing.load(Ordering::Relaxed) > 0
            || self.inner.stalling.load(Ordering::Relaxed) > 0
    }

    /// Takes one refusal, if any is due.
    fn refused(&self) -> bool {
        take_one(&self.inner.refusing)
    }

    /// Takes one stall, if any is due.
    fn stalled(&self) -> bool {
        take_one(&self.inner.stalling)
    }
}

/// Takes one from `counter` when it is above 0.
fn take_one(counter: &AtomicU32) -> bool {
    counter.load(Ordering::Relaxed) > 0
        && counter
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
}

impl Publish for MemoryBroker {
    fn publish(&self, message: Outgoing) -> BoxFuture<'_, Result<(), PublishError>> {
        Box::pin(async move {
            if self.stalled() {
                std::future::pending::<()>().await;
            }
            if self.refused() {
                let kind = if self.inner.rejecting.load(Ordering::Relaxed) {
                    PublishErrorKind::Rejected
                } else {
                    PublishErrorKind::Disconnected
                };
                return Err(PublishError::new(
                    &message.address,
                    kind,
                    "refused by the simulated broker (testing::sim)",
                ));
            }
            MemoryBroker::publish(self, message).await;
            Ok(())
        })
    }
}
