//! The group's lag per assigned partition, for the backlog series.

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use ruststream_core::Backlog;

use crate::context::TrackingContext;

/// How far the group is behind on each partition assigned to `consumer` (blocking).
pub(crate) fn lag(consumer: &BaseConsumer<TrackingContext>) -> Result<Vec<Backlog>, String> {
    const ASK: Duration = Duration::from_secs(2);
    let assignment = consumer.assignment().map_err(|e| e.to_string())?;
    let committed = consumer
        .committed_offsets(assignment, ASK)
        .map_err(|e| e.to_string())?;
    committed
        .elements()
        .iter()
        .map(|element| {
            let (low, high) = consumer
                .fetch_watermarks(element.topic(), element.partition(), ASK)
                .map_err(|e| e.to_string())?;
            let from = match element.offset() {
                rdkafka::Offset::Offset(offset) => offset,
                _ => low,
            };
            Ok(Backlog {
                kind: "pending",
                partition: Some(element.partition()),
                value: u64::try_from(high.saturating_sub(from)).unwrap_or(0),
            })
        })
        .collect()
}
