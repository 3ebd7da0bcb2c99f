//! One consumer group's queue on one address: ready, unacknowledged and delayed entries.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use ruststream_core::Headers;
use tokio::sync::Notify;

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
    unacked: Unacked,
    delayed: usize,
    /// Deliveries so far, in order: what puts a closing consumer's entries back in the
    /// order they went out.
    delivered: u64,
    /// Publishers waiting for room: an ack wakes them only when there are some.
    waiting_publishers: usize,
    /// Consumers waiting for an entry: a pop that leaves more wakes one only then.
    waiting_consumers: usize,
}

/// Delivered, unacknowledged entries, in slots reused as they free up: a delivery's tag
/// names its slot and the slot's generation, so taking one back is an index and a
/// compare (a hash map insert and remove per delivery cost about 200 instructions), and
/// a stale or repeated tag finds nothing.
#[derive(Debug, Default)]
struct Unacked {
    slots: Vec<Slot>,
    free: Vec<u32>,
    len: usize,
}

#[derive(Debug, Default)]
struct Slot {
    generation: u32,
    held: Option<Held>,
}

#[derive(Debug)]
struct Held {
    entry: Entry,
    consumer: u32,
    order: u64,
}

impl Unacked {
    fn insert(&mut self, held: Held) -> u64 {
        let index = match self.free.pop() {
            Some(index) => index,
            None => {
                self.slots.push(Slot::default());
                u32::try_from(self.slots.len() - 1).expect("fewer than 2^32 unacked entries")
            }
        };
        let slot = &mut self.slots[index as usize];
        slot.held = Some(held);
        self.len += 1;
        (u64::from(slot.generation) << 32) | u64::from(index)
    }

    fn remove(&mut self, tag: u64) -> Option<Held> {
        let index = self.held_at(tag)?;
        let held = self.slots[index as usize].held.take();
        self.vacate(index);
        held
    }

    /// Like `remove`, for an entry done with for good: dropped where it lies, not moved
    /// out first (it is some 120 bytes).
    fn discard(&mut self, tag: u64) -> bool {
        let Some(index) = self.held_at(tag) else {
            return false;
        };
        self.slots[index as usize].held = None;
        self.vacate(index);
        true
    }

    /// The slot `tag` names, if it holds the entry the tag was given for.
    fn held_at(&self, tag: u64) -> Option<u32> {
        // The tag's halves: generation above, slot index below.
        #[allow(clippy::cast_possible_truncation)]
        let (generation, index) = ((tag >> 32) as u32, tag as u32);
        let slot = self.slots.get(index as usize)?;
        (slot.generation == generation && slot.held.is_some()).then_some(index)
    }

    /// A slot emptied: a later tag for it is stale.
    fn vacate(&mut self, index: u32) {
        let slot = &mut self.slots[index as usize];
        slot.generation = slot.generation.wrapping_add(1);
        self.free.push(index);
        self.len -= 1;
    }

    /// The tags a consumer holds.
    fn of(&self, consumer: u32) -> Vec<u64> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, slot)| slot.held.as_ref().is_some_and(|h| h.consumer == consumer))
            .map(|(index, slot)| (u64::from(slot.generation) << 32) | index as u64)
            .collect()
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn len(&self) -> usize {
        self.len
    }
}

/// Which count a waiter is in.
#[derive(Clone, Copy)]
enum Side {
    Publisher,
    Consumer,
}

/// A publisher waiting for room, or a consumer for an entry, counted as such (so a wake-up
/// is given only when someone waits) until it is done waiting or dropped while it waits.
struct Waiter<'g> {
    group: &'g Group,
    side: Side,
}

impl<'g> Waiter<'g> {
    /// Counts a waiter, under the lock that saw there was nothing for it.
    fn count(group: &'g Group, mut q: MutexGuard<'_, Queues>, side: Side) -> Self {
        *q.waiting(side) += 1;
        Self { group, side }
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        *self.group.lock().waiting(self.side) -= 1;
    }
}

impl Queues {
    fn waiting(&mut self, side: Side) -> &mut usize {
        match side {
            Side::Publisher => &mut self.waiting_publishers,
            Side::Consumer => &mut self.waiting_consumers,
        }
    }
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
    /// Names the group's consumers (for `release`).
    consumers: std::sync::atomic::AtomicU32,
}

impl Group {
    pub(crate) fn new(capacity: usize) -> Arc<Self> {
        Arc::new(Self {
            queues: Mutex::default(),
            capacity,
            ready: Notify::new(),
            room: Notify::new(),
            consumers: std::sync::atomic::AtomicU32::new(0),
        })
    }

