//! K2: `Commit::Auto` commits acks and drops through the timer, and has no retry.

use std::sync::Arc;
use std::time::Duration;

use crate::common::{
    Script, committed_becomes, create_topic, eventually, handler, kafka, logs, produce, topic,
    unique,
};
use ruststream::{App, HandlerOutcome, Headers, on};
use ruststream_kafka::Commit;

use crate::support::start;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k2_auto_retry_is_unsupported_logged_and_never_comes_back() {
    let kafka = kafka().await;
    let (t, group) = (unique("k2"), unique("g"));
    create_topic(&t, 1).await;
    let script = Script::new(|_| HandlerOutcome::retry());
    let app = start(App::new().register(on(
        topic(&kafka, &t, &group, Commit::Auto),
        handler(Arc::clone(&script)),
    )))
    .await;
    produce(&kafka, &t, None, b"x", &Headers::new()).await;
    produce(&kafka, &t, None, b"y", &Headers::new()).await;
    eventually(Duration::from_secs(30), "both handled", || {
        script.count() == 2
    })
    .await;
    committed_becomes(&group, &t, 0, 2, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(script.count(), 2, "nothing brings a record back under Auto");
    assert!(
        logs().contains("the broker has no operation for `retry`"),
        "Unsupported logged"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k2_auto_ack_and_drop_commit_through_the_timer() {
    let kafka = kafka().await;
    let (t, group) = (unique("k2ack"), unique("g"));
    create_topic(&t, 1).await;
    let script = Script::new(|d| {
        if d.payload() == "drop" {
            HandlerOutcome::drop()
        } else {
            HandlerOutcome::ack()
        }
    });
    let app = start(App::new().register(on(
        topic(&kafka, &t, &group, Commit::Auto),
        handler(Arc::clone(&script)),
    )))
    .await;
    for p in [&b"ack"[..], b"drop", b"ack"] {
        produce(&kafka, &t, None, p, &Headers::new()).await;
    }
    committed_becomes(&group, &t, 0, 3, Duration::from_secs(30)).await;
    assert_eq!(script.count(), 3);
    app.stop().await;
}
