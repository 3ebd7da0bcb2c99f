//! K7, K9: retry copies on the topic (key, headers, count, partition), the cap and
//! the dead-letter topic, and every group reading the topic receiving the copy.

use std::sync::Arc;
use std::time::Duration;

use crate::common::{
    Script, committed_becomes, create_topic, eventually, handler, kafka, produce, read_topic,
    topic, unique,
};
use ruststream::{App, HandlerOutcome, Headers, RETRY_COUNT_HEADER, on};
use ruststream_kafka::Commit;

use crate::support::start;

async fn retry_after_once(commit: Commit) {
    let kafka = kafka().await;
    let (t, group) = (unique("k7"), unique("g"));
    create_topic(&t, 3).await;
    let script = Script::new(|d| {
        if d.attempt().number() == 1 {
            HandlerOutcome::retry_after(Duration::from_millis(300))
        } else {
            HandlerOutcome::ack()
        }
    });
    let app = start(App::new().register(on(
        topic(&kafka, &t, &group, commit),
        handler(Arc::clone(&script)),
    )))
    .await;
    let mut headers = Headers::new();
    headers.insert("trace", "t-7");
    let (partition, offset) =
        produce(&kafka, &t, Some("customer-9"), b"{\"id\":9}", &headers).await;
    eventually(Duration::from_secs(30), "the copy is handled", || {
        script.count() == 2
    })
    .await;
    let calls = script.calls();
    assert!(calls[1].at - calls[0].at >= Duration::from_millis(300));
    assert_eq!(calls[1].attempt, 2);
    let records = read_topic(&t, 3, 2, Duration::from_secs(10)).await;
    assert_eq!(records.len(), 2, "the original and one copy");
    let copy = records
        .iter()
        .find(|r| r.offset != offset || r.partition != partition)
        .unwrap();
    assert_eq!(copy.partition, partition, "K9: the key's partition");
    assert!(copy.offset > offset);
    assert_eq!(copy.key.as_deref(), Some(&b"customer-9"[..]));
    assert_eq!(&copy.payload[..], b"{\"id\":9}");
    assert_eq!(copy.header("trace"), Some("t-7"));
    assert_eq!(copy.header(RETRY_COUNT_HEADER), Some("1"));
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k7_retry_after_copies_to_the_topic_with_key_headers_and_count_under_tracked() {
    retry_after_once(Commit::Tracked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k7_retry_after_copies_to_the_topic_with_key_headers_and_count_under_auto() {
    retry_after_once(Commit::Auto).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k7_at_the_cap_the_copy_goes_to_the_dead_letter_topic_as_the_last_attempt_arrived() {
    let kafka = kafka().await;
    let (t, dead, group) = (unique("k7cap"), unique("k7dead"), unique("g"));
    create_topic(&t, 1).await;
    create_topic(&dead, 1).await;
    let script = Script::new(|_| HandlerOutcome::retry());
    let app = start(
        App::new().register(
            on(
                topic(&kafka, &t, &group, Commit::Tracked),
                handler(Arc::clone(&script)),
            )
            .max_attempts(3)
            .dead_letter(&dead),
        ),
    )
    .await;
    let mut headers = Headers::new();
    headers.insert("trace", "t-8");
    produce(&kafka, &t, Some("k"), b"\x00bytes\xff", &headers).await;
    let letters = read_topic(&dead, 1, 1, Duration::from_secs(30)).await;
    assert_eq!(letters.len(), 1);
    assert_eq!(script.count(), 3, "exactly max_attempts runs");
    assert_eq!(
        script
            .calls()
            .iter()
            .map(|c| c.headers.get_str(RETRY_COUNT_HEADER).map(str::to_owned))
            .collect::<Vec<_>>(),
        vec![None, Some("1".to_owned()), Some("2".to_owned())]
    );
    let letter = &letters[0];
    assert_eq!(&letter.payload[..], b"\x00bytes\xff");
    assert_eq!(letter.key.as_deref(), Some(&b"k"[..]));
    assert_eq!(letter.header("trace"), Some("t-8"));
    assert_eq!(
        letter.header(RETRY_COUNT_HEADER),
        Some("2"),
        "as the last attempt arrived"
    );
    // Original and two copies: all settled, the group is past them.
    committed_becomes(&group, &t, 0, 3, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        read_topic(&dead, 1, 2, Duration::from_secs(1)).await.len(),
        1,
        "exactly one dead letter"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k7_at_the_cap_without_dead_letter_the_record_settles_and_nothing_is_produced() {
    let kafka = kafka().await;
    let (t, group) = (unique("k7go"), unique("g"));
    create_topic(&t, 1).await;
    let script = Script::new(|_| HandlerOutcome::retry());
    let app = start(
        App::new().register(
            on(
                topic(&kafka, &t, &group, Commit::Tracked),
                handler(Arc::clone(&script)),
            )
            .max_attempts(2),
        ),
    )
    .await;
    produce(&kafka, &t, None, b"x", &Headers::new()).await;
    committed_becomes(&group, &t, 0, 2, Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(script.count(), 2);
    assert_eq!(
        read_topic(&t, 1, 3, Duration::from_secs(2)).await.len(),
        2,
        "original and one copy only"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k9_every_group_reading_the_topic_receives_the_copy() {
    let kafka = kafka().await;
    let (t, retrying, other) = (unique("k9"), unique("retrying"), unique("other"));
    create_topic(&t, 2).await;
    let first = Script::new(|d| {
        if d.attempt().number() == 1 {
            HandlerOutcome::retry_after(Duration::from_millis(50))
        } else {
            HandlerOutcome::ack()
        }
    });
    let second = Script::new(|_| HandlerOutcome::ack());
    let app = start(
        App::new()
            .register(
                on(
                    topic(&kafka, &t, &retrying, Commit::Tracked),
                    handler(Arc::clone(&first)),
                )
                .name("retrying"),
            )
            .register(
                on(
                    topic(&kafka, &t, &other, Commit::Tracked),
                    handler(Arc::clone(&second)),
                )
                .name("other"),
            ),
    )
    .await;
    produce(&kafka, &t, Some("key"), b"x", &Headers::new()).await;
    eventually(
        Duration::from_secs(30),
        "both groups saw original and copy",
        || first.count() == 2 && second.count() == 2,
    )
    .await;
    let seen: Vec<Option<String>> = second
        .calls()
        .iter()
        .map(|c| c.headers.get_str(RETRY_COUNT_HEADER).map(str::to_owned))
        .collect();
    assert_eq!(seen, vec![None, Some("1".to_owned())]);
    assert_eq!(
        second.calls()[0].partition,
        second.calls()[1].partition,
        "same key, same partition"
    );
    app.stop().await;
}
