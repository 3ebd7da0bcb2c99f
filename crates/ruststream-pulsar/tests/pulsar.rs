//! Pulsar against a real Pulsar-protocol broker (pulsar-lite, through the test relay):
//! SPEC P1-P7.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Script, eventually, handler, pulsar, unique};
use ruststream::{App, HandlerOutcome, Headers, Running, on};
use ruststream_pulsar::SubType;

async fn start(app: App) -> Running {
    app.start().await.expect("the app starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p1_ack_is_acknowledged_and_never_sent_again() {
    let pulsar = pulsar().await;
    let topic = unique("p1-ack");
    let script = Script::new(|_| HandlerOutcome::ack());
    let app = start(
        App::new().register(on(
            pulsar
                .topic(&topic)
                .subscription("s")
                .ack_timeout(Duration::from_secs(1)),
            handler(Arc::clone(&script)),
        )),
    )
    .await;
    let mut headers = Headers::new();
    headers.insert("trace", "t1");
    pulsar
        .publisher()
        .send(&topic, Some(b"k1"), &headers, b"hello".to_vec())
        .await
        .unwrap();
    eventually(Duration::from_secs(20), "handled", || script.count() == 1).await;
    let call = &script.calls()[0];
    assert_eq!(&call.payload[..], b"hello");
    assert_eq!(call.key.as_deref(), Some(&b"k1"[..]));
    assert_eq!(call.headers.get_str("trace"), Some("t1"));
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        script.count(),
        1,
        "acknowledged: never sent again, even after the ack timeout"
    );
    app.stop().await;
}

fn topic_of(
    pulsar: &ruststream_pulsar::Pulsar,
    topic: &str,
    sub_type: SubType,
) -> ruststream_pulsar::PulsarTopic {
    pulsar
        .topic(topic)
        .subscription("s")
        .subscription_type(sub_type)
}

