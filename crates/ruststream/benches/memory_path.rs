//! The full path of one message on the memory broker: publish, fetch, lane, JSON decode,
//! handler, plan, ack. Prints nanoseconds and heap allocations per message, for the
//! whole path and for the consume side alone (messages published beforehand).
//!
//! Run with `cargo bench -p ruststream --bench memory_path`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ruststream::core::Outgoing;
use ruststream::memory::MemoryBroker;
use ruststream::{App, HandlerOutcome, Message, State, on};
use serde::Deserialize;

// Counts allocations only while a profiler is active, so the timed runs pay nothing.
#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

#[derive(Deserialize)]
#[allow(dead_code)]
struct Tick {
    id: u64,
    price: u32,
    qty: u16,
    buy: bool,
}

struct Done(AtomicUsize, tokio::sync::Notify, usize);

async fn handle(Message(tick): Message<Tick>, State(done): State<Arc<Done>>) -> HandlerOutcome {
    std::hint::black_box(tick);
    if done.0.fetch_add(1, Ordering::Relaxed) + 1 == done.2 {
        done.1.notify_one();
    }
    HandlerOutcome::ack()
}

/// The batch handler (`MEMORY_PATH_BATCH=n`): every element decoded, all acked.
async fn handle_batch(
    batch: ruststream::batch::Batch<Tick>,
    State(done): State<Arc<Done>>,
) -> ruststream::BatchOutcome {
    std::hint::black_box(&*batch);
    let before = done.0.fetch_add(batch.len(), Ordering::Relaxed);
    if before < done.2 && before + batch.len() >= done.2 {
        done.1.notify_one();
    }
    ruststream::BatchOutcome::ack_all()
}

const PAYLOAD: &[u8] = br#"{"id":123456,"price":4200,"qty":7,"buy":true}"#;

struct Measure {
    nanos: f64,
    allocations: f64,
}

/// Publishes `n` messages (before or while consuming) and waits until all are acked.
async fn run(n: usize, prefill: bool, count_allocations: bool) -> Measure {
    let broker = MemoryBroker::with_capacity(n + 1);
    let done = Arc::new(Done(AtomicUsize::new(0), tokio::sync::Notify::new(), n));
    let message = Outgoing::new("ticks", Bytes::from_static(PAYLOAD));
    if prefill {
        // The group exists once a subscription opened; messages published before wait
        // for it, so publish into the address first and measure only consumption.
        for _ in 0..n {
            broker.publish(message.clone()).await;
        }
    }
    let app = App::new().state(Arc::clone(&done));
    // `MEMORY_PATH_BATCH=n`: a batch registration of up to n messages per call.
    let app = match std::env::var("MEMORY_PATH_BATCH")
        .ok()
        .and_then(|n| n.parse().ok())
    {
        Some(n) => app.register(
            ruststream::on_batch(broker.topic("ticks"), handle_batch)
                .max_batch(n)
                .max_in_flight(n.max(1024)),
        ),
        None => app.register(on(broker.topic("ticks"), handle)),
    };
    // `MEMORY_PATH_METRICS=1`: the same with metrics collected (issue #14).
    let app = if std::env::var_os("MEMORY_PATH_METRICS").is_some() {
        app.metrics()
    } else {
        app
    };
    let profiler = count_allocations.then(|| dhat::Profiler::builder().testing().build());
    let started = Instant::now();
    let running = app.start().await.expect("start");
    if !prefill {
        for _ in 0..n {
            broker.publish(message.clone()).await;
        }
    }
    let finished = done.1.notified();
    if done.0.load(Ordering::Relaxed) < n {
        tokio::time::timeout(Duration::from_secs(120), finished)
            .await
            .expect("all messages handled");
    }
    let elapsed = started.elapsed();
    let allocations = profiler.map_or(0, |p| {
        let blocks = dhat::HeapStats::get().total_blocks;
        drop(p);
        blocks
    });
    running.stop().await;
    Measure {
        nanos: elapsed.as_nanos() as f64 / n as f64,
        allocations: allocations as f64 / n as f64,
    }
}

/// The floor the issue measures against: draining a prefilled tokio channel and decoding
/// each payload, with no framework (callgrind counts only inside this function).
async fn floor_drain(mut queue: tokio::sync::mpsc::Receiver<Bytes>, n: usize) {
    for _ in 0..n {
        let payload = queue.recv().await.expect("a message");
        let tick: Tick = serde_json::from_slice(&payload).expect("decodes");
        std::hint::black_box(tick);
    }
}

async fn floor(n: usize) {
    let (tx, rx) = tokio::sync::mpsc::channel(n + 1);
    for _ in 0..n {
        tx.send(Bytes::from_static(PAYLOAD)).await.expect("queued");
    }
    // A task of its own, as the framework's driver is (and so not inlined into this one).
    tokio::spawn(floor_drain(rx, n)).await.expect("drained");
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    if let Some(n) = std::env::var("MEMORY_PATH_FLOOR_N")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        runtime.block_on(floor(n));
        return;
    }
    // `MEMORY_PATH_N=n` runs one consume-only pass of n messages and exits: the callgrind
    // script runs two sizes and divides the difference of instructions by the difference
    // of messages, which removes start-up costs.
    if let Some(n) = std::env::var("MEMORY_PATH_N")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        runtime.block_on(run(n, true, false));
        return;
    }
    runtime.block_on(run(10_000, true, false));
    for (label, prefill) in [("consume (prefilled)", true), ("publish + consume", false)] {
        // Steady state: the difference between a large and a small run removes start-up
        // costs (spawning lanes, first growth of queues).
        let per_message = |small: &Measure, large: &Measure, f: fn(&Measure) -> f64| {
            (f(large) * LARGE as f64 - f(small) * SMALL as f64) / (LARGE - SMALL) as f64
        };
        let small = runtime.block_on(run(SMALL, prefill, false));
        let large = runtime.block_on(run(LARGE, prefill, false));
        let nanos = per_message(&small, &large, |m| m.nanos);
        let small = runtime.block_on(run(SMALL, prefill, true));
        let large = runtime.block_on(run(LARGE, prefill, true));
        let allocations = per_message(&small, &large, |m| m.allocations);
        println!(
            "memory_path/{label}: {nanos:.0} ns/message, {allocations:.2} allocations/message (steady state)"
        );
    }
}

const SMALL: usize = 20_000;
const LARGE: usize = 120_000;
