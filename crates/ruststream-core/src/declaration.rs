//! What a registration declares about retries, resolved against its descriptor.

use std::sync::Arc;
use std::time::Duration;

/// A registration's retry declaration, with the retry address already resolved
/// (the registration's own destination, else the descriptor's single address).
///
/// Made from `Declaration::default()` with its fields set, so a field added later
/// breaks no one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Declaration {
    /// The cap: the attempt at which a retry becomes a dead letter (first delivery is 1).
    pub max_attempts: Option<u32>,
    /// Where exhausted (and, by default, undecodable) deliveries go.
    pub dead_letter: Option<Arc<str>>,
    /// Where retry copies go.
    pub retry_address: Option<Arc<str>>,
    /// The handler deadline (SPEC G1), once the app resolved it: a transport that keeps
    /// a running delivery alive (JetStream `+WPI`) stops doing so past it.
    pub handler_timeout: Option<Duration>,
    /// How many deliveries the subscription may hold at once (SPEC G5), once the app
    /// resolved it: a transport whose client buffers what the broker sends ahead
    /// (RabbitMQ's prefetch) sends no more ahead than this.
    pub max_in_flight: Option<usize>,
    /// How many consumers the registration opens on this subscription, each with its own
    /// driver (`consumers(n)`; 0 reads as 1). `max_in_flight` is each one's.
    pub consumers: usize,
    /// Which of them this one is, from 0 (set for each `Descriptor::open`): a transport
    /// that names its consumers (Redis) tells them apart by it.
    pub consumer: usize,
}

impl Declaration {
    /// True when the registration declares a cap or a dead letter, which puts `retry()`
    /// on the runtime retry path for brokers that count nothing.
    pub fn declares_retries(&self) -> bool {
        self.max_attempts.is_some() || self.dead_letter.is_some()
    }

    /// How many consumers the registration opens, at least 1.
    pub fn consumer_count(&self) -> usize {
        self.consumers.max(1)
    }
}
