//! What the exactly-once tests share: the subscription, the window reports, a
//! transforming handler.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use ruststream::{App, Delivery, HandlerOutcome, Headers, Publisher, Running};
use ruststream_kafka::{Commit, EosPipeline, Kafka, WindowReport};

/// Produces `0`, `1`, ... up to `count` (excluded) to `topic`, without key or headers, one
/// after the other.
pub(crate) async fn produce_numbered(kafka: &Kafka, topic: &str, count: u32) {
    for i in 0..count {
        crate::common::produce(
            kafka,
            topic,
            None,
            i.to_string().as_bytes(),
            &Headers::new(),
        )
        .await;
    }
}

pub(crate) fn transactional(
    kafka: &Kafka,
    topic: &str,
    group: &str,
    pipeline: &EosPipeline,
) -> ruststream_kafka::KafkaTopic<ruststream_kafka::Grouped> {
    kafka
        .topic(topic)
        .group(group)
        .commit(Commit::Transactional(pipeline.clone()))
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "500")
}

/// Collects every window report.
pub(crate) fn collect(pipeline: &EosPipeline) -> Arc<Mutex<Vec<(WindowReport, Instant)>>> {
    let reports: Arc<Mutex<Vec<(WindowReport, Instant)>>> = Arc::default();
    let mut rx = pipeline.reports();
    let sink = Arc::clone(&reports);
    tokio::spawn(async move {
        while rx.changed().await.is_ok() {
            if let Some(report) = rx.borrow_and_update().clone() {
                sink.lock().unwrap().push((report, Instant::now()));
            }
        }
    });
    reports
}

/// Transforms each input into `out-<payload>` on `output`, then acks; records calls.
pub(crate) fn transform(
    output: String,
    calls: Arc<Mutex<Vec<(i64, Instant)>>>,
    retry_offset: Option<i64>,
) -> impl Fn(
    Delivery,
    Publisher,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = HandlerOutcome> + Send>>
+ Clone
+ Send
+ Sync
+ 'static {
    let retried = Arc::new(Mutex::new(false));
    move |d: Delivery, publisher: Publisher| {
        let (output, calls, retried) = (output.clone(), Arc::clone(&calls), Arc::clone(&retried));
        Box::pin(async move {
            let offset = d.metadata().offset.unwrap();
            calls.lock().unwrap().push((offset, Instant::now()));
            let payload = format!("out-{}", String::from_utf8_lossy(d.payload()));
            if publisher.to(&output).send_bytes(payload).await.is_err() {
                return HandlerOutcome::retry();
            }
            if Some(offset) == retry_offset
                && !std::mem::replace(&mut *retried.lock().unwrap(), true)
            {
                return HandlerOutcome::retry();
            }
            HandlerOutcome::ack()
        })
    }
}

pub(crate) async fn start(app: App) -> Running {
    app.start().await.expect("the app starts")
}
