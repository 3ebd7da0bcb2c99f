//! Defects found trying RabbitMQ as production users would (issue #46): a retry copy
//! whose headers pass the connection's `frame_max`, and an undeclared `retry()` on a
//! classic queue.

mod common;

use std::sync::Arc;
use std::time::Duration;

use lapin::options::BasicGetOptions;
use lapin::types::ShortString;
use ruststream::{App, HandlerOutcome, Headers, on};
use ruststream_rabbitmq::{QueueKind, RabbitMq, lapin};
use ruststream_test_support::ops::metric;
use ruststream_test_support::{Script, handler, logs, unique_suffix};

use common::{declare, rabbit};

/// Takes one message off `queue`, waiting up to 10 s for one to arrive.
async fn arrives(rabbit: &RabbitMq, queue: &str) -> Option<lapin::message::Delivery> {
    let channel = rabbit.connection().create_channel().await.expect("channel");
    for _ in 0..200 {
        let got = channel
            .basic_get(ShortString::from(queue), BasicGetOptions { no_ack: true })
            .await
            .expect("basic.get");
        if let Some(message) = got {
            return Some(message.delivery);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// Issue #46, item 3: a message whose headers fill the content-header frame to exactly
/// the connection's `frame_max` is published and consumed; its retry copy, one header
/// larger, is refused by the service before the broker sees it (the broker would close
/// the whole connection with FRAME_ERROR), so the message goes to the dead letter as it
/// arrived (SPEC G3), once, and the connection stays up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g3_a_retry_copy_over_frame_max_goes_to_the_dead_letter_and_the_connection_stays() {
    let rabbit = rabbit().await;
    let (queue, dead) = (
        format!("frame-{}", unique_suffix()),
        format!("frame-dead-{}", unique_suffix()),
    );
    declare(&rabbit, &queue, &[]).await;
    declare(&rabbit, &dead, &[]).await;
    let frame_max = rabbit.connection().configuration().frame_max() as usize;
    // The frame: 7 + 1 overhead, 14 fixed, 1 delivery mode, 4 table length, then the
    // entry `pad`: 1 + 3 name, 1 type, 4 length, the value.
    let pad = frame_max - (7 + 1 + 14 + 1 + 4 + 1 + 3 + 1 + 4);
    let mut headers = Headers::new();
    headers.insert("pad", "p".repeat(pad));
    rabbit
        .publisher()
        .send(&queue, &headers, b"fills the frame")
        .await
        .expect("a header frame of exactly frame_max is taken");
    let script = Script::new(|_| HandlerOutcome::retry());
    let running = App::new()
        .metrics()
        .register(
            on(rabbit.queue(&queue), handler(Arc::clone(&script)))
                .max_attempts(3)
                .dead_letter(&dead),
        )
        .start()
        .await
        .expect("starts");
    let letter = arrives(&rabbit, &dead).await.expect("a dead letter");
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The "copies refused" and "dead letters" alerts of docs/operating.md fire.
    let counted = |kind: &'static str, series: &'static str| {
        let running = &running;
        async move { metric(running, series, &[kind]).await }
    };
    let refused = counted("kind=\"refused\"", "ruststream_copy_failures_total").await;
    let dead_letters = counted("kind=\"dead_letter\"", "ruststream_copies_published_total").await;
    assert_eq!((refused, dead_letters), (1.0, 1.0));
    running.stop().await;
    assert_eq!(script.count(), 1, "one run, then the dead letter");
    assert_eq!(letter.data, b"fills the frame");
    let table = letter.properties.headers().clone().expect("headers");
    assert!(
        !table.inner().contains_key("x-ruststream-retry-count"),
        "as it arrived"
    );
    assert_eq!(table.inner().len(), 1, "the pad header alone");
    let logged = logs();
    assert!(logged.contains("too large"), "the cause is named");
    assert!(!logged.contains("FRAME_ERROR"), "the broker never saw it");
    assert!(
        rabbit.connection().status().connected(),
        "the connection stays up"
    );
}

/// Issue #46, item 5: an undeclared `retry()` on a classic queue (a plain requeue, which
/// the broker only flags) is counted by the service, so attempts grow; each requeue
/// waits a floor (10 ms doubling to 1 s), and attempt 10 is reported at WARN (SPEC G2).
/// Before: 11,727 runs in 15 s, every one at attempt 1, and no WARN.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r2_r3_an_undeclared_retry_on_a_classic_queue_is_counted_slowed_and_warned() {
    let rabbit = rabbit().await;
    let queue = format!("spin-{}", unique_suffix());
    declare(&rabbit, &queue, &[]).await;
    let script = Script::new(|_| HandlerOutcome::retry());
    let running = App::new()
        .register(on(rabbit.queue(&queue), handler(Arc::clone(&script))).name("spinner"))
        .start()
        .await
        .expect("starts");
    rabbit
        .publisher()
        .send(&queue, &Headers::new(), b"always failing")
        .await
        .expect("published");
    let window = Duration::from_secs(6);
    let cpu = ruststream_test_support::cpu_share_over(window).await;
    running.stop().await;
    let attempts: Vec<u32> = script.calls().iter().map(|c| c.attempt).collect();
    // The floors add up to 3.3 s by attempt 10 and 1 s each after: about 12 in 6 s.
    assert!(
        (10..=20).contains(&attempts.len()),
        "{} runs in {window:?}: {attempts:?}",
        attempts.len()
    );
    let counted: Vec<u32> = (1..=attempts.len() as u32).collect();
    assert_eq!(attempts, counted, "each requeue is one more attempt");
    assert!(cpu < 0.25, "CPU {:.0}% of a core", cpu * 100.0);
    let logged = logs();
    assert!(
        logged.lines().any(|l| l.contains("WARN")
            && l.contains("no max_attempts caps it")
            && l.contains("attempt=10")),
        "attempt 10 reported at WARN"
    );
}

/// Issue #46, item 11: a quorum queue whose own `x-delivery-limit` is at or below
/// `max_attempts` would drop a message before the runtime's last attempt and dead
/// letter: the start is refused, naming the limit; a limit above the cap starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r5_a_quorum_delivery_limit_at_or_below_max_attempts_is_refused() {
    use lapin::types::AMQPValue;
    let rabbit = rabbit().await;
    let (low, high, dead) = (
        format!("limit-low-{}", unique_suffix()),
        format!("limit-high-{}", unique_suffix()),
        format!("limit-dead-{}", unique_suffix()),
    );
    for (queue, limit) in [(&low, 3), (&high, 10)] {
        declare(
            &rabbit,
            queue,
            &[
                ("x-queue-type", common::text("quorum")),
                ("x-delivery-limit", AMQPValue::LongLongInt(limit)),
            ],
        )
        .await;
    }
    declare(&rabbit, &dead, &[]).await;
    let register = |queue: &str| {
        on(
            rabbit.queue(queue).kind(QueueKind::Quorum),
            handler(Script::new(|_| HandlerOutcome::ack())),
        )
        .max_attempts(3)
        .dead_letter(&dead)
    };
    let refused = App::new().register(register(&low)).start().await;
    let Err(error) = refused else {
        panic!(
            "a delivery limit of 3 under max_attempts(3) started: {}",
            logs()
        );
    };
    let shown = error.to_string();
    assert!(shown.contains("x-delivery-limit is 3"), "{shown}");
    assert!(shown.contains(&low), "{shown}");
    let running = App::new()
        .register(register(&high))
        .start()
        .await
        .expect("a limit above the cap starts");
    running.stop().await;
}

