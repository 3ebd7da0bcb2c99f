//! Exactly-once consume-transform-produce: `Commit::Transactional` and [`EosPipeline`]
//! (SPEC K6).
//!
//! The pipeline owns a transactional producer. Time is cut into windows of
//! `commit_interval`; in each window, the records handlers publish through the pipeline
//! and the positions their subscription settles go into one transaction. To close a
//! window the subscription stops handing out records and waits until every record it
//! handed out has settled (a barrier), so a record's outputs and its offset always land
//! in the same transaction. Then it commits (`send_offsets_to_transaction` with the
//! consumer's group metadata, then `commit_transaction`) and opens the next window.
//!
//! A `retry()`, a failed produce, a produce whose report its caller stopped waiting for
//! (it may still land, and a copy is sent again after a timeout) or a partition move
//! makes the open window unable to commit: at the barrier it is aborted at once (not
//! after the transaction timeout), the source partitions are rewound to their last
//! committed positions (a partition the group has committed nothing for yet: to the
//! first record the window read of it) and read again. A record waiting out
//! `retry_after` whose copy was made in the aborted window is read again too.
//! Retry and dead-letter copies are produced through the pipeline too, so an aborted
//! window leaves no orphan copy.
//!
//! What Kafka guarantees: a `read_committed` consumer sees a window's records exactly
//! when the group's offsets for its inputs are committed, and never those of an aborted
//! window. What it does not: a `read_uncommitted` consumer sees every produced record,
//! aborted or not; side effects other than produced records (a database write, an HTTP
//! call) happen again when a window is read again; a delayed retry copy
//! (`retry_after`) is produced in the window open when its timer fires, while its
//! original settles just after, so a crash between the two can produce the copy twice;
//! and while a record waits out `retry_after`, its partition's committed position waits
//! at it (SPEC D2: the record comes back if the process dies), so the records after it
//! on that partition commit their outputs in their own windows but their offsets only
//! once the wait ends: a crash, a stop or a rebalance within the wait reads them again
//! and produces their outputs again. Where outputs must be exactly once, prefer `retry()`
//! (which aborts the window and reads it again) to `retry_after` on this path. (When a
//! window that read the waiting record's partition aborts, or the partition moves, the
//! record is read again and waits again, and the first wait makes no copy.)

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use crate::context::KafkaContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use ruststream_core::{BoxFuture, Outgoing, Publish, PublishError, PublishErrorKind};
use tokio::sync::{RwLock, watch};

use crate::Kafka;
use crate::publish::{DELIVERY_TIMEOUT, to_kafka};

/// How often a pipeline commits a window, unless set.
pub const DEFAULT_COMMIT_INTERVAL: Duration = Duration::from_millis(100);
/// How long one transaction call may take.
pub(crate) const TRANSACTION_TIMEOUT: Duration = Duration::from_secs(30);

/// A transactional producer shared by one `Commit::Transactional` subscription and the
/// handlers it runs. Its id is the producer's `transactional.id`: a second pipeline with
/// the same id fences this one, which then stops its subscription with an error.
#[derive(Clone)]
pub struct EosPipeline {
    pub(crate) shared: Arc<Pipeline>,
}

impl std::fmt::Debug for EosPipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EosPipeline")
            .field("id", &self.shared.id)
            .finish()
    }
}

/// How a window ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowReport {
    /// Windows closed so far by this pipeline, this one included.
    pub number: u64,
    /// Committed, or aborted (and read again).
    pub committed: bool,
    /// The offsets committed with it, `(topic, partition, next offset)`.
    pub offsets: Vec<(String, i32, i64)>,
    /// Records produced in it.
    pub records: u64,
}

pub(crate) struct Pipeline {
    pub(crate) id: String,
    kafka: Kafka,
    pub(crate) commit_interval: Mutex<Duration>,
    pub(crate) producer: OnceLock<Arc<FutureProducer<KafkaContext>>>,
    /// Publishers hold it shared while a record is in flight; closing a window holds it
    /// alone, so no record straddles two transactions.
    pub(crate) gate: Arc<RwLock<()>>,
    /// A produce failed in the open window: it must abort.
    pub(crate) doomed: AtomicBool,
    /// Records produced in the open window.
    pub(crate) records: AtomicU64,
    pub(crate) attached: AtomicBool,
    pub(crate) reports: watch::Sender<Option<WindowReport>>,
}

impl EosPipeline {
    /// A pipeline with transactional id `id` on `kafka`. The producer starts with the
    /// subscription that uses it.
    pub fn new(kafka: &Kafka, id: impl Into<String>) -> Self {
        Self {
            shared: Arc::new(Pipeline {
                id: id.into(),
                kafka: kafka.clone(),
                commit_interval: Mutex::new(DEFAULT_COMMIT_INTERVAL),
                producer: OnceLock::new(),
                gate: Arc::new(RwLock::new(())),
                doomed: AtomicBool::new(false),
                records: AtomicU64::new(0),
                attached: AtomicBool::new(false),
                reports: watch::channel(None).0,
            }),
        }
    }

    /// How often a window is committed (default 100 ms).
    pub fn commit_interval(self, interval: Duration) -> Self {
        *self
            .shared
            .commit_interval
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = interval;
        self
    }

    /// The transactional id.
    pub fn id(&self) -> &str {
        &self.shared.id
    }

    /// Publishes inside the open window (what handlers get as their `Publisher`).
    pub fn publisher(&self) -> EosPublisher {
        EosPublisher {
            pipeline: Arc::clone(&self.shared),
        }
    }

