//! Deliveries whose copy the broker refused, remembered across their comebacks so each
//! comes back later than the last time (SPEC G3), and so one whose dead letter was
//! refused goes straight to its dead letter when it comes back, its handler not run
//! again past the cap.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use ruststream_core::{
    AttemptSource, DeadLetters, Delivery, MESSAGE_ID_HEADER, Settle, Verdict, plan,
};

use super::copy::deliver;
use super::shared::{Fate, Shared};
use super::why::{self, Why};

/// Entries kept at most; past it the memory starts again (a delivery refused again then
/// waits the shortest time once more: slower growth, never a storm).
const CAPACITY: usize = 4096;

/// A delivery's identity on its broker, the same each time it comes back.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Identity {
    /// Address and position (Pulsar: its message id, its sequence being its producer's).
    Position(Arc<str>, Option<i32>, Option<i64>, Option<u64>, LedgerEntry),
    /// Address and message id (`x-ruststream-id`), where the position is not the
    /// message's own.
    Id(Arc<str>, Bytes),
}
type LedgerEntry = Option<(u64, u64, i32, i32)>;

#[derive(Debug)]
pub(crate) struct Refusals {
    counts: Mutex<HashMap<Identity, Refused>>,
    /// How many entries owe a dead letter: read without the lock for every delivery.
    owed: AtomicUsize,
    /// Whether a delivery's position names the message. RabbitMQ's is the delivery tag,
    /// its channel's count: another consumer's channel, or the channel after a
    /// reconnect, gives the same tag to another message, and the message itself comes
    /// back with a new one. There only a message id identifies a delivery.
    by_position: bool,
}

/// A delivery's refusals in a row, and whether the last refused copy was its dead letter.
#[derive(Debug, Default, Clone, Copy)]
struct Refused {
    count: u32,
    dead_letter: bool,
}

impl Refusals {
    /// The memory of one registration; `by_position`: whether a delivery's position
    /// names its message on this broker.
    pub(crate) fn new(by_position: bool) -> Self {
        Self {
            counts: Mutex::default(),
            owed: AtomicUsize::new(0),
            by_position,
        }
    }

    fn identity(&self, delivery: &Delivery) -> Option<Identity> {
        let address = Arc::clone(delivery.address_arc());
        if !self.by_position {
            // Without an id nothing is remembered: the refusals in a row count as the
            // first each time, and a quorum queue's own count still says a dead letter
            // is owed.
            let id = delivery.headers().get(MESSAGE_ID_HEADER)?;
            return Some(Identity::Id(address, id.clone()));
        }
        let m = delivery.metadata();
        if m.offset.is_none() && m.sequence.is_none() {
            // Core NATS: nothing identifies the message, and nothing brings it back anyway.
            return None;
        }
        Some(Identity::Position(
            address,
            m.partition,
            m.offset,
            m.sequence,
            m.ledger_entry,
        ))
    }

    /// One more refusal for `delivery`, of its dead letter or of a retry copy; how many in
    /// a row now (1 for the first).
    pub(crate) fn refused(&self, delivery: &Delivery, dead_letter: bool) -> u32 {
        let Some(id) = self.identity(delivery) else {
            return 1;
        };
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        if counts.len() >= CAPACITY && !counts.contains_key(&id) {
            counts.clear();
            self.owed.store(0, Ordering::Relaxed);
        }
        let entry = counts.entry(id).or_default();
        entry.count = entry.count.saturating_add(1);
        if dead_letter && !entry.dead_letter {
            self.owed.fetch_add(1, Ordering::Relaxed);
        }
        entry.dead_letter |= dead_letter;
        entry.count
    }

    /// [`refused`](Self::refused), for a copy of a registration capped at `max_attempts`:
    /// for a dead letter where nothing names the message (a RabbitMQ message without an
    /// id), the broker's count of its attempts past the cap says how many in a row.
    pub(crate) fn in_a_row(
        &self,
        delivery: &Delivery,
        dead_letter: bool,
        max_attempts: Option<u32>,
    ) -> u32 {
        let remembered = self.refused(delivery, dead_letter);
        let attempt = delivery.attempt();
        match max_attempts {
            Some(max) if dead_letter && attempt.source() == AttemptSource::Broker => {
                remembered.max(attempt.number().saturating_sub(max).saturating_add(1))
            }
            _ => remembered,
        }
    }

    /// Whether `delivery` came back because its dead letter was refused: its handler
    /// ran its last attempt already.
    pub(crate) fn owes_dead_letter(&self, delivery: &Delivery) -> bool {
        if self.owed.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let Some(id) = self.identity(delivery) else {
            return false;
        };
        let counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        counts.get(&id).is_some_and(|r| r.dead_letter)
    }