async fn send(pulsar: &ruststream_pulsar::Pulsar, topic: &str, payload: &str) {
    pulsar
        .publisher()
        .send(topic, None, &Headers::new(), payload.as_bytes().to_vec())
        .await
        .expect("the broker took it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p1_drop_is_acknowledged_too_and_never_comes_back() {
    let pulsar = pulsar().await;
    let topic = unique("p1-drop");
    let script = Script::new(|_| HandlerOutcome::drop());
    let app = start(App::new().register(on(
        topic_of(&pulsar, &topic, SubType::Shared).ack_timeout(Duration::from_secs(1)),
        handler(Arc::clone(&script)),
    )))
    .await;
    send(&pulsar, &topic, "unwanted").await;
    eventually(Duration::from_secs(20), "handled", || script.count() == 1).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(script.count(), 1);
    app.stop().await;
}

async fn retry_once(sub_type: SubType) -> Vec<u32> {
    let pulsar = pulsar().await;
    let topic = unique("p4-retry");
    let script = Script::new(|d| {
        if d.attempt().number() == 1 && d.payload() == "first" {
            HandlerOutcome::retry()
        } else {
            HandlerOutcome::ack()
        }
    });
    let app = start(App::new().register(on(
        topic_of(&pulsar, &topic, sub_type),
        handler(Arc::clone(&script)),
    )))
    .await;
    send(&pulsar, &topic, "first").await;
    eventually(Duration::from_secs(20), "redelivered", || {
        script.count() == 2
    })
    .await;
    let calls = script.calls();
    assert!(
        calls[1].at - calls[0].at < Duration::from_secs(5),
        "nack: sent again at once"
    );
    app.stop().await;
    calls.iter().map(|c| c.attempt).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p4_retry_comes_back_at_once_with_the_count_raised_on_shared() {
    assert_eq!(retry_once(SubType::Shared).await, vec![1, 2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p4_retry_comes_back_at_once_with_the_count_raised_on_key_shared() {
    assert_eq!(retry_once(SubType::KeyShared).await, vec![1, 2]);
}

/// pulsar-lite does not act on a negative acknowledgement on Exclusive and Failover
/// subscriptions (real Pulsar redelivers); the message comes back when the consumer
/// reconnects, and shows its count of 0 there.
async fn comes_back_with_count_zero(sub_type: SubType) {
    let pulsar = pulsar().await;
    let topic = unique("p4-single");
    let first = Script::new(|_| HandlerOutcome::retry());
    let app = start(App::new().register(on(
        topic_of(&pulsar, &topic, sub_type),
        handler(Arc::clone(&first)),
    )))
    .await;
    send(&pulsar, &topic, "again").await;
    eventually(Duration::from_secs(20), "handled", || first.count() == 1).await;
    app.stop().await;
    let second = Script::new(|_| HandlerOutcome::ack());
    let app = start(App::new().register(on(
        topic_of(&pulsar, &topic, sub_type),
        handler(Arc::clone(&second)),
    )))
    .await;
    eventually(Duration::from_secs(20), "delivered again", || {
        second.count() == 1
    })
    .await;
    assert_eq!(first.calls()[0].attempt, 1);
    assert_eq!(
        second.calls()[0].attempt,
        1,
        "no redelivery count on {sub_type:?}"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p4_exclusive_delivers_again_with_count_zero() {
    comes_back_with_count_zero(SubType::Exclusive).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p4_failover_delivers_again_with_count_zero() {
    comes_back_with_count_zero(SubType::Failover).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p1_retry_after_is_held_then_nacked_and_comes_back_no_earlier() {
    let pulsar = pulsar().await;
    let topic = unique("p1-delay");
    let delay = Duration::from_millis(1200);
    let script = Script::new(move |d| {
        if d.attempt().number() == 1 {
            HandlerOutcome::retry_after(delay)
        } else {
            HandlerOutcome::ack()
        }
    });
    let app = start(App::new().register(on(
        topic_of(&pulsar, &topic, SubType::Shared).ack_timeout(Duration::from_secs(30)),
        handler(Arc::clone(&script)),
    )))
    .await;
    send(&pulsar, &topic, "later").await;
    eventually(Duration::from_secs(20), "came back", || script.count() == 2).await;
    let calls = script.calls();
    assert!(
        calls[1].at - calls[0].at >= delay,
        "came back after {:?}",
        calls[1].at - calls[0].at
    );
    assert_eq!(calls[1].attempt, 2, "count + 1");
    app.stop().await;
}

/// The broker's message id is in a delivery's metadata, the same when it comes again
/// (the inbox's identity of a Pulsar message without `x-ruststream-id`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_message_id_is_read_and_the_same_on_redelivery() {
    let pulsar = pulsar().await;
    let topic = unique("message-id");
    let ids = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = Arc::clone(&ids);
    let script = Script::new(move |d| {
        seen.lock().unwrap().push(d.metadata().ledger_entry);
        if d.attempt().number() == 1 {
            HandlerOutcome::retry()
        } else {
            HandlerOutcome::ack()
        }
    });
    let app = start(App::new().register(on(
        topic_of(&pulsar, &topic, SubType::Shared),
        handler(Arc::clone(&script)),
    )))
    .await;
    send(&pulsar, &topic, "first").await;
    send(&pulsar, &topic, "second").await;
    eventually(Duration::from_secs(20), "each twice", || {
        script.count() == 4
    })
    .await;
    app.stop().await;
    let ids = ids.lock().unwrap().clone();
    let mut distinct: Vec<_> = ids.iter().map(|id| id.expect("a message id")).collect();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        2,
        "one id per message, kept on redelivery: {ids:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p2_a_delay_not_shorter_than_ack_timeout_is_refused_and_the_timer_brings_it_back() {
    let pulsar = pulsar().await;
    let topic = unique("p2");
    let ack_timeout = Duration::from_secs(2);
    let script = Script::new(move |d| {
        if d.attempt().number() == 1 {
            HandlerOutcome::retry_after(ack_timeout)
        } else {
            HandlerOutcome::ack()
        }
    });
    let app = start(App::new().register(on(
        topic_of(&pulsar, &topic, SubType::Shared).ack_timeout(ack_timeout),
        handler(Arc::clone(&script)),
    )))
    .await;
    send(&pulsar, &topic, "too long").await;
    eventually(
        Duration::from_secs(20),
        "back after the ack timeout",
        || script.count() == 2,
    )
    .await;
    let calls = script.calls();
    assert!(
        calls[1].at - calls[0].at >= ack_timeout - Duration::from_millis(100),
        "the client's ack timeout brought it back"
    );
    assert!(common::logs().contains("refused"), "the refusal is logged");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p2_p6_every_refusal_is_listed_at_startup() {
    let pulsar = pulsar().await;
    let script = Script::new(|_| HandlerOutcome::ack());
    let err = App::new()
        .register(
            on(
                topic_of(&pulsar, "a", SubType::Shared),
                handler(Arc::clone(&script)),
            )
            .name("cap-only")
            .max_attempts(3),
        )
        .register(
            on(
                topic_of(&pulsar, "b", SubType::Shared),
                handler(Arc::clone(&script)),
            )
            .name("dead-only")
            .dead_letter("b-dead"),
        )
        .register(
            on(
                topic_of(&pulsar, "c", SubType::Exclusive),
                handler(Arc::clone(&script)),
            )
            .name("exclusive")
            .max_attempts(3)
            .dead_letter("c-dead"),
        )
        .register(
            on(
                topic_of(&pulsar, "d", SubType::Failover),
                handler(Arc::clone(&script)),
            )
            .name("failover")
            .max_attempts(3)
            .dead_letter("d-dead"),
        )
        .register(
            on(
                topic_of(&pulsar, "e", SubType::Shared)
                    .ack_timeout(Duration::from_secs(10))
                    .longest_delay(Duration::from_secs(10)),
                handler(Arc::clone(&script)),
            )
            .name("delay"),
        )
        .start()
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("5 rule(s) broken"), "{err}");
    assert!(
        err.contains("`cap-only` on `a`: max_attempts without a dead letter"),
        "{err}"
    );
    assert!(
        err.contains("`dead-only` on `b`: a dead letter without max_attempts"),
        "{err}"
    );
    assert!(
        err.contains("`exclusive` on `c`: a cap on a Exclusive subscription"),
        "{err}"
    );
    assert!(
        err.contains("`failover` on `d`: a cap on a Failover subscription"),
        "{err}"
    );
    assert!(
        err.contains("`delay` on `e`: longest retry_after 10s"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p5_the_handler_runs_max_attempts_times_then_the_client_dead_letters_it() {
    let pulsar = pulsar().await;
    let (topic, dead) = (unique("p5"), unique("p5-dead"));
    let script = Script::new(|_| HandlerOutcome::retry());
    let letters = Script::new(|_| HandlerOutcome::ack());
    let app = start(
        App::new()
            .register(
                on(
                    topic_of(&pulsar, &topic, SubType::Shared),
                    handler(Arc::clone(&script)),
                )
                .name("orders")
                .max_attempts(3)
                .dead_letter(&dead),
            )
            .register(
                on(
                    pulsar.topic(&dead).subscription("dlq"),
                    handler(Arc::clone(&letters)),
                )
                .name("dead"),
            ),
    )
    .await;
    let mut headers = Headers::new();
    headers.insert("trace", "t5");
    pulsar
        .publisher()
        .send(&topic, Some(b"k"), &headers, b"poison".to_vec())
        .await
        .unwrap();
    eventually(Duration::from_secs(30), "the dead letter arrived", || {
        letters.count() == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(script.count(), 3, "exactly max_attempts runs");
    assert_eq!(
        script.calls().iter().map(|c| c.attempt).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    let letter = &letters.calls()[0];
    assert_eq!(&letter.payload[..], b"poison");
    assert_eq!(letter.headers.get_str("REAL_TOPIC"), Some(topic.as_str()));
    assert!(
        letter.headers.get_str("ORIGIN_MESSAGE_ID").is_some(),
        "{:?}",
        letter.headers
    );
    assert_eq!(letter.headers.get_str("trace"), Some("t5"));
    app.stop().await;
}

#[test]
fn p7_a_killed_service_loses_the_wait_not_the_held_message() {
    let service = tokio::runtime::Runtime::new().unwrap();
    let topic = unique("p7");
    let first = Script::new(|_| HandlerOutcome::retry_after(Duration::from_secs(600)));
    service.block_on(async {
        let pulsar = pulsar().await;
        let running = App::new()
            .register(on(
                topic_of(&pulsar, &topic, SubType::Shared),
                handler(Arc::clone(&first)),
            ))
            .start()
            .await
            .unwrap();
        std::mem::forget(running);
        send(&pulsar, &topic, "held").await;
        eventually(Duration::from_secs(20), "handled and held", || {
            first.count() == 1
        })
        .await;
    });
    // The process "dies": its runtime and connections vanish without any shutdown.
    service.shutdown_background();
    let next = tokio::runtime::Runtime::new().unwrap();
    next.block_on(async {
        let pulsar = pulsar().await;
        let again = Script::new(|_| HandlerOutcome::ack());
        let app = start(App::new().register(on(
            topic_of(&pulsar, &topic, SubType::Shared),
            handler(Arc::clone(&again)),
        )))
        .await;
        eventually(
            Duration::from_secs(30),
            "the held message came back",
            || again.count() == 1,
        )
        .await;
        assert_eq!(&again.calls()[0].payload[..], b"held");
        app.stop().await;
    });
}

/// The attempt number a Pulsar handler sees is the subscription's own count per message
/// (the Rust client does not report the broker's): it rises with each redelivery to this
/// consumer, says where it came from, and starts again at 1 on the next consumer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d5_p4_the_attempt_is_counted_by_the_subscription_and_starts_again_on_the_next_consumer() {
    use ruststream_core::AttemptSource;
    use std::sync::Mutex;

    let pulsar = pulsar().await;
    let topic = unique("d5");
    let sources = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&sources);
    let first = Script::new(move |d| {
        seen.lock().unwrap().push(d.attempt().source());
        if d.attempt().number() == 1 {
            HandlerOutcome::retry()
        } else {
            // Held in the service: the stop below hands it back unacknowledged (P7).
            HandlerOutcome::retry_after(Duration::from_secs(600))
        }
    });
    let app = start(App::new().register(on(
        topic_of(&pulsar, &topic, SubType::Shared),
        handler(Arc::clone(&first)),
    )))
    .await;
    send(&pulsar, &topic, "counted").await;
    eventually(Duration::from_secs(20), "redelivered once", || {
        first.count() == 2
    })
    .await;
    app.stop().await;
    let attempts: Vec<u32> = first.calls().iter().map(|c| c.attempt).collect();
    assert_eq!(attempts, [1, 2]);
    assert!(
        sources
            .lock()
            .unwrap()
            .iter()
            .all(|s| *s == AttemptSource::Subscription)
    );

    let next = Script::new(|_| HandlerOutcome::ack());
    let app = start(App::new().register(on(
        topic_of(&pulsar, &topic, SubType::Shared),
        handler(Arc::clone(&next)),
    )))
    .await;
    eventually(
        Duration::from_secs(30),
        "delivered to the next consumer",
        || next.count() == 1,
    )
    .await;
    assert_eq!(next.calls()[0].attempt, 1, "the count starts again (D5)");
    app.stop().await;
}

/// Acknowledgements are individual on every subscription type: acknowledging the second
/// of two messages leaves the first unacknowledged (a cumulative ack would take it too),
/// so after a reconnect the first comes back and the second does not.
async fn only_the_unacknowledged_first_comes_back(sub_type: SubType) {
    let pulsar = pulsar().await;
    let topic = unique("p3");
    let first = Script::new(|d| {
        if d.payload() == "first" {
            // Held unacknowledged in the service; the stop hands it back.
            HandlerOutcome::retry_after(Duration::from_secs(600))
        } else {
            HandlerOutcome::ack()
        }
    });
    let app = start(App::new().register(on(
        topic_of(&pulsar, &topic, sub_type),
        handler(Arc::clone(&first)),
    )))
    .await;
    send(&pulsar, &topic, "first").await;
    send(&pulsar, &topic, "second").await;
    eventually(Duration::from_secs(20), "both handled", || {
        first.count() == 2
    })
    .await;
    app.stop().await;

    let next = Script::new(|_| HandlerOutcome::ack());
    let app = start(App::new().register(on(
        topic_of(&pulsar, &topic, sub_type),
        handler(Arc::clone(&next)),
    )))
    .await;
    eventually(Duration::from_secs(30), "the first came back", || {
        next.count() >= 1
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let payloads: Vec<_> = next.calls().iter().map(|c| c.payload.clone()).collect();
    assert_eq!(payloads, [&b"first"[..]], "{sub_type:?}: only the first");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p3_acks_are_individual_on_shared() {
    only_the_unacknowledged_first_comes_back(SubType::Shared).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p3_acks_are_individual_on_key_shared() {
    only_the_unacknowledged_first_comes_back(SubType::KeyShared).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p3_acks_are_individual_on_exclusive() {
    only_the_unacknowledged_first_comes_back(SubType::Exclusive).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p3_acks_are_individual_on_failover() {
    only_the_unacknowledged_first_comes_back(SubType::Failover).await;
}

/// A held wait comes due while a delivery waits for its lane (one lane, a slow handler
/// and one queued delivery ahead of it): its nack goes out when the wait is over, not once the lane
/// frees, so the broker delivers it again on time (to another consumer of the
/// subscription too). The slow handler runs until the relay sees the nack, or 10 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p1_a_held_wait_is_nacked_when_due_while_a_delivery_waits_for_its_lane() {
    use common::relay::REDELIVER_UNACKNOWLEDGED_MESSAGES as REDELIVER;
    use std::sync::Mutex;
    use std::time::Instant;

    let (pulsar, sent) = common::pulsar_watched().await;
    let topic = unique("p1-held-while-waiting");
    // One lane holds one delivery and queues one more: `next` waits for room.
    for payload in ["held", "slow", "queued", "next"] {
        pulsar
            .publisher()
            .send(&topic, None, &Headers::new(), payload.as_bytes().to_vec())
            .await
            .expect("the broker took it");
    }
    let calls: Arc<Mutex<Vec<(String, u32, Instant)>>> = Arc::default();
    let released_by_nack = Arc::new(Mutex::new(None));
    let (record, released) = (Arc::clone(&calls), Arc::clone(&released_by_nack));
    let handler = move |delivery: ruststream::Delivery| {
        let (record, released, sent) = (Arc::clone(&record), Arc::clone(&released), sent.clone());
        async move {
            let payload = String::from_utf8_lossy(delivery.payload_slice()).into_owned();
            let attempt = delivery.attempt().number();
            record
                .lock()
                .unwrap()
                .push((payload.clone(), attempt, Instant::now()));
            match (payload.as_str(), attempt) {
                ("held", 1) => HandlerOutcome::retry_after(Duration::from_millis(300)),
                ("slow", _) => {
                    let deadline = Instant::now() + Duration::from_secs(10);
                    while sent.times(REDELIVER).is_empty() && Instant::now() < deadline {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    *released.lock().unwrap() = sent.times(REDELIVER).first().copied();
                    HandlerOutcome::ack()
                }
                _ => HandlerOutcome::ack(),
            }
        }
    };
    let app = start(
        App::new().register(on(
            pulsar
                .topic(&topic)
                .subscription("s")
                .subscription_type(SubType::Shared),
            handler,
        )),
    )
    .await;
    eventually(Duration::from_secs(30), "held handled again", || {
        calls
            .lock()
            .unwrap()
            .iter()
            .any(|(p, a, _)| p == "held" && *a == 2)
    })
    .await;
    app.stop().await;
    let calls = calls.lock().unwrap().clone();
    let order: Vec<(&str, u32)> = calls.iter().map(|(p, a, _)| (p.as_str(), *a)).collect();
    assert_eq!(
        order,
        [
            ("held", 1),
            ("slow", 1),
            ("queued", 1),
            ("next", 1),
            ("held", 2)
        ],
        "one lane: in order, the held one last"
    );
    let nacked = released_by_nack
        .lock()
        .unwrap()
        .expect("the nack went out while `slow` ran (`next` waiting for the lane)");
    let held_at = calls[0].2;
    assert!(
        nacked >= held_at + Duration::from_millis(300),
        "nacked after its 300 ms, not before: {:?}",
        nacked - held_at
    );
}
