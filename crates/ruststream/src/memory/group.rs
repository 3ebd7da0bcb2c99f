//! One consumer group's queue on one address: ready, unacknowledged and delayed entries.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use ruststream_core::Headers;
use tokio::sync::Notify;

/// A message as the memory broker stores it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Stored {
    pub(crate) payload: Bytes,
    pub(crate) headers: Headers,
    pub(crate) key: Option<Bytes>,
    pub(crate) sequence: u64,
    /// Deliveries counted before this one (a simulated redelivery; 0 otherwise).
    pub(crate) earlier: u32,
}

/// Where an entry is.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum State {
    /// No entry: the slot is on the free list.
    #[default]
    Free,
    Ready,
    /// Delivered to `consumer` and not settled; `order` is its place among all
    /// deliveries (what puts a closing consumer's entries back in the order they went out).
    Unacked {
        consumer: u32,
        order: u64,
    },
    /// Waiting out a `requeue_after` delay.
    Delayed,
}

/// One entry of the group, from its publish until it is done with. It stays in its slot
/// the whole time: the ready queue and the tags name it by index, so a delivery moves
/// no entry, and taking one back is an index and a compare (a hash map insert and
/// remove per delivery cost about 200 instructions).
#[derive(Debug, Default)]
struct Slot {
    /// Changes with every delivery of the entry and when the slot is freed: a tag names
    /// one delivery (generation above, index below), and a stale or repeated one finds
    /// nothing.
    generation: u32,
    /// Deliveries so far: the native redelivery count.
    delivered: u32,
    state: State,
    message: Stored,
}

#[derive(Debug, Default)]
struct Queues {
    slots: Vec<Slot>,
    free: Vec<u32>,
    /// The slots of ready entries, in the order they go out.
    ready: VecDeque<u32>,
    /// Entries held (ready, unacknowledged or delayed): what the capacity bounds.
    held: usize,
    /// Deliveries so far, in order.
    delivered: u64,
    /// Publishers waiting for room: an ack wakes them only when there are some.
    waiting_publishers: usize,
    /// Consumers waiting for an entry: a pop that leaves more wakes one only then.
    waiting_consumers: usize,
}

impl Queues {
    fn waiting(&mut self, side: Side) -> &mut usize {
        match side {
            Side::Publisher => &mut self.waiting_publishers,
            Side::Consumer => &mut self.waiting_consumers,
        }
    }

    /// Stores `message` as a ready entry, at the back.
    fn push_back(&mut self, message: Stored) {
        let index = match self.free.pop() {
            Some(index) => index,
            None => {
                self.slots.push(Slot::default());
                u32::try_from(self.slots.len() - 1).expect("fewer than 2^32 entries")
            }
        };
        let slot = &mut self.slots[index as usize];
        slot.delivered = message.earlier;
        slot.message = message;
        slot.state = State::Ready;
        self.held += 1;
        self.ready.push_back(index);
    }

    /// The slot `tag` names, if it holds the delivery the tag was given for.
    fn unacked_at(&self, tag: u64) -> Option<usize> {
        // The tag's halves: generation above, slot index below.
        #[allow(clippy::cast_possible_truncation)]
        let (generation, index) = ((tag >> 32) as u32, tag as u32 as usize);
        let slot = self.slots.get(index)?;
        (slot.generation == generation && matches!(slot.state, State::Unacked { .. }))
            .then_some(index)
    }

    /// Done with the entry in `index` for good: its message dropped, its slot free.
    #[inline]
    fn free(&mut self, index: usize) {
        let slot = &mut self.slots[index];
        slot.message = Stored::default();
        slot.state = State::Free;
        slot.generation = slot.generation.wrapping_add(1);
        self.held -= 1;
        #[allow(clippy::cast_possible_truncation)]
        self.free.push(index as u32);
    }

    /// Puts the entry in `index` back at the front.
    fn ready_again(&mut self, index: usize) {
        self.slots[index].state = State::Ready;
        #[allow(clippy::cast_possible_truncation)]
        self.ready.push_front(index as u32);
    }
}

