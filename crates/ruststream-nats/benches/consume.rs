//! What consuming costs through ruststream next to the raw async-nats loop a user would
//! write, on the same messages, in one run: Core NATS (subscribe, decode, handle) and
//! JetStream (pull at the client's default batch, decode, handle, +ACK). CPU time of the
//! consuming thread per message, the rate, and Core messages lost to the client's buffer
//! (see `ruststream_test_support::bench`). Needs a nats-server with JetStream at `RUSTSTREAM_NATS_URL`.
//!
//! Run with `cargo bench -p ruststream-nats --bench consume` (scripts/test starts a server).

use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use ruststream::App;
use ruststream_nats::Nats;
use ruststream_nats::async_nats::jetstream::{self, consumer::pull, stream};
use ruststream_test_support::bench::{
    Figures, Side, Span, env_count, in_turn, load_average, own_thread, register, report,
};
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
/// Messages per side and rounds: `BENCH_MESSAGES` (Core; JetStream gets half) and
/// `BENCH_ROUNDS` change them, `BENCH_ONLY=core` leaves JetStream out and
/// `BENCH_ONLY=jetstream` leaves Core out (for callgrind).
static CORE_MESSAGES: LazyLock<usize> = LazyLock::new(|| env_count("BENCH_MESSAGES", 200_000));
static JS_MESSAGES: LazyLock<usize> = LazyLock::new(|| *CORE_MESSAGES / 2);
static ROUNDS: LazyLock<usize> = LazyLock::new(|| env_count("BENCH_ROUNDS", 3));

fn decode(payload: &[u8]) {
    let tick: Tick = serde_json::from_slice(payload).expect("decodes");
    std::hint::black_box(tick);
}

const END: &[u8] = b"end";
const QUIET: Duration = Duration::from_secs(2);
const LIMIT: Duration = Duration::from_secs(300);

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

