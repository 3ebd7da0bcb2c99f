//! Where a new group, consumer or subscription starts reading (SPEC G8).

use std::time::SystemTime;

/// Where a subscription that has never read its address before starts: a new Kafka
/// group, JetStream durable consumer or Pulsar subscription. A subscription that exists
/// resumes where it left off, whatever this says. The default is the same on every
/// broker: [`StartAt::Earliest`], so nothing produced before the first deploy is skipped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum StartAt {
    /// The oldest message the broker still keeps.
    #[default]
    Earliest,
    /// Only messages produced after the subscription is created.
    Latest,
    /// The first message stored at or after this time, where ruststream can show it
    /// works (JetStream, Redis); on Kafka and Pulsar the app refuses to start, saying why.
    Time(SystemTime),
}
