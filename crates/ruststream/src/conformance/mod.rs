//! One behaviour suite for every transport (feature `conformance`).
//!
//! A transport's tests implement [`Bed`] for each way it can be used (a subscription type,
//! a commit mode) and invoke [`conformance_tests!`](crate::conformance_tests), which
//! writes one test per scenario below. The scenarios check what the spec promises on
//! every broker, the same way: a round trip keeps payload, headers and key; an ack is
//! never delivered again; a retry under a declaration comes back as the next attempt;
//! `retry_after` comes back no earlier than its delay; at the cap the handler has run
//! exactly `max_attempts` times and exactly one dead letter with the original payload
//! and headers exists; `lanes(n)` keeps per-key order; a stop lets the running handler
//! finish and settles it, and a stop during a backlog fetches no more; `drop()` is final; two members of a group share the work;
//! broken registrations are refused all at once; the retry path follows the capabilities
//! the transport declares on its descriptor (the broker's own count, or the runtime's
//! header-counted copies); `consumers(2)` shares one registration's work in one app. Bad input (an undecodable payload,
//! forged retry counts, empty and large payloads, hostile header values) never crashes
//! the service, loses nothing, and prints a `RELIABILITY|…` line for RELIABILITY.md.

mod bad_input;
mod batches;
mod outcomes;
mod running;
mod scale;
mod support;

use std::future::Future;
use std::time::Duration;

use ruststream_core::Descriptor;

pub use bad_input::{
    e1_undecodable_is_dead_lettered, e1_undecodable_without_a_dead_letter_is_dropped_once,
    e2_a_panic_is_a_failed_attempt, empty_and_large_payloads_arrive_intact,
    forged_retry_counts_end_in_one_dead_letter,
    hostile_headers_arrive_intact_or_are_refused_by_name,
};
pub use batches::{
    batch_failures_retry_every_message, batch_is_cut_by_size_and_by_time,
    batch_keeps_per_key_order, batch_outcomes_settle_each_message_as_alone,
};
pub use outcomes::{
    ack_is_final, d6_at_the_cap_one_dead_letter_says_why, drop_is_final,
    g2_backoff_spaces_every_retry, retry_after_waits, retry_is_the_next_attempt,
    retry_path_follows_the_capabilities, round_trip,
};
pub use running::{
    competing_consumers_share_the_work, e3_a_stop_during_a_backlog_stops_fetching,
    e3_stop_drains_and_settles, e4_broken_registrations_are_all_refused,
    g1_a_hung_handler_is_cancelled_at_its_deadline, g4_unbounded_registrations_are_refused,
    lanes_keep_per_key_order,
};
pub use scale::consumers_share_the_work_in_one_app;

use crate::Publisher;

/// A transport as the suite uses it.
pub trait Bed: Send + Sync + 'static {
    /// Its subscription descriptor.
    type Descriptor: Descriptor;

    /// A new address nobody else uses, ready to be published to and read from.
    fn address(&self) -> impl Future<Output = String> + Send;

    /// A subscription on `address` as group (or subscription) `group`.
    fn subscribe(&self, address: &str, group: &str) -> Self::Descriptor;

    /// A confirmed publisher.
    fn publisher(&self) -> Publisher;

    /// How long a started app may need before it receives what is published (a Kafka
    /// group forming, a Core subscription reaching the server).
    fn warm_up(&self) -> Duration;

    /// Whether the broker carries a message key.
    fn keys(&self) -> bool;

    /// How long an unsettled delivery may take to come back to a new app of the same group
    /// (JetStream: its `ack_wait`). Scenarios that check something is *not* delivered
    /// again wait this long after the new app has read a later message. Default 1 s.
    fn redelivered_within(&self) -> Duration {
        Duration::from_secs(1)
    }

    /// Whether two apps of one group on one address can both receive messages (false
    /// where the address has one partition, or the subscription one active consumer).
    fn shares_one_address(&self) -> bool {
        true
    }

    /// The transport's name in the `RELIABILITY|…` lines the bad-input scenarios print
    /// (collected into RELIABILITY.md by `scripts/reliability`).
    fn label(&self) -> String;
}

/// Writes one `#[tokio::test]` per scenario for the bed `$bed` (an expression, awaited
/// inside each test). `keys` also writes the per-key order scenario.
#[macro_export]
macro_rules! conformance_tests {
    ($bed:expr) => {
        $crate::conformance_tests!(@each $bed; round_trip, ack_is_final, retry_is_the_next_attempt, retry_after_waits, g2_backoff_spaces_every_retry, d6_at_the_cap_one_dead_letter_says_why, e3_stop_drains_and_settles, e3_a_stop_during_a_backlog_stops_fetching, e1_undecodable_is_dead_lettered, e1_undecodable_without_a_dead_letter_is_dropped_once, forged_retry_counts_end_in_one_dead_letter, empty_and_large_payloads_arrive_intact, e2_a_panic_is_a_failed_attempt, drop_is_final, retry_path_follows_the_capabilities, competing_consumers_share_the_work, e4_broken_registrations_are_all_refused, hostile_headers_arrive_intact_or_are_refused_by_name, g4_unbounded_registrations_are_refused, g1_a_hung_handler_is_cancelled_at_its_deadline, batch_outcomes_settle_each_message_as_alone, batch_failures_retry_every_message, batch_is_cut_by_size_and_by_time, consumers_share_the_work_in_one_app);
    };
    ($bed:expr, keys) => {
        $crate::conformance_tests!($bed);
        $crate::conformance_tests!(@each $bed; lanes_keep_per_key_order, batch_keeps_per_key_order);
    };
    (@each $bed:expr; $($scenario:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() {
                $crate::conformance::$scenario($bed.await).await;
            }
        )*
    };
}
