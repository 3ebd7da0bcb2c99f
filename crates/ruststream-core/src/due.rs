//! What a transport holds until a time: its `retry_after` waits kept in the service.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// `item` waiting until `due`, ordered (and equal) by `due` alone, so the heap pops the
/// earliest wait first whatever the item is.
#[derive(Debug, Clone)]
struct Due<I, T> {
    due: I,
    item: T,
}

impl<I: Ord, T> PartialEq for Due<I, T> {
    fn eq(&self, other: &Self) -> bool {
        self.due == other.due
    }
}

impl<I: Ord, T> Eq for Due<I, T> {}

impl<I: Ord, T> PartialOrd for Due<I, T> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl<I: Ord, T> Ord for Due<I, T> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.due.cmp(&other.due)
    }
}

/// Items held until their time, earliest first: a transport's `retry_after` waits (the
/// receipts it settles once due). `I` is the clock's instant.
///
/// The earliest due item is looked at with [`Held::due_at`] and taken with [`Held::pop`]
/// only once settled, so a settlement cut short (a cancelled `next`) leaves it held.
#[derive(Debug)]
pub struct Held<I, T> {
    heap: BinaryHeap<Reverse<Due<I, T>>>,
}

impl<I: Ord + Copy, T> Default for Held<I, T> {
    fn default() -> Self {
        Self {
            heap: BinaryHeap::new(),
        }
    }
}

impl<I: Ord + Copy, T> Held<I, T> {
    /// Nothing held.
    pub fn new() -> Self {
        Self::default()
    }

    /// Holds `item` until `due`.
    pub fn hold(&mut self, due: I, item: T) {
        self.heap.push(Reverse(Due { due, item }));
    }

    /// When the earliest item comes due.
    pub fn next_due(&self) -> Option<I> {
        self.heap.peek().map(|Reverse(first)| first.due)
    }

    /// The earliest item, if it is due at `now` (still held: [`Held::pop`] takes it).
    pub fn due_at(&self, now: I) -> Option<&T> {
        self.heap
            .peek()
            .filter(|Reverse(first)| first.due <= now)
            .map(|Reverse(first)| &first.item)
    }

    /// Takes the earliest item.
    pub fn pop(&mut self) -> Option<T> {
        self.heap.pop().map(|Reverse(first)| first.item)
    }

    /// How many items are held.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// Forgets every item (their deliveries came back some other way).
    pub fn clear(&mut self) {
        self.heap.clear();
    }

    /// Takes every item with its time, in no particular order.
    pub fn drain(&mut self) -> impl Iterator<Item = (I, T)> + '_ {
        self.heap.drain().map(|Reverse(held)| (held.due, held.item))
    }
}

#[cfg(test)]
mod tests {
    use super::Held;

    #[test]
    fn the_earliest_comes_first_whatever_the_item() {
        let mut held = Held::new();
        for (due, item) in [(3, "c"), (1, "a"), (2, "b")] {
            held.hold(due, item);
        }
        assert_eq!(held.next_due(), Some(1));
        let order: Vec<&str> = std::iter::from_fn(|| held.pop()).collect();
        assert_eq!(order, ["a", "b", "c"]);
    }

    #[test]
    fn only_a_due_item_is_offered_and_it_stays_until_popped() {
        let mut held = Held::new();
        held.hold(5, "late");
        held.hold(2, "early");
        assert_eq!(held.due_at(1), None, "nothing due yet");
        assert_eq!(held.due_at(2), Some(&"early"));
        assert_eq!(held.len(), 2, "looking takes nothing");
        assert_eq!(held.pop(), Some("early"));
        assert_eq!(held.due_at(4), None);
        assert_eq!(held.due_at(9), Some(&"late"));
    }
}
