//! G2: an uncapped delivery that keeps failing is reported at attempt 10.

use std::sync::Arc;
use std::time::Duration;

use crate::common::{Script, create_stream, eventually, handler, logs, nats, unique};
use bytes::Bytes;
use ruststream::{App, HandlerOutcome, Headers, on};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g2_an_uncapped_delivery_that_keeps_failing_is_reported_at_attempt_10() {
    let nats = nats().await;
    let base = unique("G2WARN");
    let subject = format!("{base}.in");
    create_stream(&nats, &base, std::slice::from_ref(&subject)).await;
    let script = Script::new(|d| {
        if d.attempt().number() < 12 {
            HandlerOutcome::retry()
        } else {
            HandlerOutcome::ack()
        }
    });
    let app = App::new()
        .register(
            on(
                nats.consumer(&base, "worker").filter_subject(&subject),
                handler(Arc::clone(&script)),
            )
            .name("uncapped"),
        )
        .start()
        .await
        .expect("start");
    nats.publisher()
        .jetstream(&subject, &Headers::new(), Bytes::from_static(b"x"), None)
        .await
        .expect("publish");
    eventually(Duration::from_secs(20), "12 attempts", || {
        script.count() == 12
    })
    .await;
    app.stop().await;
    let log = logs();
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("keeps failing") && l.contains(&subject))
        .collect();
    assert_eq!(warnings.len(), 1, "once, at attempt 10: {warnings:?}");
    assert!(warnings[0].contains("WARN") && warnings[0].contains("attempt=10"));
}
