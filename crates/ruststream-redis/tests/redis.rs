//! Redis Streams against the redis-server the test command starts: SPEC S1-S8 where the
//! behaviour suite does not already show them.

use std::sync::Arc;
use std::time::Duration;

use redis::Value;
use redis::aio::ConnectionManager;
use ruststream::{App, HandlerOutcome, Headers, Message, StartError, on};
use ruststream_core::{
    AttemptSource, DEAD_LETTER_ATTEMPTS, DEAD_LETTER_ENTRY, DEAD_LETTER_PREFIX, DEAD_LETTER_REASON,
    DEAD_LETTER_SOURCE,
};
use ruststream_redis::{Redis, redis};
use ruststream_test_support::{Script, eventually, handler, logs, unique_suffix};

mod common;
use common::redis;

/// An entry's fields as raw bytes, in order.
type Fields = Vec<(Vec<u8>, Vec<u8>)>;

fn stream(what: &str) -> String {
    format!("{what}-{}", unique_suffix())
}

async fn add(redis: &Redis, stream: &str, payload: &[u8]) {
    redis
        .publisher()
        .send(stream, &Headers::new(), payload)
        .await
        .expect("XADD confirmed");
}

async fn query<T: redis::FromRedisValue>(
    connection: &mut ConnectionManager,
    command: &redis::Cmd,
) -> T {
    command.query_async(connection).await.expect("command")
}

/// How many entries of `group` on `stream` are pending.
async fn pending(redis: &Redis, stream: &str, group: &str) -> i64 {
    let mut connection = redis.connection();
    let summary: Value = query(
        &mut connection,
        redis::cmd("XPENDING").arg(stream).arg(group),
    )
    .await;
    match summary {
        Value::Array(items) => match items.first() {
            Some(Value::Int(n)) => *n,
            other => panic!("XPENDING summary: {other:?}"),
        },
        other => panic!("XPENDING summary: {other:?}"),
    }
}

