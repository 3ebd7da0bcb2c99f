//! RabbitMQ against the rabbitmq-server the test command starts: SPEC R1-R7 where the
//! behaviour suite does not already show them.

use std::sync::Arc;
use std::time::Duration;

use lapin::options::BasicGetOptions;
use lapin::types::{AMQPValue, ShortString};
use ruststream::{App, HandlerOutcome, Headers, StartError, on};
use ruststream_core::{AttemptSource, PublishErrorKind};
use ruststream_rabbitmq::{ExchangeKind, QueueKind, RabbitMq, lapin};
use ruststream_test_support::{Script, eventually, handler, unique_suffix};

mod common;
use common::{declare, rabbit, text};

/// Takes one message off `queue`, if there is one.
async fn get(rabbit: &RabbitMq, queue: &str) -> Option<lapin::message::Delivery> {
    let channel = rabbit.connection().create_channel().await.expect("channel");
    let message = channel
        .basic_get(ShortString::from(queue), BasicGetOptions { no_ack: true })
        .await
        .expect("basic.get")
        .map(|m| m.delivery);
    let _ = channel.close(200, ShortString::from("done")).await;
    message
}

/// Takes one message off `queue`, waiting up to 10 s for one to arrive.
async fn arrives(rabbit: &RabbitMq, queue: &str) -> Option<lapin::message::Delivery> {
    for _ in 0..200 {
        if let Some(message) = get(rabbit, queue).await {
            return Some(message);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

async fn send(rabbit: &RabbitMq, queue: &str, payload: &[u8]) {
    rabbit
        .publisher()
        .send(queue, &Headers::new(), payload)
        .await
        .expect("published");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r1_drop_rejects_to_the_queues_dead_letter_exchange() {
    let rabbit = rabbit().await;
    let (queue, rejected) = (
        format!("r1-{}", unique_suffix()),
        format!("r1-rejected-{}", unique_suffix()),
    );
    declare(&rabbit, &rejected, &[]).await;
    declare(
        &rabbit,
        &queue,
        &[
            ("x-dead-letter-exchange", text("")),
            ("x-dead-letter-routing-key", text(&rejected)),
        ],
    )
    .await;
    let script = Script::new(|_| HandlerOutcome::drop());
    let running = App::new()
        .register(on(rabbit.queue(&queue), handler(Arc::clone(&script))))
        .start()
        .await
        .expect("starts");
    send(&rabbit, &queue, b"unwanted").await;
    eventually(Duration::from_secs(10), "handled", || script.count() == 1).await;
    let letter = arrives(&rabbit, &rejected)
        .await
        .expect("basic.reject(requeue=false) routed it to the dead-letter exchange");
    assert_eq!(letter.data, b"unwanted");
    let reason = letter
        .properties
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get("x-first-death-reason").cloned());
    let Some(AMQPValue::LongString(reason)) = reason else {
        panic!("no x-first-death-reason: {:?}", letter.properties.headers());
    };
    assert_eq!(reason.as_bytes(), b"rejected", "the broker says why");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(script.count(), 1, "never delivered again");
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r3_a_quorum_queues_attempt_is_the_brokers_delivery_count() {
    let rabbit = rabbit().await;
    let queue = format!("r3-{}", unique_suffix());
    declare(&rabbit, &queue, &[("x-queue-type", text("quorum"))]).await;
    let sources = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = Arc::clone(&sources);
    let script = Script::new(move |d| {
        seen.lock().unwrap().push(d.attempt().source());
        if d.attempt().number() < 3 {
            HandlerOutcome::retry()
        } else {
            HandlerOutcome::ack()
        }
    });
    let running = App::new()
        .register(on(
            rabbit.queue(&queue).kind(QueueKind::Quorum),
            handler(Arc::clone(&script)),
        ))
        .start()
        .await
        .expect("starts");
    send(&rabbit, &queue, b"counted").await;
    eventually(Duration::from_secs(10), "three deliveries", || {
        script.count() == 3
    })
    .await;
    running.stop().await;
    let calls = script.calls();
    assert_eq!(
        calls.iter().map(|c| c.attempt).collect::<Vec<_>>(),
        [1, 2, 3]
    );
    assert!(
        calls
            .iter()
            .all(|c| c.headers.get("x-ruststream-retry-count").is_none()),
        "no copies: the same message, counted by the broker"
    );
    assert_eq!(calls[1].headers.get_str("x-delivery-count"), Some("1"));
    assert!(
        sources
            .lock()
            .unwrap()
            .iter()
            .all(|s| *s == AttemptSource::Broker)
    );
}

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
async fn r7_an_unroutable_publish_is_an_error_not_a_silent_drop() {
    let rabbit = rabbit().await;
    let queue = format!("r7-nobody-{}", unique_suffix());
    let error = rabbit
        .publisher()
        .send(&queue, &Headers::new(), b"lost?")
        .await
        .expect_err("no queue takes it");
    assert_eq!(error.kind(), PublishErrorKind::NoSuchAddress, "{error}");
    assert!(error.to_string().contains(&queue), "{error}");
}

/// lapin gives a `basic.return` to whichever confirmation it completes next, so with
/// several publishes in flight on one channel a refusal can land on another message:
/// a message no queue took reported as sent (lost), one stored reported as refused.
/// Every result must belong to its own message, however many run at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r7_each_result_is_its_own_while_many_publishes_overlap() {
    let rabbit = rabbit().await;
    let suffix = unique_suffix();
    let (queue, nobody) = (format!("r7-some-{suffix}"), format!("r7-none-{suffix}"));
    declare(&rabbit, &queue, &[]).await;
    let publisher = rabbit.publisher();
    let mut sends = tokio::task::JoinSet::new();
    for n in 0..4000_u32 {
        let publisher = publisher.clone();
        let to = if n % 4 == 0 {
            nobody.clone()
        } else {
            queue.clone()
        };
        sends.spawn(async move {
            let sent = publisher
                .send(&to, &Headers::new(), n.to_string().as_bytes())
                .await;
            (n, sent)
        });
    }
    let (mut stored, mut wrong) = (0, Vec::new());
    while let Some(joined) = sends.join_next().await {
        let (n, sent) = joined.expect("task");
        match (n % 4 == 0, sent) {
            (true, Err(e)) if e.kind() == PublishErrorKind::NoSuchAddress => {}
            (false, Ok(())) => stored += 1,
            (unroutable, other) => wrong.push(format!("{n} (to nobody: {unroutable}): {other:?}")),
        }
    }
    assert!(wrong.is_empty(), "results on the wrong message: {wrong:?}");
    let mut arrived = 0;
    while get(&rabbit, &queue).await.is_some() {
        arrived += 1;
    }
    assert_eq!((stored, arrived), (3000, 3000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r2_no_outcome_comes_back_when_the_channel_closes() {
    let rabbit = rabbit().await;
    let queue = format!("r2-{}", unique_suffix());
    declare(&rabbit, &queue, &[]).await;
    let stuck = Script::slow(Duration::from_secs(60), |_| HandlerOutcome::ack());
    let running = App::new()
        .shutdown_timeout(Duration::from_millis(200))
        .register(on(rabbit.queue(&queue), handler(Arc::clone(&stuck))))
        .start()
        .await
        .expect("starts");
    send(&rabbit, &queue, b"unfinished").await;
    eventually(Duration::from_secs(10), "the handler runs", || {
        stuck.count() == 1
    })
    .await;
    running.stop().await; // the drain gives up; the channel closes
    let again = Script::new(|_| HandlerOutcome::ack());
    let running = App::new()
        .register(on(rabbit.queue(&queue), handler(Arc::clone(&again))))
        .start()
        .await
        .expect("starts");
    eventually(
        Duration::from_secs(10),
        "given back and delivered again",
        || again.count() == 1,
    )
    .await;
    assert_eq!(&again.calls()[0].payload[..], b"unfinished");
    running.stop().await;
}

/// `retry_after` on both kinds: back no earlier than the delay, as the next attempt; on a
/// quorum queue the same message (the broker's count), on a classic one a copy (the
/// runtime's count in its header).
async fn retry_after_comes_back(kind: QueueKind) -> Vec<ruststream_test_support::Seen> {
    let rabbit = rabbit().await;
    let queue = format!("r4-{}", unique_suffix());
    let arguments = match kind {
        QueueKind::Quorum => vec![("x-queue-type", text("quorum"))],
        _ => Vec::new(),
    };
    declare(&rabbit, &queue, &arguments).await;
    let script = Script::new(|d| {
        if d.attempt().number() == 1 {
            HandlerOutcome::retry_after(Duration::from_millis(400))
        } else {
            HandlerOutcome::ack()
        }
    });
    let running = App::new()
        .register(
            on(
                rabbit.queue(&queue).kind(kind),
                handler(Arc::clone(&script)),
            )
            .max_attempts(5),
        )
        .start()
        .await
        .expect("starts");
    send(&rabbit, &queue, b"later").await;
    eventually(Duration::from_secs(10), "back after the delay", || {
        script.count() == 2
    })
    .await;
    running.stop().await;
    let calls = script.calls();
    assert_eq!(calls[1].attempt, 2);
    assert!(calls[1].at - calls[0].at >= Duration::from_millis(390));
    assert!(get(&rabbit, &queue).await.is_none(), "nothing left behind");
    calls
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r4_quorum_retry_after_is_held_then_nacked_and_counted_by_the_broker() {
    let calls = retry_after_comes_back(QueueKind::Quorum).await;
    assert_eq!(calls[1].headers.get_str("x-delivery-count"), Some("1"));
    assert_eq!(
        calls[1].headers.get("x-ruststream-retry-count"),
        None,
        "no copy"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r4_classic_retry_after_is_a_counted_copy() {
    let calls = retry_after_comes_back(QueueKind::Classic).await;
    assert_eq!(
        calls[1].headers.get_str("x-ruststream-retry-count"),
        Some("1")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r5_at_the_cap_the_delivery_goes_to_the_dead_letter_queue_as_it_arrived() {
    let rabbit = rabbit().await;
    let (queue, dead) = (
        format!("r5-{}", unique_suffix()),
        format!("r5-dead-{}", unique_suffix()),
    );
    declare(&rabbit, &queue, &[("x-queue-type", text("quorum"))]).await;
    declare(&rabbit, &dead, &[]).await;
    let script = Script::new(|_| HandlerOutcome::retry());
    let running = App::new()
        .register(
            on(
                rabbit.queue(&queue).kind(QueueKind::Quorum),
                handler(Arc::clone(&script)),
            )
            .max_attempts(3)
            .dead_letter(&dead),
        )
        .start()
        .await
        .expect("starts");
    let mut headers = Headers::new();
    headers.insert("trace", "t-5");
    rabbit
        .publisher()
        .send(&queue, &headers, b"\x00exhausted\xff")
        .await
        .expect("published");
    let letter = arrives(&rabbit, &dead).await.expect("a dead letter");
    running.stop().await;
    assert_eq!(script.count(), 3, "exactly max_attempts runs");
    assert_eq!(letter.data, b"\x00exhausted\xff", "byte for byte");
    let trace = letter
        .properties
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get("trace").cloned());
    assert_eq!(trace, Some(text("t-5")), "headers kept");
    assert!(
        get(&rabbit, &queue).await.is_none(),
        "the original was acknowledged"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_fails_at_once_naming_the_address_never_the_password() {
    ruststream_test_support::capture_logs("trace");
    let url = std::env::var("RUSTSTREAM_RABBITMQ_URL").expect("RUSTSTREAM_RABBITMQ_URL");
    let wrong = "pw-wrong-6d1f3e";
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    let bad = format!("{scheme}://guest:{wrong}@{host}");
    let started = std::time::Instant::now();
    let error = RabbitMq::connect(&bad)
        .await
        .expect_err("the broker refuses the password");
    assert!(started.elapsed() < Duration::from_secs(5), "failed at once");
    let shown = format!("{error} {error:?}");
    let address = host.split('/').next().expect("host:port");
    assert!(shown.contains(address), "{shown}");
    assert!(shown.contains("amqp://***@"), "masked: {shown}");
    assert!(!shown.contains(wrong), "{shown}");
    ruststream_test_support::assert_no_log_line_holds(wrong);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g7_start_against_a_closed_port_fails_within_the_timeout_naming_it() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let url = format!("amqp://guest:s3cret@127.0.0.1:{port}/%2f");
    let started = std::time::Instant::now();
    let error = RabbitMq::connect_within(&url, Duration::from_secs(2))
        .await
        .expect_err("nothing listens there");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    let shown = format!("{error} {error:?}");
    assert!(shown.contains(&format!("127.0.0.1:{port}")), "{shown}");
    assert!(!shown.contains("s3cret"), "{shown}");
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g5_quorum_held_retry_after_waits_come_due_at_max_in_flight() {
    let rabbit = rabbit().await;
    let queue = format!("g5-held-{}", unique_suffix());
    declare(&rabbit, &queue, &[("x-queue-type", text("quorum"))]).await;
    for n in 0..20 {
        send(&rabbit, &queue, format!("m{n}").as_bytes()).await;
    }
    let script = Script::new(|d| {
        if d.attempt().number() == 1 {
            HandlerOutcome::retry_after(Duration::from_millis(300))
        } else {
            HandlerOutcome::ack()
        }
    });
    let running = App::new()
        .register(
            on(
                rabbit.queue(&queue).kind(QueueKind::Quorum),
                handler(Arc::clone(&script)),
            )
            .max_in_flight(5),
        )
        .start()
        .await
        .expect("starts");
    // Every wait fills the bound; each comes due and is nacked though nothing is fetched.
    eventually(
        Duration::from_secs(20),
        "every message back and acked",
        || script.calls().iter().filter(|c| c.attempt == 2).count() == 20,
    )
    .await;
    running.stop().await;
    assert!(get(&rabbit, &queue).await.is_none(), "nothing left behind");
}

/// R1: acks gathered into one `multiple` ack never cover a delivery still running: with
/// four lanes, `a`, `c` and `d` are acked while `b`'s handler still runs; the app is then
/// stopped with a drain deadline `b` never meets, so `b` is left unsettled and the broker
/// gives it back, and only it, to the next reader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r1_a_multiple_ack_never_covers_a_delivery_still_running() {
    let rabbit = rabbit().await;
    let queue = format!("r1-multiple-{}", unique_suffix());
    declare(&rabbit, &queue, &[]).await;
    for payload in [&b"a"[..], b"b", b"c", b"d"] {
        send(&rabbit, &queue, payload).await;
    }
    let handled = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = Arc::clone(&handled);
    let running = App::new()
        .shutdown_timeout(Duration::from_millis(300))
        .register(
            on(rabbit.queue(&queue), move |payload: ruststream::Payload| {
                let seen = Arc::clone(&seen);
                async move {
                    if &payload.0[..] == b"b" {
                        std::future::pending::<()>().await;
                    }
                    seen.lock().unwrap().push(payload.0.clone());
                    HandlerOutcome::ack()
                }
            })
            .lanes(4),
        )
        .start()
        .await
        .expect("starts");
    eventually(Duration::from_secs(10), "a, c and d acked", || {
        handled.lock().unwrap().len() == 3
    })
    .await;
    running.stop().await;
    let again = arrives(&rabbit, &queue).await.expect("b is given back");
    assert_eq!(again.data, b"b");
    assert!(
        get(&rabbit, &queue).await.is_none(),
        "a, c and d were acked, and only they"
    );
}

/// R1: acks whose send was cut short (the runtime drops a fetch when a lane finishes
/// first) are finished by the next call, not forgotten: `b` and `c` are acked while `a`
/// still runs, so they go alone; the fetch that starts sending them is dropped after one
/// poll; the next fetch and the stop send what is left; only `a` comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r1_acks_cut_short_by_a_dropped_fetch_are_sent_by_the_next() {
    use ruststream_core::{Declaration, Delivery, Descriptor, Settle, Subscription};
    let rabbit = rabbit().await;
    let queue = format!("r1-cut-short-{}", unique_suffix());
    declare(&rabbit, &queue, &[]).await;
    for payload in [&b"a"[..], b"b", b"c"] {
        send(&rabbit, &queue, payload).await;
    }
    let mut subscription = rabbit
        .queue(&queue)
        .open(&Declaration::default())
        .await
        .expect("opens");
    let mut receipts = Vec::new();
    for _ in 0..3 {
        let mut slot = Delivery::empty();
        let receipt = subscription.next_into(&mut slot).await.expect("a delivery");
        receipts.push((slot.payload().clone(), receipt.expect("received")));
    }
    for (payload, receipt) in receipts {
        if &payload[..] != b"a" {
            subscription
                .settle(receipt, Settle::Ack)
                .await
                .expect("acked");
        }
    }
    let mut slot = Delivery::empty();
    let mut fetch = Box::pin(subscription.next_into(&mut slot));
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    assert!(
        fetch.as_mut().poll(&mut cx).is_pending(),
        "nothing more to fetch"
    );
    drop(fetch);
    let mut slot = Delivery::empty();
    let again = tokio::time::timeout(
        Duration::from_millis(300),
        subscription.next_into(&mut slot),
    );
    assert!(again.await.is_err(), "nothing more to fetch");
    subscription.close().await;
    let back = arrives(&rabbit, &queue).await.expect("a is given back");
    assert_eq!(back.data, b"a");
    assert!(get(&rabbit, &queue).await.is_none(), "b and c were acked");
}
