//! The Pulsar descriptor: topics, a subscription name and type, an ack timeout.

use std::sync::Arc;
use std::time::Duration;

use pulsar::consumer::{ConsumerOptions, DeadLetterPolicy, InitialPosition};
use ruststream_core::{
    Capabilities, DeadLetters, Declaration, DelayedRedelivery, Descriptor, Publish, StartAt,
    SubscribeError, Verb,
};

use crate::subscription::PulsarSubscription;
use crate::{Pulsar, SubType};

/// Topics read through one subscription of a given type.
#[derive(Clone)]
pub struct PulsarTopic {
    pulsar: Pulsar,
    topics: Vec<String>,
    address: String,
    subscription: String,
    sub_type: SubType,
    ack_timeout: Option<Duration>,
    longest_delay: Option<Duration>,
    options: ConsumerOptions,
    start_at: StartAt,
}

impl std::fmt::Debug for PulsarTopic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PulsarTopic")
            .field("topics", &self.topics)
            .field("subscription", &self.subscription)
            .field("sub_type", &self.sub_type)
            .finish()
    }
}

impl PulsarTopic {
    pub(crate) fn new(pulsar: Pulsar, topics: Vec<String>) -> Self {
        Self {
            pulsar,
            address: topics.join(","),
            topics,
            subscription: String::new(),
            sub_type: SubType::Shared,
            ack_timeout: None,
            longest_delay: None,
            options: ConsumerOptions::default(),
            start_at: StartAt::Earliest,
        }
    }

    /// The subscription name (required).
    pub fn subscription(mut self, name: impl Into<String>) -> Self {
        self.subscription = name.into();
        self
    }

    /// The subscription type (default Shared).
    pub fn subscription_type(mut self, sub_type: SubType) -> Self {
        self.sub_type = sub_type;
        self
    }

    /// The client's ack timeout: an unsettled delivery comes back after it. Without one a
    /// delivery comes back only when the consumer disconnects.
    pub fn ack_timeout(mut self, timeout: Duration) -> Self {
        self.ack_timeout = Some(timeout);
        self
    }

    /// The longest `retry_after` the handler returns: checked against the ack timeout at
    /// startup (SPEC P2).
    pub fn longest_delay(mut self, delay: Duration) -> Self {
        self.longest_delay = Some(delay);
        self
    }

    /// Where a new subscription starts (default [`StartAt::Earliest`], where the
    /// client's own default is latest); an existing subscription resumes from its
    /// cursor (SPEC G8). `StartAt::Time` is refused at start.
    pub fn start_at(mut self, start: StartAt) -> Self {
        self.start_at = start;
        self
    }

    /// Consumer options passed to the client (their `initial_position` is replaced by
    /// [`start_at`](Self::start_at)).
    pub fn options(mut self, options: ConsumerOptions) -> Self {
        self.options = options;
        self
    }

    fn counts(&self) -> bool {
        matches!(self.sub_type, SubType::Shared | SubType::KeyShared)
    }
}

impl Descriptor for PulsarTopic {
    type Subscription = PulsarSubscription;

    fn address(&self) -> &str {
        &self.address
    }

