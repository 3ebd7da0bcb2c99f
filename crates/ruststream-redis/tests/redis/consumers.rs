//! S1, S8: consumer names: one kept across restarts reads its own pending entries, and
//! those named here leave the group once they hold nothing.

use std::sync::Arc;
use std::time::Duration;

use crate::common::redis;
use redis::Value;
use ruststream::{App, HandlerOutcome, Headers, on};
use ruststream_redis::{Redis, redis};
use ruststream_test_support::{Script, eventually, handler};

use crate::support::{add, query, stream};

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
