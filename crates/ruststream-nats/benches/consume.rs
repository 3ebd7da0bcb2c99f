//! Consume throughput through ruststream next to raw async-nats, on the same messages,
//! in one run: Core NATS (subscribe, decode, handle) and JetStream (pull, decode, handle,
//! +ACK). Needs a nats-server with JetStream at `RUSTSTREAM_NATS_URL`.
//!
//! Run with `cargo bench -p ruststream-nats --bench consume` (scripts/test starts a server).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use ruststream::{App, HandlerOutcome, Message, State, on};
use ruststream_nats::Nats;
use ruststream_nats::async_nats::jetstream::{self, consumer::pull, stream};
use serde::Deserialize;

#[derive(Deserialize)]
#[allow(dead_code)]
struct Tick {
    id: u64,
    price: u32,
    qty: u16,
    buy: bool,
}

const PAYLOAD: &[u8] = br#"{"id":123456,"price":4200,"qty":7,"buy":true}"#;
const CORE_MESSAGES: usize = 100_000;
const JS_MESSAGES: usize = 50_000;
const ROUNDS: usize = 3;

struct Count(AtomicUsize);

async fn handle(Message(tick): Message<Tick>, State(count): State<Arc<Count>>) -> HandlerOutcome {
    std::hint::black_box(tick);
    count.0.fetch_add(1, Ordering::Relaxed);
    HandlerOutcome::ack()
}

fn decode(payload: &[u8]) {
    let tick: Tick = serde_json::from_slice(payload).expect("decodes");
    std::hint::black_box(tick);
}

