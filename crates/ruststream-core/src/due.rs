//! A value waiting for a moment, ordered by the moment alone.

/// `item` waiting until `due`: ordered (and equal) by `due` alone, so a
/// `BinaryHeap<Reverse<Due<Instant, T>>>` pops the earliest wait first whatever `T` is
/// (a transport's held `retry_after` deliveries).
#[derive(Debug, Clone)]
pub struct Due<I, T> {
    /// When.
    pub due: I,
    /// What waits.
    pub item: T,
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

#[cfg(test)]
mod tests {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;

    use super::Due;

    #[test]
    fn the_earliest_comes_first_whatever_the_item() {
        let mut heap = BinaryHeap::new();
        for (due, item) in [(3, "c"), (1, "a"), (2, "b")] {
            heap.push(Reverse(Due { due, item }));
        }
        let order: Vec<&str> = std::iter::from_fn(|| heap.pop().map(|Reverse(d)| d.item)).collect();
        assert_eq!(order, ["a", "b", "c"]);
    }
}
