//! R1, R2: acknowledgements: drop rejects to the dead-letter exchange, a multiple ack never
//! covers a running delivery, acks cut short are sent by the next fetch, and no outcome
//! comes back when the channel closes.

use std::sync::Arc;
use std::time::Duration;

use crate::common::{declare, rabbit, text};
use lapin::types::AMQPValue;
use ruststream::{App, HandlerOutcome, on};
use ruststream_rabbitmq::lapin;
use ruststream_test_support::{Script, eventually, handler, unique_suffix};

use crate::support::{arrives, get, send};

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
