//! N1, N4: each outcome sends its acknowledgement (`+ACK`, `-NAK`, `+TERM`), no outcome is
//! redelivered after `ack_wait`, and a settlement the server did not take is reported.

use std::sync::Arc;
use std::time::Duration;

use crate::common::{Script, eventually, handler, logs};
use ruststream::{App, HandlerOutcome, Headers, on};
use ruststream_nats::async_nats::jetstream::{self};

use crate::support::{Setup, start};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n1_ack_sends_plus_ack_and_is_never_redelivered() {
    let s = Setup::new("N1ACK").await;
    let script = Script::new(|_| HandlerOutcome::ack());
    let app = start(App::new().register(on(
        s.consumer().ack_wait(Duration::from_millis(500)),
        handler(Arc::clone(&script)),
    )))
    .await;
    let seq = s.publish(b"one", &Headers::new()).await;
    eventually(Duration::from_secs(5), "handled", || script.count() == 1).await;
    let mut info = s.info().await;
    for _ in 0..50 {
        if info.ack_floor.stream_sequence == seq {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        info = s.info().await;
    }
    assert_eq!(
        info.ack_floor.stream_sequence, seq,
        "the ack floor moved past it"
    );
    assert_eq!(info.num_ack_pending, 0);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(script.count(), 1, "never sent again, even after ack_wait");
    assert_eq!(script.calls()[0].attempt, 1);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n1_retry_sends_nak_and_the_same_sequence_comes_back_at_once_delivered_plus_one() {
    let s = Setup::new("N1NAK").await;
    let script = Script::new(|d| {
        if d.attempt().number() == 1 {
            HandlerOutcome::retry()
        } else {
            HandlerOutcome::ack()
        }
    });
    let app = start(App::new().register(on(s.consumer(), handler(Arc::clone(&script))))).await;
    let seq = s.publish(b"again", &Headers::new()).await;
    eventually(Duration::from_secs(5), "redelivered", || {
        script.count() == 2
    })
    .await;
    let calls = script.calls();
    assert_eq!(
        calls.iter().map(|c| c.attempt).collect::<Vec<_>>(),
        vec![1, 2]
    );
    assert!(
        calls.iter().all(|c| c.sequence == Some(seq)),
        "same stream sequence"
    );
    assert!(
        calls[1].at - calls[0].at < Duration::from_secs(5),
        "at once, not after ack_wait (30 s)"
    );
    app.stop().await;
    let info = s.info().await;
    assert_eq!(info.num_ack_pending, 0);
    assert_eq!(
        info.num_redelivered, 0,
        "nothing left waiting for redelivery"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n1_retry_after_sends_nak_with_delay_redelivered_no_earlier_and_nothing_published() {
    let s = Setup::new("N1DELAY").await;
    let delay = Duration::from_millis(800);
    let script = Script::new(move |d| {
        if d.attempt().number() == 1 {
            HandlerOutcome::retry_after(delay)
        } else {
            HandlerOutcome::ack()
        }
    });
    let app = start(App::new().register(on(s.consumer(), handler(Arc::clone(&script))))).await;
    let seq = s.publish(b"later", &Headers::new()).await;
    eventually(Duration::from_secs(10), "redelivered", || {
        script.count() == 2
    })
    .await;
    let calls = script.calls();
    assert!(
        calls[1].at - calls[0].at >= delay,
        "came back after {:?}",
        calls[1].at - calls[0].at
    );
    assert_eq!((calls[1].attempt, calls[1].sequence), (2, Some(seq)));
    assert_eq!(Setup::messages(&s.stream).await, 1, "no copy was published");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n1_drop_sends_term_and_is_never_redelivered() {
    use futures_util::StreamExt;

    let s = Setup::new("N1TERM").await;
    // The server announces each +TERM (an +ACK would not be): what tells drop from ack.
    let mut terminated = s
        .nats
        .client()
        .subscribe(format!(
            "$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.{}.worker",
            s.base
        ))
        .await
        .expect("advisories");
    let script = Script::new(|_| HandlerOutcome::drop());
    let app = start(App::new().register(on(
        s.consumer().ack_wait(Duration::from_millis(400)),
        handler(Arc::clone(&script)),
    )))
    .await;
    let seq = s.publish(b"unwanted", &Headers::new()).await;
    eventually(Duration::from_secs(5), "handled", || script.count() == 1).await;
    let advisory = tokio::time::timeout(Duration::from_secs(5), terminated.next())
        .await
        .expect("a MSG_TERMINATED advisory: the server got +TERM")
        .expect("subscribed");
    let advisory: serde_json::Value =
        serde_json::from_slice(&advisory.payload).expect("a JSON advisory");
    assert_eq!(advisory["stream_seq"], seq, "{advisory}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(script.count(), 1, "+TERM: never sent again");
    assert_eq!(s.info().await.num_ack_pending, 0);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n4_no_outcome_is_redelivered_after_ack_wait_and_counts_as_an_attempt() {
    let s = Setup::new("N4WAIT").await;
    let ack_wait = Duration::from_secs(1);
    // Attempt 1 outlives ack_wait. With the keepalive on (the default) the handler
    // deadline is what ends it (D3, G1): no `+WPI` past it, so it comes back as the next
    // attempt, no earlier than ack_wait.
    let script = Script::new(|_| HandlerOutcome::ack());
    let slow_first = {
        let script = Arc::clone(&script);
        move |d: ruststream::Delivery| {
            let script = Arc::clone(&script);
            async move {
                let first = d.attempt().number() == 1;
                let outcome = handler(script)(d).await;
                if first {
                    tokio::time::sleep(Duration::from_millis(2500)).await;
                }
                outcome
            }
        }
    };
    let app = start(
        App::new().register(
            on(s.consumer().ack_wait(ack_wait), slow_first)
                .lanes(2)
                .timeout(ack_wait),
        ),
    )
    .await;
    let seq = s.publish(b"slow", &Headers::new()).await;
    eventually(
        Duration::from_secs(10),
        "redelivered after ack_wait",
        || script.count() == 2,
    )
    .await;
    let calls = script.calls();
    assert_eq!(
        calls[1].attempt, 2,
        "the server's delivered counts the expiry"
    );
    assert_eq!(calls[1].sequence, Some(seq));
    assert!(calls[1].at - calls[0].at >= ack_wait - Duration::from_millis(50));
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn double_ack_reports_a_settlement_the_server_did_not_take() {
    let s = Setup::new("DOUBLE").await;
    let js = jetstream::new(s.nats.client().clone());
    let base = s.base.clone();
    // The handler removes its own consumer, so no server takes the ack.
    let removes_consumer = move |_d: ruststream::Delivery| {
        let js = js.clone();
        let base = base.clone();
        async move {
            js.delete_consumer_from_stream("worker", &base)
                .await
                .expect("delete consumer");
            HandlerOutcome::ack()
        }
    };
    let app = start(App::new().register(on(s.consumer().double_ack(true), removes_consumer))).await;
    s.publish(b"x", &Headers::new()).await;
    eventually(
        Duration::from_secs(10),
        "the failed settlement is logged",
        || logs().contains("settlement failed"),
    )
    .await;
    app.stop().await;
}
