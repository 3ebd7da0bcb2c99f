//! The ops endpoint over pulsar-lite, scraped by a real Prometheus (issue #14).

mod common;

use common::{pulsar, unique};
use ruststream::{App, Headers, on};
use ruststream_pulsar::SubType;
use ruststream_test_support::ops::{Expect, UNDECODABLE, WORDS, answer, assert_scraped, payload};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ops_prometheus_scrapes_pulsar_outcomes() {
    let pulsar = pulsar().await;
    let name = unique("ops");
    let running = App::new()
        .ops(0)
        .register(
            on(
                pulsar
                    .topic(&name)
                    .subscription("s")
                    .subscription_type(SubType::Shared),
                answer,
            )
            .name("words")
            .max_attempts(3)
            .dead_letter(format!("{name}-dead")),
        )
        .start()
        .await
        .expect("start");
    for word in WORDS {
        pulsar
            .publisher()
            .send(&name, None, &Headers::new(), payload(word).to_vec())
            .await
            .expect("publish");
    }
    pulsar
        .publisher()
        .send(&name, None, &Headers::new(), UNDECODABLE.to_vec())
        .await
        .expect("publish");
    // Pulsar's broker counts redeliveries and moves the message to the dead letter
    // itself (P6): the runtime sees three failed attempts and publishes nothing.
    assert_scraped(
        &running,
        "words",
        Expect {
            error: 3.0,
            undecodable: 1.0,
            stamped: true,
            dead_lettered: 0.0,
            backlog: &[],
        },
    )
    .await;
    running.stop().await;
}
