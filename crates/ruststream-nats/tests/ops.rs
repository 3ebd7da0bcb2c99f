//! The ops endpoint over a real nats-server, scraped by a real Prometheus (issue #14).

mod common;

use std::time::Duration;

use common::{create_stream, nats, unique};
use ruststream::{App, Headers, on};
use ruststream_test_support::ops::{
    Expect, WORDS, answer, assert_dashboard_queries, assert_scraped, get, payload,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ops_prometheus_scrapes_jetstream_outcomes_and_dead_letters() {
    let nats = nats().await;
    let name = unique("OPSJS");
    let dead = format!("{name}.dead");
    create_stream(&nats, &name, std::slice::from_ref(&name)).await;
    create_stream(&nats, &format!("{name}_DEAD"), std::slice::from_ref(&dead)).await;
    let running = App::new()
        .ops(0)
        .register(
            on(nats.consumer(&name, "ops"), answer)
                .name("words")
                .max_attempts(3)
                .dead_letter(dead),
        )
        .start()
        .await
        .expect("start");
    for word in WORDS {
        nats.publisher()
            .jetstream(&name, &Headers::new(), payload(word), None)
            .await
            .expect("publish");
    }
    let prometheus = assert_scraped(
        &running,
        "words",
        Expect {
            error: 2.0,
            dead_lettered: 1.0,
        },
    )
    .await;
    assert_dashboard_queries(&prometheus).await;
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ops_core_subscription_counts_acks_as_unsupported_settlements() {
    let nats = nats().await;
    let subject = unique("opscore");
    let running = App::new()
        .ops(0)
        .register(on(nats.subject(&subject), answer).name("core"))
        .start()
        .await
        .expect("start");
    nats.client().flush().await.unwrap();
    for _ in 0..3 {
        nats.client()
            .publish(subject.clone(), payload("ack"))
            .await
            .unwrap();
    }
    let addr = running.ops_addr().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let metrics = get(addr, "/metrics").await.1;
        let unsupported = ruststream_test_support::ops::sample(
            &metrics,
            "ruststream_settle_errors_total",
            &[
                "registration=\"core\"",
                "kind=\"unsupported\"",
                "transport=\"nats-core\"",
            ],
        );
        if unsupported == 3.0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{metrics}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    running.stop().await;
}
