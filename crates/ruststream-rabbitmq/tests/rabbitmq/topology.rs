//! R6: queues and exchanges checked or declared at start: missing or mismatched ones are
//! refused naming them, bound exchanges route to the queue.

use std::sync::Arc;
use std::time::Duration;

use crate::common::{declare, rabbit};
use lapin::types::ShortString;
use ruststream::{App, HandlerOutcome, StartError, on};
use ruststream_rabbitmq::{ExchangeKind, QueueKind, lapin};
use ruststream_test_support::{Script, eventually, handler, unique_suffix};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r6_a_missing_queue_is_refused_at_start_naming_it() {
    let rabbit = rabbit().await;
    let queue = format!("r6-missing-{}", unique_suffix());
    let refused = App::new()
        .register(on(
            rabbit.queue(&queue),
            handler(Script::new(|_| HandlerOutcome::ack())),
        ))
        .start()
        .await;
    let Err(error @ StartError::Open { .. }) = refused else {
        panic!("started, or refused for another reason: {refused:?}");
    };
    let shown = error.to_string();
    assert!(shown.contains(&queue), "{shown}");
    assert!(
        shown.contains("declare(true)"),
        "says how to fix it: {shown}"
    );

    // With declaration on, the same start declares it and goes through.
    let running = App::new()
        .register(on(
            rabbit.queue(&queue).declare(true),
            handler(Script::new(|_| HandlerOutcome::ack())),
        ))
        .start()
        .await
        .expect("declared and started");
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r6_a_kind_that_does_not_match_the_queue_is_refused_at_start() {
    let rabbit = rabbit().await;
    let queue = format!("r6-kind-{}", unique_suffix());
    declare(&rabbit, &queue, &[]).await; // classic
    let refused = App::new()
        .register(on(
            rabbit.queue(&queue).kind(QueueKind::Quorum).declare(true),
            handler(Script::new(|_| HandlerOutcome::ack())),
        ))
        .start()
        .await;
    let Err(error @ StartError::Open { .. }) = refused else {
        panic!("a quorum reading of a classic queue started: {refused:?}");
    };
    let shown = error.to_string();
    assert!(
        shown.contains(&queue) && shown.contains("Quorum"),
        "{shown}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r6_a_bound_exchange_is_declared_and_routes_to_the_queue() {
    let rabbit = rabbit().await;
    let (queue, exchange) = (
        format!("r6-bound-{}", unique_suffix()),
        format!("r6-orders-{}", unique_suffix()),
    );
    let script = Script::new(|_| HandlerOutcome::ack());
    let running = App::new()
        .register(on(
            rabbit
                .queue(&queue)
                .declare(true)
                .bind(&exchange, ExchangeKind::Topic, "orders.*"),
            handler(Arc::clone(&script)),
        ))
        .start()
        .await
        .expect("starts");
    let channel = rabbit.connection().create_channel().await.expect("channel");
    for key in ["orders.eu", "invoices.eu", "orders.us"] {
        channel
            .basic_publish(
                ShortString::from(exchange.as_str()),
                ShortString::from(key),
                lapin::options::BasicPublishOptions::default(),
                key.as_bytes(),
                lapin::BasicProperties::default(),
            )
            .await
            .expect("published")
            .await
            .expect("sent");
    }
    eventually(Duration::from_secs(10), "the two orders routed", || {
        script.count() == 2
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    running.stop().await;
    let mut routed: Vec<String> = script
        .calls()
        .iter()
        .map(|c| String::from_utf8_lossy(&c.payload).into_owned())
        .collect();
    routed.sort();
    assert_eq!(
        routed,
        ["orders.eu", "orders.us"],
        "by the binding's pattern"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r6_an_exchange_of_another_kind_is_refused_at_start_naming_it() {
    let rabbit = rabbit().await;
    let (queue, exchange) = (
        format!("r6-kind-{}", unique_suffix()),
        format!("r6-fanout-{}", unique_suffix()),
    );
    let channel = rabbit.connection().create_channel().await.expect("channel");
    channel
        .exchange_declare(
            ShortString::from(exchange.as_str()),
            ExchangeKind::Fanout,
            lapin::options::ExchangeDeclareOptions::default(),
            lapin::types::FieldTable::default(),
        )
        .await
        .expect("a fanout exchange");
    let refused = App::new()
        .register(on(
            rabbit
                .queue(&queue)
                .declare(true)
                .bind(&exchange, ExchangeKind::Topic, "#"),
            |_: ruststream::Message<u64>| async { HandlerOutcome::ack() },
        ))
        .start()
        .await
        .expect_err("refused");
    let text = format!(
        "{refused}: {}",
        std::error::Error::source(&refused)
            .map(ToString::to_string)
            .unwrap_or_default()
    );
    assert!(text.contains(&exchange), "names the exchange: {text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r6_the_default_exchange_takes_no_binding() {
    let rabbit = rabbit().await;
    let refused = App::new()
        .register(on(
            rabbit
                .queue("r6-default")
                .bind("", ExchangeKind::Direct, "x"),
            |_: ruststream::Message<u64>| async { HandlerOutcome::ack() },
        ))
        .start()
        .await
        .expect_err("refused");
    assert!(
        refused.to_string().contains("default exchange"),
        "{refused}"
    );
}