/// A delivery a consumer finished with (acked or dropped) and has not yet removed: it
/// goes with the consumer's next pop, under the same lock (one lock round trip per
/// delivery instead of two). After the removal, the tag when it named no outstanding
/// delivery.
#[derive(Debug, Default)]
pub(crate) struct Settled(pub(crate) Option<u64>);

impl Settled {
    fn take(&mut self) -> Self {
        Self(self.0.take())
    }
}

/// An entry a consumer took: its tag and its slot.
struct Taken {
    tag: u64,
    index: usize,
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
        if q.held >= self.capacity {
            return false;
        }
        q.push_back(message.clone());
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
                if q.held < self.capacity {
                    q.push_back(message);
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
        self.lock().push_back(message);
        self.ready.notify_one();
    }

    /// Takes the next ready entry, waiting for one, and hands it to `fill` (its tag, the
    /// message, its deliveries so far) under the lock; `done`, an entry the consumer
    /// finished with (`Settled`), is removed under the same lock first. Cancel safe:
    /// nothing is taken or removed until the lock is held, and a pop dropped while it
    /// waits is no longer counted waiting.
    pub(crate) async fn pop<R>(
        &self,
        consumer: u32,
        mut done: Settled,
        fill: impl FnOnce(u64, &Stored, u32) -> R,
    ) -> (R, Settled) {
        loop {
            let waiting = {
                let mut q = self.lock();
                let (room, stale) = Self::finish(&mut q, done.take());
                if let Some(taken) = Self::take(&mut q, consumer) {
                    return (self.taken(q, taken, room, fill), stale);
                }
                let waiting = Waiter::count(self, q, Side::Consumer);
                self.tell_room(room);
                waiting
            };
            // Made only when the queue was empty. Every wake-up here is a `notify_one`,
            // which leaves a permit when nobody waits yet, so one given between the
            // check above and this wait is not lost.
            self.ready.notified().await;
            drop(waiting);
        }
    }

    /// Like `pop`, if an entry is ready now (`done` is removed either way).
    #[inline]
    pub(crate) fn try_pop<R>(
        &self,
        consumer: u32,
        done: Settled,
        fill: impl FnOnce(u64, &Stored, u32) -> R,
    ) -> (Option<R>, Settled) {
        let mut q = self.lock();
        let (room, stale) = Self::finish(&mut q, done);
        let Some(taken) = Self::take(&mut q, consumer) else {
            drop(q);
            self.tell_room(room);
            return (None, stale);
        };
        (Some(self.taken(q, taken, room, fill)), stale)
    }

    /// The front entry, counted delivered and held unacknowledged.
    #[inline]
    fn take(q: &mut Queues, consumer: u32) -> Option<Taken> {
        let index = q.ready.pop_front()?;
        q.delivered += 1;
        let order = q.delivered;
        let slot = &mut q.slots[index as usize];
        slot.generation = slot.generation.wrapping_add(1);
        slot.delivered += 1;
        slot.state = State::Unacked { consumer, order };
        Some(Taken {
            tag: (u64::from(slot.generation) << 32) | u64::from(index),
            index: index as usize,
        })
    }

    /// An entry taken: handed to `fill` under the lock, then, with the lock let go,
    /// another waiting consumer told when there is more, and waiting publishers when
    /// `room` says an entry was removed for them.
    #[inline]
    fn taken<R>(
        &self,
        q: MutexGuard<'_, Queues>,
        Taken { tag, index }: Taken,
        room: bool,
        fill: impl FnOnce(u64, &Stored, u32) -> R,
    ) -> R {
        let slot = &q.slots[index];
        let filled = fill(tag, &slot.message, slot.delivered);
        // Another consumer waits and there is more: pass the word on.
        let more = !q.ready.is_empty() && q.waiting_consumers > 0;
        drop(q);
        if more {
            self.ready.notify_one();
        }
        self.tell_room(room);
        filled
    }

    /// Removes `done`'s entry for good, if there is one: whether publishers wait for the
    /// room it made, and the tag back when it named no outstanding delivery.
    #[inline]
    fn finish(q: &mut Queues, done: Settled) -> (bool, Settled) {
        let Some(tag) = done.0 else {
            return (false, Settled(None));
        };
        let Some(index) = q.unacked_at(tag) else {
            return (false, Settled(Some(tag)));
        };
        q.free(index);
        (q.waiting_publishers > 0, Settled(None))
    }