    /// The copy went out: forget the delivery.
    pub(crate) fn confirmed(&self, delivery: &Delivery) {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        if counts.is_empty() {
            return;
        }
        if let Some(id) = self.identity(delivery)
            && counts.remove(&id).is_some_and(|r| r.dead_letter)
        {
            self.owed.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// Whether a delivery is back past its cap because its dead letter was refused (SPEC
/// G3): its handler ran its last attempt already, so only the dead letter is tried again
/// ([`dead_letter_again`]), never the handler. Known by an attempt above `max_attempts`
/// that the broker counted, or by the refusal remembered here (Kafka `Auto` reads the
/// record again at attempt 1). A count from the retry header above the cap is not enough:
/// the runtime never writes one, so it is a producer's forgery, and the message is handled
/// once as at the cap. Never where the broker's client dead-letters (Pulsar).
#[inline]
pub(crate) fn owes_dead_letter<S>(shared: &Shared<S>, delivery: &Delivery) -> bool {
    let declaration = &shared.declaration;
    let Some(max) = declaration.max_attempts else {
        return false;
    };
    let attempt = delivery.attempt();
    let counted_past = attempt.number() > max && attempt.source() == AttemptSource::Broker;
    declaration.dead_letter.is_some()
        && shared.capabilities.dead_letters != DeadLetters::Broker
        && (counted_past || shared.refusals.owes_dead_letter(delivery))
}

/// The dead letter of a delivery [`owes_dead_letter`] found, tried again; what becomes of
/// the original. Where the subscription moves it (Redis), it is told what the dead letter
/// says about itself (SPEC D6), as at the first try.
#[cold]
pub(crate) async fn dead_letter_again<S>(shared: &Shared<S>, delivery: &Delivery) -> Fate {
    const AGAIN: &str =
        "its dead letter was refused before and is sent again; the handler did not run again";
    let attempt = delivery.attempt().number();
    tracing::warn!(
        registration = &*shared.registration,
        address = delivery.address(),
        attempt,
        max_attempts = shared.declaration.max_attempts,
        "back after its dead letter was refused: the handler is not run again, the dead letter is tried again"
    );
    let plan = plan(
        Verdict::Reject,
        attempt,
        &shared.declaration,
        &shared.capabilities,
    );
    match plan.copy {
        Some(copy) => Fate::Settle(deliver(shared, delivery, copy, plan.settle, &AGAIN).await),
        None if plan.settle == Settle::DeadLetter => {
            let why = Why {
                reason: AGAIN,
                registration: &shared.registration,
                stream_sequence: shared.stream_sequence,
            };
            Fate::DeadLetter(Box::new(why::added(delivery, why)))
        }
        None => Fate::Settle(plan.settle),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ruststream_core::{Headers, Metadata};

    fn delivery(tag: u64, id: Option<&'static str>) -> Delivery {
        let mut headers = Headers::new();
        if let Some(id) = id {
            headers.insert(MESSAGE_ID_HEADER, id);
        }
        let mut delivery = Delivery::empty();
        delivery
            .refill(&Arc::from("orders"), Bytes::from_static(b"{}"))
            .set_headers(headers)
            .set_metadata(Metadata::sequence(tag));
        delivery
    }

    #[test]
    fn g3_a_position_that_names_a_message_is_remembered_by_it() {
        let refusals = Refusals::new(true);
        assert_eq!(refusals.refused(&delivery(7, None), true), 1);
        assert_eq!(refusals.refused(&delivery(7, None), true), 2);
        assert!(refusals.owes_dead_letter(&delivery(7, None)));
        assert!(!refusals.owes_dead_letter(&delivery(8, None)));
        refusals.confirmed(&delivery(7, None));
        assert!(!refusals.owes_dead_letter(&delivery(7, None)));
    }

    #[test]
    fn g3_a_delivery_tag_never_names_a_message_only_its_id_does() {
        let refusals = Refusals::new(false);
        // Tag 7 on one channel, refused: the same tag on another names another message.
        assert_eq!(refusals.refused(&delivery(7, None), true), 1);
        assert!(!refusals.owes_dead_letter(&delivery(7, None)));
        assert_eq!(
            refusals.refused(&delivery(7, None), true),
            1,
            "nothing kept"
        );
        // With an id, the message is known again under any tag.
        assert_eq!(refusals.refused(&delivery(7, Some("m-1")), true), 1);
        assert_eq!(refusals.refused(&delivery(12, Some("m-1")), true), 2);
        assert!(refusals.owes_dead_letter(&delivery(3, Some("m-1"))));
        assert!(!refusals.owes_dead_letter(&delivery(7, Some("m-2"))));
    }

    #[test]
    fn g3_without_a_name_the_brokers_count_past_the_cap_says_how_many_in_a_row() {
        let refusals = Refusals::new(false);
        let at = |number| {
            let mut d = delivery(1, None);
            d.set_attempt(ruststream_core::Attempt::from_broker(number));
            d
        };
        // Capped at 3: its dead letter refused at 3, then as it comes back at 4 and 5.
        let counts: Vec<u32> = (3..=5)
            .map(|n| refusals.in_a_row(&at(n), true, Some(3)))
            .collect();
        assert_eq!(counts, vec![1, 2, 3]);
        assert_eq!(refusals.in_a_row(&at(5), false, Some(3)), 1, "a retry copy");
    }
}
