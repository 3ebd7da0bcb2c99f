//! D1: what a graceful stop does with a delayed retry, under `Tracked` and `Auto`.

use std::sync::Arc;
use std::time::Duration;

use crate::common::{
    Script, committed, committed_becomes, create_topic, eventually, handler, kafka, produce,
    read_topic, topic, unique,
};
use ruststream::{App, HandlerOutcome, Headers, RETRY_COUNT_HEADER, on};
use ruststream_kafka::Commit;

use crate::support::start;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tracked_a_stop_during_a_delayed_retry_hands_the_original_back() {
    let kafka = kafka().await;
    let (t, group) = (unique("hold"), unique("g"));
    create_topic(&t, 1).await;
    let script = Script::new(|_| HandlerOutcome::retry_after(Duration::from_secs(600)));
    let app = start(App::new().register(on(
        topic(&kafka, &t, &group, Commit::Tracked),
        handler(Arc::clone(&script)),
    )))
    .await;
    produce(&kafka, &t, None, b"held", &Headers::new()).await;
    eventually(Duration::from_secs(30), "handled", || script.count() == 1).await;
    app.stop().await;
    assert_eq!(
        read_topic(&t, 1, 2, Duration::from_secs(2)).await.len(),
        1,
        "no copy was produced"
    );
    assert_eq!(
        committed(&group, &t, 0).await,
        None,
        "the original is not committed"
    );
    // The next instance gets the original again.
    let again = Script::new(|_| HandlerOutcome::ack());
    let app = start(App::new().register(on(
        topic(&kafka, &t, &group, Commit::Tracked),
        handler(Arc::clone(&again)),
    )))
    .await;
    eventually(Duration::from_secs(30), "the original came back", || {
        again.count() == 1
    })
    .await;
    assert_eq!(again.calls()[0].attempt, 1);
    committed_becomes(&group, &t, 0, 1, Duration::from_secs(10)).await;
    app.stop().await;
}

/// D1 on Kafka `Auto` (issue #47): the offset was stored at hand-over, so a retry copy
/// waiting out its `retry_after` at a graceful stop is published at once instead of being
/// lost with the process; the topic then holds the original and its copy (count 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d1_a_graceful_stop_publishes_a_waiting_auto_copy_early() {
    let kafka = kafka().await;
    let (t, group) = (unique("d1auto"), unique("g"));
    create_topic(&t, 1).await;
    produce(&kafka, &t, Some("k"), b"wait", &Headers::new()).await;
    let script = Script::new(|_| HandlerOutcome::retry_after(Duration::from_secs(120)));
    let app = App::new()
        .register(
            on(
                topic(&kafka, &t, &group, Commit::Auto),
                handler(Arc::clone(&script)),
            )
            .max_attempts(3),
        )
        .start()
        .await
        .expect("start");
    eventually(Duration::from_secs(30), "handled", || script.count() == 1).await;
    let stopped = std::time::Instant::now();
    app.stop().await;
    assert!(
        stopped.elapsed() < Duration::from_secs(20),
        "not held for the 120 s"
    );
    let records = read_topic(&t, 1, 2, Duration::from_secs(20)).await;
    assert_eq!(records.len(), 2, "the original and its copy");
    let copy = &records[1];
    assert_eq!(&copy.payload[..], b"wait");
    assert_eq!(copy.key.as_deref(), Some(&b"k"[..]));
    let count = copy
        .headers
        .iter()
        .find(|(name, _)| name == RETRY_COUNT_HEADER)
        .map(|(_, value)| value.clone());
    assert_eq!(count.as_deref(), Some(&b"1"[..]), "the copy counts 1");
}
