//! The partitions a subscription paused while it fetches nothing (at `max_in_flight`,
//! SPEC G5, or while a delivery waits long for its lane), resumed by its next fetch.

use rdkafka::TopicPartitionList;
use rdkafka::consumer::Consumer;

use crate::queue::Consumer_;

/// Every partition ever paused is resumed: librdkafka keeps an application pause across a
/// revoke and a later assignment of the same partition.
pub(crate) struct Paused(TopicPartitionList);

impl Paused {
    pub(crate) fn new() -> Self {
        Self(TopicPartitionList::new())
    }

    /// Pauses the assigned partitions not paused yet. One whose pause fails is tried
    /// again on the next call.
    pub(crate) fn pause(&mut self, consumer: &Consumer_, address: &str) {
        let Ok(assignment) = consumer.assignment() else {
            return;
        };
        let mut fresh = TopicPartitionList::new();
        for element in assignment.elements() {
            let (topic, partition) = (element.topic(), element.partition());
            if self.0.find_partition(topic, partition).is_none() {
                fresh.add_partition(topic, partition);
            }
        }
        if fresh.count() == 0 {
            return;
        }
        match consumer.pause(&fresh) {
            Ok(()) => {
                tracing::debug!(
                    address,
                    partitions = fresh.count(),
                    "partitions paused while nothing is fetched"
                );
                for element in fresh.elements() {
                    self.0.add_partition(element.topic(), element.partition());
                }
            }
            Err(e) => {
                tracing::warn!(address, error = %e, "pausing partitions while nothing is fetched failed");
            }
        }
    }

    /// Resumes every partition paused.
    #[inline]
    pub(crate) fn resume(&mut self, consumer: &Consumer_, address: &str) {
        if self.0.count() != 0 {
            self.resume_all(consumer, address);
        }
    }

    #[cold]
    fn resume_all(&mut self, consumer: &Consumer_, address: &str) {
        let paused = std::mem::replace(&mut self.0, TopicPartitionList::new());
        if let Err(e) = consumer.resume(&paused) {
            tracing::warn!(address, error = %e, "resuming paused partitions failed");
        }
    }
}
