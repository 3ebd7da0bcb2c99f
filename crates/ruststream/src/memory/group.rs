//! One consumer group's queue on one address: ready, unacknowledged and delayed entries.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use ruststream_core::Headers;
use tokio::sync::Notify;

use ruststream_core::hash::SpreadMap;

/// A message as the memory broker stores it.
#[derive(Debug, Clone)]
pub(crate) struct Stored {
    pub(crate) payload: Bytes,
    pub(crate) headers: Headers,
    pub(crate) key: Option<Bytes>,
    pub(crate) sequence: u64,
}

#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) message: Stored,
    /// Deliveries so far: the native redelivery count.
    pub(crate) delivered: u32,
}

#[derive(Debug, Default)]
struct Queues {
    ready: VecDeque<Entry>,
    unacked: SpreadMap<u64, Entry>,
    delayed: usize,
    next_tag: u64,
}

/// A group: consumers of the group compete for its entries.
#[derive(Debug)]
pub(crate) struct Group {
    queues: Mutex<Queues>,
    capacity: usize,
    /// Wakes a consumer when an entry becomes ready.
    ready: Notify,
    /// Wakes publishers when room appears.
    room: Notify,
}

impl Group {
    pub(crate) fn new(capacity: usize) -> Arc<Self> {
        Arc::new(Self {
            queues: Mutex::default(),
            capacity,
            ready: Notify::new(),
            room: Notify::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Queues> {
        // A panic while holding this lock cannot leave the queues half-updated (every
        // update is one push or pop), so a poisoned lock is still consistent.
        self.queues.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a copy of `message` when there is room; false when the group is full.
    pub(crate) fn try_push(&self, message: &Stored) -> bool {
        let mut q = self.lock();
        if q.ready.len() + q.unacked.len() + q.delayed >= self.capacity {
            return false;
        }
        q.ready.push_back(Entry {
            message: message.clone(),
            delivered: 0,
        });
        drop(q);
        self.ready.notify_one();
        true
    }

    /// Adds a message, waiting while the group holds `capacity` entries (back-pressure).
    pub(crate) async fn push(&self, message: Stored) {
        loop {
            let room = self.room.notified();
            {
                let mut q = self.lock();
                if q.ready.len() + q.unacked.len() + q.delayed < self.capacity {
                    q.ready.push_back(Entry {
                        message,
                        delivered: 0,
                    });
                    drop(q);
                    self.ready.notify_one();
                    return;
                }
            }
            room.await;
        }
    }

    /// Adds a message whatever the capacity (messages published before any group existed).
    pub(crate) fn push_unbounded(&self, message: Stored) {
        self.lock().ready.push_back(Entry {
            message,
            delivered: 0,
        });
        self.ready.notify_one();
    }

    /// Takes the next ready entry, waiting for one. Cancel safe: nothing is taken until
    /// the lock is held.
    pub(crate) async fn pop(&self) -> (u64, Stored, u32) {
        loop {
            let ready = self.ready.notified();
            {
                let mut q = self.lock();
                if let Some(mut entry) = q.ready.pop_front() {
                    entry.delivered += 1;
                    let tag = q.next_tag;
                    q.next_tag += 1;
                    let out = (tag, entry.message.clone(), entry.delivered);
                    q.unacked.insert(tag, entry);
                    let more = !q.ready.is_empty();
                    drop(q);
                    if more {
                        self.ready.notify_one();
                    }
                    return out;
                }
            }
            ready.await;
        }
    }

    /// Done with `tag` for good.
    pub(crate) fn remove(&self, tag: u64) -> bool {
        let removed = self.lock().unacked.remove(&tag).is_some();
        self.room.notify_waiters();
        removed
    }

    /// Puts `tag` back at the front: delivered again before anything fetched later.
    pub(crate) fn requeue(&self, tag: u64) -> bool {
        let mut q = self.lock();
        let Some(entry) = q.unacked.remove(&tag) else {
            return false;
        };
        q.ready.push_front(entry);
        drop(q);
        self.ready.notify_one();
        true
    }

    /// Holds `tag` for `delay`, then puts it back at the front.
    pub(crate) fn requeue_after(self: &Arc<Self>, tag: u64, delay: Duration) -> bool {
        let mut q = self.lock();
        let Some(entry) = q.unacked.remove(&tag) else {
            return false;
        };
        q.delayed += 1;
        drop(q);
        let group = Arc::clone(self);
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let mut q = group.lock();
            q.delayed -= 1;
            q.ready.push_front(entry);
            drop(q);
            group.ready.notify_one();
        });
        true
    }

    /// Puts every tag of a closing consumer back, in delivery order.
    pub(crate) fn release(&self, tags: impl IntoIterator<Item = u64>) {
        let mut q = self.lock();
        let mut back: Vec<(u64, Entry)> = tags
            .into_iter()
            .filter_map(|t| q.unacked.remove(&t).map(|e| (t, e)))
            .collect();
        back.sort_by_key(|(t, _)| std::cmp::Reverse(*t));
        for (_, entry) in back {
            q.ready.push_front(entry);
        }
        drop(q);
        self.ready.notify_one();
    }

    /// Nothing ready, unacknowledged or delayed.
    pub(crate) fn is_idle(&self) -> bool {
        let q = self.lock();
        q.ready.is_empty() && q.unacked.is_empty() && q.delayed == 0
    }

    /// Entries not yet done (ready + unacknowledged + delayed).
    pub(crate) fn depth(&self) -> usize {
        let q = self.lock();
        q.ready.len() + q.unacked.len() + q.delayed
    }
}
