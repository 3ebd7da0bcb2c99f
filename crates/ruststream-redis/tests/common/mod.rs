//! What the Redis tests share: the server the test command started.
#![allow(dead_code, unreachable_pub)]

use ruststream_redis::Redis;

/// The server the test command started; a missing one fails the test.
pub async fn redis() -> Redis {
    ruststream_test_support::capture_logs("debug,redis=info");
    let url = std::env::var("RUSTSTREAM_REDIS_URL").unwrap_or_else(|_| {
        panic!("RUSTSTREAM_REDIS_URL is not set: run the tests with scripts/test, which starts redis-server")
    });
    Redis::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("the Redis tests need redis-server: {e}"))
}
