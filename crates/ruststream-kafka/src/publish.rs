//! Producing records, confirmed by their delivery report.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::context::KafkaContext;
use bytes::Bytes;
use rdkafka::config::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use ruststream_core::{BoxFuture, Headers, Outgoing, Publish, PublishError, PublishErrorKind};

/// How long a record may wait for its delivery report: past it the publish fails
/// (`PublishErrorKind::Timeout`), also while the cluster is away. It is librdkafka's
/// `message.timeout.ms` (300 s of its own) on the producers this crate makes, unless
/// the settings given to `Kafka::with_settings` name it or `delivery.timeout.ms`.
pub const DELIVERY_TIMEOUT: Duration = Duration::from_secs(30);

/// Sets [`DELIVERY_TIMEOUT`] on a producer's `config`, unless `settings` set it.
pub(crate) fn bound_delivery(config: &mut ClientConfig, settings: &BTreeMap<String, String>) {
    if !settings.contains_key("message.timeout.ms") && !settings.contains_key("delivery.timeout.ms")
    {
        config.set(
            "message.timeout.ms",
            DELIVERY_TIMEOUT.as_millis().to_string(),
        );
    }
}

/// Produces records and waits for the broker's delivery report. Cheap to clone.
#[derive(Clone)]
pub struct KafkaPublisher {
    producer: Arc<FutureProducer<KafkaContext>>,
    brokers: Arc<str>,
}

impl std::fmt::Debug for KafkaPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KafkaPublisher")
    }
}

/// The partition a record goes to, as an option of a published message
/// (`Outgoing::extras`, `PublishBuilder::with`); without it, the partitioner picks one by
/// the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Partition(pub i32);

/// Where a produced record landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Landed {
    /// Its partition.
    pub partition: i32,
    /// Its offset.
    pub offset: i64,
}

impl KafkaPublisher {
    pub(crate) fn new(producer: Arc<FutureProducer<KafkaContext>>, brokers: Arc<str>) -> Self {
        Self { producer, brokers }
    }

    /// Produces one record (to `partition`, or by key when `None`) and waits for its
    /// delivery report.
    pub async fn send(
        &self,
        topic: &str,
        key: Option<&[u8]>,
        headers: &Headers,
        payload: &[u8],
        partition: Option<i32>,
    ) -> Result<Landed, PublishError> {
        let record = record(topic, key, headers, payload, partition);
        match self.producer.send(record, DELIVERY_TIMEOUT).await {
            Ok(delivery) => Ok(Landed {
                partition: delivery.partition,
                offset: delivery.offset,
            }),
            Err((error, _)) => Err(PublishError::new(topic, kind(&error), error)),
        }
    }

    /// The underlying producer.
    pub fn producer(&self) -> &FutureProducer<KafkaContext> {
        &self.producer
    }
}

/// The record of one message (to `partition`, or by key when `None`).
fn record<'a>(
    topic: &'a str,
    key: Option<&'a [u8]>,
    headers: &Headers,
    payload: &'a [u8],
    partition: Option<i32>,
) -> FutureRecord<'a, [u8], [u8]> {
    let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic).payload(payload);
    if let Some(key) = key {
        record = record.key(key);
    }
    if let Some(partition) = partition {
        record = record.partition(partition);
    }
    if !headers.is_empty() {
        record = record.headers(to_kafka(headers));
    }
    record
}

/// The record of `message`.
fn record_of(message: &Outgoing) -> FutureRecord<'_, [u8], [u8]> {
    let partition = message.extras.get::<Partition>().map(|p| p.0);
    record(
        &message.address,
        message.key.as_deref(),
        &message.headers,
        &message.payload,
        partition,
    )
}

