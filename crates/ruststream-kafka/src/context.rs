//! Rebalance bookkeeping shared by librdkafka's callbacks and the subscription (K5).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use rdkafka::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, ConsumerContext, Rebalance};

/// Counts partition moves: every assign or revoke of a partition raises its generation,
/// and any move raises the epoch, which the subscription checks cheaply per record.
#[derive(Debug, Default)]
pub(crate) struct Moves {
    epoch: AtomicU64,
    generations: Mutex<HashMap<(String, i32), u64>>,
}

impl Moves {
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    pub(crate) fn generation(&self, topic: &str, partition: i32) -> u64 {
        self.generations
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&(topic.to_owned(), partition))
            .copied()
            .unwrap_or(0)
    }

    pub(crate) fn moved(&self, partitions: impl Iterator<Item = (String, i32)>) {
        let mut generations = self
            .generations
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for key in partitions {
            *generations.entry(key).or_default() += 1;
        }
        drop(generations);
        self.epoch.fetch_add(1, Ordering::AcqRel);
    }
}

/// The consumer context: records partition moves.
pub(crate) struct TrackingContext {
    pub(crate) moves: std::sync::Arc<Moves>,
}

impl ClientContext for TrackingContext {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => {
                tracing::error!(target: "librdkafka", facility, "{message}")
            }
            RDKafkaLogLevel::Warning => tracing::warn!(target: "librdkafka", facility, "{message}"),
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                tracing::info!(target: "librdkafka", facility, "{message}")
            }
            RDKafkaLogLevel::Debug => tracing::debug!(target: "librdkafka", facility, "{message}"),
        }
    }
}

impl ConsumerContext for TrackingContext {
    fn pre_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let list = match rebalance {
            Rebalance::Assign(list) | Rebalance::Revoke(list) => list,
            Rebalance::Error(e) => {
                tracing::warn!(error = %e, "rebalance error");
                return;
            }
        };
        if let Rebalance::Revoke(_) = rebalance {
            tracing::info!(
                partitions = list.count(),
                "partitions revoked; their tracked state is discarded"
            );
        }
        self.moves.moved(
            list.elements()
                .into_iter()
                .map(|e| (e.topic().to_owned(), e.partition())),
        );
    }
}
