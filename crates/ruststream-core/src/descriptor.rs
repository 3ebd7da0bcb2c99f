//! The two traits a transport implements: a subscription descriptor and the open
//! subscription its driver task reads and settles.

use std::future::Future;
use std::sync::Arc;

use crate::capabilities::Capabilities;
use crate::declaration::Declaration;
use crate::delivery::Delivery;
use crate::error::{AckError, SubscribeError};
use crate::plan::Settle;
use crate::publish::Publish;

/// A subscription descriptor bound to its broker: what to read, and what the broker can
/// do for it. The runtime validates registrations against it, then opens it.
pub trait Descriptor: Send + 'static {
    /// The open subscription.
    type Subscription: Subscription;

    /// The address read, for logs and errors (a topic, a subject, a pattern).
    fn address(&self) -> &str;

    /// The single address a retry copy is published to, or `None` when the descriptor
    /// reads a set no single publish reaches (then the registration must name one).
    fn retry_address(&self) -> Option<&str>;

    /// What the broker can do for this subscription.
    fn capabilities(&self) -> Capabilities;

    /// Transport-specific rules a registration's declaration must keep (Pulsar: cap and
    /// dead letter go together). Each returned string is one broken rule.
    fn check(&self, declaration: &Declaration) -> Vec<String> {
        let _ = declaration;
        Vec::new()
    }

    /// The broker's confirmed publish, used for retry copies and dead letters.
    fn publisher(&self) -> Arc<dyn Publish>;

    /// Opens the subscription (missing streams, unknown topics... are errors here).
    fn open(
        self,
        declaration: &Declaration,
    ) -> impl Future<Output = Result<Self::Subscription, SubscribeError>> + Send;
}

/// An open subscription. Exactly one task, the subscription's driver, calls it.
pub trait Subscription: Send + 'static {
    /// What the transport needs to settle one delivery (an ack subject, a partition and
    /// offset, a message id).
    type Receipt: Send + 'static;

    /// The next delivery; `None` once the subscription is closed for good. Must be
    /// cancel safe: the driver drops it unfinished to settle or to stop.
    fn next(
        &mut self,
    ) -> impl Future<Output = Option<Result<(Delivery, Self::Receipt), SubscribeError>>> + Send;

    /// Performs one settlement on the broker.
    fn settle(
        &mut self,
        receipt: Self::Receipt,
        settle: Settle,
    ) -> impl Future<Output = Result<(), AckError>> + Send;

    /// The delivery waits, unsettled, for its delayed retry copy (a runtime timer): it is
    /// not running any more (Kafka's transactional windows need not wait for it).
    fn parked(&mut self, receipt: &Self::Receipt) {
        let _ = receipt;
    }

    /// Stops fetching and closes the consumer. Deliveries not settled by now come back
    /// as the broker's rules say.
    fn close(self) -> impl Future<Output = ()> + Send;
}
