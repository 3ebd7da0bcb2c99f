//! The RabbitMQ descriptor: a queue, its kind, whether to declare it, and the prefetch.

use std::sync::Arc;

use lapin::ExchangeKind;
use lapin::options::{ExchangeDeclareOptions, QueueBindOptions};
use lapin::types::{FieldTable, ShortString};
use ruststream_core::{
    Capabilities, DeadLetters, Declaration, DelayedRedelivery, Descriptor, Publish, SubscribeError,
    Verb,
};

use crate::RabbitMq;
use crate::queue::{QueueKind, declare};
use crate::subscription::RabbitSubscription;

/// How many deliveries the broker sends ahead unacknowledged, unless set.
pub const DEFAULT_PREFETCH: u16 = 256;

/// One queue, read with manual acknowledgements.
#[derive(Clone)]
pub struct RabbitQueue {
    rabbit: RabbitMq,
    queue: String,
    kind: QueueKind,
    declare: bool,
    prefetch: u16,
    bindings: Vec<Binding>,
}

/// An exchange the queue is bound to at start.
#[derive(Debug, Clone)]
struct Binding {
    exchange: String,
    kind: ExchangeKind,
    routing_key: String,
}

impl std::fmt::Debug for RabbitQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RabbitQueue")
            .field("queue", &self.queue)
            .field("kind", &self.kind)
            .finish()
    }
}

impl RabbitQueue {
    pub(crate) fn new(rabbit: RabbitMq, queue: String) -> Self {
        Self {
            rabbit,
            queue,
            kind: QueueKind::Classic,
            declare: false,
            prefetch: DEFAULT_PREFETCH,
            bindings: Vec::new(),
        }
    }

    /// The queue's kind (default [`QueueKind::Classic`]). It must match the queue's
    /// `x-queue-type` on the broker: a quorum queue read as classic would count attempts
    /// twice, so with [`declare`](Self::declare) a mismatch fails the start.
    pub fn kind(mut self, kind: QueueKind) -> Self {
        self.kind = kind;
        self
    }

    /// Declares the queue (durable, of this kind) at start when it is missing; off by
    /// default, when a missing queue fails the start naming it.
    pub fn declare(mut self, declare: bool) -> Self {
        self.declare = declare;
        self
    }

    /// Binds the queue to `exchange` with `routing_key` at start, declaring the exchange
    /// (durable, of `kind`) when missing; call it once per binding. An exchange that
    /// exists with another kind fails the start naming it; the broker's own `amq.*`
    /// exchanges are only checked to exist. The queue must exist by then (or be declared,
    /// [`declare`](Self::declare)).
    pub fn bind(
        mut self,
        exchange: impl Into<String>,
        kind: ExchangeKind,
        routing_key: impl Into<String>,
    ) -> Self {
        self.bindings.push(Binding {
            exchange: exchange.into(),
            kind,
            routing_key: routing_key.into(),
        });
        self
    }

    /// How many deliveries the broker may send ahead unacknowledged (`basic.qos`,
    /// default [`DEFAULT_PREFETCH`]); at least 1.
    pub fn prefetch(mut self, prefetch: u16) -> Self {
        self.prefetch = prefetch;
        self
    }
}

impl Descriptor for RabbitQueue {
    type Subscription = RabbitSubscription;

    fn address(&self) -> &str {
        &self.queue
    }