/// The loop a user would write: next, decode. Ends at an `END` message, which the
/// publisher sends (again and again) once nothing more arrives.
async fn core_raw(publisher: &Nats, service: &Nats, round: usize) -> Figures {
    let subject = format!("bench.core.raw.{round}.{}", std::process::id());
    let span = Span::new(*CORE_MESSAGES);
    let client = service.client().clone();
    let (consumer_span, consumer_subject) = (Arc::clone(&span), subject.clone());
    let (ready_tx, ready) = tokio::sync::oneshot::channel();
    let consumer = tokio::spawn(own_thread(Side::Raw, move || async move {
        let mut sub = client.subscribe(consumer_subject).await.unwrap();
        client.flush().await.unwrap();
        let _ = ready_tx.send(());
        while let Some(m) = sub.next().await {
            if &m.payload[..] == END {
                break;
            }
            decode(&m.payload);
            Span::hit(&consumer_span);
        }
        Span::figures(&consumer_span)
    }));
    ready.await.unwrap();
    publish_core(publisher, &subject, *CORE_MESSAGES).await;
    Span::wait(&span, QUIET, LIMIT).await;
    while !consumer.is_finished() {
        publisher
            .client()
            .publish(subject.clone(), Bytes::from_static(END))
            .await
            .unwrap();
        publisher.client().flush().await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    consumer.await.unwrap()
}

async fn core_framework(publisher: &Nats, service: &Nats, round: usize, metrics: bool) -> Figures {
    let subject = format!("bench.core.fw.{round}.{metrics}.{}", std::process::id());
    let span = Span::new(*CORE_MESSAGES);
    let (service, consumer_span, consumer_subject) =
        (service.clone(), Arc::clone(&span), subject.clone());
    let (ready_tx, ready) = tokio::sync::oneshot::channel();
    let consumer = tokio::spawn(own_thread(Side::Ruststream, move || async move {
        let app = App::new().state(Arc::clone(&consumer_span));
        let app = register(app, service.subject(&consumer_subject));
        let app = if metrics { app.metrics() } else { app };
        let running = app.start().await.unwrap();
        service.client().flush().await.unwrap();
        let _ = ready_tx.send(());
        Span::wait(&consumer_span, QUIET, LIMIT).await;
        let figures = Span::figures(&consumer_span);
        running.stop().await;
        figures
    }));
    ready.await.unwrap();
    publish_core(publisher, &subject, *CORE_MESSAGES).await;
    consumer.await.unwrap()
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
    for _ in 0..*JS_MESSAGES {
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
            && info.ack_floor.stream_sequence >= *JS_MESSAGES as u64
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

/// The loop a user would write: pull (the client's default batch), decode, ack.
async fn jetstream_raw(nats: &Nats, round: usize) -> Figures {
    let name = format!("BENCH_RAW_{round}_{}", std::process::id());
    let stream = prefill(nats, &name).await;
    let consumer_stream = stream.clone();
    let figures = own_thread(Side::Raw, move || async move {
        let consumer: jetstream::consumer::PullConsumer = consumer_stream
            .create_consumer(pull::Config {
                durable_name: Some("raw".into()),
                ..Default::default()
            })
            .await
            .unwrap();
        let mut messages = consumer.messages().await.unwrap();
        let span = Span::new(*JS_MESSAGES);
        for _ in 0..*JS_MESSAGES {
            let m = messages.next().await.unwrap().unwrap();
            decode(&m.payload);
            m.ack().await.unwrap();
            Span::hit(&span);
        }
        Span::figures(&span)
    })
    .await;
    wait_acked(&stream, "raw").await;
    jetstream::new(nats.client().clone())
        .delete_stream(&name)
        .await
        .unwrap();
    figures
}

async fn jetstream_framework(nats: &Nats, round: usize) -> Figures {
    let name = format!("BENCH_FW_{round}_{}", std::process::id());
    let stream = prefill(nats, &name).await;
    let (service, consumer_name) = (nats.clone(), name.clone());
    let figures = own_thread(Side::Ruststream, move || async move {
        let span = Span::new(*JS_MESSAGES);
        let app = App::new().state(Arc::clone(&span));
        let running = register(app, service.consumer(&consumer_name, "framework"))
            .start()
            .await
            .unwrap();
        Span::wait(&span, LIMIT, LIMIT).await;
        let figures = Span::figures(&span);
        running.stop().await;
        figures
    })
    .await;
    wait_acked(&stream, "framework").await;
    jetstream::new(nats.client().clone())
        .delete_stream(&name)
        .await
        .unwrap();
    figures
}

#[tokio::main]
async fn main() {
    let url = std::env::var("RUSTSTREAM_NATS_URL")
        .expect("RUSTSTREAM_NATS_URL: run scripts/test or start nats-server");
    // Separate connections for the publisher/observer and for the consumers, as in a
    // deployment where producer and service are different processes.
    let nats = Nats::connect(&url).await.expect("connect");
    let service = Nats::connect(&url).await.expect("connect");
    let load = load_average();
    let mut figures: [Vec<Figures>; 5] = Default::default();
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    let (core, jetstream) = (only != "jetstream", only != "core");
    for round in 0..*ROUNDS {
        if core {
            // Alternate the order so neither side always runs on a warmer server.
            let (raw, fw) = in_turn(
                round,
                || core_raw(&nats, &service, round),
                || core_framework(&nats, &service, round, false),
            )
            .await;
            figures[0].push(raw);
            figures[1].push(fw);
        }
        if core && jetstream {
            // The same with metrics on (issue #14), compared with the run just above.
            figures[4].push(core_framework(&nats, &service, round, true).await);
        }
        if jetstream {
            let (raw, fw) = in_turn(
                round,
                || jetstream_raw(&service, round),
                || jetstream_framework(&service, round),
            )
            .await;
            figures[2].push(raw);
            figures[3].push(fw);
        }
    }
    let load = format!("{load} at start, {} at end", load_average());
    let core_title = format!("nats/core consume ({} messages)", *CORE_MESSAGES);
    let jetstream_title = format!("nats/jetstream pull+ack ({} messages)", *JS_MESSAGES);
    let metrics_title = format!(
        "nats/core metrics off (as raw) vs on (as ruststream) ({} messages)",
        *CORE_MESSAGES
    );
    let reports = [
        (core, core_title, 0, 1),
        (jetstream, jetstream_title, 2, 3),
        (core && jetstream, metrics_title, 1, 4),
    ];
    for (wanted, title, first, second) in reports {
        if wanted {
            let report = report(&title, &figures[first], &figures[second], &load);
            println!("{report}");
        }
    }
}