/// What a failed produce was (SPEC G3): the broker's or librdkafka's refusal of this
/// record or topic is permanent; a timeout or a lost connection is transient.
pub(crate) fn kind(error: &rdkafka::error::KafkaError) -> PublishErrorKind {
    use rdkafka::types::RDKafkaErrorCode as Code;
    match error.rdkafka_error_code() {
        Some(Code::MessageTimedOut | Code::RequestTimedOut | Code::QueueFull) => {
            PublishErrorKind::Timeout
        }
        Some(Code::AllBrokersDown | Code::BrokerTransportFailure | Code::NotEnoughReplicas) => {
            PublishErrorKind::Disconnected
        }
        Some(Code::MessageSizeTooLarge | Code::MessageBatchTooLarge) => PublishErrorKind::TooLarge,
        Some(Code::UnknownTopicOrPartition | Code::UnknownTopic | Code::InvalidTopic) => {
            PublishErrorKind::NoSuchAddress
        }
        Some(Code::TopicAuthorizationFailed | Code::ClusterAuthorizationFailed) => {
            PublishErrorKind::NotAuthorized
        }
        _ => PublishErrorKind::Rejected,
    }
}

pub(crate) fn to_kafka(headers: &Headers) -> OwnedHeaders {
    headers.iter().fold(
        OwnedHeaders::new_with_capacity(headers.len()),
        |h, (key, value)| {
            h.insert(Header {
                key,
                value: Some(value.as_ref()),
            })
        },
    )
}

impl Publish for KafkaPublisher {
    fn publish(&self, message: Outgoing) -> BoxFuture<'_, Result<(), PublishError>> {
        Box::pin(async move {
            let key: Option<&Bytes> = message.key.as_ref();
            let partition = message.extras.get::<Partition>().map(|p| p.0);
            self.send(
                &message.address,
                key.map(|k| k.as_ref()),
                &message.headers,
                &message.payload,
                partition,
            )
            .await
            .map(drop)
        })
    }

    fn describe(&self) -> ruststream_core::Described {
        ruststream_core::Described::new("kafka", &self.brokers)
    }

    /// Every record handed to librdkafka as it comes, then the delivery reports awaited
    /// together. A full producer queue waits for the reports of what is queued, then
    /// tries the record once more. A message is let go once librdkafka has its copy;
    /// only its address (an `Arc`, shared by messages to one topic) waits with its report.
    fn publish_all<'a>(
        &'a self,
        messages: Box<dyn Iterator<Item = Outgoing> + Send + 'a>,
    ) -> BoxFuture<'a, Vec<Result<(), PublishError>>> {
        Box::pin(async move {
            let mut results: Vec<Result<(), PublishError>> =
                Vec::with_capacity(messages.size_hint().0);
            let mut queued = Vec::with_capacity(messages.size_hint().0);
            for message in messages {
                let i = results.len();
                let mut sent = self.producer.send_result(record_of(&message));
                if let Err((e, _)) = &sent
                    && e.rdkafka_error_code() == Some(rdkafka::types::RDKafkaErrorCode::QueueFull)
                {
                    reported(&mut results, queued.drain(..)).await;
                    sent = self.producer.send_result(record_of(&message));
                }
                match sent {
                    Ok(report) => {
                        queued.push((i, Arc::clone(&message.address), report));
                        results.push(Ok(()));
                    }
                    Err((e, _)) => {
                        results.push(Err(PublishError::new(&message.address, kind(&e), e)))
                    }
                }
            }
            reported(&mut results, queued.into_iter()).await;
            results
        })
    }
}

/// Awaits the delivery reports of `queued` (index, address, report), writing failures
/// into `results`.
async fn reported(
    results: &mut [Result<(), PublishError>],
    queued: impl Iterator<Item = (usize, Arc<str>, rdkafka::producer::DeliveryFuture)>,
) {
    for (i, address, report) in queued {
        results[i] = match report.await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err((e, _))) => Err(PublishError::new(&address, kind(&e), e)),
            Err(_) => Err(PublishError::new(
                &*address,
                PublishErrorKind::Disconnected,
                "the producer went away before the delivery report",
            )),
        };
    }
}
