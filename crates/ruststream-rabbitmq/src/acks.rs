//! The deliveries of one channel not yet settled with the broker, and the acks waiting to
//! be sent: a run of acked deliveries at the front goes as one `basic.ack` with
//! `multiple`, which the broker applies to every unsettled delivery of the channel up to
//! its tag, so the run never reaches past a delivery still running, held, or settled some
//! other way (SPEC R1).

use std::collections::VecDeque;

/// What one flush sends: one `multiple` ack up to a tag (when the front of the channel's
/// unsettled deliveries is acked), and the other acked tags alone.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Flush {
    /// The last tag of the acked run at the front, and how many it covers.
    pub(crate) through: Option<(u64, usize)>,
    /// Acked tags behind an unsettled one, each acked alone.
    pub(crate) alone: Vec<u64>,
}

/// Unsettled deliveries of the current channel, in tag order (the broker numbers a
/// channel's deliveries upwards), each marked once acked here and not yet sent.
#[derive(Debug, Default)]
pub(crate) struct Unacked {
    tags: VecDeque<(u64, bool)>,
    acked: usize,
}

impl Unacked {
    /// A delivery came on the channel.
    #[inline]
    pub(crate) fn delivered(&mut self, tag: u64) {
        debug_assert!(self.tags.back().is_none_or(|(last, _)| *last < tag));
        self.tags.push_back((tag, false));
    }

    /// Acked by its handler: sent at the next flush.
    #[inline]
    pub(crate) fn acked(&mut self, tag: u64) {
        if let Some(entry) = self.find(tag)
            && !entry.1
        {
            entry.1 = true;
            self.acked += 1;
        }
    }

    /// Settled with the broker another way (rejected, nacked): no longer covered.
    pub(crate) fn settled(&mut self, tag: u64) {
        if let Ok(at) = self.tags.binary_search_by_key(&tag, |(t, _)| *t) {
            if self.tags[at].1 {
                self.acked -= 1;
            }
            self.tags.remove(at);
        }
    }

    /// Acks waiting to be sent.
    #[inline]
    pub(crate) fn waiting(&self) -> usize {
        self.acked
    }

    /// What to send now; the tags it covers are forgotten.
    pub(crate) fn flush(&mut self) -> Flush {
        let mut flush = Flush::default();
        if self.acked == 0 {
            return flush;
        }
        let mut run = 0;
        while let Some((tag, true)) = self.tags.front().copied() {
            self.tags.pop_front();
            run += 1;
            flush.through = Some((tag, run));
        }
        self.acked -= run;
        if self.acked > 0 {
            self.tags.retain(|(tag, acked)| {
                if *acked {
                    flush.alone.push(*tag);
                }
                !acked
            });
            self.acked = 0;
        }
        flush
    }

    /// The channel is gone: the broker gives back what it held.
    pub(crate) fn clear(&mut self) {
        self.tags.clear();
        self.acked = 0;
    }

    fn find(&mut self, tag: u64) -> Option<&mut (u64, bool)> {
        // Mostly the front settles first.
        if self.tags.front().is_some_and(|(t, _)| *t == tag) {
            return self.tags.front_mut();
        }
        let at = self.tags.binary_search_by_key(&tag, |(t, _)| *t).ok()?;
        self.tags.get_mut(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delivered(tags: impl IntoIterator<Item = u64>) -> Unacked {
        let mut unacked = Unacked::default();
        for tag in tags {
            unacked.delivered(tag);
        }
        unacked
    }

    #[test]
    fn r1_a_run_of_acks_at_the_front_is_one_multiple_ack() {
        let mut unacked = delivered(1..=5);
        for tag in 1..=5 {
            unacked.acked(tag);
        }
        assert_eq!(
            unacked.flush(),
            Flush {
                through: Some((5, 5)),
                alone: vec![]
            }
        );
        assert_eq!(unacked.flush(), Flush::default(), "nothing twice");
    }

    #[test]
    fn r1_a_multiple_ack_never_covers_a_running_delivery() {
        let mut unacked = delivered(1..=5);
        for tag in [1, 2, 4, 5] {
            unacked.acked(tag);
        }
        // 3 still runs: the run stops before it, 4 and 5 go alone.
        assert_eq!(
            unacked.flush(),
            Flush {
                through: Some((2, 2)),
                alone: vec![4, 5]
            }
        );
        unacked.acked(3);
        assert_eq!(
            unacked.flush(),
            Flush {
                through: Some((3, 1)),
                alone: vec![]
            }
        );
    }

    #[test]
    fn r1_a_multiple_ack_never_covers_a_rejected_or_held_delivery() {
        let mut unacked = delivered(1..=6);
        // 1 rejected (settled with the broker), 4 held for its retry_after (unsettled).
        unacked.settled(1);
        for tag in [2, 3, 5, 6] {
            unacked.acked(tag);
        }
        let flush = unacked.flush();
        // Covering 2 and 3 reaches tag 1 too, which the broker no longer holds unsettled.
        assert_eq!(flush.through, Some((3, 2)));
        assert_eq!(flush.alone, vec![5, 6], "4 is held: never covered");
        unacked.settled(4);
        assert_eq!(unacked.flush(), Flush::default());
    }

    #[test]
    fn an_ack_after_a_lost_channel_is_forgotten() {
        let mut unacked = delivered(1..=3);
        unacked.acked(1);
        unacked.clear();
        unacked.acked(2);
        assert_eq!(unacked.waiting(), 0);
        assert_eq!(unacked.flush(), Flush::default());
    }
}
