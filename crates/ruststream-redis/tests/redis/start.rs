//! S1, S7, G8: where a new group starts reading, and the settings and keys that fail a start.

use std::sync::Arc;
use std::time::Duration;

use crate::common::redis;
use ruststream::{App, HandlerOutcome, Headers, Message, StartError, on};
use ruststream_redis::redis;
use ruststream_test_support::{Script, eventually, handler};

use crate::support::{add, query, stream};

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
