//! S2, S5: drop acknowledges; an entry with no outcome is claimed by another consumer
//! once the claim timeout passed, and a running one is kept from them.

use std::sync::Arc;
use std::time::Duration;

use crate::common::redis;
use ruststream::{App, HandlerOutcome, on};
use ruststream_test_support::{Script, eventually, handler};

use crate::support::{add, fields, futures_now, pending, stream};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s2_drop_acknowledges_and_the_entry_stays_in_the_stream() {
    let redis = redis().await;
    let key = stream("s2-drop");
    let script = Script::new(|_| HandlerOutcome::drop());
    let running = App::new()
        .register(on(redis.stream(&key, "g"), handler(Arc::clone(&script))))
        .start()
        .await
        .expect("starts");
    add(&redis, &key, b"dropped").await;
    eventually(Duration::from_secs(10), "handled", || script.count() == 1).await;
    eventually(Duration::from_secs(5), "acknowledged", || {
        futures_now(pending(&redis, &key, "g")) == 0
    })
    .await;
    running.stop().await;
    assert_eq!(fields(&redis, &key).await.len(), 1, "still in the stream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s2_s5_no_outcome_is_claimed_by_another_consumer_once_the_claim_timeout_passed() {
    let redis = redis().await;
    let key = stream("s2-nothing");
    let claim = Duration::from_millis(800);
    let stuck = Script::slow(Duration::from_secs(60), |_| HandlerOutcome::ack());
    let running = App::new()
        .shutdown_timeout(Duration::from_millis(200))
        .register(on(
            redis.stream(&key, "g").claim_timeout(claim),
            handler(Arc::clone(&stuck)),
        ))
        .start()
        .await
        .expect("starts");
    add(&redis, &key, b"unfinished").await;
    eventually(Duration::from_secs(10), "the handler runs", || {
        stuck.count() == 1
    })
    .await;
    // The drain gives up: no outcome, and this consumer stops keeping it alive.
    running.stop().await;
    let stopped = tokio::time::Instant::now();
    let again = Script::new(|_| HandlerOutcome::ack());
    let running = App::new()
        .register(on(
            redis.stream(&key, "g").claim_timeout(claim),
            handler(Arc::clone(&again)),
        ))
        .start()
        .await
        .expect("starts");
    eventually(
        Duration::from_secs(10),
        "claimed by the other consumer",
        || again.count() == 1,
    )
    .await;
    assert!(stopped.elapsed() >= claim, "not before the claim timeout");
    running.stop().await;
    let call = &again.calls()[0];
    assert_eq!(&call.payload[..], b"unfinished");
    assert_eq!(call.attempt, 2, "the claim counts as an attempt (S3)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s5_a_running_entry_is_kept_from_other_consumers_past_the_claim_timeout() {
    let redis = redis().await;
    let key = stream("s5");
    // The keepalive runs every third of the claim timeout, so a stall of the server (an
    // fsync of its append-only file on a busy disk) or of this process shorter than two
    // thirds of it cannot let the other consumer claim: a second here, not half of one.
    let claim = Duration::from_millis(1_000);
    let slow = Script::slow(Duration::from_millis(4_000), |_| HandlerOutcome::ack());
    let other = Script::new(|_| HandlerOutcome::ack());
    let running = App::new()
        .register(on(
            redis.stream(&key, "g").claim_timeout(claim),
            handler(Arc::clone(&slow)),
        ))
        .register(on(
            redis.stream(&key, "g").claim_timeout(claim),
            handler(Arc::clone(&other)),
        ))
        .start()
        .await
        .expect("starts");
    add(&redis, &key, b"slow work").await;
    eventually(Duration::from_secs(10), "taken by one consumer", || {
        slow.count() + other.count() >= 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(5_000)).await;
    running.stop().await;
    // Whichever consumer took it first ran it to the end; the other never saw it.
    let calls: Vec<_> = slow.calls().into_iter().chain(other.calls()).collect();
    assert_eq!(
        calls.len(),
        1,
        "handled once, four claim timeouts long: {calls:?}"
    );
    assert_eq!(calls[0].attempt, 1);
    assert_eq!(pending(&redis, &key, "g").await, 0);
}

/// S5 with entries read ahead behind a busy lane: the driver takes no more from the
/// subscription while one waits for the lane, so the read-ahead sits unread; the reader
/// must keep those entries alive meanwhile, not wait for room to read more first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s5_entries_read_ahead_behind_a_busy_lane_are_kept_from_other_consumers() {
    let redis = redis().await;
    let key = stream("s5-ahead");
    let claim = Duration::from_millis(1_000);
    for n in 0..6u8 {
        add(&redis, &key, &[b'a' + n]).await;
    }
    let slow = Script::slow(Duration::from_millis(1_500), |_| HandlerOutcome::ack());
    let first = App::new()
        .register(
            on(
                redis.stream(&key, "g").claim_timeout(claim),
                handler(Arc::clone(&slow)),
            )
            .lanes(1),
        )
        .start()
        .await
        .expect("starts");
    eventually(Duration::from_secs(10), "the first runs", || {
        slow.count() >= 1
    })
    .await;
    // Another consumer of the group, claiming what has been idle past the claim timeout.
    let other = Script::new(|_| HandlerOutcome::ack());
    let second = App::new()
        .register(on(
            redis.stream(&key, "g").claim_timeout(claim),
            handler(Arc::clone(&other)),
        ))
        .start()
        .await
        .expect("starts");
    eventually(Duration::from_secs(20), "all six handled", || {
        slow.count() + other.count() >= 6
    })
    .await;
    // Long enough for a wrongful claim of the last ones to show.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    first.stop().await;
    second.stop().await;
    assert_eq!(
        other.calls().len(),
        0,
        "the other consumer took entries this one kept: {:?}",
        other.calls()
    );
    let calls = slow.calls();
    assert_eq!(calls.len(), 6, "each handled once: {calls:?}");
    assert!(calls.iter().all(|c| c.attempt == 1), "{calls:?}");
    assert_eq!(pending(&redis, &key, "g").await, 0);
}
