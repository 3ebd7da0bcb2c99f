//! K8: where copies go for `topics` and `partitions` subscriptions, and the
//! registrations refused at start.

use std::sync::Arc;
use std::time::Duration;

use crate::common::{Script, create_topic, eventually, handler, kafka, produce, unique};
use ruststream::{App, HandlerOutcome, Headers, on};
use ruststream_kafka::{Commit, Offset};

use crate::support::start;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k8_topics_and_partitions_without_a_retry_destination_refuse_to_start() {
    let kafka = kafka().await;
    let script = Script::new(|_| HandlerOutcome::ack());
    let err = App::new()
        .register(
            on(
                kafka.topics(["a", "b"]).group("g"),
                handler(Arc::clone(&script)),
            )
            .name("topics"),
        )
        .register(
            on(
                kafka.partitions([("a", 0, Offset::Beginning)]).group("g"),
                handler(Arc::clone(&script)),
            )
            .name("partitions")
            .max_attempts(3),
        )
        .register(
            on(
                kafka
                    .topic("c")
                    .group("g")
                    .commit(Commit::Tracked)
                    .set("enable.auto.offset.store", "true"),
                handler(Arc::clone(&script)),
            )
            .name("contradiction"),
        )
        .register(
            on(
                // Without .group(..) this would not compile; an empty group is refused.
                kafka
                    .topic("d")
                    .group("")
                    .set("enable.auto.commit", "false"),
                handler(Arc::clone(&script)),
            )
            .name("no-group"),
        )
        .start()
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("registration `topics` on `a,b`") && err.contains(".retry_to(address)"),
        "{err}"
    );
    assert!(err.contains("registration `partitions` on `a/0`"), "{err}");
    assert!(err.contains("enable.auto.offset.store=true"), "{err}");
    assert!(
        err.contains("enable.auto.commit=false") && err.contains(".group(name)"),
        "{err}"
    );
    assert!(err.contains("5 rule(s) broken"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k8_topics_copies_go_to_the_named_destination() {
    let kafka = kafka().await;
    let (a, b, retry, group) = (unique("k8a"), unique("k8b"), unique("k8retry"), unique("g"));
    for t in [&a, &b, &retry] {
        create_topic(t, 1).await;
    }
    let script = Script::new(|d| {
        if d.attempt().number() == 1 {
            HandlerOutcome::retry_after(Duration::from_millis(50))
        } else {
            HandlerOutcome::ack()
        }
    });
    let app = start(
        App::new().register(
            on(
                kafka
                    .topics([a.clone(), b.clone(), retry.clone()])
                    .group(&group)
                    .set("auto.commit.interval.ms", "100")
                    .set("session.timeout.ms", "6000")
                    .set("heartbeat.interval.ms", "500"),
                handler(Arc::clone(&script)),
            )
            .retry_to(&retry),
        ),
    )
    .await;
    produce(&kafka, &b, None, b"x", &Headers::new()).await;
    eventually(Duration::from_secs(30), "the copy is handled", || {
        script.count() == 2
    })
    .await;
    let calls = script.calls();
    assert_eq!(
        (calls[0].address.as_str(), calls[1].address.as_str()),
        (b.as_str(), retry.as_str())
    );
    app.stop().await;
}
