//! S3, S4, G5: retry and retry-after keep the entry pending in Redis and claim it again;
//! a stop gives held waits back; held waits come due at `max_in_flight`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::common::redis;
use ruststream::{App, HandlerOutcome, on};
use ruststream_core::AttemptSource;
use ruststream_test_support::{Script, eventually, handler};

use crate::support::{add, fields, pending, stream};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_s4_retry_is_claimed_again_at_once_and_counted_by_redis() {
    let redis = redis().await;
    let key = stream("s4-retry");
    let script = Script::new(|d| {
        if d.attempt().number() < 3 {
            HandlerOutcome::retry()
        } else {
            HandlerOutcome::ack()
        }
    });
    let sources = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = Arc::clone(&sources);
    let scripted = handler(Arc::clone(&script));
    let running = App::new()
        .register(on(
            redis.stream(&key, "g"),
            move |d: ruststream::Delivery| {
                seen.lock().unwrap().push(d.attempt().source());
                scripted(d)
            },
        ))
        .start()
        .await
        .expect("starts");
    add(&redis, &key, b"again").await;
    eventually(Duration::from_secs(10), "three attempts", || {
        script.count() == 3
    })
    .await;
    running.stop().await;
    let attempts: Vec<u32> = script.calls().iter().map(|c| c.attempt).collect();
    assert_eq!(attempts, [1, 2, 3]);
    assert!(
        sources
            .lock()
            .unwrap()
            .iter()
            .all(|s| *s == AttemptSource::Broker),
        "counted by Redis"
    );
    assert_eq!(pending(&redis, &key, "g").await, 0);
    assert_eq!(fields(&redis, &key).await.len(), 1, "no copies");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s4_retry_after_keeps_the_entry_pending_in_redis_then_claims_it() {
    let redis = redis().await;
    let key = stream("s4-after");
    let wait = Duration::from_millis(600);
    let script = Script::new(move |d| {
        if d.attempt().number() == 1 {
            HandlerOutcome::retry_after(wait)
        } else {
            HandlerOutcome::ack()
        }
    });
    let running = App::new()
        .register(on(redis.stream(&key, "g"), handler(Arc::clone(&script))).max_attempts(5))
        .start()
        .await
        .expect("starts");
    add(&redis, &key, b"later").await;
    eventually(Duration::from_secs(10), "the first attempt", || {
        script.count() == 1
    })
    .await;
    assert_eq!(
        pending(&redis, &key, "g").await,
        1,
        "pending in Redis while it waits"
    );
    eventually(Duration::from_secs(10), "back after the wait", || {
        script.count() == 2
    })
    .await;
    running.stop().await;
    let calls = script.calls();
    assert_eq!(calls[1].attempt, 2);
    assert!(calls[1].at - calls[0].at >= wait - Duration::from_millis(10));
    assert_eq!(pending(&redis, &key, "g").await, 0);
    assert_eq!(fields(&redis, &key).await.len(), 1, "no copies");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s4_a_stop_gives_held_waits_back_to_the_group_at_once() {
    let redis = redis().await;
    let key = stream("s4-stop");
    // A claim timeout far beyond the test: only the stop's give-back brings it early.
    let claim = Duration::from_secs(60);
    let waiting = Script::new(|_| HandlerOutcome::retry_after(Duration::from_secs(120)));
    let running = App::new()
        .register(on(
            redis.stream(&key, "g").claim_timeout(claim),
            handler(Arc::clone(&waiting)),
        ))
        .start()
        .await
        .expect("starts");
    add(&redis, &key, b"waiting").await;
    eventually(Duration::from_secs(10), "held", || waiting.count() == 1).await;
    running.stop().await;
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
        "claimed at once by another consumer",
        || again.count() == 1,
    )
    .await;
    running.stop().await;
    let call = &again.calls()[0];
    assert_eq!(&call.payload[..], b"waiting");
    assert_eq!(call.attempt, 2, "the retry_after's attempt");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g5_held_retry_after_waits_come_due_at_max_in_flight() {
    let redis = redis().await;
    let key = stream("g5-held");
    for n in 0..20 {
        add(&redis, &key, format!("m{n}").as_bytes()).await;
    }
    let script = Script::new(|d| {
        if d.attempt().number() == 1 {
            HandlerOutcome::retry_after(Duration::from_millis(300))
        } else {
            HandlerOutcome::ack()
        }
    });
    let running = App::new()
        .metrics()
        .register(on(redis.stream(&key, "g"), handler(Arc::clone(&script))).max_in_flight(5))
        .start()
        .await
        .expect("starts");
    // The waits fill the bound: the "saturated" alert of docs/operating.md fires (in
    // flight at max_in_flight), and in flight never passes it.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let in_flight =
            ruststream_test_support::ops::metric(&running, "ruststream_in_flight", &[]).await;
        assert!(in_flight <= 5.0, "in flight {in_flight} past the bound");
        if in_flight == 5.0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never at the bound");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Every wait fills the bound; each comes due and is claimed though nothing is fetched.
    eventually(
        Duration::from_secs(20),
        "every entry back and acked",
        || script.calls().iter().filter(|c| c.attempt == 2).count() == 20,
    )
    .await;
    running.stop().await;
    assert_eq!(pending(&redis, &key, "g").await, 0);
}

/// While a delivery waits for its lane (one lane, a slow handler and one queued delivery
/// ahead of it) the driver reads nothing: the acknowledgements gathered are sent and a
/// held wait that comes due is claimed then, not once the lane frees. The slow handler
/// runs until Redis shows both, or 10 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s4_a_held_wait_is_claimed_when_due_while_a_delivery_waits_for_its_lane() {
    let redis = redis().await;
    let key = stream("s4-held-while-waiting");
    for payload in ["acked", "held", "slow", "queued", "next"] {
        add(&redis, &key, payload.as_bytes()).await;
    }
    let ids = ids_by_payload(&redis, &key).await;
    // Each call's payload and attempt.
    let calls: Arc<std::sync::Mutex<Vec<Call>>> = Arc::default();
    let shown = Arc::new(std::sync::Mutex::new(None));
    let handler = {
        let (redis, key, ids) = (redis.clone(), key.clone(), ids.clone());
        let (calls, shown) = (Arc::clone(&calls), Arc::clone(&shown));
        move |d: ruststream::Delivery| {
            let (redis, key, ids) = (redis.clone(), key.clone(), ids.clone());
            let (calls, shown) = (Arc::clone(&calls), Arc::clone(&shown));
            async move {
                let attempt = d.attempt().number();
                calls.lock().unwrap().push((d.payload().to_vec(), attempt));
                match (&d.payload()[..], attempt) {
                    (b"held", 1) => HandlerOutcome::retry_after(Duration::from_millis(300)),
                    (b"slow", _) => {
                        let deadline = std::time::Instant::now() + Duration::from_secs(10);
                        let mut now = delivered(&redis, &key).await;
                        let both = |now: &HashMap<String, i64>| {
                            !now.contains_key(&ids["acked"]) && now.get(&ids["held"]) == Some(&2)
                        };
                        while !both(&now) && std::time::Instant::now() < deadline {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            now = delivered(&redis, &key).await;
                        }
                        *shown.lock().unwrap() = Some(now);
                        HandlerOutcome::ack()
                    }
                    _ => HandlerOutcome::ack(),
                }
            }
        }
    };
    let running = App::new()
        .register(on(redis.stream(&key, "g"), handler))
        .start()
        .await
        .expect("starts");
    eventually(Duration::from_secs(30), "held handled again", || {
        calls
            .lock()
            .unwrap()
            .iter()
            .any(|(payload, attempt)| payload == b"held" && *attempt == 2)
    })
    .await;
    running.stop().await;
    let shown = shown.lock().unwrap().clone().expect("`slow` ran");
    assert_eq!(
        shown.get(&ids["acked"]),
        None,
        "`acked`'s XACK went out while `slow` ran: {shown:?}"
    );
    assert_eq!(
        shown.get(&ids["held"]),
        Some(&2),
        "`held` claimed again (its second delivery counted) while `slow` ran: {shown:?}"
    );
    assert_eq!(pending(&redis, &key, "g").await, 0);
}

type Call = (Vec<u8>, u32);

/// An entry as `XRANGE` gives it: its id and its fields.
type Entry = (String, Vec<(String, Vec<u8>)>);

/// Each entry's id by its payload (the tests publish one payload per entry).
async fn ids_by_payload(redis: &ruststream_redis::Redis, key: &str) -> HashMap<String, String> {
    let mut connection = redis.connection();
    let entries: Vec<Entry> = crate::support::query(
        &mut connection,
        ruststream_redis::redis::cmd("XRANGE")
            .arg(key)
            .arg("-")
            .arg("+"),
    )
    .await;
    entries
        .into_iter()
        .filter_map(|(id, fields)| {
            let payload = fields.into_iter().find(|(name, _)| name == "payload")?.1;
            Some((String::from_utf8(payload).ok()?, id))
        })
        .collect()
}

/// The pending entries of group `g` on `key`, and how many times each was delivered.
async fn delivered(redis: &ruststream_redis::Redis, key: &str) -> HashMap<String, i64> {
    let mut connection = redis.connection();
    let pending: Vec<(String, String, i64, i64)> = crate::support::query(
        &mut connection,
        ruststream_redis::redis::cmd("XPENDING")
            .arg(key)
            .arg("g")
            .arg("-")
            .arg("+")
            .arg(100),
    )
    .await;
    pending
        .into_iter()
        .map(|(id, _, _, count)| (id, count))
        .collect()
}