    fn transport(&self) -> &'static str {
        "rabbitmq"
    }

    fn retry_address(&self) -> Option<&str> {
        Some(&self.queue)
    }

    fn capabilities(&self) -> Capabilities {
        let common = Capabilities::NOTHING
            .with_ack(Verb::Native)
            .with_drop(Verb::Native)
            .with_redeliver(Verb::Native)
            .with_dead_letters(DeadLetters::Runtime)
            // Unacknowledged until the copy or dead letter is confirmed: a crash gives
            // the original back (R5).
            .with_holds_original(true)
            // A delivery tag is its channel's count, not the message's name.
            .with_positions_name_messages(false);
        match self.kind {
            QueueKind::Classic => common
                .with_delayed_redelivery(DelayedRedelivery::Unsupported)
                .with_native_count(false),
            QueueKind::Quorum => common
                .with_delayed_redelivery(DelayedRedelivery::Held { limit: None })
                .with_native_count(true),
        }
    }

    fn check(&self, _declaration: &Declaration) -> Vec<String> {
        let mut broken = Vec::new();
        if self.prefetch == 0 {
            broken.push(
                "prefetch(0) would let the broker send without bound: use at least 1".to_owned(),
            );
        }
        if let Some(rule) = queue_rule(&self.queue) {
            broken.push(rule);
        }
        for binding in &self.bindings {
            if binding.exchange.is_empty() {
                broken.push(
                    "bind(\"\", ..): the default exchange routes by queue name and takes no bindings"
                        .to_owned(),
                );
            } else if binding.exchange.len() > 255 {
                broken.push(format!(
                    "the exchange name `{}…` is over 255 bytes",
                    &binding.exchange[..32]
                ));
            }
        }
        broken
    }

    fn address_rule(&self, address: &str) -> Option<String> {
        queue_rule(address)
    }

    fn publisher(&self) -> Arc<dyn Publish> {
        Arc::new(self.rabbit.publisher())
    }

    fn describe(&self) -> ruststream_core::Described {
        let mut described = self
            .rabbit
            .publisher()
            .describe()
            .setting("queue-type", format!("{:?}", self.kind).to_lowercase())
            .setting("prefetch", self.prefetch.to_string());
        for binding in &self.bindings {
            described = described.setting(
                "bound-to",
                format!("{} ({})", binding.exchange, binding.routing_key),
            );
        }
        described.queue = Some(self.queue.clone());
        described
    }

    /// The dead-letter queue, read with `basic.get` and acknowledged once replayed.
    async fn dead_letters(
        &self,
        address: &str,
    ) -> Result<Box<dyn ruststream_core::LetterBox>, String> {
        Ok(Box::new(
            crate::letters::RabbitLetters::open(&self.rabbit.link, address).await?,
        ))
    }

    /// The broker answers and, unless the queue is declared at start, has it (a
    /// passive declare on a channel of its own).
    async fn verify(&self) -> Result<(), String> {
        let connection = self
            .rabbit
            .link
            .connected()
            .await
            .map_err(|e| e.to_string())?;
        if self.declare {
            return Ok(());
        }
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| e.to_string())?;
        let passive = lapin::options::QueueDeclareOptions {
            passive: true,
            ..Default::default()
        };
        let declared = channel
            .queue_declare(self.queue.as_str().into(), passive, Default::default())
            .await;
        let _ = channel.close(200, "checked".into()).await;
        declared
            .map(drop)
            .map_err(|e| format!("RabbitMQ queue `{}`: {e}", self.queue))
    }

    async fn open(self, declaration: &Declaration) -> Result<RabbitSubscription, SubscribeError> {
        let connection = self
            .rabbit
            .link
            .connected()
            .await
            .map_err(|e| SubscribeError::new(&self.queue, e))?;
        let version = match self.kind {
            QueueKind::Quorum => self.rabbit.link.server_version().await,
            QueueKind::Classic => None,
        };
        declare(&connection, &self.queue, self.kind, self.declare, version).await?;
        if !self.bindings.is_empty() {
            bind(&connection, &self.queue, &self.bindings).await?;
        }
        if !self.declare {
            // Declaring checked the kind already (R6).
            crate::probe::check_kind(&connection, &self.queue, self.kind).await?;
        }
        if self.kind == QueueKind::Quorum {
            crate::probe::check_delivery_limit(&connection, &self.queue, declaration, version)
                .await?;
        }
        // What the broker sends ahead is held by the service as surely as what runs: it
        // counts toward max_in_flight (G5), so the broker sends no more than that.
        let bound = declaration.max_in_flight.unwrap_or(usize::MAX);
        let prefetch = self
            .prefetch
            .min(u16::try_from(bound).unwrap_or(u16::MAX))
            .max(1);
        RabbitSubscription::open(
            Arc::clone(&self.rabbit.link),
            &self.queue,
            prefetch,
            self.kind == QueueKind::Quorum,
        )
        .await
    }
}

/// Declares each binding's exchange (only checks `amq.*` ones) and binds `queue` to it, on
/// a channel of its own.
async fn bind(
    connection: &lapin::Connection,
    queue: &str,
    bindings: &[Binding],
) -> Result<(), SubscribeError> {
    let channel = connection
        .create_channel()
        .await
        .map_err(|e| SubscribeError::new(queue, e))?;
    for binding in bindings {
        let exchange = binding.exchange.as_str();
        let options = ExchangeDeclareOptions {
            passive: exchange.starts_with("amq."),
            durable: true,
            ..ExchangeDeclareOptions::default()
        };
        channel
            .exchange_declare(
                ShortString::from(exchange),
                binding.kind.clone(),
                options,
                FieldTable::default(),
            )
            .await
            .map_err(|e| {
                SubscribeError::new(
                    queue,
                    format!(
                        "declaring exchange `{exchange}` ({:?}, durable): {e}",
                        binding.kind
                    ),
                )
            })?;
        channel
            .queue_bind(
                ShortString::from(queue),
                ShortString::from(exchange),
                ShortString::from(binding.routing_key.as_str()),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| {
                SubscribeError::new(
                    queue,
                    format!(
                        "binding to exchange `{exchange}` with key `{}`: {e}",
                        binding.routing_key
                    ),
                )
            })?;
    }
    let _ = channel.close(200, ShortString::from("bound")).await;
    Ok(())
}

/// Why `queue` is not a queue name a publish can reach, or `None`.
fn queue_rule(queue: &str) -> Option<String> {
    if queue.is_empty() {
        return Some("a RabbitMQ queue name is not empty".to_owned());
    }
    if queue.len() > 255 {
        return Some("a RabbitMQ queue name is at most 255 bytes".to_owned());
    }
    if queue.starts_with("amq.") {
        return Some("names starting with `amq.` are reserved by RabbitMQ".to_owned());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::queue_rule;

    #[test]
    fn g4_queue_names_follow_the_brokers_rules() {
        assert_eq!(queue_rule("orders.dead"), None);
        for bad in ["", "amq.gen-1"] {
            assert!(queue_rule(bad).is_some(), "{bad:?}");
        }
        assert!(queue_rule(&"q".repeat(256)).is_some());
    }
}
