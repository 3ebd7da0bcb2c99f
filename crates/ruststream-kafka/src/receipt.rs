//! What a Kafka delivery is settled by.

use std::sync::Arc;

/// Where a delivery came from, and which assignment of its partition it belongs to.
#[derive(Debug, Clone)]
pub struct KafkaReceipt {
    pub(crate) topic: Arc<str>,
    pub(crate) partition: i32,
    pub(crate) offset: i64,
    pub(crate) generation: u64,
    /// Its partition's place in the book.
    pub(crate) slot: usize,
}
