//! R3-R5, G5: attempts as the broker counts them, retry-after on quorum and classic
//! queues, the cap and the dead-letter queue, held waits at `max_in_flight`.

use std::sync::Arc;
use std::time::Duration;

use crate::common::{declare, rabbit, text};
use ruststream::{App, HandlerOutcome, Headers, on};
use ruststream_core::AttemptSource;
use ruststream_rabbitmq::QueueKind;
use ruststream_test_support::{Script, eventually, handler, unique_suffix};

use crate::support::{arrives, get, send};

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

/// G3 with two consumers on a quorum queue: a dead letter the broker refuses is
/// remembered for its message, never for the delivery tag it came with, which is its
/// channel's count: the other channel's messages carry the same tags, and each of them
/// runs its handler and is acknowledged, none sent to the refusing dead letter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g3_a_refused_dead_letter_sends_no_message_of_another_channel_to_it() {
    let rabbit = rabbit().await;
    let (queue, dead) = (
        format!("g3-tags-{}", unique_suffix()),
        format!("g3-tags-dead-{}", unique_suffix()),
    );
    declare(&rabbit, &queue, &[("x-queue-type", text("quorum"))]).await;
    // Takes nothing: every dead letter published to it is refused (basic.nack).
    declare(
        &rabbit,
        &dead,
        &[
            (
                "x-max-length",
                ruststream_rabbitmq::lapin::types::AMQPValue::LongInt(0),
            ),
            ("x-overflow", text("reject-publish")),
        ],
    )
    .await;
    let script = Script::new(|d| {
        if &d.payload()[..] == b"capped" {
            HandlerOutcome::retry()
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
            .max_attempts(1)
            .dead_letter(&dead)
            .consumers(2),
        )
        .start()
        .await
        .expect("starts");
    send(&rabbit, &queue, b"capped").await;
    eventually(Duration::from_secs(10), "the capped one ran", || {
        script.count() == 1
    })
    .await;
    // Its dead letter refused, and tried again each time it comes back.
    let others = 20;
    for n in 0..others {
        send(&rabbit, &queue, format!("other-{n}").as_bytes()).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ran = || {
        script
            .calls()
            .iter()
            .filter(|c| c.payload != "capped")
            .count()
    };
    let all_ran = tokio::time::timeout(Duration::from_secs(15), async {
        while ran() < others {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    running.stop().await;
    let calls = script.calls();
    assert!(
        all_ran.is_ok(),
        "{} of {others} other messages ran; calls: {:?}",
        ran(),
        calls
            .iter()
            .map(|c| (c.payload.clone(), c.sequence))
            .collect::<Vec<_>>()
    );
    let capped = calls.iter().filter(|c| c.payload == "capped").count();
    assert_eq!(capped, 1, "the capped one ran once, past its cap never");
}
