//! What a Kafka delivery is settled by.

/// Where a delivery came from, and which assignment of its partition it belongs to.
#[derive(Debug, Clone)]
pub struct KafkaReceipt {
    /// Its partition's place in the subscription's book, which names the topic (a place
    /// is never reused for another partition): no topic name to count a reference to
    /// for every record.
    pub(crate) slot: usize,
    pub(crate) partition: i32,
    pub(crate) offset: i64,
    pub(crate) generation: u64,
}
