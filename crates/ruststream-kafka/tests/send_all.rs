//! `send_all` against the Kafka-API broker the test command starts: each message let go
//! once librdkafka has its copy, a result for each, a refused one alone.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::{create_topic, kafka, read_topic, unique};
use ruststream::Publisher;
use ruststream::core::{Outgoing, PublishErrorKind};

/// A payload that counts its own drop.
struct Counted(Arc<AtomicUsize>, Vec<u8>);

impl AsRef<[u8]> for Counted {
    fn as_ref(&self) -> &[u8] {
        &self.1
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_all_lets_each_message_go_once_sent_and_answers_each() {
    let kafka = kafka().await;
    let topic = unique("send-all");
    create_topic(&topic, 1).await;
    let (n, too_large) = (200, 7);
    let dropped = Arc::new(AtomicUsize::new(0));
    // How many messages were already dropped when each was made.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let messages = (0..n).map(|i| {
        seen.lock().unwrap().push(dropped.load(Ordering::SeqCst));
        let body = if i == too_large {
            vec![b'x'; 2_000_000]
        } else {
            i.to_string().into_bytes()
        };
        Outgoing::new(
            topic.as_str(),
            Bytes::from_owner(Counted(Arc::clone(&dropped), body)),
        )
    });
    let results = Publisher::new(kafka.publish_handle())
        .send_all(messages)
        .await;
    // Every message before the one being made had been let go: none were gathered.
    assert_eq!(*seen.lock().unwrap(), (0..n).collect::<Vec<_>>());
    assert_eq!(dropped.load(Ordering::SeqCst), n);
    assert_eq!(results.len(), n);
    for (i, result) in results.iter().enumerate() {
        if i == too_large {
            let e = result.as_ref().expect_err("larger than message.max.bytes");
            assert_eq!(e.kind(), PublishErrorKind::TooLarge, "{e}");
            assert!(e.to_string().contains(&topic), "{e}");
        } else {
            assert!(result.is_ok(), "message {i}: {result:?}");
        }
    }
    let records = read_topic(&topic, 1, n - 1, Duration::from_secs(30)).await;
    let payloads: Vec<Bytes> = records.into_iter().map(|r| r.payload).collect();
    let expected: Vec<Bytes> = (0..n)
        .filter(|&i| i != too_large)
        .map(|i| Bytes::from(i.to_string()))
        .collect();
    assert_eq!(payloads, expected);
}

/// A publish to a cluster that does not answer fails after `DELIVERY_TIMEOUT` (30 s),
/// not after librdkafka's own 300 s; a `message.timeout.ms` setting wins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_to_an_unreachable_cluster_fails_after_the_delivery_timeout() {
    use ruststream_kafka::{DELIVERY_TIMEOUT, Kafka};
    let away = "127.0.0.1:1";
    let publish = |kafka: Kafka| async move {
        let started = std::time::Instant::now();
        let result = tokio::time::timeout(
            Duration::from_secs(90),
            Publisher::new(kafka.publish_handle())
                .to("unreachable")
                .send_bytes("x"),
        )
        .await
        .expect("the publish gave up by itself");
        (result, started.elapsed())
    };
    let set = [("message.timeout.ms".to_owned(), "1500".to_owned())].into();
    let (result, took) = publish(Kafka::with_settings(away, set).expect("client")).await;
    let e = result.expect_err("nothing answers");
    assert_eq!(e.kind(), PublishErrorKind::Timeout, "{e}");
    assert!(
        took < Duration::from_secs(15),
        "the setting's 1.5 s: {took:?}"
    );
    let (result, took) = publish(Kafka::connect(away).expect("client")).await;
    let e = result.expect_err("nothing answers");
    assert_eq!(e.kind(), PublishErrorKind::Timeout, "{e}");
    assert!(e.to_string().contains("unreachable"), "{e}");
    assert!(
        took >= DELIVERY_TIMEOUT - Duration::from_secs(1) && took < Duration::from_secs(60),
        "failed after {took:?}"
    );
}
