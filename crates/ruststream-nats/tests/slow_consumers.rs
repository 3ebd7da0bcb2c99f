//! The exact Core NATS slow-consumer count (SPEC G7) with `slow_consumer_layer`, against a
//! real nats-server. Alone in its file: it installs the process's global subscriber.

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::{Script, eventually, handler, unique};
use ruststream::{App, HandlerOutcome, on};
use ruststream_nats::{Nats, async_nats};
use tracing_subscriber::prelude::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g7_with_the_layer_every_core_drop_is_counted() {
    tracing_subscriber::registry()
        .with(ruststream_nats::slow_consumer_layer())
        .init();
    let url = std::env::var("RUSTSTREAM_NATS_URL").expect("RUSTSTREAM_NATS_URL");
    // A small client buffer, so a burst overflows it at once.
    let options = async_nats::ConnectOptions::new().subscription_capacity(64);
    let service = Nats::connect_with(&url, options).await.expect("connect");
    let subject = unique("g7exact");
    let script = Script::slow(Duration::from_millis(1), |_| HandlerOutcome::ack());
    let app = App::new()
        .register(on(service.subject(&subject), handler(Arc::clone(&script))))
        .start()
        .await
        .expect("start");
    service.client().flush().await.unwrap();
    // The sender is a plain client: only the service's connection holds subscriptions.
    let sender = async_nats::connect(&url).await.expect("connect");
    let sent = 50_000u64;
    for n in 0..sent {
        sender
            .publish(subject.clone(), Bytes::from(n.to_string()))
            .await
            .unwrap();
    }
    sender.flush().await.unwrap();
    // Every message sent is either handled or counted as dropped, none in between.
    eventually(Duration::from_secs(60), "handled + dropped = sent", || {
        script.count() as u64 + service.slow_consumer_drops_on(&subject) == sent
    })
    .await;
    let dropped = service.slow_consumer_drops_on(&subject);
    app.stop().await;
    assert!(
        dropped > sent / 2,
        "the burst overflowed: {dropped} dropped"
    );
    assert_eq!(service.slow_consumer_drops(), dropped);
    println!(
        "RELIABILITY|NATS Core|guard rail: {sent} messages published at once to a 1 ms handler behind a 64-message client buffer, slow_consumer_layer installed|{dropped} counted dropped and {} handled: exactly the {sent} sent|none|none declared",
        sent - dropped
    );
}
