//! The ops endpoint over a real Kafka (tansu), scraped by a real Prometheus (issue #14).

mod common;

use common::{create_topic, kafka, produce, topic, unique};
use ruststream::{App, Headers, on};
use ruststream_kafka::Commit;
use ruststream_test_support::ops::{
    Expect, UNDECODABLE, WORDS, answer, assert_scraped, backlog_becomes, held, payload,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ops_prometheus_scrapes_kafka_outcomes_and_dead_letters() {
    let kafka = kafka().await;
    let name = unique("ops");
    let dead = format!("{name}-dead");
    create_topic(&name, 1).await;
    create_topic(&dead, 1).await;
    let running = App::new()
        .ops(0)
        .register(
            on(topic(&kafka, &name, &unique("g"), Commit::Tracked), answer)
                .name("words")
                .max_attempts(3)
                .dead_letter(dead),
        )
        .start()
        .await
        .expect("start");
    for word in WORDS {
        produce(&kafka, &name, None, &payload(word), &Headers::new()).await;
    }
    produce(&kafka, &name, None, UNDECODABLE, &Headers::new()).await;
    // Tracked retries run again in place (K4): attempts 1 and 2 fail, the third is
    // dead-lettered.
    assert_scraped(
        &running,
        "words",
        Expect {
            error: 3.0,
            undecodable: 1.0,
            stamped: true,
            dead_lettered: 2.0,
            backlog: &["pending"],
        },
    )
    .await;
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ops_kafka_lag_is_high_watermark_minus_committed_and_returns_to_zero() {
    let kafka = kafka().await;
    let name = unique("opslag");
    create_topic(&name, 1).await;
    for _ in 0..10 {
        produce(&kafka, &name, None, &payload("ack"), &Headers::new()).await;
    }
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let running = App::new()
        .metrics()
        .state(std::sync::Arc::clone(&gate))
        .register(on(topic(&kafka, &name, &unique("g"), Commit::Tracked), held).name("lag"))
        .start()
        .await
        .expect("start");
    // The first record is held: nothing is committed, all 10 are behind.
    backlog_becomes(
        &running,
        "lag",
        &["pending"],
        10.0,
        std::time::Duration::from_secs(30),
    )
    .await;
    gate.add_permits(100);
    backlog_becomes(
        &running,
        "lag",
        &["pending"],
        0.0,
        std::time::Duration::from_secs(30),
    )
    .await;
    running.stop().await;
}
