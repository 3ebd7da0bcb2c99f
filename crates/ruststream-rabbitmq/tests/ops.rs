//! The ops endpoint over the real rabbitmq-server, scraped by a real Prometheus (issue
//! #46): the same outcome counts and dead-letter count as on every transport, and a
//! backlog.

mod common;

use std::time::Duration;

use common::{declare, rabbit};
use ruststream::{App, Headers, on};
use ruststream_test_support::ops::{
    Expect, UNDECODABLE, WORDS, answer, assert_scraped, backlog_becomes, held, payload,
};
use ruststream_test_support::unique_suffix;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ops_prometheus_scrapes_rabbitmq_outcomes_and_dead_letters() {
    let rabbit = rabbit().await;
    let (queue, dead) = (
        format!("ops-{}", unique_suffix()),
        format!("ops-dead-{}", unique_suffix()),
    );
    declare(&rabbit, &queue, &[]).await;
    declare(&rabbit, &dead, &[]).await;
    let running = App::new()
        .ops(0)
        .register(
            on(rabbit.queue(&queue), answer)
                .name("words")
                .max_attempts(3)
                .dead_letter(&dead),
        )
        .start()
        .await
        .expect("start");
    for word in WORDS {
        rabbit
            .publisher()
            .send(&queue, &Headers::new(), &payload(word))
            .await
            .expect("published");
    }
    rabbit
        .publisher()
        .send(&queue, &Headers::new(), UNDECODABLE)
        .await
        .expect("published");
    assert_scraped(
        &running,
        "words",
        Expect {
            error: 3.0,
            undecodable: 1.0,
            stamped: false,
            dead_lettered: 2.0,
            backlog: &["pending"],
        },
    )
    .await;
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ops_rabbitmq_backlog_shows_what_waits_and_returns_to_zero() {
    let rabbit = rabbit().await;
    let queue = format!("ops-lag-{}", unique_suffix());
    declare(&rabbit, &queue, &[]).await;
    for _ in 0..10 {
        rabbit
            .publisher()
            .send(&queue, &Headers::new(), &payload("ack"))
            .await
            .expect("published");
    }
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let running = App::new()
        .metrics()
        .state(std::sync::Arc::clone(&gate))
        // One delivery held, no more sent ahead: the other 9 wait in the queue.
        .register(on(rabbit.queue(&queue), held).name("lag").max_in_flight(1))
        .start()
        .await
        .expect("start");
    backlog_becomes(&running, "lag", &["pending"], 9.0, Duration::from_secs(20)).await;
    gate.add_permits(100);
    backlog_becomes(&running, "lag", &["pending"], 0.0, Duration::from_secs(20)).await;
    running.stop().await;
}
