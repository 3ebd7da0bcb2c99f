//! Publishing: key, headers and partition, through the Kafka publisher and the
//! common one; errors name the topic.

use std::time::Duration;

use crate::common::{create_topic, kafka, read_topic, unique};
use ruststream::Headers;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_publisher_sets_key_headers_and_partition_and_errors_name_the_topic() {
    let kafka = kafka().await;
    let t = unique("pub");
    create_topic(&t, 3).await;
    let mut headers = Headers::new();
    headers.insert("h", "v");
    let landed = kafka
        .publisher()
        .send(&t, Some(b"k"), &headers, b"p", Some(2))
        .await
        .unwrap();
    assert_eq!(landed.partition, 2);
    let records = read_topic(&t, 3, 1, Duration::from_secs(10)).await;
    assert_eq!(
        (
            records[0].partition,
            records[0].key.as_deref(),
            records[0].header("h")
        ),
        (2, Some(&b"k"[..]), Some("v"))
    );
    let err = kafka
        .publisher()
        .send(&t, None, &Headers::new(), b"p", Some(99))
        .await
        .unwrap_err();
    assert_eq!(err.address(), t);
    assert!(err.to_string().contains(&t), "{err}");
}

/// The one publishing shape (`ruststream::Publisher`) on Kafka: key, header and the
/// partition as a typed option.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_common_publisher_carries_key_headers_and_the_partition_option() {
    let kafka = kafka().await;
    let t = unique("common-pub");
    create_topic(&t, 3).await;
    let publisher = ruststream::Publisher::new(kafka.publish_handle());
    publisher
        .to(&t)
        .key("k")
        .header("h", "v")
        .with(ruststream_kafka::Partition(1))
        .send(&serde_json::json!({"id": 1}))
        .await
        .unwrap();
    let records = read_topic(&t, 3, 1, Duration::from_secs(10)).await;
    assert_eq!(
        (
            records[0].partition,
            records[0].key.as_deref(),
            records[0].header("h")
        ),
        (1, Some(&b"k"[..]), Some("v"))
    );
}
