//! `send_all` of many messages next to the raw client's own pipelined publish (one
//! pipeline of `XADD`s), rate compared, in alternating rounds.
//! Needs redis-server at `RUSTSTREAM_REDIS_URL` (scripts/test starts one).
//!
//! Run with `cargo bench -p ruststream-redis --bench publish`.

use ruststream::Publisher;
use ruststream::core::Outgoing;
use ruststream_redis::{Redis, redis};
use ruststream_test_support::bench::{PAYLOAD, env_count};
use ruststream_test_support::publish_bench::compare;

#[tokio::main]
async fn main() {
    let url = std::env::var("RUSTSTREAM_REDIS_URL")
        .expect("RUSTSTREAM_REDIS_URL: run scripts/test or start a broker");
    let redis = Redis::connect(&url).await.expect("redis");
    let n = env_count("BENCH_MESSAGES", 100_000);
    let rounds = env_count("BENCH_ROUNDS", 3);
    let stream =
        |side: &str, round: usize| format!("bench-publish-{side}-{round}-{}", std::process::id());
    let raw = |round: usize| {
        let (mut connection, stream) = (redis.connection(), stream("raw", round));
        async move {
            let mut pipe = redis::pipe();
            for _ in 0..n {
                pipe.cmd("XADD")
                    .arg(&stream)
                    .arg("*")
                    .arg("payload")
                    .arg(PAYLOAD);
            }
            let ids: Vec<String> = pipe.query_async(&mut connection).await.expect("published");
            assert_eq!(ids.len(), n);
        }
    };
    let publisher = Publisher::new(redis.publish_handle());
    let framework = |round: usize| {
        let (publisher, stream) = (publisher.clone(), stream("send-all", round));
        async move {
            // One shared address for all, as a caller sending many to one place makes it.
            let address: std::sync::Arc<str> = std::sync::Arc::from(stream.as_str());
            let messages =
                (0..n).map(move |_| Outgoing::new(std::sync::Arc::clone(&address), PAYLOAD));
            let results = publisher.send_all(messages).await;
            assert!(results.iter().all(Result::is_ok), "every message confirmed");
        }
    };
    compare("redis/publish", n, rounds, raw, framework).await;
    // What the rounds wrote would stay in the broker's memory run after run.
    let mut connection = redis.connection();
    for side in ["raw", "send-all"] {
        for round in 0..rounds {
            let _: i64 = redis::cmd("DEL")
                .arg(stream(side, round))
                .query_async(&mut connection)
                .await
                .expect("stream deleted");
        }
    }
}