    /// Wakes the publishers waiting for room when an entry was removed for them (with
    /// the lock let go).
    #[inline]
    fn tell_room(&self, room: bool) {
        if room {
            self.room.notify_waiters();
        }
    }

    /// Done with `tag` for good.
    pub(crate) fn remove(&self, tag: u64) -> bool {
        let mut q = self.lock();
        let (room, stale) = Self::finish(&mut q, Settled(Some(tag)));
        drop(q);
        self.tell_room(room);
        stale.0.is_none()
    }

    /// Puts `tag` back at the front: delivered again before anything fetched later.
    pub(crate) fn requeue(&self, tag: u64) -> bool {
        let mut q = self.lock();
        let Some(index) = q.unacked_at(tag) else {
            return false;
        };
        q.ready_again(index);
        drop(q);
        self.ready.notify_one();
        true
    }

    /// Holds `tag` for `delay`, then puts it back at the front.
    pub(crate) fn requeue_after(self: &Arc<Self>, tag: u64, delay: Duration) -> bool {
        let mut q = self.lock();
        let Some(index) = q.unacked_at(tag) else {
            return false;
        };
        q.slots[index].state = State::Delayed;
        drop(q);
        let group = Arc::clone(self);
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            // Nothing else moves a delayed entry: it is still in its slot.
            group.lock().ready_again(index);
            group.ready.notify_one();
        });
        true
    }

    /// Puts every entry a closing consumer holds back, in delivery order.
    pub(crate) fn release(&self, consumer: u32) {
        let mut q = self.lock();
        let mut back: Vec<(u64, usize)> = q
            .slots
            .iter()
            .enumerate()
            .filter_map(|(index, slot)| match slot.state {
                State::Unacked { consumer: c, order } if c == consumer => Some((order, index)),
                _ => None,
            })
            .collect();
        back.sort_unstable_by_key(|(order, _)| std::cmp::Reverse(*order));
        for (_, index) in back {
            q.ready_again(index);
        }
        drop(q);
        self.ready.notify_one();
    }

    /// Drops the ready entries whose headers `which` picks (a simulated crash of a
    /// broker that brings back only what was committed, or nothing).
    #[cfg(feature = "sim")]
    pub(crate) fn purge_ready(&self, which: &impl Fn(&Headers) -> bool) {
        let mut q = self.lock();
        let ready = std::mem::take(&mut q.ready);
        for index in ready {
            if which(&q.slots[index as usize].message.headers) {
                q.free(index as usize);
            } else {
                q.ready.push_back(index);
            }
        }
        drop(q);
        self.tell_room(true);
    }

    /// Nothing ready, unacknowledged or delayed.
    pub(crate) fn is_idle(&self) -> bool {
        self.lock().held == 0
    }

    /// Entries not yet done (ready + unacknowledged + delayed).
    pub(crate) fn depth(&self) -> usize {
        self.lock().held
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    use bytes::Bytes;

    use super::{Group, Settled, Stored};

    fn owned(tag: u64, message: &Stored, delivered: u32) -> (u64, Stored, u32) {
        (tag, message.clone(), delivered)
    }

    fn pop_now(group: &Group, consumer: u32) -> Option<(u64, Stored, u32)> {
        group.try_pop(consumer, Settled::default(), owned).0
    }

    fn stored(sequence: u64) -> Stored {
        Stored {
            payload: Bytes::from_static(b"{}"),
            headers: ruststream_core::Headers::new(),
            key: None,
            sequence,
            earlier: 0,
        }
    }

    /// A tag names one delivery of one entry: after a requeue, a settlement or a release
    /// the old tag finds nothing, a redelivery counts up and gets a tag of its own, and
    /// a slot reused for a new entry does not answer to the old entry's tags.
    #[test]
    fn a_tag_settles_only_the_delivery_it_was_given_for() {
        let group = Group::new(10);
        assert!(group.try_push(&stored(1)));
        let (first, message, delivered) = pop_now(&group, 0).expect("ready");
        assert_eq!((message.sequence, delivered), (1, 1));
        assert!(group.requeue(first));
        assert!(!group.remove(first), "requeued: the old tag is stale");
        let (second, message, delivered) = pop_now(&group, 0).expect("ready again");
        assert_eq!((message.sequence, delivered), (1, 2));
        assert_ne!(first, second);
        assert!(group.remove(second));
        assert!(!group.remove(second), "settled once only");
        assert!(group.is_idle());

        // The freed slot holds the next entry; the old tags do not reach it.
        assert!(group.try_push(&stored(2)));
        let (third, message, delivered) = pop_now(&group, 0).expect("ready");
        assert_eq!((message.sequence, delivered), (2, 1));
        assert!(!group.requeue(first) && !group.remove(second));
        assert_eq!(group.depth(), 1);
        assert!(group.remove(third));
        assert_eq!(group.depth(), 0);
    }

    /// A closing consumer's entries go back in the order they went out, ahead of what was
    /// ready, and its tags go stale; another consumer's stay with it.
    #[test]
    fn a_release_puts_back_only_the_consumers_entries_in_delivery_order() {
        let group = Group::new(10);
        for sequence in 1..=4 {
            assert!(group.try_push(&stored(sequence)));
        }
        let (a, ..) = pop_now(&group, 0).expect("1");
        let (b, ..) = pop_now(&group, 1).expect("2");
        let (c, ..) = pop_now(&group, 0).expect("3");
        group.release(0);
        assert!(!group.remove(a) && !group.remove(c), "released: stale");
        let order: Vec<(u64, u32)> = (0..3)
            .map(|_| {
                let (_, message, delivered) = pop_now(&group, 2).expect("ready");
                (message.sequence, delivered)
            })
            .collect();
        assert_eq!(order, [(1, 2), (3, 2), (4, 1)]);
        assert!(
            group.remove(b),
            "the other consumer's delivery is still its own"
        );
    }

    /// A fetch given up while it waits (the driver drops one whenever something else
    /// comes first) is no longer counted waiting, so later pops and acks do not wake
    /// anyone for nothing; the next pop still gets the next entry.
    #[test]
    fn a_pop_or_push_dropped_while_waiting_is_no_longer_counted() {
        let group = Group::new(1);
        let mut cx = Context::from_waker(Waker::noop());
        for _ in 0..3 {
            let mut pop = pin!(group.pop(0, Settled::default(), owned));
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

        let mut pop = pin!(group.pop(0, Settled::default(), owned));
        let Poll::Ready(((_, message, delivered), _)) = pop.as_mut().poll(&mut cx) else {
            panic!("an entry is ready");
        };
        assert_eq!((message.sequence, delivered), (1, 1));
    }

    /// A delivery finished with goes with the consumer's next pop: removed under its
    /// lock whether or not an entry is ready, waiting publishers woken for its room,
    /// and its tag handed back when it named no outstanding delivery.
    #[test]
    fn a_settled_tag_is_removed_with_the_next_pop() {
        let group = Group::new(1);
        let mut cx = Context::from_waker(Waker::noop());
        assert!(group.try_push(&stored(1)));
        let (first, ..) = pop_now(&group, 0).expect("ready");
        let mut push = pin!(group.push(stored(2)));
        assert!(
            push.as_mut().poll(&mut cx).is_pending(),
            "the group is full"
        );

        let (nothing, stale) = group.try_pop(0, Settled(Some(first)), owned);
        assert!(nothing.is_none(), "the second entry waits for room");
        assert!(stale.0.is_none(), "removed");
        assert_eq!(group.depth(), 0);
        assert!(
            push.as_mut().poll(&mut cx).is_ready(),
            "the publisher was woken"
        );

        let (second, ..) = pop_now(&group, 0).expect("published");
        let mut pop = pin!(group.pop(0, Settled(Some(second)), owned));
        assert!(pop.as_mut().poll(&mut cx).is_pending(), "nothing ready");
        assert!(group.is_idle(), "removed before the pop waited");
        let (_, stale) = group.try_pop(0, Settled(Some(second)), owned);
        assert_eq!(stale.0, Some(second), "settled once only");
    }
}