    fn transport(&self) -> &'static str {
        "pulsar"
    }

    fn retry_address(&self) -> Option<&str> {
        // Never needed: the broker redelivers the same message; nothing is copied.
        None
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::NOTHING
            .with_ack(Verb::Native)
            .with_drop(Verb::AsAck)
            .with_redeliver(Verb::Native)
            .with_delayed_redelivery(DelayedRedelivery::Held {
                limit: self.ack_timeout,
            })
            .with_native_count(self.counts())
            .with_dead_letters(DeadLetters::Broker)
            .with_holds_original(true)
            .with_redeliver_in_place(false)
            .with_rewinds(false)
    }

    fn reads(&self, address: &str) -> bool {
        let wanted = full_name(address);
        self.topics.iter().any(|t| full_name(t) == wanted)
    }

    fn address_rule(&self, address: &str) -> Option<String> {
        topic_rule(address)
    }

    fn check(&self, declaration: &Declaration) -> Vec<String> {
        let mut broken = Vec::new();
        if self.subscription.is_empty() {
            broken.push("a Pulsar subscription needs a name: .subscription(name)".to_owned());
        }
        match (declaration.max_attempts, &declaration.dead_letter) {
            (Some(_), None) => broken.push(
                "max_attempts without a dead letter: on Pulsar the two form the client's dead-letter policy and go together"
                    .to_owned(),
            ),
            (None, Some(_)) => broken.push(
                "a dead letter without max_attempts: on Pulsar the two form the client's dead-letter policy and go together"
                    .to_owned(),
            ),
            _ => {}
        }
        if declaration.declares_retries() && !self.counts() {
            broken.push(format!(
                "a cap on a {:?} subscription: it counts no redeliveries (every message arrives with count 0); use Shared or KeyShared",
                self.sub_type
            ));
        }
        let consumers = declaration.consumer_count();
        if consumers > 1 && !self.counts() {
            broken.push(format!(
                "consumers({consumers}) on a {:?} subscription: only one of its consumers \
                 receives messages at a time; use Shared or KeyShared",
                self.sub_type
            ));
        }
        if let StartAt::Time(_) = self.start_at {
            broken.push(
                "start_at(StartAt::Time(..)) is refused on Pulsar: a real broker can seek a subscription to a time, but on the broker ruststream is tested on (pulsar-lite) a seek by time does not redeliver to the consumer that asked, so it cannot be shown to work; a new subscription starts at the earliest or the latest message".to_owned(),
            );
        }
        if let (Some(delay), Some(timeout)) = (self.longest_delay, self.ack_timeout)
            && delay >= timeout
        {
            broken.push(format!(
                "longest retry_after {delay:?} is not shorter than ack_timeout {timeout:?}: the client's timer would bring the message back first"
            ));
        }
        broken
    }

    fn publisher(&self) -> Arc<dyn Publish> {
        Arc::new(self.pulsar.publisher())
    }

    fn describe(&self) -> ruststream_core::Described {
        self.pulsar
            .publisher()
            .describe()
            .group(&self.subscription)
            .setting("subscription-type", format!("{:?}", self.sub_type))
    }

    /// The dead-letter topic, read by the subscription `ruststream-dead-letters`.
    async fn dead_letters(
        &self,
        address: &str,
    ) -> Result<Box<dyn ruststream_core::LetterBox>, String> {
        Ok(Box::new(
            crate::letters::PulsarLetters::open(&self.pulsar, address).await?,
        ))
    }

    /// A lookup of each topic answers (the broker that owns it).
    async fn verify(&self) -> Result<(), String> {
        for topic in &self.topics {
            let lookup = self.pulsar.client().lookup_topic(topic.clone());
            match tokio::time::timeout(Duration::from_secs(5), lookup).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(format!("Pulsar topic `{topic}`: {e}")),
                Err(_) => return Err(format!("Pulsar did not answer within 5s about `{topic}`")),
            }
        }
        Ok(())
    }

    async fn open(self, declaration: &Declaration) -> Result<PulsarSubscription, SubscribeError> {
        let mut builder = self
            .pulsar
            .client
            .consumer()
            .with_topics(&self.topics)
            .with_subscription(&self.subscription)
            .with_subscription_type(self.sub_type)
            .with_options(ConsumerOptions {
                initial_position: match self.start_at {
                    StartAt::Latest => InitialPosition::Latest,
                    _ => InitialPosition::Earliest,
                },
                ..self.options.clone()
            })
            .with_unacked_message_resend_delay(self.ack_timeout);
        if let (Some(max), Some(topic)) = (declaration.max_attempts, &declaration.dead_letter) {
            builder = builder.with_dead_letter_policy(DeadLetterPolicy {
                max_redeliver_count: max as usize,
                dead_letter_topic: topic.to_string(),
            });
        }
        let consumer = builder
            .clone()
            .with_consumer_id(crate::subscription::consumer_id())
            .build::<Vec<u8>>()
            .await
            .map_err(|e| SubscribeError::new(&self.address, e))?;
        Ok(PulsarSubscription::new(
            consumer,
            builder,
            &self.address,
            self.counts(),
            declaration.max_attempts,
        ))
    }
}

/// A topic name as the broker resolves it: `orders` is
/// `persistent://public/default/orders`.
fn full_name(topic: &str) -> String {
    if topic.contains("://") {
        topic.to_owned()
    } else if topic.matches('/').count() == 2 {
        format!("persistent://{topic}")
    } else {
        format!("persistent://public/default/{topic}")
    }
}

/// Why `topic` is not a Pulsar topic name a producer can use, or `None`.
fn topic_rule(topic: &str) -> Option<String> {
    if topic.is_empty() || topic.contains(char::is_whitespace) {
        return Some("a Pulsar topic name is not empty and holds no whitespace".to_owned());
    }
    let full = full_name(topic);
    let Some((scheme, path)) = full.split_once("://") else {
        return Some("not a Pulsar topic name".to_owned());
    };
    if scheme != "persistent" && scheme != "non-persistent" {
        return Some(format!(
            "`{scheme}://` is neither persistent:// nor non-persistent://"
        ));
    }
    let parts: Vec<&str> = path.split('/').collect();
    if parts.len() != 3 || parts.iter().any(|p| p.is_empty()) {
        return Some("a Pulsar topic is `name`, `tenant/namespace/name` or `persistent://tenant/namespace/name`".to_owned());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn g4_pulsar_names_resolve_like_the_broker() {
        assert_eq!(full_name("orders"), "persistent://public/default/orders");
        assert_eq!(full_name("t/ns/orders"), "persistent://t/ns/orders");
        assert_eq!(topic_rule("orders-dead"), None);
        assert_eq!(topic_rule("persistent://public/default/orders-dead"), None);
        for bad in ["", "a b", "ftp://x/y/z", "a/b", "persistent://a//c"] {
            assert!(topic_rule(bad).is_some(), "{bad:?}");
        }
    }
}
