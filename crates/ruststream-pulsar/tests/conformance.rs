//! The behaviour suite on Pulsar Shared, KeyShared, Exclusive and Failover
//! subscriptions, against pulsar-lite (through the test relay).

mod common;

use std::time::Duration;

use common::{pulsar, unique};
use ruststream::Publisher;
use ruststream::conformance::Bed;
use ruststream_pulsar::pulsar::ConsumerOptions;
use ruststream_pulsar::pulsar::consumer::InitialPosition;
use ruststream_pulsar::{Pulsar, PulsarTopic, SubType};

struct Topics {
    pulsar: Pulsar,
    sub_type: SubType,
}

impl Bed for Topics {
    type Descriptor = PulsarTopic;

    async fn address(&self) -> String {
        unique("suite")
    }

    fn subscribe(&self, address: &str, group: &str) -> PulsarTopic {
        self.pulsar
            .topic(address)
            .subscription(group)
            .subscription_type(self.sub_type)
            .options(ConsumerOptions::default().with_initial_position(InitialPosition::Earliest))
    }

    fn publisher(&self) -> Publisher {
        Publisher::new(std::sync::Arc::new(self.pulsar.publisher()))
    }

    fn warm_up(&self) -> Duration {
        Duration::from_millis(200)
    }

    fn keys(&self) -> bool {
        true
    }

    fn shares_one_address(&self) -> bool {
        matches!(self.sub_type, SubType::Shared | SubType::KeyShared)
    }

    fn label(&self) -> String {
        format!("Pulsar {:?}", self.sub_type)
    }
}

mod shared {
    async fn bed() -> super::Topics {
        super::Topics {
            pulsar: super::pulsar().await,
            sub_type: super::SubType::Shared,
        }
    }
    ruststream::conformance_tests!(bed(), keys);
}

/// Every scenario but the three that retry up to the cap: pulsar-lite's KeyShared
/// dispatcher redelivers a message once after a negative acknowledgement, but not a
/// second time, so the third attempt never comes (on Shared it does; `p5_…` in
/// `pulsar.rs` checks the cap there).
mod key_shared {
    async fn bed() -> super::Topics {
        super::Topics {
            pulsar: super::pulsar().await,
            sub_type: super::SubType::KeyShared,
        }
    }
    ruststream::conformance_tests!(@each bed();
        round_trip, ack_is_final, retry_is_the_next_attempt, retry_after_waits,
        e3_stop_drains_and_settles, lanes_keep_per_key_order, e1_undecodable_is_dead_lettered,
        e1_undecodable_without_a_dead_letter_is_dropped_once,
        empty_and_large_payloads_arrive_intact, e2_a_panic_is_a_failed_attempt, drop_is_final,
        competing_consumers_share_the_work, e4_broken_registrations_are_all_refused,
        g4_unbounded_registrations_are_refused, g1_a_hung_handler_is_cancelled_at_its_deadline);
}

/// The scenarios that neither retry nor cap: Exclusive and Failover count no attempts (P4)
/// and refuse a cap (P6), and pulsar-lite does not act on a nack on them; `pulsar.rs`
/// checks P4 and P6 there.
mod exclusive {
    async fn bed() -> super::Topics {
        super::Topics {
            pulsar: super::pulsar().await,
            sub_type: super::SubType::Exclusive,
        }
    }
    ruststream::conformance_tests!(@each bed();
        round_trip, ack_is_final, e3_stop_drains_and_settles, lanes_keep_per_key_order,
        e1_undecodable_without_a_dead_letter_is_dropped_once,
        empty_and_large_payloads_arrive_intact, e4_broken_registrations_are_all_refused,
        g4_unbounded_registrations_are_refused);
}

/// As for Exclusive.
mod failover {
    async fn bed() -> super::Topics {
        super::Topics {
            pulsar: super::pulsar().await,
            sub_type: super::SubType::Failover,
        }
    }
    ruststream::conformance_tests!(@each bed();
        round_trip, ack_is_final, e3_stop_drains_and_settles, lanes_keep_per_key_order,
        e1_undecodable_without_a_dead_letter_is_dropped_once,
        empty_and_large_payloads_arrive_intact, e4_broken_registrations_are_all_refused,
        g4_unbounded_registrations_are_refused);
}
