//! Bounded start, Core drops counted, one start position (SPEC G7, G8) against a real
//! nats-server.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Script, create_stream, eventually, handler, logs, nats, unique};
use ruststream::{App, HandlerOutcome, Headers, on};
use ruststream_nats::{Nats, StartAt};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g7_connecting_to_a_closed_port_fails_at_once_naming_the_address() {
    let started = Instant::now();
    let err = Nats::connect("nats://127.0.0.1:1")
        .await
        .expect_err("nothing listens there");
    let took = started.elapsed();
    assert!(err.to_string().contains("nats://127.0.0.1:1"), "{err}");
    assert!(took < Duration::from_secs(15), "failed after {took:?}");
    println!(
        "RELIABILITY|NATS Core and JetStream|guard rail: start against a closed port, connect timeout 10 s: failed after {:.2} s naming the address|none|none|none",
        took.as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g8_a_new_durable_consumer_reads_the_stream_from_the_start_by_default() {
    let nats = nats().await;
    let name = unique("G8JS");
    create_stream(&nats, &name, std::slice::from_ref(&name)).await;
    for n in 0..3u8 {
        nats.publisher()
            .jetstream(&name, &Headers::new(), Bytes::from(vec![n]), None)
            .await
            .expect("publish");
    }
    let script = Script::new(|_| HandlerOutcome::ack());
    let app = App::new()
        .register(on(
            nats.consumer(&name, "new"),
            handler(Arc::clone(&script)),
        ))
        .start()
        .await
        .expect("start");
    eventually(Duration::from_secs(10), "the 3 earlier messages", || {
        script.count() == 3
    })
    .await;
    app.stop().await;
    let script = Script::new(|_| HandlerOutcome::ack());
    let app = App::new()
        .register(on(
            nats.consumer(&name, "latest").start_at(StartAt::Latest),
            handler(Arc::clone(&script)),
        ))
        .start()
        .await
        .expect("start");
    nats.publisher()
        .jetstream(&name, &Headers::new(), Bytes::from_static(b"later"), None)
        .await
        .expect("publish");
    eventually(Duration::from_secs(10), "the later message", || {
        script.count() >= 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let payloads: Vec<Vec<u8>> = script.calls().iter().map(|c| c.payload.to_vec()).collect();
    assert_eq!(payloads, vec![b"later".to_vec()], "the backlog skipped");
    app.stop().await;
    println!(
        "RELIABILITY|NATS JetStream|guard rail: a new subscription created after 3 messages were sent, default start position|lost 0 of 3 (StartAt::Earliest); with StartAt::Latest the 3 are skipped and a later one is read, as asked|none|none declared"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g7_core_slow_consumer_drops_are_counted_and_reported() {
    let url = std::env::var("RUSTSTREAM_NATS_URL").expect("RUSTSTREAM_NATS_URL");
    let _ = nats().await; // captures logs
    let service = Nats::connect(&url).await.expect("connect");
    let subject = unique("g7drops");
    let script = Script::slow(Duration::from_millis(1), |_| HandlerOutcome::ack());
    let app = App::new()
        .register(on(service.subject(&subject), handler(Arc::clone(&script))))
        .start()
        .await
        .expect("start");
    service.client().flush().await.unwrap();
    let sender = Nats::connect(&url).await.expect("connect");
    let sent = 200_000usize;
    for n in 0..sent {
        sender
            .client()
            .publish(subject.clone(), Bytes::from(n.to_string()))
            .await
            .unwrap();
    }
    sender.client().flush().await.unwrap();
    eventually(Duration::from_secs(30), "drops reported", || {
        service.slow_consumer_drops() > 0
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let dropped = service.slow_consumer_drops();
    app.stop().await;
    assert!(
        logs().contains("Core NATS slow consumer"),
        "reported at WARN"
    );
    println!(
        "RELIABILITY|NATS Core|guard rail: {sent} messages published at once to a 1 ms handler: the client's buffer overflows|at least {dropped} reported dropped (counted from the client's slow-consumer events, WARN at most every 10 s)|none|none declared"
    );
}
