//! Bounded memory and start, one start position (SPEC G5, G7, G8) against pulsar-lite.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Script, assert_waited, eventually, handler, pulsar, relay, unique};
use ruststream::StartAt;
use ruststream::{App, HandlerOutcome, Headers, on};
use ruststream_pulsar::Pulsar;

async fn send(pulsar: &Pulsar, topic: &str, payload: &str) {
    pulsar
        .publisher()
        .send(topic, None, &Headers::new(), payload.as_bytes().to_vec())
        .await
        .expect("the broker took it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g8_a_new_subscription_reads_the_backlog_by_default() {
    let pulsar = pulsar().await;
    let topic = unique("g8-backlog");
    // The topic exists and holds 3 messages before any subscription does.
    for n in 0..3 {
        send(&pulsar, &topic, &format!("early-{n}")).await;
    }
    let script = Script::new(|_| HandlerOutcome::ack());
    let app = App::new()
        .register(on(
            pulsar.topic(&topic).subscription("new"),
            handler(Arc::clone(&script)),
        ))
        .start()
        .await
        .expect("start");
    eventually(Duration::from_secs(20), "the 3 earlier messages", || {
        script.count() == 3
    })
    .await;
    app.stop().await;
    // Latest, asked for: the backlog is skipped, what comes after is read.
    let script = Script::new(|_| HandlerOutcome::ack());
    let app = App::new()
        .register(on(
            pulsar
                .topic(&topic)
                .subscription("latest")
                .start_at(StartAt::Latest),
            handler(Arc::clone(&script)),
        ))
        .start()
        .await
        .expect("start");
    tokio::time::sleep(Duration::from_secs(1)).await;
    send(&pulsar, &topic, "later").await;
    eventually(Duration::from_secs(20), "the later message", || {
        script.count() >= 1
    })
    .await;
    let payloads: Vec<Vec<u8>> = script.calls().iter().map(|c| c.payload.to_vec()).collect();
    assert_eq!(payloads, vec![b"later".to_vec()], "the backlog skipped");
    app.stop().await;
    println!(
        "RELIABILITY|Pulsar|guard rail: a new subscription created after 3 messages were sent, default start position|lost 0 of 3 (StartAt::Earliest); with StartAt::Latest the 3 are skipped and a later one is read, as asked|none|none declared"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g7_connecting_to_a_closed_port_fails_within_the_timeout_naming_the_address() {
    let started = Instant::now();
    let err = Pulsar::connect_within("pulsar://127.0.0.1:1", Duration::from_secs(2))
        .await
        .expect_err("nothing listens there");
    let took = started.elapsed();
    assert!(err.to_string().contains("pulsar://127.0.0.1:1"), "{err}");
    assert!(took < Duration::from_secs(7), "failed after {took:?}");
    println!(
        "RELIABILITY|Pulsar|guard rail: start against a closed port, connect timeout 2 s: failed after {:.1} s naming the address|none|none|none",
        took.as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g5_held_retry_after_waits_stop_fetching_at_max_in_flight() {
    let pulsar = pulsar().await;
    let topic = unique("g5-held");
    for n in 0..300 {
        send(&pulsar, &topic, &format!("m{n}")).await;
    }
    let script = Script::new(|_| HandlerOutcome::retry_after(Duration::from_secs(60)));
    let app = App::new()
        .metrics()
        .register(
            on(
                pulsar.topic(&topic).subscription("bounded"),
                handler(Arc::clone(&script)),
            )
            .max_in_flight(50),
        )
        .start()
        .await
        .expect("start");
    eventually(Duration::from_secs(30), "the bound reached", || {
        script.count() >= 50
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(script.count(), 50, "fetching stopped at max_in_flight");
    // The "saturated" alert of docs/operating.md fires.
    let in_flight = ruststream_test_support::ops::metric(&app, "ruststream_in_flight", &[]).await;
    assert_eq!(in_flight, 50.0, "in flight at the bound");
    app.stop().await;
    println!(
        "RELIABILITY|Pulsar|guard rail: 300 messages, every one retry_after(60 s) held in the service, max_in_flight(50): 50 held, the rest left to the client and broker|lost 0 (the held messages stay unacknowledged)|none|none declared"
    );
}

/// The bound filled by held waits alone: the driver stops calling `next`, and the waits
/// must still come due (in `idle`), or the registration would stop for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g5_held_retry_after_waits_come_due_at_max_in_flight() {
    let pulsar = pulsar().await;
    let topic = unique("g5-due");
    for n in 0..20 {
        send(&pulsar, &topic, &format!("m{n}")).await;
    }
    let seen = Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
    let first_seen = Arc::clone(&seen);
    let script = Script::new(move |d| {
        if first_seen.lock().unwrap().insert(d.payload().to_vec()) {
            HandlerOutcome::retry_after(Duration::from_millis(300))
        } else {
            HandlerOutcome::ack()
        }
    });
    let app = App::new()
        .register(
            on(
                pulsar.topic(&topic).subscription("due"),
                handler(Arc::clone(&script)),
            )
            .max_in_flight(5),
        )
        .start()
        .await
        .expect("start");
    eventually(
        Duration::from_secs(30),
        "every message back once and acked",
        || script.count() >= 40,
    )
    .await;
    app.stop().await;
    let mut handled: Vec<Vec<u8>> = script.calls().iter().map(|c| c.payload.to_vec()).collect();
    handled.sort();
    let mut expected: Vec<Vec<u8>> = (0..20)
        .flat_map(|n| [format!("m{n}").into_bytes(), format!("m{n}").into_bytes()])
        .collect();
    expected.sort();
    assert_eq!(
        handled, expected,
        "each message handled twice: held, then acked"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g7_a_waiting_start_warns_once_per_interval_and_connects_when_the_broker_comes() {
    let _ = pulsar().await; // captures logs
    let broker = std::env::var("RUSTSTREAM_PULSAR_ADDR").expect("RUSTSTREAM_PULSAR_ADDR");
    let late = relay::start_later(broker, Duration::from_secs(5)).await;
    let address = format!("pulsar://{late}");
    let started = Instant::now();
    let pulsar = Pulsar::connect_waiting(&address, Duration::from_secs(2))
        .await
        .expect("connected once the broker listens");
    let took = started.elapsed();
    let topic = unique("g7wait");
    let script = Script::new(|_| HandlerOutcome::ack());
    let app = App::new()
        .register(on(
            pulsar.topic(&topic).subscription(unique("s")),
            handler(Arc::clone(&script)),
        ))
        .start()
        .await
        .expect("start");
    pulsar
        .publisher()
        .send(&topic, None, &Headers::new(), b"after the wait".to_vec())
        .await
        .expect("publish");
    eventually(Duration::from_secs(20), "the message", || {
        script.count() == 1
    })
    .await;
    app.stop().await;
    let warnings = assert_waited(&address, took, Duration::from_secs(5));
    println!(
        "RELIABILITY|Pulsar|guard rail: Pulsar::connect_waiting(warn every 2 s), broker listening only after 5 s: connected after {:.1} s with {warnings} WARN line(s) naming the address, then a message handled|none|none|none",
        took.as_secs_f64()
    );
}

/// Many publishes at once (`send_all` of 5,000) wait for room in the client's outbound
/// queue (100 messages by default) instead of failing with `SlowDown`: every one is
/// confirmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_all_beyond_the_clients_queue_waits_for_room_and_confirms_each() {
    let pulsar = pulsar().await;
    let topic = unique("send-all");
    let publisher = ruststream::Publisher::new(pulsar.publish_handle());
    let messages = (0..5_000).map(|n| ruststream::Outgoing::new(topic.as_str(), n.to_string()));
    let results = publisher.send_all(messages).await;
    let failed: Vec<String> = results
        .iter()
        .filter_map(|r| r.as_ref().err().map(ToString::to_string))
        .take(3)
        .collect();
    assert!(failed.is_empty(), "refused: {failed:?}");
    assert_eq!(results.len(), 5_000);
}

/// `send_all` answers each message: one whose header Pulsar cannot carry (not UTF-8) is
/// refused by name, the others before and after it are stored, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_all_refuses_only_the_message_pulsar_cannot_carry() {
    let pulsar = pulsar().await;
    let topic = unique("send-all-mixed");
    let publisher = ruststream::Publisher::new(pulsar.publish_handle());
    let messages = (0..10).map(|n| {
        let mut message = ruststream::Outgoing::new(topic.as_str(), n.to_string());
        if n == 4 {
            message.headers.insert("raw", vec![0xff, 0xfe]);
        }
        message
    });
    let results = publisher.send_all(messages).await;
    for (n, result) in results.iter().enumerate() {
        match (n, result) {
            (4, Err(e)) => assert!(e.to_string().contains("`raw`"), "{e}"),
            (4, Ok(())) => panic!("a header that is not UTF-8 was sent"),
            (_, result) => assert!(result.is_ok(), "{n}: {result:?}"),
        }
    }
    let script = Script::new(|_| HandlerOutcome::ack());
    let app = App::new()
        .register(on(
            pulsar.topic(&topic).subscription("read"),
            handler(Arc::clone(&script)),
        ))
        .start()
        .await
        .expect("start");
    eventually(Duration::from_secs(20), "the 9 stored", || {
        script.count() == 9
    })
    .await;
    app.stop().await;
    let read: Vec<String> = script
        .calls()
        .iter()
        .map(|c| String::from_utf8_lossy(&c.payload).into_owned())
        .collect();
    assert_eq!(read, ["0", "1", "2", "3", "5", "6", "7", "8", "9"]);
}

/// An empty topic name (an unset setting, say) is refused by name, not sent, and the
/// call's other messages go out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_topic_name_is_refused_and_the_others_go_out() {
    let pulsar = pulsar().await;
    let topic = unique("send-all-empty");
    let messages = [
        ruststream::core::Outgoing::new("", "to nowhere"),
        ruststream::core::Outgoing::new(topic.as_str(), "1"),
    ];
    let results = ruststream::Publisher::new(pulsar.publish_handle())
        .send_all(messages)
        .await;
    let refused = results[0].as_ref().expect_err("an empty topic name");
    assert_eq!(
        refused.kind(),
        ruststream::core::PublishErrorKind::Rejected,
        "{refused}"
    );
    assert!(refused.to_string().contains("empty"), "{refused}");
    assert!(results[1].is_ok(), "{:?}", results[1]);
}