    /// A name for a new consumer of the group.
    pub(crate) fn consumer(&self) -> u32 {
        self.consumers
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
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
            let waiting = {
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
                // Counted under the lock, so an ack after it sees this publisher.
                Waiter::count(self, q, Side::Publisher)
            };
            room.await;
            drop(waiting);
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
    /// the lock is held, and a pop dropped while it waits is no longer counted waiting.
    pub(crate) async fn pop(&self, consumer: u32) -> (u64, Stored, u32) {
        loop {
            let waiting = {
                let mut q = self.lock();
                if let Some(popped) = Self::take(&mut q, consumer) {
                    drop(q);
                    return self.taken(popped);
                }
                Waiter::count(self, q, Side::Consumer)
            };
            // Made only when the queue was empty. Every wake-up here is a `notify_one`,
            // which leaves a permit when nobody waits yet, so one given between the
            // check above and this wait is not lost.
            self.ready.notified().await;
            drop(waiting);
        }
    }

    /// Takes the next ready entry if there is one.
    #[inline]
    pub(crate) fn try_pop(&self, consumer: u32) -> Option<(u64, Stored, u32)> {
        let mut q = self.lock();
        let popped = Self::take(&mut q, consumer)?;
        drop(q);
        Some(self.taken(popped))
    }

    /// The front entry, counted delivered and held unacknowledged: its tag, a copy of
    /// it, its deliveries so far, and whether another consumer should be told there is
    /// more.
    #[inline]
    fn take(q: &mut Queues, consumer: u32) -> Option<((u64, Stored, u32), bool)> {
        let mut entry = q.ready.pop_front()?;
        entry.delivered += 1;
        q.delivered += 1;
        let order = q.delivered;
        let out = (entry.message.clone(), entry.delivered);
        let tag = q.unacked.insert(Held {
            entry,
            consumer,
            order,
        });
        // Another consumer waits and there is more: pass the word on.
        let more = !q.ready.is_empty() && q.waiting_consumers > 0;
        Some(((tag, out.0, out.1), more))
    }

    /// An entry taken (with the lock let go): another waiting consumer told when there
    /// is more.
    #[inline]
    fn taken(&self, (popped, more): ((u64, Stored, u32), bool)) -> (u64, Stored, u32) {
        if more {
            self.ready.notify_one();
        }
        popped
    }

    /// Done with `tag` for good.
    pub(crate) fn remove(&self, tag: u64) -> bool {
        let mut q = self.lock();
        let removed = q.unacked.discard(tag);
        let waiting = q.waiting_publishers > 0;
        drop(q);
        if waiting {
            self.room.notify_waiters();
        }
        removed
    }

    /// Puts `tag` back at the front: delivered again before anything fetched later.
    pub(crate) fn requeue(&self, tag: u64) -> bool {
        let mut q = self.lock();
        let Some(Held { entry, .. }) = q.unacked.remove(tag) else {
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
        let Some(Held { entry, .. }) = q.unacked.remove(tag) else {
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

    /// Puts every entry a closing consumer holds back, in delivery order.
    pub(crate) fn release(&self, consumer: u32) {
        let mut q = self.lock();
        let tags = q.unacked.of(consumer);
        let mut back: Vec<Held> = tags
            .into_iter()
            .filter_map(|t| q.unacked.remove(t))
            .collect();
        back.sort_by_key(|held| std::cmp::Reverse(held.order));
        for held in back {
            q.ready.push_front(held.entry);
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

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    use bytes::Bytes;

    use super::{Group, Stored};

    fn stored(sequence: u64) -> Stored {
        Stored {
            payload: Bytes::from_static(b"{}"),
            headers: ruststream_core::Headers::new(),
            key: None,
            sequence,
        }
    }

    /// A fetch given up while it waits (the driver drops one whenever something else
    /// comes first) is no longer counted waiting, so later pops and acks do not wake
    /// anyone for nothing; the next pop still gets the next entry.
    #[test]
    fn a_pop_or_push_dropped_while_waiting_is_no_longer_counted() {
        let group = Group::new(1);
        let mut cx = Context::from_waker(Waker::noop());
        for _ in 0..3 {
            let mut pop = pin!(group.pop(0));
            assert!(pop.as_mut().poll(&mut cx).is_pending());
            assert_eq!(group.lock().waiting_consumers, 1);
        }
        assert_eq!(group.lock().waiting_consumers, 0);

        assert!(group.try_push(&stored(1)));
        for _ in 0..3 {
            let mut push = pin!(group.push(stored(2)));
            assert!(
                push.as_mut().poll(&mut cx).is_pending(),
                "the group is full"
            );
            assert_eq!(group.lock().waiting_publishers, 1);
        }
        assert_eq!(group.lock().waiting_publishers, 0);

        let mut pop = pin!(group.pop(0));
        let Poll::Ready((_, message, delivered)) = pop.as_mut().poll(&mut cx) else {
            panic!("an entry is ready");
        };
        assert_eq!((message.sequence, delivered), (1, 1));
    }
}
