//! S6, G3: entries moved to the dead-letter stream as stored (large, undecodable,
//! refused by Redis).

use std::sync::Arc;
use std::time::Duration;

use crate::common::redis;
use ruststream::{App, HandlerOutcome, Message, Running, on};
use ruststream_core::{
    DEAD_LETTER_ATTEMPTS, DEAD_LETTER_ENTRY, DEAD_LETTER_PREFIX, DEAD_LETTER_REASON,
    DEAD_LETTER_SOURCE,
};
use ruststream_redis::redis;
use ruststream_test_support::{Script, eventually, handler, logs};

use crate::support::{add, fields, futures_now, pending, query, stream};

/// An entry's fields as raw bytes, in order.
type Fields = Vec<(Vec<u8>, Vec<u8>)>;

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

/// An app whose registration on `key` is capped at one attempt with its dead letters
/// going to `dead`, which holds a string for now: Redis refuses every dead letter as it
/// runs the transaction (`WRONGTYPE`, which does not stop the rest of a `MULTI`).
async fn capped_while_dead_letters_are_refused(
    redis: &ruststream_redis::Redis,
    key: &str,
    dead: &str,
    script: &Arc<Script>,
) -> Running {
    let () = query(
        &mut redis.connection(),
        redis::cmd("SET").arg(dead).arg("a string"),
    )
    .await;
    App::new()
        .register(
            on(
                redis
                    .stream(key, "g")
                    .claim_timeout(Duration::from_millis(300)),
                handler(Arc::clone(script)),
            )
            .max_attempts(1)
            .dead_letter(dead),
        )
        .start()
        .await
        .expect("starts")
}

/// Lets `dead` take dead letters again and waits (5 s at most) for the first; how many
/// it holds then.
async fn dead_letters_let_in(redis: &ruststream_redis::Redis, dead: &str) -> usize {
    let mut connection = redis.connection();
    let () = query(&mut connection, redis::cmd("DEL").arg(dead)).await;
    let mut moved = 0;
    for _ in 0..100 {
        moved = query(&mut connection, redis::cmd("XLEN").arg(dead)).await;
        if moved > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    moved
}

/// A dead letter Redis refuses leaves the entry pending rather than acknowledged without
/// its dead letter (G3, S6); once the key can take it, the entry comes back and is
/// dead-lettered, the handler not run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g3_s6_a_dead_letter_redis_refuses_leaves_the_entry_pending() {
    let redis = redis().await;
    let (key, dead) = (stream("g3-refused"), stream("g3-refused-dead"));
    add(&redis, &key, b"{\"id\":1}").await;
    let script = Script::new(|_| HandlerOutcome::retry());
    let running = capped_while_dead_letters_are_refused(&redis, &key, &dead, &script).await;
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
    let moved = dead_letters_let_in(&redis, &dead).await;
    running.stop().await;
    assert_eq!(moved, 1, "dead-lettered once the key can take it");
    assert_eq!(pending(&redis, &key, "g").await, 0, "and acknowledged");
    assert_eq!(script.count(), 1, "the handler never runs past the cap");
    // Sent again as the entry came back, it still says why (SPEC D6).
    let letters: Vec<(String, Fields)> = query(
        &mut redis.connection(),
        redis::cmd("XRANGE").arg(&dead).arg("-").arg("+"),
    )
    .await;
    let (stored, added) = said(&letters[0].1);
    assert_eq!(stored, vec![(b"payload".to_vec(), b"{\"id\":1}".to_vec())]);
    let reason = added
        .iter()
        .find(|(name, _)| name.as_slice() == DEAD_LETTER_REASON.as_bytes())
        .map(|(_, value)| String::from_utf8_lossy(value).into_owned());
    assert!(
        reason.as_deref().is_some_and(|r| r.contains("refused")),
        "the reason says it was sent again: {reason:?} in {added:?}"
    );
}

/// While one entry's dead letter is refused, other entries of the stream (whose ids share
/// its sequence part, mostly 0) are handled as usual, and none follows it to the dead
/// letter once the key takes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g3_s6_a_refused_dead_letter_sends_no_other_entry_to_it() {
    let redis = redis().await;
    let (key, dead) = (stream("g3-others"), stream("g3-others-dead"));
    add(&redis, &key, b"capped").await;
    let script = Script::new(|d| {
        if &d.payload()[..] == b"capped" {
            HandlerOutcome::retry()
        } else {
            HandlerOutcome::ack()
        }
    });
    let running = capped_while_dead_letters_are_refused(&redis, &key, &dead, &script).await;
    eventually(Duration::from_secs(10), "the capped one ran", || {
        script.count() == 1
    })
    .await;
    // Its dead letter refused, and tried again as it comes back: others come meanwhile.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for n in 0..3u8 {
        add(&redis, &key, &[b'a' + n]).await;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    eventually(Duration::from_secs(10), "the others handled", || {
        script.count() == 4
    })
    .await;
    assert_eq!(dead_letters_let_in(&redis, &dead).await, 1);
    // Anything else wrongly owed would follow it now.
    tokio::time::sleep(Duration::from_millis(500)).await;
    running.stop().await;
    let moved: usize = query(&mut redis.connection(), redis::cmd("XLEN").arg(&dead)).await;
    assert_eq!(moved, 1, "only the capped entry is dead-lettered");
    assert_eq!(pending(&redis, &key, "g").await, 0, "all acknowledged");
    assert_eq!(script.count(), 4, "each ran once: {:?}", script.calls());
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