    /// Every closed window, newest last (a watch: slow readers see the latest).
    pub fn reports(&self) -> watch::Receiver<Option<WindowReport>> {
        self.shared.reports.subscribe()
    }
}

impl Pipeline {
    pub(crate) fn interval(&self) -> Duration {
        *self
            .commit_interval
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Creates the transactional producer, fences older producers with the same id, and
    /// opens the first transaction. Blocking: run off the async runtime.
    pub(crate) fn start(&self) -> Result<Arc<FutureProducer<KafkaContext>>, KafkaError> {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", self.kafka.brokers())
            .set("transactional.id", &self.id)
            .set("enable.idempotence", "true");
        crate::publish::bound_delivery(&mut config, self.kafka.settings());
        for (key, value) in self.kafka.settings() {
            config.set(key, value);
        }
        let producer: FutureProducer<KafkaContext> =
            config.create_with_context(self.kafka.context())?;
        producer.init_transactions(TRANSACTION_TIMEOUT)?;
        producer.begin_transaction()?;
        let producer = Arc::new(producer);
        let _ = self.producer.set(Arc::clone(&producer));
        Ok(producer)
    }

    pub(crate) fn report(&self, committed: bool, offsets: Vec<(String, i32, i64)>) {
        let records = self.records.swap(0, Ordering::AcqRel);
        self.reports.send_modify(|last| {
            let number = last.as_ref().map_or(1, |r| r.number + 1);
            *last = Some(WindowReport {
                number,
                committed,
                offsets,
                records,
            });
        });
    }
}

/// Publishes records inside the pipeline's open window, confirmed by their delivery
/// report. A failed produce dooms the window (it aborts and is read again).
#[derive(Clone)]
pub struct EosPublisher {
    pipeline: Arc<Pipeline>,
}

impl std::fmt::Debug for EosPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EosPublisher")
            .field("pipeline", &self.pipeline.id)
            .finish()
    }
}

impl Publish for EosPublisher {
    fn describe(&self) -> ruststream_core::Described {
        ruststream_core::Described::new("kafka", self.pipeline.kafka.brokers())
            .setting("transactional-id", &self.pipeline.id)
    }

    fn publish(&self, message: Outgoing) -> BoxFuture<'_, Result<(), PublishError>> {
        Box::pin(async move {
            let Some(producer) = self.pipeline.producer.get().cloned() else {
                return Err(PublishError::new(
                    &message.address,
                    PublishErrorKind::Rejected,
                    format!("the EosPipeline `{}` has not started", self.pipeline.id),
                ));
            };
            let _window = self.pipeline.gate.read().await;
            let mut record: FutureRecord<'_, [u8], [u8]> =
                FutureRecord::to(&message.address).payload(&message.payload[..]);
            if let Some(key) = &message.key {
                record = record.key(&key[..]);
            }
            if let Some(partition) = message.extras.get::<crate::publish::Partition>() {
                record = record.partition(partition.0);
            }
            let headers: Option<OwnedHeaders> =
                (!message.headers.is_empty()).then(|| to_kafka(&message.headers));
            if let Some(headers) = headers {
                record = record.headers(headers);
            }
            let mut unconfirmed = Unconfirmed(Some(&self.pipeline.doomed));
            let sent = producer.send(record, DELIVERY_TIMEOUT).await;
            unconfirmed.0 = None;
            match sent {
                Ok(_) => {
                    self.pipeline.records.fetch_add(1, Ordering::AcqRel);
                    Ok(())
                }
                Err((error, _)) => {
                    self.pipeline.doomed.store(true, Ordering::Release);
                    Err(PublishError::new(
                        &message.address,
                        crate::publish::kind(&error),
                        error,
                    ))
                }
            }
        })
    }
}

/// A record handed to the producer but not yet confirmed. A caller that stops waiting
/// (a timeout; the runtime's copy confirmation tries again after one) leaves it in the
/// open transaction, where it may still land: the window must not commit it, since the
/// caller may send it again. Dropped before the report, it dooms the window.
struct Unconfirmed<'p>(Option<&'p AtomicBool>);

impl Drop for Unconfirmed<'_> {
    fn drop(&mut self) {
        if let Some(doomed) = self.0 {
            doomed.store(true, Ordering::Release);
        }
    }
}

/// The offsets a window will commit: next offset per partition.
pub(crate) type WindowOffsets = HashMap<(Arc<str>, i32), i64>;

/// True when the error means another producer with our id took over (librdkafka does
/// not always flag it fatal: the broker's "newer producer" answer to
/// `send_offsets_to_transaction` arrives as an abortable error).
pub(crate) fn fenced(error: &KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode as Code;
    match error {
        KafkaError::Transaction(e) => {
            e.is_fatal()
                || matches!(
                    e.code(),
                    Code::Fenced | Code::ProducerFenced | Code::InvalidProducerEpoch
                )
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{DEFAULT_COMMIT_INTERVAL, EosPipeline};

    /// K6: a window is committed every 100 ms unless the pipeline is told otherwise, and
    /// the window loop reads what it was told.
    #[test]
    fn k6_windows_commit_every_100_ms_unless_told() {
        let kafka = crate::Kafka::connect("127.0.0.1:1").expect("a client; nothing connects yet");
        let pipeline = EosPipeline::new(&kafka, "k6-default");
        assert_eq!(DEFAULT_COMMIT_INTERVAL, Duration::from_millis(100));
        assert_eq!(pipeline.shared.interval(), Duration::from_millis(100));
        let pipeline = pipeline.commit_interval(Duration::from_millis(250));
        assert_eq!(pipeline.shared.interval(), Duration::from_millis(250));
    }
}
