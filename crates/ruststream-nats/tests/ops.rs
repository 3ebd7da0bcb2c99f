//! The ops endpoint over a real nats-server, scraped by a real Prometheus (issue #14).

mod common;

use std::time::Duration;

use common::{create_stream, nats, unique};
use ruststream::{App, Headers, on};
use ruststream_test_support::ops::{
    Expect, UNDECODABLE, WORDS, answer, assert_dashboard_queries, assert_scraped, backlog_becomes,
    get, held, payload,
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
    nats.publisher()
        .jetstream(
            &name,
            &Headers::new(),
            bytes::Bytes::from_static(UNDECODABLE),
            None,
        )
        .await
        .expect("publish");
    let prometheus = assert_scraped(
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
    assert_dashboard_queries(&prometheus).await;
    running.stop().await;
}

/// Core NATS, scraped like the others (issue #46): failures, an undecodable message and
/// the dead letters (runtime copies to a subject) counted with the same meaning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ops_prometheus_scrapes_core_outcomes_and_dead_letters() {
    let nats = nats().await;
    let subject = unique("opscorewords");
    let running = App::new()
        .ops(0)
        .register(
            on(nats.subject(&subject), answer)
                .name("words")
                .max_attempts(3)
                .dead_letter(format!("{subject}.dead")),
        )
        .start()
        .await
        .expect("start");
    nats.client().flush().await.unwrap();
    for word in WORDS {
        nats.client()
            .publish(subject.clone(), payload(word))
            .await
            .unwrap();
    }
    nats.client()
        .publish(subject.clone(), bytes::Bytes::from_static(UNDECODABLE))
        .await
        .unwrap();
    assert_scraped(
        &running,
        "words",
        Expect {
            error: 3.0,
            undecodable: 1.0,
            stamped: false,
            dead_lettered: 2.0,
            backlog: &[],
        },
    )
    .await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ops_jetstream_backlog_shows_what_waits_and_returns_to_zero() {
    let nats = nats().await;
    let name = unique("OPSLAG");
    create_stream(&nats, &name, std::slice::from_ref(&name)).await;
    for _ in 0..10 {
        nats.publisher()
            .jetstream(&name, &Headers::new(), payload("ack"), None)
            .await
            .expect("publish");
    }
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let running = App::new()
        .metrics()
        .state(std::sync::Arc::clone(&gate))
        .register(on(nats.consumer(&name, "lag"), held).name("lag"))
        .start()
        .await
        .expect("start");
    let kinds = ["pending", "ack_pending"];
    // Nothing acknowledged while the handler holds: all 10 wait, pulled or not.
    backlog_becomes(&running, "lag", &kinds, 10.0, Duration::from_secs(20)).await;
    gate.add_permits(100);
    backlog_becomes(&running, "lag", &kinds, 0.0, Duration::from_secs(20)).await;
    running.stop().await;
}