/// The field lists of every entry of `stream`, oldest first.
async fn fields(redis: &Redis, stream: &str) -> Vec<Vec<(String, String)>> {
    let mut connection = redis.connection();
    let entries: Vec<(String, Vec<(String, String)>)> = query(
        &mut connection,
        redis::cmd("XRANGE").arg(stream).arg("-").arg("+"),
    )
    .await;
    entries.into_iter().map(|(_, fields)| fields).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s1_a_new_group_starts_at_the_earliest_entry_and_an_existing_one_keeps_its_position() {
    let redis = redis().await;
    let key = stream("s1");
    add(&redis, &key, b"before the group").await;
    let first = Script::new(|_| HandlerOutcome::ack());
    let running = App::new()
        .register(on(redis.stream(&key, "g"), handler(Arc::clone(&first))))
        .start()
        .await
        .expect("starts");
    eventually(Duration::from_secs(10), "the earlier entry read", || {
        first.count() == 1
    })
    .await;
    running.stop().await;
    add(&redis, &key, b"while away").await;
    let second = Script::new(|_| HandlerOutcome::ack());
    let running = App::new()
        .register(on(redis.stream(&key, "g"), handler(Arc::clone(&second))))
        .start()
        .await
        .expect("starts");
    eventually(Duration::from_secs(10), "the new entry read", || {
        second.count() == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    running.stop().await;
    assert_eq!(&first.calls()[0].payload[..], b"before the group");
    assert_eq!(second.count(), 1, "the group kept its position");
    assert_eq!(&second.calls()[0].payload[..], b"while away");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s1_a_key_of_another_type_fails_the_start_naming_the_stream() {
    let redis = redis().await;
    let key = stream("s1-string");
    let mut connection = redis.connection();
    let () = query(
        &mut connection,
        redis::cmd("SET").arg(&key).arg("not a stream"),
    )
    .await;
    let refused = App::new()
        .register(on(redis.stream(&key, "g"), |_: Message<u64>| async {
            HandlerOutcome::ack()
        }))
        .start()
        .await
        .expect_err("refused");
    assert!(matches!(refused, StartError::Open { .. }), "{refused}");
    let text = format!(
        "{refused}: {}",
        std::error::Error::source(&refused)
            .map(ToString::to_string)
            .unwrap_or_default()
    );
    assert!(text.contains(&key), "names the stream: {text}");
    assert!(text.contains("WRONGTYPE"), "says why: {text}");
}

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

/// Runs a future to completion from a synchronous condition (the test's own runtime is
/// multi-threaded, so blocking one worker briefly is fine).
fn futures_now<F: std::future::Future>(future: F) -> F::Output {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(future))
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
async fn s6_at_the_cap_the_entry_moves_to_the_dead_letter_stream_as_stored() {
    let redis = redis().await;
    let (key, dead) = (stream("s6"), stream("s6-dead"));
    let mut connection = redis.connection();
    // Fields in an order of the producer's own, one of them binary.
    let _: String = query(
        &mut connection,
        redis::cmd("XADD")
            .arg(&key)
            .arg("*")
            .arg("trace")
            .arg("t-1")
            .arg("payload")
            .arg("{\"id\":7}")
            .arg("blob")
            .arg(&[0_u8, 255, 10][..]),
    )
    .await;
    let script = Script::new(|_| HandlerOutcome::retry());
    let running = App::new()
        .register(
            on(redis.stream(&key, "g"), handler(Arc::clone(&script)))
                .max_attempts(2)
                .dead_letter(dead.as_str()),
        )
        .start()
        .await
        .expect("starts");
    eventually(Duration::from_secs(10), "two attempts", || {
        script.count() == 2
    })
    .await;
    let mut moved = Vec::new();
    for _ in 0..100 {
        let entries: Vec<(String, Fields)> = query(
            &mut connection,
            redis::cmd("XRANGE").arg(&dead).arg("-").arg("+"),
        )
        .await;
        if !entries.is_empty() {
            moved = entries;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    running.stop().await;
    assert_eq!(moved.len(), 1, "one dead letter");
    let expected: Fields = vec![
        (b"trace".to_vec(), b"t-1".to_vec()),
        (b"payload".to_vec(), b"{\"id\":7}".to_vec()),
        (b"blob".to_vec(), vec![0, 255, 10]),
    ];
    let (stored, added) = said(&moved[0].1);
    assert_eq!(stored, expected, "the fields as stored, in order");
    // What it says about itself, added in the same MULTI (SPEC D6).
    let added: Vec<&[u8]> = added.iter().map(|(name, _)| name.as_slice()).collect();
    for name in [
        DEAD_LETTER_REASON,
        DEAD_LETTER_SOURCE,
        DEAD_LETTER_ATTEMPTS,
        DEAD_LETTER_ENTRY,
    ] {
        assert!(added.contains(&name.as_bytes()), "{name} added");
    }
    assert_eq!(pending(&redis, &key, "g").await, 0, "and acknowledged");
}

/// A dead letter Redis refuses as it runs the transaction (the dead-letter key holds a
/// string: `WRONGTYPE`, which does not stop the rest of a `MULTI`) leaves the entry
/// pending rather than acknowledged without its dead letter (G3, S6); once the key can
/// take it, the entry comes back and is dead-lettered, the handler not run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g3_s6_a_dead_letter_redis_refuses_leaves_the_entry_pending() {
    let redis = redis().await;
    let (key, dead) = (stream("g3-refused"), stream("g3-refused-dead"));
    let mut connection = redis.connection();
    let () = query(
        &mut connection,
        redis::cmd("SET").arg(&dead).arg("a string"),
    )
    .await;
    add(&redis, &key, b"{\"id\":1}").await;
    let script = Script::new(|_| HandlerOutcome::retry());
    let running = App::new()
        .register(
            on(
                redis
                    .stream(&key, "g")
                    .claim_timeout(Duration::from_millis(300)),
                handler(Arc::clone(&script)),
            )
            .max_attempts(1)
            .dead_letter(dead.as_str()),
        )
        .start()
        .await
        .expect("starts");
    eventually(Duration::from_secs(10), "one attempt", || {
        script.count() == 1
    })
    .await;
    // The dead letter is tried at once, and again each time the entry comes back.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        pending(&redis, &key, "g").await,
        1,
        "not acknowledged while its dead letter is refused"
    );
    let () = query(&mut connection, redis::cmd("DEL").arg(&dead)).await;
    let mut moved = 0;
    for _ in 0..100 {
        moved = query(&mut connection, redis::cmd("XLEN").arg(&dead)).await;
        if moved > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    running.stop().await;
    assert_eq!(moved, 1, "dead-lettered once the key can take it");
    assert_eq!(pending(&redis, &key, "g").await, 0, "and acknowledged");
    assert_eq!(script.count(), 1, "the handler never runs past the cap");
}

/// A dead letter's fields: those stored with the original, and those the runtime added
/// (`x-ruststream-dead-letter-*`, SPEC D6).
fn said(fields: &Fields) -> (Fields, Fields) {
    fields
        .iter()
        .cloned()
        .partition(|(name, _)| !name.starts_with(DEAD_LETTER_PREFIX.as_bytes()))
}

/// Issue #46, item 4: an entry of 5,000 fields (past what Lua's `unpack` takes) reaches
/// the dead-letter stream whole and is acknowledged; the handler, capped at 1, runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s6_an_entry_of_5000_fields_is_dead_lettered_whole() {
    let redis = redis().await;
    let (key, dead) = (stream("s6-wide"), stream("s6-wide-dead"));
    let mut connection = redis.connection();
    let mut add = redis::cmd("XADD");
    add.arg(&key).arg("*").arg("payload").arg("{}");
    for i in 0..5_000 {
        add.arg(format!("f{i}")).arg(format!("v{i}"));
    }
    let _: String = query(&mut connection, &add).await;
    let script = Script::new(|_| HandlerOutcome::retry());
    let running = App::new()
        .register(
            on(redis.stream(&key, "g"), handler(Arc::clone(&script)))
                .max_attempts(1)
                .dead_letter(dead.as_str()),
        )
        .start()
        .await
        .expect("starts");
    eventually(
        Duration::from_secs(10),
        "dead-lettered and acknowledged",
        || futures_now(pending(&redis, &key, "g")) == 0 && script.count() == 1,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    running.stop().await;
    assert_eq!(script.count(), 1, "the handler ran once");
    let moved: Vec<(String, Fields)> = query(
        &mut connection,
        redis::cmd("XRANGE").arg(&dead).arg("-").arg("+"),
    )
    .await;
    assert_eq!(moved.len(), 1, "one dead letter");
    let (stored, _) = said(&moved[0].1);
    assert_eq!(stored.len(), 5_001, "every field as stored");
    assert_eq!(stored[5_000], (b"f4999".to_vec(), b"v4999".to_vec()));
    assert!(logs().contains("dead-lettered"), "said once confirmed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s6_an_entry_without_a_payload_field_is_undecodable_and_dead_lettered_with_its_fields() {
    let redis = redis().await;
    let (key, dead) = (stream("s6-nopayload"), stream("s6-nopayload-dead"));
    let mut connection = redis.connection();
    let _: String = query(
        &mut connection,
        redis::cmd("XADD").arg(&key).arg("*").arg("other").arg("1"),
    )
    .await;
    let called = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let calls = Arc::clone(&called);
    let running = App::new()
        .register(
            on(redis.stream(&key, "g"), move |Message(_): Message<u64>| {
                calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                async { HandlerOutcome::ack() }
            })
            .dead_letter(dead.as_str())
            .max_attempts(3),
        )
        .start()
        .await
        .expect("starts");
    eventually(Duration::from_secs(10), "dead-lettered", || {
        !futures_now(fields(&redis, &dead)).is_empty()
    })
    .await;
    running.stop().await;
    assert_eq!(called.load(std::sync::atomic::Ordering::SeqCst), 0);
    let letters = fields(&redis, &dead).await;
    let stored: Vec<Vec<(String, String)>> = letters
        .iter()
        .map(|f| {
            f.iter()
                .filter(|(n, _)| !n.starts_with(DEAD_LETTER_PREFIX))
                .cloned()
                .collect()
        })
        .collect();
    assert_eq!(stored, [vec![("other".to_owned(), "1".to_owned())]]);
    assert_eq!(pending(&redis, &key, "g").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s7_broken_settings_are_all_refused_at_start() {
    let redis = redis().await;
    let refused = App::new()
        .register(
            on(
                redis
                    .stream("s7", "")
                    .claim_timeout(Duration::from_millis(10))
                    .batch(0),
                |_: Message<u64>| async { HandlerOutcome::ack() },
            )
            .name("broken"),
        )
        .start()
        .await
        .expect_err("refused");
    let text = refused.to_string();
    for rule in ["group name is empty", "claim_timeout(10ms)", "batch(0)"] {
        assert!(text.contains(rule), "{rule} in {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s8_a_consumer_name_kept_across_restarts_reads_its_own_pending_entries_at_once() {
    let redis = redis().await;
    let key = stream("s8");
    let stuck = Script::slow(Duration::from_secs(60), |_| HandlerOutcome::ack());
    let running = App::new()
        .shutdown_timeout(Duration::from_millis(200))
        .register(on(
            redis.stream(&key, "g").consumer("worker-1"),
            handler(Arc::clone(&stuck)),
        ))
        .start()
        .await
        .expect("starts");
    add(&redis, &key, b"mine").await;
    eventually(Duration::from_secs(10), "the handler runs", || {
        stuck.count() == 1
    })
    .await;
    running.stop().await;
    let again = Script::new(|_| HandlerOutcome::ack());
    // A claim timeout far beyond the test: only this consumer's own recovery brings it.
    let running = App::new()
        .register(on(
            redis
                .stream(&key, "g")
                .consumer("worker-1")
                .claim_timeout(Duration::from_secs(600)),
            handler(Arc::clone(&again)),
        ))
        .start()
        .await
        .expect("starts");
    eventually(Duration::from_secs(10), "read again at once", || {
        again.count() == 1
    })
    .await;
    running.stop().await;
    assert_eq!(&again.calls()[0].payload[..], b"mine");
    assert_eq!(again.calls()[0].attempt, 2);
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

/// The group's consumers and what each holds pending.
async fn consumers_of(redis: &Redis, stream: &str, group: &str) -> Vec<(String, i64)> {
    let mut connection = redis.connection();
    let listed: Vec<std::collections::HashMap<String, Value>> = query(
        &mut connection,
        redis::cmd("XINFO").arg("CONSUMERS").arg(stream).arg(group),
    )
    .await;
    listed
        .into_iter()
        .map(|mut c| {
            let name = redis::from_redis_value(c.remove("name").expect("name")).expect("text");
            let pending =
                redis::from_redis_value(c.remove("pending").expect("pending")).expect("n");
            (name, pending)
        })
        .collect()
}

/// Issue #46, item 10: a service that names its consumer itself removes it from the group
/// at a stop when it holds nothing pending, and at a start removes those that processes of
/// this host left behind (their pid gone) with nothing pending; one holding entries stays,
/// so they can still be claimed. Before: one more consumer in the group at every start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s1_consumers_named_here_leave_the_group_once_they_hold_nothing() {
    let redis = redis().await;
    let key = stream("s1-leave");
    let mut connection = redis.connection();
    let _: () = query(
        &mut connection,
        redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&key)
            .arg("g")
            .arg("0")
            .arg("MKSTREAM"),
    )
    .await;
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("hostname");
    let (gone, gone_busy) = (
        format!("{}-4000000-0", host.trim()),
        format!("{}-4000001-0", host.trim()),
    );
    for name in [&gone, &gone_busy] {
        let _: i64 = query(
            &mut connection,
            redis::cmd("XGROUP")
                .arg("CREATECONSUMER")
                .arg(&key)
                .arg("g")
                .arg(name),
        )
        .await;
    }
    // One entry pending with the second departed consumer: it must stay.
    let _: String = query(
        &mut connection,
        redis::cmd("XADD")
            .arg(&key)
            .arg("*")
            .arg("payload")
            .arg("\"held\""),
    )
    .await;
    let _: Value = query(
        &mut connection,
        redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg("g")
            .arg(&gone_busy)
            .arg("COUNT")
            .arg(1)
            .arg("STREAMS")
            .arg(&key)
            .arg(">"),
    )
    .await;
    for round in 0..3 {
        let script = Script::new(|_| HandlerOutcome::ack());
        let running = App::new()
            .register(on(redis.stream(&key, "g"), handler(Arc::clone(&script))))
            .start()
            .await
            .expect("starts");
        redis
            .publisher()
            .send(&key, &Headers::new(), format!("{round}").as_bytes())
            .await
            .expect("XADD");
        eventually(Duration::from_secs(10), "handled", || script.count() == 1).await;
        running.stop().await;
    }
    let left = consumers_of(&redis, &key, "g").await;
    assert_eq!(
        left,
        vec![(gone_busy, 1)],
        "only the departed consumer holding an entry stays"
    );
}

/// Issue #47 (G8, S1): a group created at a time reads only the entries added at or after
/// it (an entry id is the millisecond it was added); one created at `Latest` only those
/// added after it; the default reads every entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g8_a_new_group_starts_at_the_earliest_entry_a_time_or_the_latest() {
    use ruststream::StartAt;
    let redis = redis().await;
    let key = stream("g8-start");
    let send = |payload: &'static str| {
        let (redis, key) = (redis.clone(), key.clone());
        async move {
            redis
                .publisher()
                .send(&key, &Headers::new(), payload.as_bytes())
                .await
                .expect("XADD");
        }
    };
    send("before").await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let at = std::time::SystemTime::now();
    tokio::time::sleep(Duration::from_millis(20)).await;
    send("after").await;
    let read = |group: &'static str, start: StartAt| {
        let (redis, key) = (redis.clone(), key.clone());
        async move {
            let script = Script::new(|_| HandlerOutcome::ack());
            let running = App::new()
                .register(on(
                    redis.stream(&key, group).start_at(start),
                    handler(Arc::clone(&script)),
                ))
                .start()
                .await
                .expect("starts");
            (running, script)
        }
    };
    let payloads = |script: &Script| -> Vec<String> {
        script
            .calls()
            .iter()
            .map(|c| String::from_utf8_lossy(&c.payload).into_owned())
            .collect()
    };
    let (running, earliest) = read("earliest", StartAt::default()).await;
    eventually(Duration::from_secs(10), "both entries", || {
        earliest.count() == 2
    })
    .await;
    running.stop().await;
    let (running, timed) = read("timed", StartAt::Time(at)).await;
    eventually(Duration::from_secs(10), "the later entry", || {
        timed.count() >= 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    running.stop().await;
    assert_eq!(payloads(&timed), ["after"]);
    let (running, latest) = read("latest", StartAt::Latest).await;
    send("newest").await;
    eventually(Duration::from_secs(10), "the new entry", || {
        latest.count() >= 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    running.stop().await;
    assert_eq!(payloads(&latest), ["newest"]);
    assert_eq!(payloads(&earliest), ["before", "after"]);
}