async fn wait_for(count: &Count, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while count.0.load(Ordering::Relaxed) < n {
        assert!(
            Instant::now() < deadline,
            "only {} of {n} arrived",
            count.0.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
}

/// Publishes `n` Core messages, paced in flushed batches so no subscriber is a slow
/// consumer that the server cuts off.
async fn publish_core(nats: &Nats, subject: &str, n: usize) {
    for chunk in 0..n.div_ceil(1000) {
        for _ in 0..1000.min(n - chunk * 1000) {
            nats.client()
                .publish(subject.to_owned(), Bytes::from_static(PAYLOAD))
                .await
                .unwrap();
        }
        nats.client().flush().await.unwrap();
    }
}

async fn core_raw(nats: &Nats, round: usize) -> Duration {
    let subject = format!("bench.core.raw.{round}.{}", std::process::id());
    let mut sub = nats.client().subscribe(subject.clone()).await.unwrap();
    nats.client().flush().await.unwrap();
    let started = Instant::now();
    let consumer = tokio::spawn(async move {
        for _ in 0..CORE_MESSAGES {
            let m = sub.next().await.expect("message");
            decode(&m.payload);
        }
    });
    publish_core(nats, &subject, CORE_MESSAGES).await;
    consumer.await.unwrap();
    started.elapsed()
}

async fn core_framework(nats: &Nats, round: usize) -> Duration {
    let subject = format!("bench.core.fw.{round}.{}", std::process::id());
    let count = Arc::new(Count(AtomicUsize::new(0)));
    let running = App::new()
        .state(Arc::clone(&count))
        .register(on(nats.subject(&subject), handle))
        .start()
        .await
        .unwrap();
    nats.client().flush().await.unwrap();
    let started = Instant::now();
    publish_core(nats, &subject, CORE_MESSAGES).await;
    wait_for(&count, CORE_MESSAGES).await;
    let took = started.elapsed();
    running.stop().await;
    took
}

async fn prefill(nats: &Nats, name: &str) -> jetstream::stream::Stream {
    let js = jetstream::new(nats.client().clone());
    let _ = js.delete_stream(name).await;
    let stream = js
        .create_stream(stream::Config {
            name: name.to_owned(),
            subjects: vec![format!("{name}.in")],
            ..Default::default()
        })
        .await
        .unwrap();
    let mut acks = Vec::with_capacity(1000);
    for _ in 0..JS_MESSAGES {
        acks.push(
            js.publish(format!("{name}.in"), Bytes::from_static(PAYLOAD))
                .await
                .unwrap(),
        );
        if acks.len() == 1000 {
            for ack in acks.drain(..) {
                ack.await.unwrap();
            }
        }
    }
    for ack in acks {
        ack.await.unwrap();
    }
    stream
}

async fn wait_acked(stream: &jetstream::stream::Stream, consumer: &str) {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        if let Ok(info) = stream.consumer_info(consumer).await
            && info.ack_floor.stream_sequence >= JS_MESSAGES as u64
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "JetStream messages not all acknowledged"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

async fn jetstream_raw(nats: &Nats, round: usize) -> Duration {
    let name = format!("BENCH_RAW_{round}_{}", std::process::id());
    let stream = prefill(nats, &name).await;
    let started = Instant::now();
    let consumer: jetstream::consumer::PullConsumer = stream
        .create_consumer(pull::Config {
            durable_name: Some("raw".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut messages = consumer
        .stream()
        .max_messages_per_batch(32)
        .messages()
        .await
        .unwrap();
    for _ in 0..JS_MESSAGES {
        let m = messages.next().await.unwrap().unwrap();
        decode(&m.payload);
        m.ack().await.unwrap();
    }
    wait_acked(&stream, "raw").await;
    let took = started.elapsed();
    drop(messages);
    jetstream::new(nats.client().clone())
        .delete_stream(&name)
        .await
        .unwrap();
    took
}

async fn jetstream_framework(nats: &Nats, round: usize) -> Duration {
    let name = format!("BENCH_FW_{round}_{}", std::process::id());
    let stream = prefill(nats, &name).await;
    let count = Arc::new(Count(AtomicUsize::new(0)));
    let started = Instant::now();
    let running = App::new()
        .state(Arc::clone(&count))
        .register(on(nats.consumer(&name, "framework"), handle))
        .start()
        .await
        .unwrap();
    wait_acked(&stream, "framework").await;
    let took = started.elapsed();
    running.stop().await;
    jetstream::new(nats.client().clone())
        .delete_stream(&name)
        .await
        .unwrap();
    took
}

fn rate(n: usize, took: Duration) -> f64 {
    n as f64 / took.as_secs_f64()
}

#[tokio::main]
async fn main() {
    let url = std::env::var("RUSTSTREAM_NATS_URL")
        .expect("RUSTSTREAM_NATS_URL: run scripts/test or start nats-server");
    // Separate connections for the publisher/observer and for the consumers, as in a
    // deployment where producer and service are different processes.
    let nats = Nats::connect(&url).await.expect("connect");
    let service = Nats::connect(&url).await.expect("connect");
    let mut best = [0f64; 4];
    for round in 0..ROUNDS {
        // Alternate the order so neither side always runs on a warmer server.
        let (raw, fw) = if round % 2 == 0 {
            let raw = core_raw(&service, round).await;
            (raw, core_framework_with(&nats, &service, round).await)
        } else {
            let fw = core_framework_with(&nats, &service, round).await;
            (core_raw(&service, round).await, fw)
        };
        best[0] = best[0].max(rate(CORE_MESSAGES, raw));
        best[1] = best[1].max(rate(CORE_MESSAGES, fw));
        let raw = jetstream_raw(&service, round).await;
        let fw = jetstream_framework(&service, round).await;
        best[2] = best[2].max(rate(JS_MESSAGES, raw));
        best[3] = best[3].max(rate(JS_MESSAGES, fw));
    }
    println!(
        "nats/core consume: raw {:.0} msg/s, ruststream {:.0} msg/s, ratio {:.1}%",
        best[0],
        best[1],
        100.0 * best[1] / best[0]
    );
    println!(
        "nats/jetstream consume+ack: raw {:.0} msg/s, ruststream {:.0} msg/s, ratio {:.1}%",
        best[2],
        best[3],
        100.0 * best[3] / best[2]
    );
}

async fn core_framework_with(_publisher: &Nats, service: &Nats, round: usize) -> Duration {
    core_framework(service, round).await
}
