//! The ops endpoint over the real redis-server, scraped by a real Prometheus (issue #46):
//! the same outcome counts and dead-letter count as on every transport, and a backlog.

mod common;

use std::time::Duration;

use common::redis;
use ruststream::{App, Headers, on};
use ruststream_test_support::ops::{
    Expect, UNDECODABLE, WORDS, answer, assert_scraped, backlog_becomes, held, payload,
};
use ruststream_test_support::unique_suffix;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ops_prometheus_scrapes_redis_outcomes_and_dead_letters() {
    let redis = redis().await;
    let key = format!("ops-{}", unique_suffix());
    let running = App::new()
        .ops(0)
        .register(
            on(redis.stream(&key, "g"), answer)
                .name("words")
                .max_attempts(3)
                .dead_letter(format!("{key}-dead")),
        )
        .start()
        .await
        .expect("start");
    for word in WORDS {
        redis
            .publisher()
            .send(&key, &Headers::new(), &payload(word))
            .await
            .expect("XADD");
    }
    redis
        .publisher()
        .send(&key, &Headers::new(), UNDECODABLE)
        .await
        .expect("XADD");
    assert_scraped(
        &running,
        "words",
        Expect {
            error: 3.0,
            undecodable: 1.0,
            stamped: true,
            dead_lettered: 2.0,
            backlog: &["pending", "ack_pending"],
        },
    )
    .await;
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ops_redis_backlog_shows_what_waits_and_returns_to_zero() {
    let redis = redis().await;
    let key = format!("ops-lag-{}", unique_suffix());
    for _ in 0..10 {
        redis
            .publisher()
            .send(&key, &Headers::new(), &payload("ack"))
            .await
            .expect("XADD");
    }
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let running = App::new()
        .metrics()
        .state(std::sync::Arc::clone(&gate))
        .register(on(redis.stream(&key, "g"), held).name("lag"))
        .start()
        .await
        .expect("start");
    let kinds = ["pending", "ack_pending"];
    backlog_becomes(&running, "lag", &kinds, 10.0, Duration::from_secs(20)).await;
    gate.add_permits(100);
    backlog_becomes(&running, "lag", &kinds, 0.0, Duration::from_secs(20)).await;
    running.stop().await;
}
