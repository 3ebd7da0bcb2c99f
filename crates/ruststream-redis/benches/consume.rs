//! What consuming costs through ruststream (one stream, one group, ack) next to the raw
//! `redis` loop a user would write (`XREADGROUP` a batch, decode each entry, `XACK` it)
//! on the same entries, in one run: CPU time of the consuming thread per message, and
//! the rate (see `ruststream_test_support::bench`). Needs redis-server at
//! `RUSTSTREAM_REDIS_URL` (scripts/test starts it).
//!
//! Run with `cargo bench -p ruststream-redis --bench consume`.

use std::sync::LazyLock;
use std::time::Duration;

use redis::AsyncCommands;
use redis::streams::{StreamReadOptions, StreamReadReply};
use ruststream::Headers;
use ruststream_redis::{DEFAULT_BATCH, Redis, redis};
use ruststream_test_support::bench::{
    BrokerCpu, Figures, PAYLOAD, Side, Span, Tick, env_count, in_turn, load_average, own_thread,
    report, through_app, with_broker_cpu,
};

/// Messages per side and rounds; `BENCH_MESSAGES` and `BENCH_ROUNDS` change them (a
/// callgrind run wants fewer: `scripts/bench-callgrind-transport`).
static MESSAGES: LazyLock<usize> = LazyLock::new(|| env_count("BENCH_MESSAGES", 20_000));
static ROUNDS: LazyLock<usize> = LazyLock::new(|| env_count("BENCH_ROUNDS", 3));
const LIMIT: Duration = Duration::from_secs(300);

async fn fill(redis: &Redis, stream: &str) {
    let publisher = redis.publisher();
    for _ in 0..*MESSAGES {
        publisher
            .send(stream, &Headers::new(), PAYLOAD)
            .await
            .expect("sent");
    }
}

/// The loop a user would write: read a batch as the group, decode and ack each entry.
async fn raw(redis: Redis, stream: String) -> Figures {
    own_thread(Side::Raw, move || async move {
        let mut connection = redis.connection();
        let () = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&stream)
            .arg("raw")
            .arg("0")
            .query_async(&mut connection)
            .await
            .expect("group");
        let options = StreamReadOptions::default()
            .group("raw", "raw-1")
            .count(DEFAULT_BATCH)
            .block(1_000);
        let span = Span::new(*MESSAGES);
        let mut handled = 0;
        while handled < *MESSAGES {
            let reply: StreamReadReply = connection
                .xread_options(&[&stream], &[">"], &options)
                .await
                .expect("read");
            for key in reply.keys {
                for entry in key.ids {
                    let payload: Vec<u8> = entry.get("payload").expect("a payload field");
                    let tick: Tick = serde_json::from_slice(&payload).expect("decodes");
                    std::hint::black_box(tick);
                    let _: usize = connection
                        .xack(&stream, "raw", &[&entry.id])
                        .await
                        .expect("ack");
                    handled += 1;
                    Span::hit(&span);
                }
            }
        }
        Span::figures(&span)
    })
    .await
}

async fn framework(redis: Redis, stream: String) -> Figures {
    through_app(*MESSAGES, LIMIT, move || redis.stream(stream, "framework")).await
}

#[tokio::main]
async fn main() {
    let url = std::env::var("RUSTSTREAM_REDIS_URL")
        .expect("RUSTSTREAM_REDIS_URL: run scripts/test or start redis-server");
    let redis = Redis::connect(&url).await.expect("connect");
    let load = load_average();
    // What the broker's process spends per message while each side reads (ticks of 10 ms).
    let broker = BrokerCpu::listening_at(&url);
    let mut brokers = Vec::new();
    let (mut raws, mut frameworks) = (Vec::new(), Vec::new());
    for round in 0..*ROUNDS {
        let (raw_stream, framework_stream) = (
            format!("bench-raw-{}-{round}", std::process::id()),
            format!("bench-framework-{}-{round}", std::process::id()),
        );
        fill(&redis, &raw_stream).await;
        fill(&redis, &framework_stream).await;
        let ((r, raw_broker), (f, framework_broker)) = in_turn(
            round,
            || with_broker_cpu(&broker, *MESSAGES, raw(redis.clone(), raw_stream)),
            || {
                with_broker_cpu(
                    &broker,
                    *MESSAGES,
                    framework(redis.clone(), framework_stream),
                )
            },
        )
        .await;
        raws.push(r);
        frameworks.push(f);
        brokers.push((raw_broker, framework_broker));
    }
    println!(
        "{}",
        report(
            &format!(
                "redis/consume (one stream and group, ack, {} messages)",
                *MESSAGES
            ),
            &raws,
            &frameworks,
            &format!("{load} at start, {} at end", load_average())
        )
    );
    let rounds: Vec<String> = brokers
        .iter()
        .map(|(r, f)| format!("{:.1}/{:.1}", r / 1e3, f / 1e3))
        .collect();
    println!(
        "redis/consume broker CPU per message, raw/ruststream us by round: {}",
        rounds.join(" ")
    );
}