/// Issue #46, item 11: what the broker sends ahead counts toward `max_in_flight` (G5):
/// with `max_in_flight(3)` and handlers that hang, the broker holds at most 3 of 50
/// messages unacknowledged (the prefetch is cut to the bound). Before: the default
/// prefetch of 256 sent everything ahead (300 MB resident with `in_flight` 3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g5_rabbitmq_prefetch_counts_toward_max_in_flight() {
    let rabbit = rabbit().await;
    let queue = format!("bounded-{}", unique_suffix());
    declare(&rabbit, &queue, &[]).await;
    for n in 0..50 {
        rabbit
            .publisher()
            .send(&queue, &Headers::new(), format!("{n}").as_bytes())
            .await
            .expect("published");
    }
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let hangs = {
        let gate = Arc::clone(&gate);
        move |_: ruststream::Delivery| {
            let gate = Arc::clone(&gate);
            async move {
                let _ = gate.acquire().await;
                HandlerOutcome::ack()
            }
        }
    };
    let running = App::new()
        .metrics()
        .register(on(rabbit.queue(&queue), hangs).lanes(2).max_in_flight(3))
        .start()
        .await
        .expect("starts");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let channel = rabbit.connection().create_channel().await.expect("channel");
    let passive = lapin::options::QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let state = channel
        .queue_declare(
            ShortString::from(queue.as_str()),
            passive,
            Default::default(),
        )
        .await
        .expect("passive declare");
    let unacknowledged = 50 - state.message_count();
    assert!(
        (1..=3).contains(&unacknowledged),
        "{unacknowledged} sent ahead with max_in_flight(3)"
    );
    // The "saturated" alert of docs/operating.md fires: in flight at the bound.
    assert_eq!(metric(&running, "ruststream_in_flight", &[]).await, 3.0);
    gate.add_permits(100);
    running.stop().await;
}

/// Issue #47, item 7: a queue the service does not declare is checked too: read as the
/// wrong kind (a classic queue as quorum, a quorum queue as classic), the start is
/// refused naming the queue and its kind; read as its own kind it starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r6_an_undeclared_queue_of_another_kind_is_refused_at_start() {
    let rabbit = rabbit().await;
    let (classic, quorum) = (
        format!("r6-classic-{}", unique_suffix()),
        format!("r6-quorum-{}", unique_suffix()),
    );
    declare(&rabbit, &classic, &[]).await;
    declare(
        &rabbit,
        &quorum,
        &[("x-queue-type", common::text("quorum"))],
    )
    .await;
    for (queue, wrong, right) in [
        (&classic, QueueKind::Quorum, QueueKind::Classic),
        (&quorum, QueueKind::Classic, QueueKind::Quorum),
    ] {
        let reading = |kind| {
            on(
                rabbit.queue(queue).kind(kind),
                handler(Script::new(|_| HandlerOutcome::ack())),
            )
        };
        let refused = App::new().register(reading(wrong)).start().await;
        let Err(error) = refused else {
            panic!("{queue} read as {wrong:?} started");
        };
        let shown = error.to_string();
        assert!(
            shown.contains(queue.as_str()) && shown.contains("x-queue-type"),
            "{shown}"
        );
        let running = App::new()
            .register(reading(right))
            .start()
            .await
            .unwrap_or_else(|e| panic!("{queue} read as {right:?}: {e}"));
        running.stop().await;
    }
}
