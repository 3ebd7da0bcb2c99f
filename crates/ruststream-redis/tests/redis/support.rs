//! Helpers shared by the modules of this test binary: unique stream names, adding
//! entries, and reading a stream and its group back from Redis.

use redis::Value;
use redis::aio::ConnectionManager;
use ruststream::Headers;
use ruststream_redis::{Redis, redis};
use ruststream_test_support::unique_suffix;

pub(crate) fn stream(what: &str) -> String {
    format!("{what}-{}", unique_suffix())
}

pub(crate) async fn add(redis: &Redis, stream: &str, payload: &[u8]) {
    redis
        .publisher()
        .send(stream, &Headers::new(), payload)
        .await
        .expect("XADD confirmed");
}

pub(crate) async fn query<T: redis::FromRedisValue>(
    connection: &mut ConnectionManager,
    command: &redis::Cmd,
) -> T {
    command.query_async(connection).await.expect("command")
}

/// How many entries of `group` on `stream` are pending.
pub(crate) async fn pending(redis: &Redis, stream: &str, group: &str) -> i64 {
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
pub(crate) async fn fields(redis: &Redis, stream: &str) -> Vec<Vec<(String, String)>> {
    let mut connection = redis.connection();
    let entries: Vec<(String, Vec<(String, String)>)> = query(
        &mut connection,
        redis::cmd("XRANGE").arg(stream).arg("-").arg("+"),
    )
    .await;
    entries.into_iter().map(|(_, fields)| fields).collect()
}

/// Runs a future to completion from a synchronous condition (the test's own runtime is
/// multi-threaded, so blocking one worker briefly is fine).
pub(crate) fn futures_now<F: std::future::Future>(future: F) -> F::Output {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(future))
}
