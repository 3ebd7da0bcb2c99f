//! `consumers(1)` against `consumers(2)` on a handler that computes for about 1 ms per
//! message (a fixed amount of hashing, no sleep): the rate, the service's CPU per message
//! and the broker's CPU per message, medians of several rounds, on Kafka (2 partitions),
//! JetStream, RabbitMQ (classic queue) and Redis Streams, against the brokers
//! `scripts/test` starts.
//!
//! Each run starts the app, lets it settle (a Kafka group forms), fills the address with
//! `send_all`, and measures from the end of the fill to the last message handled.
//!
//! Run with `cargo bench -p ruststream-faults --bench scale` (`BENCH_ONLY=kafka|jetstream|
//! rabbitmq|redis`, `BENCH_MESSAGES`, default 4,000, `BENCH_ROUNDS`, default 3).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ruststream::core::{Descriptor, Outgoing};
use ruststream::{App, Delivery, HandlerOutcome, Publisher, on};
use ruststream_faults::{kafka, unique};
use ruststream_test_support::bench::{
    BrokerCpu, env_count, load_average, process_cpu_ns, thread_cpu_ns,
};

/// FNV-1a over the payload, `rounds` times: the handler's computation.
fn compute(payload: &[u8], rounds: u32) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325_u64;
    for _ in 0..rounds {
        for byte in payload {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    std::hint::black_box(hash)
}

const PAYLOAD: &[u8] = br#"{"id":123456,"price":4200,"qty":7,"buy":true}"#;

/// The rounds of hashing that take about 1 ms of this thread's CPU, measured over at
/// least 200 ms (the scheduler's count moves in ticks).
fn calibrate() -> u32 {
    let rounds = 1_000;
    let started = thread_cpu_ns();
    let mut calls = 0_u64;
    while thread_cpu_ns() - started < 200_000_000 {
        compute(PAYLOAD, rounds);
        calls += 1;
    }
    let per_round = (thread_cpu_ns() - started) as f64 / (calls as f64 * f64::from(rounds));
    (1_000_000.0 / per_round) as u32
}

/// One run's figures.
#[derive(Debug, Clone, Copy)]
struct Figures {
    rate: f64,
    service_ns: f64,
    broker_ns: f64,
}

/// Runs the app with `consumers` consumers on `descriptor`, fills `address` with `n`
/// messages through `publisher`, and measures.
async fn run<D: Descriptor>(
    descriptor: D,
    consumers: usize,
    settle: Duration,
    (publisher, address, n): (&Publisher, &str, usize),
    (work, broker): (u32, &BrokerCpu),
) -> Figures {
    let handled = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&handled);
    let running = App::new()
        .register(
            on(descriptor, move |d: Delivery| {
                compute(d.payload(), work);
                count.fetch_add(1, Ordering::Relaxed);
                async { HandlerOutcome::ack() }
            })
            .consumers(consumers),
        )
        .start()
        .await
        .expect("starts");
    tokio::time::sleep(settle).await;
    // Kafka: the two partitions get half each (keys would hash unevenly over two).
    let messages = (0..n).map(|i| {
        let mut message = Outgoing::new(address, PAYLOAD);
        message
            .extras
            .insert(ruststream_kafka::Partition((i % 2) as i32));
        message
    });
    let sent = publisher.send_all(messages).await;
    assert!(sent.iter().all(Result::is_ok), "filled");
    let (started, from) = (Instant::now(), handled.load(Ordering::Relaxed));
    let (own, theirs) = (process_cpu_ns("self"), broker.ns());
    let deadline = started + Duration::from_secs(300);
    while handled.load(Ordering::Relaxed) < n {
        assert!(Instant::now() < deadline, "not all handled within 300 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let measured = (n - from) as f64;
    let figures = Figures {
        rate: measured / started.elapsed().as_secs_f64(),
        service_ns: (process_cpu_ns("self") - own) as f64 / measured,
        broker_ns: (broker.ns() - theirs) as f64 / measured,
    };
    running.stop().await;
    figures
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// One transport: `rounds` rounds of both counts, in alternating order.
async fn transport(name: &str, n: usize, rounds: usize, work: u32) {
    let mut figures: [Vec<Figures>; 2] = [Vec::new(), Vec::new()];
    let load = load_average();
    for round in 0..rounds {
        let order = if round % 2 == 0 { [1, 2] } else { [2, 1] };
        for consumers in order {
            let f = once(name, consumers, n, work).await;
            figures[consumers - 1].push(f);
        }
    }
    let med = |i: usize, pick: fn(&Figures) -> f64| median(figures[i].iter().map(pick).collect());
    let (one, two) = (med(0, |f| f.rate), med(1, |f| f.rate));
    println!(
        "{name}: {n} messages x {rounds} rounds; rate consumers(1) {one:.0}/s, consumers(2) {two:.0}/s ({:.2}x); service CPU per message {:.0} / {:.0} us ({:.2}x); broker CPU per message {:.0} / {:.0} us; load {load} at start, {} at end",
        two / one,
        med(0, |f| f.service_ns) / 1e3,
        med(1, |f| f.service_ns) / 1e3,
        med(1, |f| f.service_ns) / med(0, |f| f.service_ns),
        med(0, |f| f.broker_ns) / 1e3,
        med(1, |f| f.broker_ns) / 1e3,
        load_average()
    );
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name}: run scripts/test or start the brokers"))
}

/// One run on a fresh address of transport `name`.
async fn once(name: &str, consumers: usize, n: usize, work: u32) -> Figures {
    let group = unique("g").replace('-', "_");
    match name {
        "kafka" => {
            let brokers = env("RUSTSTREAM_KAFKA_BROKERS");
            let topic = unique("scale");
            kafka::create_partitioned(&brokers, &[&topic], 2).await;
            let client = ruststream_kafka::Kafka::connect(&brokers).expect("kafka");
            let publisher = Publisher::new(Arc::new(client.publisher()));
            let descriptor = client
                .topic(&topic)
                .group(&group)
                .commit(ruststream_kafka::Commit::Tracked)
                .set("session.timeout.ms", "6000")
                .set("heartbeat.interval.ms", "500");
            let broker = BrokerCpu::listening_at(&brokers);
            let settle = Duration::from_secs(6);
            run(
                descriptor,
                consumers,
                settle,
                (&publisher, &topic, n),
                (work, &broker),
            )
            .await
        }
        "jetstream" => {
            let url = env("RUSTSTREAM_NATS_URL");
            let nats = ruststream_nats::Nats::connect(&url).await.expect("nats");
            let stream = unique("SCALE");
            ruststream_nats::async_nats::jetstream::new(nats.client().clone())
                .create_stream(ruststream_nats::async_nats::jetstream::stream::Config {
                    name: stream.clone(),
                    subjects: vec![stream.clone()],
                    ..Default::default()
                })
                .await
                .expect("stream");
            let publisher = Publisher::new(nats.publish_handle());
            let broker = BrokerCpu::listening_at(&url);
            let descriptor = nats.consumer(&stream, &group);
            let settle = Duration::from_millis(500);
            run(
                descriptor,
                consumers,
                settle,
                (&publisher, &stream, n),
                (work, &broker),
            )
            .await
        }
        "rabbitmq" => {
            let url = env("RUSTSTREAM_RABBITMQ_URL");
            let rabbit = ruststream_rabbitmq::RabbitMq::connect(&url)
                .await
                .expect("rabbitmq");
            let queue = unique("scale");
            rabbit
                .declare_queue(&queue, ruststream_rabbitmq::QueueKind::Classic)
                .await
                .expect("queue");
            let publisher = Publisher::new(rabbit.publish_handle());
            let broker = BrokerCpu::listening_at(&url);
            let descriptor = rabbit.queue(&queue);
            let settle = Duration::from_millis(500);
            run(
                descriptor,
                consumers,
                settle,
                (&publisher, &queue, n),
                (work, &broker),
            )
            .await
        }
        _ => {
            let url = env("RUSTSTREAM_REDIS_URL");
            let redis = ruststream_redis::Redis::connect(&url).await.expect("redis");
            let stream = unique("scale");
            let publisher = Publisher::new(redis.publish_handle());
            let broker = BrokerCpu::listening_at(&url);
            let descriptor = redis.stream(stream.as_str(), group.as_str());
            let settle = Duration::from_millis(500);
            run(
                descriptor,
                consumers,
                settle,
                (&publisher, &stream, n),
                (work, &broker),
            )
            .await
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n = env_count("BENCH_MESSAGES", 4_000);
    let rounds = env_count("BENCH_ROUNDS", 3);
    let only = std::env::var("BENCH_ONLY").ok();
    let work = calibrate();
    println!(
        "handler: {work} rounds of FNV-1a over {} bytes, about 1 ms of CPU",
        PAYLOAD.len()
    );
    for name in ["kafka", "jetstream", "rabbitmq", "redis"] {
        if only.as_deref().is_none_or(|o| o == name) {
            transport(name, n, rounds, work).await;
        }
    }
}
