//! The ops endpoint over a real Kafka (tansu), scraped by a real Prometheus (issue #14).

mod common;

use common::{create_topic, kafka, produce, topic, unique};
use ruststream::{App, Headers, on};
use ruststream_kafka::Commit;
use ruststream_test_support::ops::{Expect, WORDS, answer, assert_scraped, payload};

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
    // Tracked retries run again in place (K4): attempts 1 and 2 fail, the third is
    // dead-lettered.
    assert_scraped(
        &running,
        "words",
        Expect {
            error: 2.0,
            dead_lettered: 1.0,
        },
    )
    .await;
    running.stop().await;
}
