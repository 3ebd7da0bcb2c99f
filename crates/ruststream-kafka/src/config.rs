//! Commit modes and the client settings a subscription passes to librdkafka.

use std::collections::BTreeMap;

use ruststream_core::{Capabilities, DeadLetters, DelayedRedelivery, Verb};

/// How a subscription's handler outcomes reach the group's committed offsets (SPEC K1).
#[derive(Debug, Clone, Default)]
pub enum Commit {
    /// librdkafka stores each offset when it hands the record over and its timer commits
    /// it. `ack` and `drop` do nothing; `retry()` without a declaration is
    /// `AckError::Unsupported`: nothing brings the record back (K2). A crash after a record
    /// was handed over and before it was handled loses it.
    #[default]
    Auto,
    /// The automatic offset store is off; every delivered offset is tracked and the stored
    /// position never passes a record still running (K3). `retry()` delivers the record
    /// again ahead of what is fetched next (K4).
    Tracked,
    /// The consumer commits nothing itself: the [`EosPipeline`] it holds commits the
    /// subscription's settled positions together with the records its handlers produced,
    /// one window per `commit_interval` (K6). `retry()` aborts the open window, which is
    /// read again. The pipeline is part of the mode, so a transactional subscription
    /// without one cannot be written:
    ///
    /// ```compile_fail
    /// # use ruststream_kafka::Commit;
    /// let commit = Commit::Transactional; // no pipeline
    /// # let _: Commit = commit;
    /// ```
    ///
    /// ```
    /// # use ruststream_kafka::{Commit, EosPipeline, Kafka};
    /// # fn mode(kafka: &Kafka) -> Commit {
    /// let pipeline = EosPipeline::new(kafka, "billing-eos");
    /// Commit::Transactional(pipeline)
    /// # }
    /// ```
    ///
    /// [`EosPipeline`]: crate::EosPipeline
    Transactional(crate::EosPipeline),
}

/// The commit mode without its pipeline: what the subscription's code branches on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Auto,
    Tracked,
    Transactional,
}

/// Auto: nothing to send for ack and drop, no way back for a retry; a record whose copy
/// the broker refused is read again (its offset stored back, the partition sought back).
pub const AUTO_CAPABILITIES: Capabilities = Capabilities::NOTHING
    .with_ack(Verb::Implicit)
    .with_drop(Verb::Implicit)
    .with_redeliver(Verb::Unsupported)
    .with_delayed_redelivery(DelayedRedelivery::Unsupported)
    .with_native_count(false)
    .with_dead_letters(DeadLetters::Runtime)
    .with_holds_original(false)
    .with_redeliver_in_place(false)
    .with_rewinds(true);

/// Tracked: ack and drop store the position, retry redelivers locally, and a delayed
/// copy's original keeps the position waiting until the copy is confirmed.
pub const TRACKED_CAPABILITIES: Capabilities = Capabilities::NOTHING
    .with_ack(Verb::Native)
    .with_drop(Verb::AsAck)
    .with_redeliver(Verb::Native)
    .with_delayed_redelivery(DelayedRedelivery::Unsupported)
    .with_native_count(false)
    .with_dead_letters(DeadLetters::Runtime)
    .with_holds_original(true)
    .with_redeliver_in_place(true)
    .with_rewinds(false);

/// Transactional: settles like Tracked; `retry()` (a `Redeliver`) aborts the open window
/// instead of running the record again in place.
pub const TRANSACTIONAL_CAPABILITIES: Capabilities =
    TRACKED_CAPABILITIES.with_redeliver_in_place(false);

impl Commit {
    /// What the mode can do.
    pub const fn capabilities(&self) -> Capabilities {
        self.mode().capabilities()
    }

    pub(crate) const fn mode(&self) -> Mode {
        match self {
            Commit::Auto => Mode::Auto,
            Commit::Tracked => Mode::Tracked,
            Commit::Transactional(_) => Mode::Transactional,
        }
    }

    /// The pipeline a transactional subscription commits through.
    pub(crate) fn pipeline(&self) -> Option<&crate::EosPipeline> {
        match self {
            Commit::Transactional(pipeline) => Some(pipeline),
            _ => None,
        }
    }
}

impl Mode {
    const fn capabilities(self) -> Capabilities {
        match self {
            Mode::Auto => AUTO_CAPABILITIES,
            Mode::Tracked => TRACKED_CAPABILITIES,
            Mode::Transactional => TRANSACTIONAL_CAPABILITIES,
        }
    }

    /// Whether the subscription tracks offsets (Tracked and Transactional).
    pub(crate) const fn tracks(self) -> bool {
        !matches!(self, Mode::Auto)
    }
}

/// Settings a subscription hands to librdkafka, on top of the connection's.
#[derive(Debug, Clone, Default)]
pub(crate) struct Settings {
    pub(crate) values: BTreeMap<String, String>,
}

impl Settings {
    pub(crate) fn set(&mut self, key: String, value: String) {
        self.values.insert(key, value);
    }

    fn is(&self, key: &str, value: &str) -> bool {
        self.values
            .get(key)
            .is_some_and(|v| v.eq_ignore_ascii_case(value))
    }

    /// Settings that contradict the mode, one sentence each.
    pub(crate) fn contradictions(&self, commit: Mode) -> Vec<String> {
        let mut broken = Vec::new();
        if commit == Mode::Transactional && self.is("enable.auto.commit", "true") {
            broken.push(
                "Commit::Transactional commits offsets in the pipeline's transactions; \
                 enable.auto.commit=true would commit them outside"
                    .to_owned(),
            );
        }
        if commit != Mode::Transactional && self.is("enable.auto.commit", "false") {
            broken.push(format!(
                "Commit::{commit:?} commits through librdkafka's auto-commit timer; \
                 enable.auto.commit=false contradicts it"
            ));
        }
        if self.is("enable.auto.offset.store", "true") {
            broken.push(format!(
                "Commit::{commit:?} stores offsets itself; \
                 enable.auto.offset.store=true would store them behind its back"
            ));
        }
        if self.values.contains_key("group.id") {
            broken.push("set the group with .group(..), not the group.id setting".to_owned());
        }
        broken
    }
}

#[cfg(test)]
mod tests {
    use ruststream_core::Descriptor;

    use super::*;
    use crate::Kafka;

    #[test]
    fn k1_a_subscription_is_auto_unless_told_and_each_mode_declares_its_own_capabilities() {
        assert!(matches!(Commit::default(), Commit::Auto));
        // Connections are lazy: no broker is needed to build descriptors.
        let kafka = Kafka::connect("127.0.0.1:1").expect("a client");
        let topic = || kafka.topic("orders").group("billing");
        assert_eq!(topic().capabilities(), AUTO_CAPABILITIES);
        assert_eq!(
            topic().commit(Commit::Tracked).capabilities(),
            TRACKED_CAPABILITIES
        );
        assert_eq!(
            topic()
                .commit(Commit::Transactional(crate::EosPipeline::new(&kafka, "tx")))
                .capabilities(),
            TRANSACTIONAL_CAPABILITIES
        );
    }
}
