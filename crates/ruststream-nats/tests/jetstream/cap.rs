//! N5-N7: below the cap a retry naks with the delay; at the cap the dead letter is
//! byte-identical (or the message is terminated); the consumer has no `max_deliver`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{Script, eventually, handler};
use ruststream::{App, HandlerOutcome, Headers, on};
use ruststream_nats::async_nats::jetstream::consumer;

use crate::support::{Setup, start};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n5_below_the_cap_naks_with_the_delay_and_copies_nothing() {
    let s = Setup::new("N5").await;
    let script = Script::new(|_| HandlerOutcome::retry_after(Duration::from_millis(200)));
    let app = start(
        App::new().register(
            on(s.consumer(), handler(Arc::clone(&script)))
                .max_attempts(3)
                .dead_letter(s.dead()),
        ),
    )
    .await;
    let seq = s.publish(b"x", &Headers::new()).await;
    eventually(Duration::from_secs(10), "three attempts", || {
        script.count() == 3
    })
    .await;
    let calls = script.calls();
    assert_eq!(
        calls.iter().map(|c| c.attempt).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    assert!(calls.iter().all(|c| c.sequence == Some(seq)));
    assert!(
        calls
            .windows(2)
            .all(|w| w[1].at - w[0].at >= Duration::from_millis(200))
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while Setup::messages(&s.dead_stream).await == 0 {
        assert!(Instant::now() < deadline, "no dead letter at the cap");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    app.stop().await;
    assert_eq!(
        Setup::messages(&s.stream).await,
        1,
        "the stream holds only the original"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n6_at_the_cap_the_dead_letter_is_byte_identical_and_the_original_terminated() {
    let s = Setup::new("N6DLQ").await;
    let script = Script::new(|_| HandlerOutcome::retry());
    let app = start(
        App::new().register(
            on(
                s.consumer().ack_wait(Duration::from_millis(500)),
                handler(Arc::clone(&script)),
            )
            .max_attempts(2)
            .dead_letter(s.dead()),
        ),
    )
    .await;
    let mut headers = Headers::new();
    headers.insert("trace", "abc-123").insert("tenant", "eu");
    s.publish(b"\x00\x01not json\xff", &headers).await;
    let dead_stream = s.dead_stream.clone();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Setup::messages(&dead_stream).await == 0 {
        assert!(Instant::now() < deadline, "no dead letter stored");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let dead = dead_stream.get_raw_message(1).await.expect("dead letter");
    assert_eq!(&dead.payload[..], b"\x00\x01not json\xff");
    assert_eq!(
        dead.headers.get("trace").map(|v| v.as_str()),
        Some("abc-123")
    );
    assert_eq!(dead.headers.get("tenant").map(|v| v.as_str()), Some("eu"));
    // Nothing lost or changed; what is added says why, under its own prefix (D6).
    let added = dead
        .headers
        .iter()
        .filter(|(name, _)| {
            AsRef::<str>::as_ref(name).starts_with(ruststream::core::DEAD_LETTER_PREFIX)
        })
        .count();
    assert_eq!(
        dead.headers.len() - added,
        2,
        "no header of its own added or lost"
    );
    assert_eq!(
        dead.headers
            .get(ruststream::core::DEAD_LETTER_REASON)
            .map(|v| v.as_str()),
        Some("retry()")
    );
    assert_eq!(
        dead.headers
            .get(ruststream::core::DEAD_LETTER_SEQUENCE)
            .map(|v| v.as_str()),
        Some("1"),
        "the original's stream sequence"
    );
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(
        script.count(),
        2,
        "terminated after the dead letter: never redelivered"
    );
    assert_eq!(s.info().await.num_ack_pending, 0);
    assert_eq!(
        Setup::messages(&dead_stream).await,
        1,
        "exactly one dead letter"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n6_at_the_cap_without_dead_letter_sends_term() {
    let s = Setup::new("N6TERM").await;
    let script = Script::new(|_| HandlerOutcome::retry());
    let app = start(
        App::new().register(
            on(
                s.consumer().ack_wait(Duration::from_millis(400)),
                handler(Arc::clone(&script)),
            )
            .max_attempts(2),
        ),
    )
    .await;
    s.publish(b"x", &Headers::new()).await;
    eventually(Duration::from_secs(5), "two attempts", || {
        script.count() == 2
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(script.count(), 2);
    assert_eq!(s.info().await.num_ack_pending, 0);
    assert_eq!(Setup::messages(&s.dead_stream).await, 0);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n7_the_consumer_has_no_max_deliver() {
    let s = Setup::new("N7").await;
    let script = Script::new(|_| HandlerOutcome::ack());
    let app = start(
        App::new().register(
            on(s.consumer(), handler(script))
                .max_attempts(3)
                .dead_letter(s.dead()),
        ),
    )
    .await;
    let info = s.info().await;
    assert!(
        info.config.max_deliver <= 0,
        "max_deliver is {}",
        info.config.max_deliver
    );
    assert_eq!(info.config.ack_policy, consumer::AckPolicy::Explicit);
    app.stop().await;
}
